//! Helpers shared by the CLI integration tests: the tiny model and doctored copies of it.
#![allow(dead_code)]

use k3_format::writer::{write_index, write_shard, TensorSpec};
use k3_format::Checkpoint;
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
    copy_tiny(dst);
    let ck = Checkpoint::open(tiny()).unwrap();
    let mut index = Vec::new();
    for (si, shard) in ck.shards().iter().enumerate() {
        let file = shard
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let mut views: Vec<_> = ck.iter().filter(|v| v.shard == si).collect();
        views.sort_by_key(|v| v.offset);
        let specs: Vec<TensorSpec> = views
            .iter()
            .map(|v| {
                let mut s = TensorSpec::new(v.name, v.dtype, v.shape);
                edit(&mut s);
                s
            })
            .collect();
        write_shard(&dst.join(&file), &specs, |i, _, buf| {
            buf.copy_from_slice(views[i].bytes)
        })
        .unwrap();
        index.extend(specs.iter().map(|s| (s.name.clone(), file.clone())));
    }
    write_index(
        &dst.join("model.safetensors.index.json"),
        index.iter().map(|(t, s)| (t.as_str(), s.as_str())),
    )
    .unwrap();
}
