//! Every integrity failure of a shard or index is its own error, naming the file and numbers.

mod common;

use common::*;
use k3_format::{Checkpoint, FormatError};
use std::path::Path;

fn open_one(bytes: &[u8]) -> (tempfile::TempDir, String, FormatError) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "model-00001-of-00001.safetensors", bytes);
    let e = Checkpoint::open(dir.path()).unwrap_err();
    (dir, p.display().to_string(), e)
}

fn assert_names(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{p:?} not in {msg:?}");
    }
}

fn two_tensors() -> Vec<T> {
    vec![
        t("a.weight", "BF16", &[4, 8], 2),
        t("b.weight", "F32", &[10], 4),
    ]
}

#[test]
fn truncated_file_is_refused() {
    let full = shard_bytes(&two_tensors());
    let cut = &full[..full.len() - 7];
    let (_d, shard, e) = open_one(cut);
    assert!(
        matches!(e, FormatError::Truncated { missing: 7, .. }),
        "{e:?}"
    );
    let msg = e.to_string();
    let (want, have) = (full.len().to_string(), cut.len().to_string());
    assert_names(
        &msg,
        &[
            &shard,
            "truncated, re-download",
            &want,
            &have,
            "7 bytes missing",
            "b.weight",
        ],
    );
}

#[test]
fn header_length_beyond_file() {
    let mut bytes = shard_bytes(&two_tensors());
    let len = bytes.len() as u64;
    bytes[..8].copy_from_slice(&len.to_le_bytes());
    let (_d, shard, e) = open_one(&bytes);
    assert!(matches!(e, FormatError::HeaderBeyondFile { .. }), "{e:?}");
    assert_names(
        &e.to_string(),
        &[
            &shard,
            &format!("header length {len}"),
            &format!("{len}-byte file"),
        ],
    );

    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let (_d, shard, e) = open_one(&bytes);
    assert!(matches!(
        e,
        FormatError::HeaderBeyondFile {
            header_len: u64::MAX,
            ..
        }
    ));
    assert_names(&e.to_string(), &[&shard, "18446744073709551615"]);
}

#[test]
fn file_shorter_than_prefix() {
    let (_d, shard, e) = open_one(&[1, 2, 3]);
    assert!(matches!(e, FormatError::ShortFile { len: 3, .. }));
    assert_names(
        &e.to_string(),
        &[&shard, "is 3 bytes", "8-byte header length"],
    );
    let (_d, _, e) = open_one(&[]);
    assert!(matches!(e, FormatError::ShortFile { len: 0, .. }));
}

#[test]
fn malformed_and_non_utf8_headers() {
    let (_d, shard, e) = open_one(&raw_shard("{\"a\": {\"dtype\": \"F32\",", &[]));
    assert!(
        matches!(e, FormatError::MalformedHeader { header_len: 22, .. }),
        "{e:?}"
    );
    assert_names(
        &e.to_string(),
        &[&shard, "malformed JSON header (22 bytes)", "line 1"],
    );

    let (_d, shard, e) = open_one(&raw_shard(r#"{"a":{"dtype":"F32","shape":[1]}}"#, &[0; 4]));
    assert!(matches!(e, FormatError::TensorEntry { .. }), "{e:?}");
    assert_names(
        &e.to_string(),
        &[&shard, "tensor \"a\": missing field `data_offsets`"],
    );

    let mut header = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#.to_vec();
    header[2] = 0xFF;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(&[0; 4]);
    let (_d, shard, e) = open_one(&bytes);
    assert!(
        matches!(
            e,
            FormatError::NonUtf8Header {
                offset: 2,
                file_offset: 10,
                ..
            }
        ),
        "{e:?}"
    );
    assert_names(
        &e.to_string(),
        &[&shard, "not UTF-8", "header offset 2", "file offset 10"],
    );
}

#[test]
fn reversed_offsets() {
    let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}"#;
    let (_d, shard, e) = open_one(&raw_shard(h, &[0; 8]));
    assert!(matches!(
        e,
        FormatError::OffsetsReversed {
            start: 8,
            end: 4,
            ..
        }
    ));
    assert_names(&e.to_string(), &[&shard, "\"a\"", "[8, 4]", "start > end"]);
}

#[test]
fn overlapping_offsets() {
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
               "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let (_d, shard, e) = open_one(&raw_shard(h, &[0; 12]));
    assert!(
        matches!(e, FormatError::OffsetsOverlap { overlap: 4, .. }),
        "{e:?}"
    );
    assert_names(
        &e.to_string(),
        &[
            &shard,
            "\"a\" [0, 8]",
            "\"b\" [4, 12]",
            "overlap by 4 bytes",
        ],
    );
}

#[test]
fn out_of_range_offsets_with_holes() {
    let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
               "b":{"dtype":"F32","shape":[1],"data_offsets":[100,104]}}"#;
    let (_d, shard, e) = open_one(&raw_shard(h, &[0; 8]));
    assert!(
        matches!(
            e,
            FormatError::OffsetsOutOfRange {
                end: 104,
                data_len: 8,
                ..
            }
        ),
        "{e:?}"
    );
    assert_names(
        &e.to_string(),
        &[&shard, "\"b\"", "end 104", "8-byte data section"],
    );
}

