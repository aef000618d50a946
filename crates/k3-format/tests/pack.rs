//! Packed trunk (docs/FORMATS.md#packed-trunk): writing, reopening, matching and verifying, on the committed tiny
//! checkpoints and on synthetic ones written with `k3_format::writer`.

use k3_format::bind::{bind_model, model_tensors, ModelBinding};
use k3_format::pack::{PackOptions, TRUNK_BIN, TRUNK_JSON};
use k3_format::writer::{write_shard, TensorSpec};
use k3_format::{write_trunk_pack, Checkpoint, Dtype, K3Config, PackError, TrunkPack};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

/// Config, checkpoint and binding of a model directory.
fn load(dir: &Path) -> (K3Config, Checkpoint, ModelBinding) {
    let cfg = K3Config::load(dir.join("config.json")).unwrap();
    let ck = Checkpoint::open(dir).unwrap();
    let b = bind_model(&ck, &cfg).unwrap();
    (cfg, ck, b)
}

fn opts(overwrite: bool, chunk_bytes: usize) -> PackOptions {
    PackOptions {
        overwrite,
        chunk_bytes,
    }
}

/// Packs `model` into `out` with default options.
fn pack(model: &Path, out: &Path) -> Result<TrunkPack, PackError> {
    let (cfg, ck, b) = load(model);
    write_trunk_pack(&ck, &b, &cfg, out, &PackOptions::default(), &mut |_, _| {})
}

fn check_tiny(name: &str, chunk: usize) {
    let model = fixture(name);
    let (cfg, ck, b) = load(&model);
    let out = tempfile::tempdir().unwrap();
    let mut last = (0, 0);
    let mut calls = 0;
    let p = write_trunk_pack(
        &ck,
        &b,
        &cfg,
        out.path(),
        &opts(false, chunk),
        &mut |d, t| {
            assert!(d >= last.0 && d <= t);
            last = (d, t);
            calls += 1;
        },
    )
    .unwrap();
    assert_eq!(last.0, last.1, "progress ends at the total");
    assert_eq!(last.1, p.total_bytes());
    assert!(calls >= b.layers.len());
    assert_eq!(p.num_layers(), cfg.num_hidden_layers);
    assert!(p.direct_io_ok() && p.buffered_fallback_note().is_none());
    let bin = std::fs::read(p.path()).unwrap();
    assert_eq!(bin.len() % 4096, 0, "file end padded to 4096");
    for (l, lt) in b.layers.iter().enumerate() {
        let run = lt.trunk_run().unwrap();
        let (off, n) = p.layer(l);
        assert_eq!(off % 4096, 0, "layer {l} file_off {off}");
        assert_eq!(n, run.len());
        let src = &ck.shards()[run.shard].bytes()[run.start as usize..run.end as usize];
        let dst = &bin[off as usize..(off + n) as usize];
        assert!(src == dst, "layer {l}: bytes differ from the shard run");
        let e = p.layer_entry(l).unwrap();
        assert!(e.verify(dst));
        assert_eq!(e.source_offset, run.start);
        for t in lt.tensors() {
            let pt = e.tensor(&t.name).unwrap();
            assert_eq!(pt.off, t.offset - run.start);
            let s = (off + pt.off) as usize;
            assert_eq!(&bin[s..s + pt.nbytes as usize], t.view(&ck).unwrap().bytes);
        }
    }
    let q = TrunkPack::open(out.path()).unwrap();
    q.check_against(&b, &cfg).unwrap();
    q.check_source(&ck).unwrap();
    q.verify_checksums(&mut |_, _| {}).unwrap();
    assert_eq!(q.layers(), p.layers());
    assert!(!out.path().join("trunk.bin.tmp").exists());
    assert!(!out.path().join("trunk.json.tmp").exists());
}

#[test]
fn packs_tiny_k3_verbatim_and_aligned() {
    // An odd chunk size exercises runs spanning several chunks.
    check_tiny("tiny-k3", 4096 + 7);
}

#[test]
fn packs_tiny_k3_wide_verbatim_and_aligned() {
    check_tiny("tiny-k3-wide", PackOptions::default().chunk_bytes);
}

