//! `cargo xtask check-docs`: every documentation citation in the repository points at
//! something that exists.
//!
//! Scanned: every `*.rs`, `*.md`, `*.py` and `*.toml` file under `crates/`, `xtask/`,
//! `tools/` and `docs/`, the `README*` files under `fixtures/`, and the top-level `README.md`
//! (directories named `target` or starting with `.` are skipped, and so is this file, whose
//! tests spell out bad citations on purpose). Problems reported, one line each as
//! `path:line: what`:
//!
//! - a citation `docs/NAME.md` whose file does not exist;
//! - a citation `docs/NAME.md#anchor` whose file has no heading with that anchor (anchors are
//!   GitHub's heading slugs, see [`slug`], with `-1`, `-2`, … for repeated headings);
//! - in a markdown file, an in-page link `](#anchor)` to an anchor the file does not have;
//! - a citation of the old outside specification ([`OUTSIDE_SPEC`]) or a path into the
//!   sibling shared folder ([`OUTSIDE_DIR`]),
//!   both of which a clone of the repository does not have.

/// The old citation form of the outside specification (built so this file does not contain
/// it literally and a plain grep of the tree finds nothing).
const OUTSIDE_SPEC: &str = concat!("spec ", "\u{a7}");
/// The sibling folder outside the repository.
const OUTSIDE_DIR: &str = concat!("..", "/shared");
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Top-level directories that are scanned.
const ROOTS: [&str; 5] = ["crates", "xtask", "tools", "docs", "fixtures"];
/// File extensions that are scanned.
const EXTENSIONS: [&str; 4] = ["rs", "md", "py", "toml"];
/// This file: its tests contain deliberately broken citations.
const SELF_PATH: &str = "xtask/src/check_docs.rs";

/// Runs the check on the repository at `root` and prints every problem.
pub fn run(root: &Path) -> ExitCode {
    let scan = scan(root);
    for p in &scan.problems {
        println!("{p}");
    }
    if scan.problems.is_empty() {
        println!(
            "check-docs: OK ({} citations in {} files)",
            scan.citations, scan.files
        );
        ExitCode::SUCCESS
    } else {
        println!(
            "check-docs: {} problem(s) ({} citations in {} files)",
            scan.problems.len(),
            scan.citations,
            scan.files
        );
        ExitCode::FAILURE
    }
}

/// Every problem found in the repository at `root`, as `path:line: what`, in file order.
/// (`run` prints the same list; this is the entry point for tests.)
#[cfg_attr(not(test), allow(dead_code))]
pub fn check_docs(root: &Path) -> Vec<String> {
    scan(root).problems
}

/// The GitHub anchor of a heading: markdown links reduced to their text, lower-cased, every
/// character that is not a letter, digit, space, `-` or `_` removed, then each space turned
/// into `-`.
pub fn slug(heading: &str) -> String {
    let text = strip_links(heading.trim());
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of every heading of a markdown text (fenced code blocks excluded), with the
/// `-1`, `-2`, … suffixes GitHub gives repeated headings.
pub fn anchors(markdown: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    let mut fence: Option<(char, usize)> = None;
    for line in markdown.lines() {
        let trimmed = line.trim_start_matches(' ');
        let indent = line.len() - trimmed.len();
        if indent <= 3 {
            if let Some(marker) = fence_marker(trimmed) {
                match fence {
                    None => fence = Some(marker),
                    Some((c, n)) if marker.0 == c && marker.1 >= n && is_closing(trimmed) => {
                        fence = None
                    }
                    Some(_) => {}
                }
                continue;
            }
        }
        if fence.is_some() || indent > 3 {
            continue;
        }
        if let Some(text) = atx_heading(trimmed) {
            let base = slug(text);
            let n = seen.entry(base.clone()).or_insert(0);
            let anchor = if *n == 0 { base } else { format!("{base}-{n}") };
            *n += 1;
            out.insert(anchor);
        }
    }
    out
}

/// `(char, length)` of a code fence opening or closing line (three or more backticks or
/// tildes).
fn fence_marker(line: &str) -> Option<(char, usize)> {
    let c = line.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let n = line.chars().take_while(|&x| x == c).count();
    (n >= 3).then_some((c, n))
}

/// A closing fence carries nothing after its marker.
fn is_closing(line: &str) -> bool {
    let c = line.chars().next().unwrap_or(' ');
    line.trim_start_matches(c).trim().is_empty()
}

/// The text of an ATX heading line (`# …` to `###### …`), without the closing `#`s.
fn atx_heading(line: &str) -> Option<&str> {
    let level = line.chars().take_while(|&c| c == '#').count();
    if level == 0 || level > 6 {
        return None;
    }
    let rest = &line[level..];
    if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
        return None;
    }
    let text = rest.trim();
    // An optional closing sequence of `#`s, preceded by a space (or the whole text).
    let without = text.trim_end_matches('#');
    if without.is_empty() || without.ends_with(' ') || without.ends_with('\t') {
        Some(without.trim_end())
    } else {
        Some(text)
    }
}

