//! Compressed packed trunk (docs/FORMATS.md#compressed-trunk): round trip against the plain
//! pack on trained-like synthetic weights, and every kind of damage refused naming the layer
//! and chunk before any of it is decoded into weights.

use k3_format::bind::{bind_model, ModelBinding};
use k3_format::pack::{
    write_compressed_pack_with, CompressOptions, PackOptions, TensorStore, TRUNK_BIN, TRUNK_JSON,
};
use k3_format::synth::{mid_config, write_checkpoint, MatrixDist, SynthSpec};
use k3_format::{write_trunk_pack, Checkpoint, K3Config, PackError, TrunkPack};
use std::path::Path;

/// A 3-layer model with trained-like weights (hidden 256), written into `dir`.
fn model(dir: &Path) -> (K3Config, Checkpoint, ModelBinding) {
    let mut cfg = mid_config(3, 4, 256);
    cfg.hidden_size = 256;
    let mut spec = SynthSpec::new(cfg.clone());
    spec.weights.matrices = MatrixDist::Trained;
    write_checkpoint(dir, &spec, |_| {}).unwrap();
    let cfg = K3Config::load(dir.join("config.json")).unwrap();
    let ck = Checkpoint::open(dir).unwrap();
    let b = bind_model(&ck, &cfg).unwrap();
    (cfg, ck, b)
}

/// Chunks of 50,000 values: several per matrix, the last one partial.
const SMALL_CHUNKS: u64 = 50_000;

fn compressed(dir: &Path, out: &Path) -> TrunkPack {
    let (cfg, ck, b) = model(dir);
    let opts = PackOptions::default();
    let c = CompressOptions {
        chunk_values: SMALL_CHUNKS,
        ..CompressOptions::default()
    };
    write_compressed_pack_with(&ck, &b, &cfg, out, &opts, &c, &mut |_, _| {}).unwrap()
}

fn read_stored(p: &TrunkPack, l: usize) -> Vec<u8> {
    let (off, n) = p.layer(l);
    std::fs::read(p.path()).unwrap()[off as usize..(off + n) as usize].to_vec()
}

#[test]
fn compressed_pack_decodes_to_the_plain_packs_bytes() {
    let (m, out, plain) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let c = compressed(m.path(), out.path());
    let (cfg, ck, b) = model(m.path());
    let p = write_trunk_pack(
        &ck,
        &b,
        &cfg,
        plain.path(),
        &PackOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    assert!(c.is_compressed() && !p.is_compressed());
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.json_path()).unwrap()).unwrap();
    assert_eq!(
        (json["version"].as_u64(), json["codec"].as_str()),
        (Some(2), Some("bf16-exponent-huffman4"))
    );
    c.check_against(&b, &cfg).unwrap();
    c.verify_checksums(&mut |_, _| {}).unwrap();
    let mut coded_chunks = 0;
    for l in 0..c.num_layers() {
        let (pl, cl) = (p.layer_entry(l).unwrap(), c.layer_entry(l).unwrap());
        assert_eq!(
            (cl.checksum, cl.nbytes),
            (pl.checksum, pl.nbytes),
            "layer {l}"
        );
        assert_eq!(c.layer(l).0 % 4096, 0);
        let mut out = vec![0u8; c.decoded_bytes(l) as usize];
        c.decode_layer(l, &read_stored(&c, l), &mut out).unwrap();
        let run = b.layers[l].trunk_run().unwrap();
        assert!(
            out == ck.shards()[run.shard].bytes()[run.start as usize..run.end as usize],
            "layer {l}"
        );
        for t in &cl.tensors {
            if let Some(TensorStore::Coded(ct)) = &t.stored {
                assert_eq!(
                    ct.chunks.len() as u64,
                    (t.nbytes / 2).div_ceil(SMALL_CHUNKS)
                );
                coded_chunks += ct.chunks.len();
            }
        }
    }
    assert!(coded_chunks > 20, "{coded_chunks} coded chunks");
    let ratio = c.stored_total_bytes() as f64 / c.total_bytes() as f64;
    assert!(ratio < 0.72, "stored/decoded = {ratio}");
}

/// A compressed pack's first coded chunk: (layer, tensor name, chunk offset in trunk.bin, len).
fn first_chunk(p: &TrunkPack) -> (usize, String, u64, u64) {
    for l in 0..p.num_layers() {
        let e = p.layer_entry(l).unwrap();
        for t in &e.tensors {
            if let Some(TensorStore::Coded(c)) = &t.stored {
                return (
                    l,
                    t.name.clone(),
                    e.file_off + c.chunks[1].off,
                    c.chunks[1].len,
                );
            }
        }
    }
    panic!("no coded tensor");
}

