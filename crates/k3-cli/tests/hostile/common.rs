//! Shared machinery of the hostile-input suite: scratch copies of the tiny model, shard and
//! header rewriting, running `k3`, and the table-driven case checker.
//!
//! A case is a name, a description of the input (for docs/RELIABILITY.md), a damage step
//! applied to a fresh copy of `fixtures/tiny-k3`, the `k3` arguments, the expected exit code
//! and substrings stderr must contain. Every case also asserts that nothing panicked.
//! With `K3_HOSTILE_CATALOGUE=DIR` set, each group writes its rows to `DIR/<group>.md`.

use k3_format::writer::{read_shards, write_shards, ShardDoc, TensorDoc};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The clean model's ids for `--ids 637,229,263,638,730,42,197 -n 4`, as `--print-ids`
/// writes them on stderr.
pub const PROMPT: &str = "637,229,263,638,730,42,197";
pub const CLEAN_IDS: &str = "generated ids: 391,655,292,730";

pub fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3")
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

pub fn k3(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("K3_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent/k3-hostile-xdg")
        .output()
        .expect("k3 starts")
}

/// A temp directory removed on drop: `temp_dir/k3-hostile-<pid>-<name>`.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn empty(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("k3-hostile-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    /// A fresh copy of the tiny model.
    pub fn tiny(name: &str) -> Scratch {
        let s = Scratch::empty(name);
        for entry in std::fs::read_dir(tiny()).unwrap() {
            let p = entry.unwrap().path();
            std::fs::copy(&p, s.0.join(p.file_name().unwrap())).unwrap();
        }
        s
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn s(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub const SHARD1: &str = "model-00001-of-00002.safetensors";
pub const SHARD2: &str = "model-00002-of-00002.safetensors";
pub const INDEX: &str = "model.safetensors.index.json";

/// One tensor of a shard being rewritten (the library's [`TensorDoc`]).
pub type T = TensorDoc;

/// Reads every shard of `dir` (tensors in offset order), lets `edit` change them, and writes
/// shards and index back (the index lists exactly what the shards hold, unless `index` is
/// false, when the old index is kept).
pub fn rewrite(dir: &Path, index: bool, edit: impl FnOnce(&mut Vec<ShardDoc>)) {
    let mut docs = read_shards(dir).unwrap();
    edit(&mut docs);
    write_shards(dir, &docs, index).unwrap();
}

/// Finds the tensor named `name` in the docs.
pub fn find<'a>(docs: &'a mut [ShardDoc], name: &str) -> &'a mut T {
    docs.iter_mut()
        .flat_map(|d| d.tensors.iter_mut())
        .find(|t| t.spec.name == name)
        .unwrap()
}