#[test]
fn flipped_byte_is_named_by_layer() {
    let out = tempfile::tempdir().unwrap();
    let p = pack(&fixture("tiny-k3"), out.path()).unwrap();
    let (off, n) = p.layer(5);
    let mut bin = std::fs::read(p.path()).unwrap();
    bin[(off + n / 2) as usize] ^= 0x40;
    std::fs::write(p.path(), &bin).unwrap();
    let p = TrunkPack::open(out.path()).unwrap();
    let e = p.verify_checksums(&mut |_, _| {}).unwrap_err();
    assert!(matches!(e, PackError::Checksum { layer: 5, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("layer 5") && msg.contains("k3 pack"), "{msg}");
}

#[test]
fn truncated_bin_is_named_by_layer() {
    let out = tempfile::tempdir().unwrap();
    let p = pack(&fixture("tiny-k3"), out.path()).unwrap();
    let last = p.num_layers() - 1;
    let (off, n) = p.layer(last);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(p.path())
        .unwrap();
    f.set_len(off + n - 10).unwrap();
    let e = TrunkPack::open(out.path()).unwrap_err();
    assert!(
        matches!(e, PackError::Truncated { layer, missing: 10, .. } if layer == last),
        "{e:?}"
    );
    assert!(e.to_string().contains(&format!("layer {last} ")), "{e}");
    // Cut inside layer 2: layer 2 is the first that does not fit.
    let (off2, _) = p.layer(2);
    f.set_len(off2 + 3).unwrap();
    let e = TrunkPack::open(out.path()).unwrap_err();
    assert!(matches!(e, PackError::Truncated { layer: 2, .. }), "{e:?}");
}

#[test]
fn pack_of_another_model_is_refused() {
    let out = tempfile::tempdir().unwrap();
    let p = pack(&fixture("tiny-k3"), out.path()).unwrap();
    let (cfg, ck, b) = load(&fixture("tiny-k3-wide"));
    let e = p.check_against(&b, &cfg).unwrap_err();
    assert!(matches!(e, PackError::Mismatch { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("config ") && msg.contains("k3 pack"), "{msg}");
    let e = p.check_source(&ck).unwrap_err();
    assert!(e.to_string().contains("shard"), "{e}");
}

/// Writes `groups` (one shard each) and a config into `dir`.
fn write_model(dir: &Path, groups: &[Vec<TensorSpec>]) -> Checkpoint {
    for (i, g) in groups.iter().enumerate() {
        let path = dir.join(format!("model-{i:05}.safetensors"));
        write_shard(&path, g, |i, _, buf| {
            for (j, b) in buf.iter_mut().enumerate() {
                *b = (i * 31 + j * 7) as u8;
            }
        })
        .unwrap();
    }
    Checkpoint::open(dir).unwrap()
}

fn tiny_cfg() -> K3Config {
    K3Config::load(fixture("tiny-k3").join("config.json")).unwrap()
}

/// Index of the tensor ending with `suffix` in `g`.
fn find(g: &[TensorSpec], suffix: &str) -> usize {
    g.iter().position(|t| t.name.ends_with(suffix)).unwrap()
}

#[test]
fn stale_pack_names_first_mismatching_tensor() {
    let cfg = tiny_cfg();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ck_a = write_model(a.path(), &model_tensors(&cfg));
    let bind_a = bind_model(&ck_a, &cfg).unwrap();
    let out = tempfile::tempdir().unwrap();
    let p = write_trunk_pack(
        &ck_a,
        &bind_a,
        &cfg,
        out.path(),
        &PackOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    p.check_against(&bind_a, &cfg).unwrap();
    // Same config, but one norm stored as F32 and one res_proj as [E] instead of [1, E].
    let mut groups = model_tensors(&cfg);
    let i = find(
        &groups[2],
        "layers.1.block_sparse_moe.routed_expert_norm.weight",
    );
    groups[2][i].dtype = Dtype::F32;
    let j = find(&groups[4], "layers.3.mlp_res_proj.weight");
    groups[4][j].shape = vec![cfg.hidden_size];
    let ck_b = write_model(b.path(), &groups);
    let bind_b = bind_model(&ck_b, &cfg).unwrap();
    let e = p.check_against(&bind_b, &cfg).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("layers.1.block_sparse_moe.routed_expert_norm.weight"),
        "{msg}"
    );
    assert!(msg.contains("BF16") && msg.contains("F32"), "{msg}");
    // Only the shape differs (same bytes, same offsets): still refused.
    groups[2][i].dtype = Dtype::BF16;
    let c = tempfile::tempdir().unwrap();
    let ck_c = write_model(c.path(), &groups);
    let bind_c = bind_model(&ck_c, &cfg).unwrap();
    let e = p.check_against(&bind_c, &cfg).unwrap_err();
    assert!(
        e.to_string().contains("layers.3.mlp_res_proj.weight"),
        "{e}"
    );
}

#[test]
fn non_contiguous_trunk_is_refused_with_byte_counts() {
    let cfg = tiny_cfg();
    let dir = tempfile::tempdir().unwrap();
    let mut groups = model_tensors(&cfg);
    // Layer 2's first expert tensor moved between two of its trunk tensors.
    let g = &mut groups[3];
    let x = g.remove(find(
        g,
        "layers.2.block_sparse_moe.experts.0.w1.weight_packed",
    ));
    let gap = x.nbytes().unwrap();
    let at = find(g, "layers.2.input_layernorm.weight") + 1;
    g.insert(at, x);
    let ck = write_model(dir.path(), &groups);
    let b = bind_model(&ck, &cfg).unwrap();
    let out = tempfile::tempdir().unwrap();
    let e = write_trunk_pack(
        &ck,
        &b,
        &cfg,
        out.path(),
        &PackOptions::default(),
        &mut |_, _| {},
    )
    .unwrap_err();
    let PackError::Gaps {
        layer,
        gap_bytes,
        intruders,
        ref first_intruder,
        ..
    } = e
    else {
        panic!("{e:?}");
    };
    assert_eq!((layer, gap_bytes, intruders), (2, gap, 1));
    assert!(first_intruder.ends_with("experts.0.w1.weight_packed"));
    assert!(
        e.to_string().contains(&format!("{gap} bytes in between")),
        "{e}"
    );
    assert!(!out.path().join(TRUNK_BIN).exists() && !out.path().join(TRUNK_JSON).exists());
    // A trunk tensor in another shard.
    let mut groups = model_tensors(&cfg);
    let k = find(&groups[4], "layers.3.mlp_res_norm.weight");
    let t = groups[4].remove(k);
    groups[0].push(t);
    let d2 = tempfile::tempdir().unwrap();
    let ck = write_model(d2.path(), &groups);
    let b = bind_model(&ck, &cfg).unwrap();
    let e = write_trunk_pack(
        &ck,
        &b,
        &cfg,
        out.path(),
        &PackOptions::default(),
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(
        matches!(e, PackError::SplitShards { layer: 3, .. }),
        "{e:?}"
    );
}

#[test]
fn existing_pack_needs_overwrite() {
    let model = fixture("tiny-k3");
    let (cfg, ck, b) = load(&model);
    let out = tempfile::tempdir().unwrap();
    pack(&model, out.path()).unwrap();
    let e = pack(&model, out.path()).unwrap_err();
    assert!(matches!(e, PackError::Exists { .. }), "{e:?}");
    assert!(e.to_string().contains("--overwrite"), "{e}");
    let p = write_trunk_pack(
        &ck,
        &b,
        &cfg,
        out.path(),
        &opts(true, 1 << 20),
        &mut |_, _| {},
    )
    .unwrap();
    p.verify_checksums(&mut |_, _| {}).unwrap();
}

#[test]
fn index_appears_only_when_the_data_is_complete() {
    let model = fixture("tiny-k3");
    let (cfg, ck, b) = load(&model);
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_path_buf();
    // While copying: only the temporary data file exists.
    let mut seen = 0;
    write_trunk_pack(&ck, &b, &cfg, &dir, &opts(false, 4096), &mut |_, _| {
        assert!(!dir.join(TRUNK_JSON).exists() && !dir.join(TRUNK_BIN).exists());
        assert!(dir.join("trunk.bin.tmp").exists());
        seen += 1;
    })
    .unwrap();
    assert!(seen > 1);
    let good = TrunkPack::open(&dir).unwrap();
    // Interrupted half way through an overwrite: the old pack is untouched, no temp files.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = write_trunk_pack(&ck, &b, &cfg, &dir, &opts(true, 4096), &mut |d, t| {
            assert!(d < t / 2, "simulated interruption");
        });
    }));
    assert!(r.is_err());
    assert!(!dir.join("trunk.bin.tmp").exists() && !dir.join("trunk.json.tmp").exists());
    let again = TrunkPack::open(&dir).unwrap();
    assert_eq!(again.layers(), good.layers());
    again.verify_checksums(&mut |_, _| {}).unwrap();
    // Interrupted into an empty directory: no trunk.json at all.
    let fresh = tempfile::tempdir().unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = write_trunk_pack(
            &ck,
            &b,
            &cfg,
            fresh.path(),
            &opts(false, 4096),
            &mut |d, t| {
                assert!(d < t / 2, "simulated interruption");
            },
        );
    }));
    assert!(r.is_err());
    let e = TrunkPack::open(fresh.path()).unwrap_err();
    assert!(
        matches!(
            e,
            PackError::NoPack {
                interrupted: false,
                ..
            }
        ),
        "{e:?}"
    );
}