/// `[text](url)` and `![text](url)` reduced to `text`.
fn strip_links(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|i| open + i) else {
            break;
        };
        let Some(end) = rest[close + 2..].find(')').map(|i| close + 2 + i) else {
            break;
        };
        let before = &rest[..open];
        out.push_str(before.strip_suffix('!').unwrap_or(before));
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// What one scan found.
struct Scan {
    problems: Vec<String>,
    files: usize,
    citations: usize,
}

fn scan(root: &Path) -> Scan {
    let mut files = vec![root.join("README.md")];
    for dir in ROOTS {
        collect(&root.join(dir), dir == "fixtures", &mut files);
    }
    files.retain(|p| p.is_file() && rel(root, p) != SELF_PATH);
    let mut docs = DocCache::default();
    let mut scan = Scan {
        problems: Vec::new(),
        files: files.len(),
        citations: 0,
    };
    for path in &files {
        let Ok(bytes) = fs::read(path) else {
            scan.problems
                .push(format!("{}: cannot be read", rel(root, path)));
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let name = rel(root, path);
        let is_md = path.extension().is_some_and(|e| e == "md");
        let own = is_md.then(|| anchors(&text));
        for (i, line) in text.lines().enumerate() {
            let at = format!("{name}:{}", i + 1);
            for (file, anchor) in citations(line) {
                scan.citations += 1;
                let target = format!("docs/{file}.md");
                match (docs.anchors(root, &target), anchor) {
                    (None, _) => scan
                        .problems
                        .push(format!("{at}: cites {target}, which does not exist")),
                    (Some(set), Some(a)) if !set.contains(a) => scan.problems.push(format!(
                        "{at}: cites {target}#{a}, but {target} has no heading with that anchor"
                    )),
                    _ => {}
                }
            }
            if let Some(own) = &own {
                for a in page_links(line) {
                    scan.citations += 1;
                    if !own.contains(a) {
                        scan.problems.push(format!(
                            "{at}: links to #{a}, but {name} has no heading with that anchor"
                        ));
                    }
                }
            }
            if line.to_lowercase().contains(OUTSIDE_SPEC) {
                scan.problems.push(format!(
                    "{at}: cites the outside specification (`{OUTSIDE_SPEC}`); cite a docs/ section instead"
                ));
            }
            if line.contains(OUTSIDE_DIR) {
                scan.problems.push(format!(
                    "{at}: refers to `{OUTSIDE_DIR}`, which is outside the repository"
                ));
            }
        }
    }
    scan
}

/// Anchors of each cited markdown file, read once (`None` when the file does not exist).
#[derive(Default)]
struct DocCache(HashMap<String, Option<HashSet<String>>>);

impl DocCache {
    fn anchors(&mut self, root: &Path, target: &str) -> Option<&HashSet<String>> {
        self.0
            .entry(target.to_string())
            .or_insert_with(|| {
                fs::read(root.join(target))
                    .ok()
                    .map(|b| anchors(&String::from_utf8_lossy(&b)))
            })
            .as_ref()
    }
}

/// Every `docs/NAME.md` or `docs/NAME.md#anchor` in a line, as `(NAME, anchor)`. The `docs/`
/// must not continue a longer path (`crates/x/docs/…` is not a citation).
fn citations(line: &str) -> Vec<(&str, Option<&str>)> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut from = 0;
    while let Some(i) = line[from..].find("docs/").map(|i| from + i) {
        from = i + 5;
        if i > 0 && is_path_byte(bytes[i - 1]) {
            continue;
        }
        let name_end = from + run_len(&line[from..]);
        if name_end == from || !line[name_end..].starts_with(".md") {
            continue;
        }
        let after = name_end + 3;
        if line[after..]
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let name = &line[from..name_end];
        let anchor = line[after..].strip_prefix('#').and_then(|rest| {
            let n = run_len(rest);
            (n > 0).then(|| &rest[..n])
        });
        out.push((name, anchor));
        from = after;
    }
    out
}

/// In-page markdown links `](#anchor)` of a line.
fn page_links(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](#") {
        let tail = &rest[i + 3..];
        let n = run_len(tail);
        if tail[n..].starts_with(')') && n > 0 {
            out.push(&tail[..n]);
        }
        rest = &tail[n..];
    }
    out
}

/// Length of the leading run of `[A-Za-z0-9_-]` characters (plus non-ASCII letters).
fn run_len(s: &str) -> usize {
    s.char_indices()
        .find(|&(_, c)| !(c.is_alphanumeric() || c == '_' || c == '-'))
        .map_or(s.len(), |(i, _)| i)
}

/// Characters that would make `docs/` the tail of a longer path or word.
fn is_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/')
}

/// Scanned files under `dir`, sorted; under `fixtures/` only `README*` files.
fn collect(dir: &Path, readmes_only: bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') && !path.is_symlink() {
                collect(&path, readmes_only, out);
            }
            continue;
        }
        let ext_ok = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.contains(&e));
        if ext_ok && (!readmes_only || name.starts_with("README")) {
            out.push(path);
        }
    }
}