#[test]
fn size_mismatch_and_overflow() {
    let h = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    let (_d, shard, e) = open_one(&raw_shard(h, &[0; 8]));
    assert!(
        matches!(
            e,
            FormatError::SizeMismatch {
                expected: 12,
                span: 8,
                ..
            }
        ),
        "{e:?}"
    );
    assert_names(
        &e.to_string(),
        &[
            &shard,
            "F32 shape [3] needs 12 bytes",
            "[0, 8] span 8 bytes",
        ],
    );

    let h = r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#;
    let (_d, shard, e) = open_one(&raw_shard(h, &[0; 8]));
    assert!(
        matches!(e, FormatError::ShapeOverflow { elem: 4, .. }),
        "{e:?}"
    );
    assert_names(
        &e.to_string(),
        &[&shard, "[4294967296, 4294967296]", "overflows 64 bits"],
    );
}

#[test]
fn unknown_dtype() {
    let h = r#"{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}"#;
    let (_d, shard, e) = open_one(&raw_shard(h, &[0; 1]));
    assert!(matches!(e, FormatError::UnknownDtype { .. }));
    assert_names(&e.to_string(), &[&shard, "\"a\"", "unknown dtype \"F4\""]);
}

#[test]
fn duplicate_names_across_and_within_shards() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(
        dir.path(),
        "a.safetensors",
        &shard_bytes(&[t("x", "U8", &[3], 1)]),
    );
    let b = write(
        dir.path(),
        "b.safetensors",
        &shard_bytes(&[t("y", "U8", &[1], 1), t("x", "U8", &[2], 1)]),
    );
    let e = Checkpoint::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::DuplicateTensor { .. }));
    assert_names(
        &e.to_string(),
        &["\"x\"", &a.display().to_string(), &b.display().to_string()],
    );

    let h = r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    let (_d, shard, e) = open_one(&raw_shard(h, &[0; 2]));
    assert!(matches!(e, FormatError::DuplicateTensor { .. }));
    assert_names(&e.to_string(), &["\"x\"", &shard]);
}

fn indexed_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "m-1.safetensors",
        &shard_bytes(&[t("a", "U8", &[2], 1), t("b", "U8", &[2], 1)]),
    );
    write(
        dir.path(),
        "m-2.safetensors",
        &shard_bytes(&[t("c", "U8", &[2], 1)]),
    );
    dir
}

fn path_str(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

#[test]
fn index_tensor_missing_from_its_shard() {
    let dir = indexed_dir();
    let idx = write_index(
        dir.path(),
        &[("a", "m-1.safetensors"), ("zz", "m-2.safetensors")],
    );
    let e = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(e, FormatError::TensorMissingFromShard { .. }),
        "{e:?}"
    );
    let m1 = path_str(dir.path(), "m-1.safetensors");
    assert_names(
        &e.to_string(),
        &[
            &idx.display().to_string(),
            "\"zz\"",
            &path_str(dir.path(), "m-2.safetensors"),
        ],
    );
    write_index(
        dir.path(),
        &[("c", "m-1.safetensors"), ("a", "m-2.safetensors")],
    );
    let msg = Checkpoint::open(dir.path()).unwrap_err().to_string();
    assert_names(&msg, &["\"c\"", &format!("under {m1}"), "(it is in "]);
}

#[test]
fn index_shard_missing_on_disk() {
    let dir = indexed_dir();
    let idx = write_index(
        dir.path(),
        &[
            ("a", "m-1.safetensors"),
            ("c", "m-2.safetensors"),
            ("d", "m-3.safetensors"),
        ],
    );
    let e = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(e, FormatError::ShardMissing { count: 1, .. }),
        "{e:?}"
    );
    assert_names(
        &e.to_string(),
        &[
            &idx.display().to_string(),
            "1 shard file(s)",
            &path_str(dir.path(), "m-3.safetensors"),
        ],
    );
}

#[test]
fn index_refuses_escaping_paths_and_malformed_json() {
    let dir = indexed_dir();
    write_index(dir.path(), &[("a", "../m-1.safetensors")]);
    let e = Checkpoint::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::IndexBadShardPath { .. }), "{e:?}");
    write(
        dir.path(),
        "model.safetensors.index.json",
        b"{\"weight_map\": [1]}",
    );
    let e = Checkpoint::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::IndexMalformed { .. }), "{e:?}");
    write(
        dir.path(),
        "model.safetensors.index.json",
        b"{\"metadata\": {}}",
    );
    let msg = Checkpoint::open(dir.path()).unwrap_err().to_string();
    assert_names(
        &msg,
        &["model.safetensors.index.json", "no \"weight_map\" object"],
    );
}

#[test]
fn empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let e = Checkpoint::open(dir.path()).unwrap_err();
    assert!(matches!(e, FormatError::NoShards { .. }));
    let e = Checkpoint::open(dir.path().join("nope")).unwrap_err();
    assert!(matches!(e, FormatError::Io { .. }));
}
