//! Helpers shared by the CLI integration tests: the tiny model and doctored copies of it.
#![allow(dead_code)]

use k3_format::writer::{copy_rewritten, TensorSpec};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs the `k3` binary under test with `args`.
pub fn k3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(args)
        .output()
        .expect("k3 runs")
}

/// The committed tiny model.
/// `k3 run` on the tiny model with the ids every drafting test starts from, `-n n` and
/// `--json json` plus `flags`; must succeed. The process and its JSON report.
pub fn run_tiny_json(n: usize, flags: &[&str], json: &Path) -> (Output, serde_json::Value) {
    let (model, n) = (tiny(), n.to_string());
    let mut a = vec![
        "run",
        model.to_str().unwrap(),
        "--ids",
        "637,229,263,638,730,42,197",
        "-n",
        &n,
        "--json",
        json.to_str().unwrap(),
    ];
    a.extend_from_slice(flags);
    let o = k3(&a);
    assert!(o.status.success(), "{flags:?}: {}", stderr(&o));
    let r = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    (o, r)
}

pub fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3")
}

/// The tiny model's directory as a command-line argument.
pub fn tiny_arg() -> String {
    tiny().to_string_lossy().into_owned()
}

/// Copies every file of the tiny model into `dst`.
pub fn copy_tiny(dst: &Path) {
    for entry in std::fs::read_dir(tiny()).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
}

/// A copy of the tiny model with shards rewritten (tensors in offset order); `edit` may change any tensor's spec.
pub fn doctored_copy(dst: &Path, edit: impl Fn(&mut TensorSpec)) {
    copy_rewritten(&tiny(), dst, |docs| {
        docs.iter_mut()
            .flat_map(|d| d.tensors.iter_mut())
            .for_each(|t| edit(&mut t.spec))
    })
    .unwrap();
}

/// A process's stderr, lossily decoded.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A process's stdout, lossily decoded.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A scratch directory under the temp dir, removed with its contents when dropped (so keep
/// it alive while the test uses the paths inside it).
pub struct Scratch(tempfile::TempDir);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

/// An empty scratch directory `k3-cli-{group}-{name}-XXXXXX` under the temp dir.
pub fn scratch_dir(group: &str, name: &str) -> Scratch {
    let dir = tempfile::Builder::new()
        .prefix(&format!("k3-cli-{group}-{name}-"))
        .tempdir()
        .expect("a scratch directory under the temp dir");
    Scratch(dir)
}

/// `XDG_RUNTIME_DIR` for a `k3 serve` a test kills: its `k3 ps` record (left behind by a kill)
/// lands under Cargo's `target/tmp`, not in the user's runtime directory or the temp dir.
pub fn test_runtime_dir() -> &'static str {
    concat!(env!("CARGO_TARGET_TMPDIR"), "/xdg-runtime")
}