/// `path` relative to `root`, with `/` separators.
fn rel(root: &Path, path: &Path) -> String {
    let r = path.strip_prefix(root).unwrap_or(path);
    r.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository itself: every citation resolves, nothing cites the outside spec.
    #[test]
    fn the_repository_cites_only_what_exists() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let problems = check_docs(&root);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// A fresh empty directory under the system temp dir.
    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("k3-check-docs-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    #[test]
    fn finds_exactly_the_broken_citations() {
        let root = temp_dir("tree");
        write(
            &root,
            "docs/GOOD.md",
            "# Good doc\n\n## Section one\n\ntext\n\n## Section one\n\n```sh\n# not a heading\n```\n\n\
             See [one](#section-one) and [nope](#no-such-anchor).\n",
        );
        write(
            &root,
            "README.md",
            "Docs: docs/GOOD.md, docs/GOOD.md#good-doc.\n",
        );
        write(
            &root,
            "crates/a/src/lib.rs",
            "//! docs/GOOD.md#section-one and docs/GOOD.md#section-one-1 are fine.\n\
             //! docs/GOOD.md#not-a-heading is inside a code fence.\n\
             //! docs/MISSING.md does not exist.\n\
             //! old: spec \u{a7}4.2.\n\
             //! old path: ..\u{2f}shared/fixtures/upstream\n\
             //! crates/x/docs/GOOD.md#nothing is a longer path, not a citation.\n",
        );
        write(&root, "tools/t.py", "# docs/GOOD.md#section-one-2\n");
        write(&root, "xtask/Cargo.toml", "# docs/GOOD.md#section-one\n");
        // Not scanned: other extensions, non-README fixtures, target dirs, this file.
        write(&root, "crates/a/notes.txt", "docs/MISSING.md\n");
        write(&root, "fixtures/m/data.md", "docs/MISSING.md\n");
        write(&root, "fixtures/m/README.md", "docs/GOOD.md#section-one\n");
        write(&root, "crates/a/target/x.rs", "// docs/MISSING.md\n");
        write(&root, SELF_PATH, "// docs/MISSING.md\n");

        let problems = check_docs(&root);
        assert_eq!(
            problems,
            [
                "crates/a/src/lib.rs:2: cites docs/GOOD.md#not-a-heading, but docs/GOOD.md has no heading with that anchor",
                "crates/a/src/lib.rs:3: cites docs/MISSING.md, which does not exist",
                &format!("crates/a/src/lib.rs:4: cites the outside specification (`{OUTSIDE_SPEC}`); cite a docs/ section instead"),
                &format!("crates/a/src/lib.rs:5: refers to `{OUTSIDE_DIR}`, which is outside the repository"),
                "tools/t.py:1: cites docs/GOOD.md#section-one-2, but docs/GOOD.md has no heading with that anchor",
                "docs/GOOD.md:13: links to #no-such-anchor, but docs/GOOD.md has no heading with that anchor",
            ]
        );
        let scan = scan(&root);
        assert_eq!(
            scan.files, 6,
            "README.md, docs/GOOD.md, lib.rs, t.py, Cargo.toml, fixtures README"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn slugs_follow_github() {
        assert_eq!(slug("Architecture at a glance"), "architecture-at-a-glance");
        assert_eq!(
            slug("Attention residual (attn_res)"),
            "attention-residual-attn_res"
        );
        assert_eq!(slug("tiktoken.model checks"), "tiktokenmodel-checks");
        assert_eq!(
            slug("`k3 serve` — an OpenAI-compatible HTTP server"),
            "k3-serve--an-openai-compatible-http-server"
        );
        assert_eq!(
            slug("Mat-vec, criterion (load ≈ 4.3–5.5; medians)"),
            "mat-vec-criterion-load--4355-medians"
        );
        assert_eq!(
            slug("Row dots (every `W·x` in the model)"),
            "row-dots-every-wx-in-the-model"
        );
        assert_eq!(slug("[Sampling](API.md#sampling) notes"), "sampling-notes");
        assert_eq!(slug("  Ünïcode Größe  "), "ünïcode-größe");
    }

    #[test]
    fn repeated_headings_get_numbered_anchors() {
        let a =
            anchors("# A\n## B ##\n## B\n### B\n~~~\n## B\n~~~\n    # indented code\n#NoSpace\n");
        let mut v: Vec<_> = a.into_iter().collect();
        v.sort();
        assert_eq!(v, ["a", "b", "b-1", "b-2"]);
    }

    #[test]
    fn citations_are_cut_at_punctuation() {
        assert_eq!(
            citations("(docs/MODEL.md#kda-recurrence), docs/API.md. x/docs/A.md docs/B.mdx"),
            [("MODEL", Some("kda-recurrence")), ("API", None)]
        );
        assert_eq!(page_links("[a](#x) [b](#y-2). [c](http://z)"), ["x", "y-2"]);
    }
}