/// Splits a shard file into (header JSON value, data bytes).
pub fn split_shard(path: &Path) -> (Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

/// Writes `[len][header text][data]`.
pub fn join_shard(path: &Path, header: &str, data: &[u8]) {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// Edits shard 1's header as JSON (data bytes kept as they are).
pub fn edit_header(dir: &Path, file: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join(file);
    let (mut h, data) = split_shard(&path);
    edit(h.as_object_mut().unwrap());
    let mut text = h.to_string();
    while (8 + text.len()) % 8 != 0 {
        text.push(' ');
    }
    join_shard(&path, &text, &data);
}

/// Edits `config.json` as JSON.
/// Rewrites the JSON file `p` through `f`.
pub fn edit_json(p: &Path, f: impl Fn(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(p, v.to_string()).unwrap();
}

pub fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// How a case invokes k3; `{dir}` in an argument is replaced by the scratch model directory.
pub type Damage = Box<dyn Fn(&Path)>;

pub struct Case {
    pub name: String,
    /// What the input is, for the catalogue.
    pub input: String,
    pub damage: Damage,
    pub args: Vec<String>,
    pub code: i32,
    pub needles: Vec<String>,
}

/// `k3 run {dir} --ids PROMPT -n 1`.
pub fn run_args() -> Vec<String> {
    args(&["run", "{dir}", "--ids", PROMPT, "-n", "1"])
}

pub fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

pub fn case(
    name: &str,
    input: &str,
    damage: impl Fn(&Path) + 'static,
    args: Vec<String>,
    code: i32,
    needles: &[&str],
) -> Case {
    Case {
        name: name.to_string(),
        input: input.to_string(),
        damage: Box::new(damage),
        args,
        code,
        needles: needles.iter().map(|s| s.to_string()).collect(),
    }
}

/// Checks stderr for signs of a panic; returns a description of what is wrong, if anything.
pub fn panic_signs(o: &Output) -> Option<String> {
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.code() == Some(101) || err.contains("panicked") || err.contains("RUST_BACKTRACE") {
        return Some(format!("PANIC (code {:?}): {err}", o.status.code()));
    }
    if o.status.code().is_none() {
        return Some(format!("killed by a signal: {err}"));
    }
    None
}

/// The line of stderr that best shows the message (first line mentioning `k3: error` or the
/// first needle), shortened, for the catalogue.
fn excerpt(err: &str, needles: &[String], dir: &Path) -> String {
    let line = err
        .lines()
        .find(|l| needles.first().is_some_and(|n| l.contains(n.as_str())))
        .or_else(|| err.lines().find(|l| l.contains("error")))
        .or_else(|| err.lines().next())
        .unwrap_or("");
    let tmp = std::env::temp_dir().display().to_string();
    let line = line
        .replace(&dir.display().to_string(), "MODEL")
        .replace(&tmp, "$TMP")
        .replace(&format!("k3-hostile-{}-", std::process::id()), "");
    let mut s: String = line.chars().take(150).collect();
    if line.chars().count() > 150 {
        s.push('…');
    }
    s.replace('|', "\\|")
}

/// Runs every case (each on its own scratch copy), collecting all failures before asserting;
/// writes the catalogue rows when `K3_HOSTILE_CATALOGUE` is set.
pub fn check_all(group: &str, cases: Vec<Case>) {
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    for c in &cases {
        let dir = Scratch::tiny(&format!("{group}-{}", c.name));
        (c.damage)(dir.path());
        let argv: Vec<String> = c
            .args
            .iter()
            .map(|a| a.replace("{dir}", &dir.s()))
            .collect();
        let o = k3(&argv);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let both = format!("{err}{out}");
        let mut why = Vec::new();
        if let Some(p) = panic_signs(&o) {
            why.push(p);
        }
        if o.status.code() != Some(c.code) {
            why.push(format!(
                "exit code {:?}, expected {}",
                o.status.code(),
                c.code
            ));
        }
        for n in &c.needles {
            let n = n.replace("{dir}", &dir.s());
            if !both.contains(&n) {
                why.push(format!("output lacks {n:?}"));
            }
        }
        if !why.is_empty() {
            failures.push(format!(
                "[{group}/{}] {}\n  stderr: {}\n  stdout: {}",
                c.name,
                why.join("; "),
                err.trim(),
                out.trim()
            ));
        }
        let shown = if c.code == 0 {
            excerpt(&both, &c.needles, dir.path())
        } else {
            excerpt(&err, &c.needles, dir.path())
        };
        rows.push(format!(
            "| {group} | {} | {} | {} | `{}` |",
            c.name,
            c.input.replace('|', "\\|"),
            c.code,
            shown
        ));
    }
    if let Ok(d) = std::env::var("K3_HOSTILE_CATALOGUE") {
        let _ = std::fs::create_dir_all(&d);
        let _ = std::fs::write(
            Path::new(&d).join(format!("{group}.md")),
            rows.join("\n") + "\n",
        );
    }
    eprintln!("{group}: {} cases, {} failed", cases.len(), failures.len());
    assert!(
        failures.is_empty(),
        "{} of {} {group} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// `k3 pack {extra..} {dir} {dir}/{out}` (which must succeed), then `edit` on the output
/// directory: the setup of the pack and draft-trunk cases.
pub fn pack_then(
    extra: &'static [&'static str],
    out: &'static str,
    edit: impl Fn(&Path) + 'static,
) -> impl Fn(&Path) + 'static {
    move |d: &Path| {
        let dst = d.join(out);
        let (src, dst_s) = (d.display().to_string(), dst.display().to_string());
        let mut a = vec!["pack"];
        a.extend_from_slice(extra);
        a.extend([src.as_str(), dst_s.as_str()]);
        let o = k3(&args(&a));
        assert!(
            o.status.success(),
            "k3 pack: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        edit(&dst);
    }
}

/// Cuts the file at `p` to `len` bytes.
pub fn truncate_to(p: &Path, len: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.set_len(len).unwrap();
}