/// Rewrites `trunk.json` through `edit` and returns the open error.
fn open_edited(dir: &Path, edit: impl Fn(&mut serde_json::Value)) -> PackError {
    let path = dir.join(TRUNK_JSON);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    let e = TrunkPack::open(dir).unwrap_err();
    std::fs::write(&path, text).unwrap();
    e
}

#[test]
fn open_rejects_inconsistent_index() {
    let out = tempfile::tempdir().unwrap();
    pack(&fixture("tiny-k3"), out.path()).unwrap();
    let d = out.path();
    let e = open_edited(d, |v| v["layers"][1]["file_off"] = (4096 + 8).into());
    assert!(e.to_string().contains("layer 1: file_off 4104"), "{e}");
    let e = open_edited(d, |v| {
        v["layers"].as_array_mut().unwrap().pop();
    });
    assert!(e.to_string().contains("lists 12 layers"), "{e}");
    let e = open_edited(d, |v| v["format"] = "other".into());
    assert!(e.to_string().contains("\"format\""), "{e}");
    let e = open_edited(d, |v| v["layers"][3]["checksum"] = "crc32:00".into());
    assert!(e.to_string().contains("layer 3: checksum"), "{e}");
    let e = open_edited(d, |v| {
        let off = v["layers"][1]["file_off"].clone();
        v["layers"][2]["file_off"] = off;
    });
    assert!(e.to_string().contains("overlap"), "{e}");
    let e = open_edited(d, |v| v["layers"].as_array_mut().unwrap().swap(0, 1));
    assert!(e.to_string().contains("in order"), "{e}");
    let e = open_edited(d, |v| {
        v.as_object_mut().unwrap().remove("align");
    });
    assert!(matches!(e, PackError::Json { .. }), "{e:?}");
    // An alignment other than 4096 opens, with the buffered-I/O note.
    let path = d.join(TRUNK_JSON);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["align"] = 512.into();
    std::fs::write(&path, v.to_string()).unwrap();
    let p = TrunkPack::open(d).unwrap();
    assert!(!p.direct_io_ok());
    assert!(p.buffered_fallback_note().unwrap().contains("buffered"));
}

#[test]
fn missing_pack_says_how_to_make_one() {
    let d = tempfile::tempdir().unwrap();
    let e = TrunkPack::open(d.path()).unwrap_err();
    assert!(e.to_string().contains("k3 pack"), "{e}");
    std::fs::write(d.path().join("trunk.bin.tmp"), b"x").unwrap();
    let e = TrunkPack::open(d.path()).unwrap_err();
    assert!(
        matches!(
            e,
            PackError::NoPack {
                interrupted: true,
                ..
            }
        ),
        "{e:?}"
    );
}
