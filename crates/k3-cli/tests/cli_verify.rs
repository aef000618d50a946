//! `k3 verify` as a user runs it: the committed tiny model passes (and `--deep` reports its
//! NaN scale bytes); damaged copies fail with the culprit named and exit 1; manifests are
//! checked in both formats.

use k3_format::Dtype;
use sha2::{Digest, Sha256};
use std::process::Output;

mod common;
use common::{copy_tiny, doctored_copy, k3, tiny};

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn scratch(name: &str) -> common::Scratch {
    common::scratch_dir("verify", name)
}

const SHARD2: &str = "model-00002-of-00002.safetensors";

#[test]
fn tiny_model_passes_and_deep_reports_nan_scales() {
    let o = k3(&["verify", tiny().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let text = out(&o);
    assert!(!text.contains("FAIL"), "{text}");
    assert!(text.contains("PASS  tensors"), "{text}");
    assert!(
        text.contains("96 one contiguous read each, 0 scattered"),
        "{text}"
    );
    assert!(text.contains("summary: 7 passed, 0 failed"), "{text}");

    let o = k3(&["verify", tiny().to_str().unwrap(), "--deep"]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let text = out(&o);
    assert!(text.contains("3 of 18432 E8M0 scale bytes"), "{text}");
    for layer in [1, 5, 12] {
        assert!(
            text.contains(&format!("layer {layer}: 1 of 1536")),
            "{text}"
        );
    }
}

#[test]
fn truncated_shard_fails_naming_it() {
    let dir = scratch("truncated");
    copy_tiny(&dir);
    let p = dir.join(SHARD2);
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let o = k3(&["verify", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let text = out(&o);
    assert!(text.contains("FAIL  shard sizes"), "{text}");
    assert!(
        text.contains(SHARD2) && text.contains("truncated") && text.contains("100 bytes missing"),
        "{text}"
    );
}

#[test]
fn extra_bytes_fail_naming_the_shard() {
    let dir = scratch("extra");
    copy_tiny(&dir);
    let p = dir.join(SHARD2);
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len + 7)
        .unwrap();
    let o = k3(&["verify", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(
        out(&o).contains(&format!("{SHARD2}: 7 extra bytes")),
        "{}",
        out(&o)
    );
}

#[test]
fn missing_shard_fails_naming_it() {
    let dir = scratch("missing");
    copy_tiny(&dir);
    std::fs::remove_file(dir.join(SHARD2)).unwrap();
    let o = k3(&["verify", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let text = out(&o);
    assert!(
        text.contains("FAIL  shard set") && text.contains(&format!("{SHARD2}: missing")),
        "{text}"
    );
    // The checks go on with the shard that is there and report the tensors that are absent.
    assert!(text.contains("FAIL  tensors"), "{text}");
}

#[test]
fn wrong_dtypes_and_missing_tensors_are_all_reported() {
    let dir = scratch("dtype");
    let f16 = "language_model.model.layers.2.self_attn.f_a_proj.weight";
    let gone = "language_model.model.layers.7.mlp_res_norm.weight";
    let scale = "language_model.model.layers.4.block_sparse_moe.experts.3.w2.weight_scale";
    doctored_copy(&dir, |s| {
        if s.name == f16 {
            s.dtype = Dtype::F16; // same bytes, a dtype the binder refuses for a matrix
        } else if s.name == gone {
            s.name = format!("{gone}.renamed");
        } else if s.name == scale {
            s.dtype = Dtype::I8;
        }
    });
    let o = k3(&["verify", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let text = out(&o);
    assert!(
        text.contains("FAIL  tensors") && text.contains("3 problem(s) among the 916 tensors"),
        "{text}"
    );
    assert!(text.contains(f16) && text.contains("is F16"), "{text}");
    assert!(text.contains(gone) && text.contains("missing"), "{text}");
    assert!(text.contains(scale) && text.contains("is I8"), "{text}");
    assert!(text.contains("INFO  unused tensors  1 of 916"), "{text}");
}

#[test]
fn manifests_match_and_mismatch_naming_the_file() {
    let dir = scratch("manifest");
    let sha = |f: &str| -> String {
        let bytes = std::fs::read(tiny().join(f)).unwrap();
        Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let s1 = "model-00001-of-00002.safetensors";
    // sha256sum lines, as `sha256sum *.safetensors config.json` writes them.
    let good = format!(
        "{}  {s1}\n{} *{SHARD2}\n{}  config.json\n",
        sha(s1),
        sha(SHARD2),
        sha("config.json")
    );
    let m = dir.join("SHA256SUMS");
    std::fs::write(&m, &good).unwrap();
    let o = k3(&[
        "verify",
        tiny().to_str().unwrap(),
        "--manifest",
        m.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(
        out(&o).contains("PASS  checksums       3 files match the manifest"),
        "{}",
        out(&o)
    );

    let mut bad = sha(SHARD2);
    bad.replace_range(0..1, if bad.starts_with('0') { "1" } else { "0" });
    std::fs::write(&m, format!("{}  {s1}\n{bad}  {SHARD2}\n", sha(s1))).unwrap();
    let o = k3(&[
        "verify",
        tiny().to_str().unwrap(),
        "--manifest",
        m.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let text = out(&o);
    assert!(
        text.contains("FAIL  checksums") && text.contains(&format!("{SHARD2}: sha256 is")),
        "{text}"
    );
    assert!(!text.contains(&format!("{s1}: sha256 is")), "{text}");

    // XXH3 JSON manifest: written by --write-manifest, then checked.
    let j = dir.join("xxh3.json");
    let o = k3(&[
        "verify",
        tiny().to_str().unwrap(),
        "--write-manifest",
        j.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let o = k3(&[
        "verify",
        tiny().to_str().unwrap(),
        "--manifest",
        j.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(
        out(&o).contains("2 files match the manifest"),
        "{}",
        out(&o)
    );
    std::fs::write(&j, format!("{{\"{SHARD2}\": \"0123456789abcdef\"}}")).unwrap();
    let o = k3(&[
        "verify",
        tiny().to_str().unwrap(),
        "--manifest",
        j.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(
        out(&o).contains(&format!("{SHARD2}: xxh3 is")),
        "{}",
        out(&o)
    );
}

#[test]
fn usage_errors_exit_2() {
    let o = k3(&["verify", "/nonexistent/k3-model"]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    let dir = scratch("usage");
    let m = dir.join("bad.txt");
    std::fs::write(&m, "nothex  model.safetensors\n").unwrap();
    let o = k3(&[
        "verify",
        tiny().to_str().unwrap(),
        "--manifest",
        m.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    assert!(out(&o).contains("bad.txt: line 1"), "{}", out(&o));
}