#[test]
fn a_flipped_bit_is_refused_naming_layer_tensor_and_chunk() {
    let (m, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let c = compressed(m.path(), out.path());
    let (l, name, off, len) = first_chunk(&c);
    let mut bin = std::fs::read(c.path()).unwrap();
    bin[off as usize + 40] ^= 0x10;
    std::fs::write(c.path(), &bin).unwrap();
    let e = c.verify_checksums(&mut |_, _| {}).unwrap_err();
    let PackError::Chunk { detail, .. } = &e else {
        panic!("{e}")
    };
    assert!(
        detail.starts_with("stored bytes hash to xxh3-64:"),
        "{detail}"
    );
    let prefix = format!(
        "{}: layer {l}, tensor {name:?}, chunk 1 (bytes [{off}, {}) of trunk.bin): stored bytes hash to",
        c.path().display(),
        off + len
    );
    assert!(e.to_string().starts_with(&prefix), "{e}");
    // The streaming path refuses it the same way, before decoding.
    let mut dec = vec![0u8; c.decoded_bytes(l) as usize];
    let e2 = c
        .decode_layer(l, &read_stored(&c, l), &mut dec)
        .unwrap_err();
    assert_eq!(e2.to_string(), e.to_string());
}

/// Rewrites `trunk.json` through `edit`, then reopens the pack.
fn reopen_edited(
    dir: &Path,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Result<TrunkPack, PackError> {
    let path = dir.join(TRUNK_JSON);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    TrunkPack::open(dir)
}

/// The name of layer 0's first coded tensor.
fn coded_name(p: &TrunkPack) -> String {
    let e = p.layer_entry(0).unwrap();
    e.tensors
        .iter()
        .find(|t| matches!(t.stored, Some(TensorStore::Coded(_))))
        .unwrap()
        .name
        .clone()
}

#[test]
fn offsets_and_tables_outside_their_file_are_refused_at_open() {
    let (m, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let c = compressed(m.path(), out.path());
    let name = coded_name(&c);
    let stored = c.layer(0).1;
    let json = c.json_path().display().to_string();
    let e = reopen_edited(out.path(), |v| {
        v["layers"][0]["tensors"][&name]["stored"]["chunks"][0][0] = (stored - 10).into();
    })
    .unwrap_err();
    let len = c
        .layer_entry(0)
        .unwrap()
        .tensor(&name)
        .map(|t| match &t.stored {
            Some(TensorStore::Coded(ct)) => ct.chunks[0].len,
            _ => 0,
        });
    assert_eq!(
        e.to_string(),
        format!(
            "{json}: layer 0: tensor {name:?}: chunk 0 at [{}, +{}) lies outside the {stored}-byte stored run; re-run `k3 pack MODEL_DIR PACK_DIR --overwrite` (with `--draft-quant q8|mxfp4` for a draft trunk)",
            stored - 10,
            len.unwrap()
        )
    );
    let c = compressed(m.path(), out.path().join("b").as_path());
    let dir = out.path().join("b");
    let mut over = "1".repeat(256);
    over.replace_range(0..3, "111");
    let e = reopen_edited(&dir, |v| {
        v["layers"][0]["tensors"][&name]["stored"]["lengths"] = over.clone().into();
    })
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: layer 0: tensor {name:?}: bad code table: code lengths over-subscribe the code space (Kraft sum 262144/2048); re-run `k3 pack MODEL_DIR PACK_DIR --overwrite` (with `--draft-quant q8|mxfp4` for a draft trunk)",
            c.json_path().display()
        )
    );
}

#[test]
fn a_truncated_chunk_or_file_is_refused() {
    let (m, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let c = compressed(m.path(), out.path());
    let name = coded_name(&c);
    // The index says the chunk is a byte shorter: its bytes no longer hash to the record.
    let p = reopen_edited(out.path(), |v| {
        let ch = &mut v["layers"][0]["tensors"][&name]["stored"]["chunks"][0];
        ch[1] = (ch[1].as_u64().unwrap() - 1).into();
    })
    .unwrap();
    let e = p.verify_checksums(&mut |_, _| {}).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("layer 0, tensor {name:?}, chunk 0 (bytes [")),
        "{e}"
    );
    // trunk.bin cut short inside the last layer's stored run.
    let bin = out.path().join(TRUNK_BIN);
    let (off, n) = c.layer(c.num_layers() - 1);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&bin)
        .unwrap()
        .set_len(off + n - 1)
        .unwrap();
    let e = TrunkPack::open(out.path()).unwrap_err();
    assert!(
        matches!(
            e,
            PackError::Truncated {
                layer: 2,
                missing: 1,
                ..
            }
        ),
        "{e}"
    );
}
