//! Indexing, lookup and typed views on small synthetic checkpoints.

mod common;

use common::*;
use half::{bf16, f16};
use k3_format::{Checkpoint, Dtype, FormatError, ShardHeader};
use std::path::Path;

fn values() -> Vec<f32> {
    vec![1.0, -2.5, 3.25, f32::INFINITY, -0.0, 1e-40]
}

fn bf16_tensor(name: &str, v: &[f32]) -> T {
    T {
        name: name.into(),
        dtype: "BF16",
        shape: vec![v.len() as u64],
        data: v
            .iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
    }
}

fn f16_tensor(name: &str, v: &[f32]) -> T {
    T {
        name: name.into(),
        dtype: "F16",
        shape: vec![v.len() as u64],
        data: v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
    }
}

/// Pads the header so the data section starts at `8 + header_len ≡ rem (mod 4)`.
fn shard_with_data_alignment(tensors: &[T], rem: usize) -> Vec<u8> {
    let base = shard_bytes(tensors);
    let header_len = u64::from_le_bytes(base[..8].try_into().unwrap()) as usize;
    let pad = (rem + 4 - (8 + header_len) % 4) % 4;
    shard_bytes_padded(tensors, pad)
}

fn two_shards(dir: &Path) {
    let s1 = vec![
        f32s("w.f32", &[2, 3], &values()),
        bf16_tensor("w.bf16", &values()),
        f16_tensor("w.f16.odd", &[0.5, -1.0, 65504.0]),
        T {
            name: "w.u8".into(),
            dtype: "U8",
            shape: vec![2, 2],
            data: vec![0, 7, 128, 255],
        },
        f32s("scalar", &[], &[3.5]),
        f32s("empty", &[0, 8], &[]),
    ];
    write(
        dir,
        "model-00001-of-00002.safetensors",
        &shard_with_data_alignment(&s1, 0),
    );
    let s2 = vec![
        f32s("second", &[3], &[1.0, 2.0, 3.0]),
        f32s("we\\ird \"name\"", &[1], &[9.0]),
    ];
    write(
        dir,
        "model-00002-of-00002.safetensors",
        &shard_with_data_alignment(&s2, 2),
    );
}

#[test]
fn lookup_and_views() {
    let dir = tempfile::tempdir().unwrap();
    two_shards(dir.path());
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.len(), 8);
    assert_eq!(ck.shards().len(), 2);
    assert!(!ck.contains("__metadata__"));

    let w = ck.tensor("w.f32").unwrap();
    assert_eq!(
        (w.dtype, w.shape, w.shard, w.numel()),
        (Dtype::F32, &[2usize, 3][..], 0, 6)
    );
    assert_eq!(w.offset % 4, 0);
    assert_eq!(w.as_f32().unwrap(), &values()[..]);
    assert_eq!(w.offset, ck.shards()[0].data_start());
    assert_eq!(
        &ck.shards()[0].bytes()[w.offset as usize..][..4],
        &1.0f32.to_le_bytes()
    );

    let b = ck.tensor("w.bf16").unwrap();
    let widened: Vec<f32> = values()
        .iter()
        .map(|&x| bf16::from_f32(x).to_f32())
        .collect();
    assert_eq!(b.to_f32_vec().unwrap(), widened);
    assert_eq!(b.as_bf16().unwrap().len(), 6);
    assert!(matches!(
        b.as_f32(),
        Err(FormatError::WrongDtype {
            found: Dtype::BF16,
            ..
        })
    ));

    let h = ck.tensor("w.f16.odd").unwrap();
    assert_eq!(h.to_f32_vec().unwrap(), vec![0.5, -1.0, 65504.0]);
    assert_eq!(h.nbytes(), 6);
    let u = ck.tensor("w.u8").unwrap();
    assert_eq!(u.as_u8().unwrap(), &[0, 7, 128, 255]);
    assert_eq!(u.to_f32_vec().unwrap(), vec![0.0, 7.0, 128.0, 255.0]);

    let s = ck.tensor("scalar").unwrap();
    assert_eq!(
        (s.rank(), s.numel(), s.to_f32_vec().unwrap()),
        (0, 1, vec![3.5])
    );
    let e = ck.tensor("empty").unwrap();
    assert_eq!((e.numel(), e.bytes.len()), (0, 0));
    assert_eq!(e.as_f32().unwrap(), &[] as &[f32]);
}

#[test]
fn unaligned_views_error_and_copies_work() {
    let dir = tempfile::tempdir().unwrap();
    two_shards(dir.path());
    let ck = Checkpoint::open(dir.path()).unwrap();
    let t = ck.tensor("second").unwrap();
    assert_eq!(t.shard, 1);
    assert_eq!(t.offset % 4, 2);
    let e = t.as_f32().unwrap_err();
    assert!(
        matches!(e, FormatError::Unaligned { align: 4, .. }),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("model-00002-of-00002.safetensors") && msg.contains(&t.offset.to_string())
    );
    assert_eq!(t.to_f32_vec().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(
        ck.tensor("we\\ird \"name\"").unwrap().to_f32_vec().unwrap(),
        vec![9.0]
    );
}

#[test]
fn not_found_and_iteration() {
    let dir = tempfile::tempdir().unwrap();
    two_shards(dir.path());
    let ck = Checkpoint::open(dir.path()).unwrap();
    let msg = ck.tensor("nope").unwrap_err().to_string();
    assert_eq!(
        msg,
        "tensor \"nope\" is not in the checkpoint (8 tensors in 2 shards)"
    );
    let mut names: Vec<&str> = ck.iter().map(|t| t.name).collect();
    names.sort();
    assert_eq!(names.len(), 8);
    assert!(names.contains(&"second"));
    assert!(ck.heap_bytes() > 0);
    assert_eq!(ck.dir(), dir.path());
}

#[test]
fn index_file_selects_and_checks_shards() {
    let dir = tempfile::tempdir().unwrap();
    two_shards(dir.path());
    // A stray shard not named by the index is ignored when the index exists.
    write(
        dir.path(),
        "stray.safetensors",
        &shard_bytes(&[f32s("second", &[1], &[0.0])]),
    );
    write_index(
        dir.path(),
        &[
            ("second", "model-00002-of-00002.safetensors"),
            ("w.f32", "model-00001-of-00002.safetensors"),
        ],
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ck.shards().len(), 2);
    assert!(ck.shards()[0]
        .path()
        .ends_with("model-00001-of-00002.safetensors"));
    assert_eq!(ck.tensor("second").unwrap().shard, 1);
    // Tensors present in a named shard but absent from weight_map are still indexed.
    assert!(ck.contains("scalar"));
}

#[test]
fn open_files_and_header_parse() {
    let dir = tempfile::tempdir().unwrap();
    two_shards(dir.path());
    let p = dir.path().join("model-00002-of-00002.safetensors");
    let ck = Checkpoint::open_files(std::slice::from_ref(&p)).unwrap();
    assert_eq!(ck.len(), 2);
    let bytes = std::fs::read(&p).unwrap();
    let h = ShardHeader::parse(&p, &bytes).unwrap();
    assert_eq!(h.len(), 2);
    assert_eq!(h.file_len(), bytes.len() as u64);
    let t = h.iter().find(|t| t.name == "second").unwrap();
    assert_eq!((t.start, t.end, t.offset), (0, 12, h.data_start()));
    assert_eq!(t.shape, &[3]);
}
