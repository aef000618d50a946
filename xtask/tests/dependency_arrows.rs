//! README's dependency arrows are the workspace's: every k3 crate depends (normal
//! dependencies, not dev) on exactly the k3 crates its README line names, and no crate is
//! missing from the block. `cargo metadata` is the ground truth.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

type Arrows = BTreeMap<String, BTreeSet<String>>;

/// The block under "Dependency arrows" in README.md: `crate → a, b` or `crate → (none)`.
fn documented(readme: &str) -> Arrows {
    let start = readme
        .find("Dependency arrows")
        .expect("README.md has a 'Dependency arrows' section");
    let fence = readme[start..]
        .find("```")
        .expect("the arrows sit in a code block")
        + start
        + 3;
    let end = readme[fence..].find("```").expect("the code block ends") + fence;
    let mut arrows = Arrows::new();
    for line in readme[fence..end].lines().filter(|l| !l.trim().is_empty()) {
        let (from, to) = line
            .split_once('→')
            .unwrap_or_else(|| panic!("README arrow line without →: {line:?}"));
        let targets: BTreeSet<String> = match to.trim() {
            "(none)" => BTreeSet::new(),
            list => list.split(',').map(|t| t.trim().to_string()).collect(),
        };
        assert!(
            arrows.insert(from.trim().to_string(), targets).is_none(),
            "README names {} twice",
            from.trim()
        );
    }
    arrows
}

/// The workspace's k3 → k3 normal dependencies, from `cargo metadata`.
fn actual(root: &Path) -> Arrows {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let members: BTreeSet<String> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_string())
        .collect();
    let mut arrows = Arrows::new();
    for p in meta["packages"].as_array().expect("packages") {
        let deps = p["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .filter(|n| members.contains(*n))
            .map(str::to_string)
            .collect();
        arrows.insert(p["name"].as_str().expect("name").to_string(), deps);
    }
    arrows
}

#[test]
fn readme_arrows_match_cargo_metadata() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let documented = documented(&readme);
    let actual = actual(&root);
    for (krate, deps) in &actual {
        let said = documented
            .get(krate)
            .unwrap_or_else(|| panic!("{krate} is a workspace member but README's arrows omit it"));
        assert_eq!(
            said, deps,
            "README's arrows for {krate} differ from Cargo.toml"
        );
    }
    for krate in documented.keys() {
        assert!(
            actual.contains_key(krate),
            "README's arrows name {krate}, which is no workspace member"
        );
    }
}

#[test]
fn nothing_depends_on_the_binary_or_xtask() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (krate, deps) in actual(&root) {
        assert!(
            !deps.contains("k3-cli"),
            "{krate} depends on the k3 binary crate"
        );
        assert!(!deps.contains("xtask"), "{krate} depends on xtask");
    }
}

#[test]
fn the_api_types_need_no_server() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "tree",
            "-p",
            "k3-api",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .current_dir(&root)
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    for forbidden in ["axum ", "tokio ", "hyper "] {
        assert!(
            !tree.lines().any(|l| l.starts_with(forbidden)),
            "k3-api pulls in {forbidden}(it must stay free of servers and runtimes)"
        );
    }
}

/// Every `.rs` file under `dir`, recursively (skipping `target`).
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("readable directory")
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "target") {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_path_attribute_reaches_outside_its_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root");
    let mut crates: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
        .map(|e| e.path())
        .collect();
    crates.push(root.join("xtask"));
    for krate in crates {
        let mut files = Vec::new();
        rust_files(&krate, &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).expect("readable source");
            for line in text.lines().map(str::trim) {
                let Some(rest) = line.strip_prefix("#[path = \"") else {
                    continue;
                };
                let target = rest.split('"').next().unwrap_or("");
                let resolved = file.parent().expect("a parent").join(target);
                let resolved = resolved.canonicalize().unwrap_or(resolved);
                assert!(
                    resolved.starts_with(&krate),
                    "{}: #[path = \"{target}\"] reaches outside {} (share code through a crate)",
                    file.display(),
                    krate.display()
                );
            }
        }
    }
}
