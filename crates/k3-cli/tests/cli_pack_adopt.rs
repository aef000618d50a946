//! `k3 pack MODEL --adopt DIR` (docs/FORMATS.md#adopting-an-upstream-pack): a trunk in
//! upstream's layout (k3's pack with the `checksum` fields stripped) is refused by `run --trunk`
//! with a pointer to `--adopt`, adopted after every layer is compared with the checkpoint, and
//! then runs; a pack with one corrupted layer is refused naming that layer, and nothing changes.

mod common;

use common::{k3, tiny_arg};
use std::path::{Path, PathBuf};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("k3-adopt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// k3's pack of the tiny model in `dir`, rewritten as upstream's packer writes it (no checksums);
/// returns k3's own trunk.json text.
fn upstream_pack(dir: &Path) -> String {
    let out = k3(&["pack", &tiny_arg(), &dir.to_string_lossy()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = dir.join("trunk.json");
    let k3_text = std::fs::read_to_string(&json).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&k3_text).unwrap();
    for l in doc["layers"].as_array_mut().unwrap() {
        l.as_object_mut().unwrap().remove("checksum").unwrap();
    }
    std::fs::write(&json, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    k3_text
}

fn run_with_trunk(dir: &Path) -> std::process::Output {
    k3(&[
        "run",
        &tiny_arg(),
        "--ids",
        "1,2,3",
        "-n",
        "2",
        "--mem-gb",
        "0.005",
        "--trunk",
        &dir.to_string_lossy(),
        "--print-ids",
    ])
}

#[test]
fn an_upstream_pack_is_adopted_after_checking_every_layer() {
    let dir = scratch("ok");
    let k3_json = upstream_pack(&dir);
    let json = dir.join("trunk.json");
    let upstream_json = std::fs::read_to_string(&json).unwrap();

    let refused = run_with_trunk(&dir);
    assert_eq!(refused.status.code(), Some(2));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("no \"checksum\"") && err.contains("--adopt"),
        "{err}"
    );

    let bin_before = std::fs::metadata(dir.join("trunk.bin"))
        .unwrap()
        .modified()
        .unwrap();
    let out = k3(&["pack", &tiny_arg(), "--adopt", &dir.to_string_lossy()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("adopted") && err.contains("13 layers"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    // k3's index is back, checksums and all; upstream's is kept; the data was not rewritten.
    assert_eq!(std::fs::read_to_string(&json).unwrap(), k3_json);
    let kept = std::fs::read_to_string(dir.join("trunk.json.upstream")).unwrap();
    assert_eq!(kept, upstream_json);
    let bin_after = std::fs::metadata(dir.join("trunk.bin"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(bin_before, bin_after);

    let ran = run_with_trunk(&dir);
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupted_layer_is_refused_by_name() {
    let dir = scratch("bad");
    upstream_pack(&dir);
    let json = dir.join("trunk.json");
    let before = std::fs::read_to_string(&json).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&before).unwrap();
    let layer5 = &doc["layers"][5];
    let at = layer5["file_off"].as_u64().unwrap() + layer5["nbytes"].as_u64().unwrap() / 2;
    let bin = dir.join("trunk.bin");
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes[at as usize] ^= 0x40;
    std::fs::write(&bin, bytes).unwrap();

    let out = k3(&["pack", &tiny_arg(), "--adopt", &dir.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("layer 5 differs from the checkpoint"), "{err}");
    assert!(
        err.contains("tensor \"language_model.model.layers.5."),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&json).unwrap(), before);
    assert!(!dir.join("trunk.json.upstream").exists());
    assert!(!dir.join("trunk.json.tmp").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn adopt_takes_no_out_dir() {
    let out = k3(&["pack", &tiny_arg(), "/tmp/x", "--adopt", "/tmp/y"]);
    assert_eq!(out.status.code(), Some(2));
    let out = k3(&["pack", &tiny_arg()]);
    assert_eq!(out.status.code(), Some(2));
}
