//! A compressed packed trunk (docs/FORMATS.md#compressed-trunk) gives the same ids and logits,
//! bit for bit, as the plain pack and the shards at streaming budgets and thread counts; its
//! reads are the stored bytes and its decoded bytes are reported; a damaged chunk stops the
//! run naming layer, tensor and chunk.

use k3_engine::planning::{budget_extremes, piece_ring_budget};
use k3_engine::{argmax, Budget, DecodeMode, Engine, EngineOptions};
use k3_format::pack::{write_compressed_pack_with, CompressOptions, PackOptions};
use k3_format::{bind_model, Checkpoint, K3Config, TrunkPack};
use std::path::{Path, PathBuf};

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

const PROMPT: [u32; 7] = [637, 229, 263, 638, 730, 42, 197];

fn opts(budget: Option<Budget>, threads: usize, trunk: Option<&Path>) -> EngineOptions {
    EngineOptions {
        threads: Some(threads),
        budget,
        ctx: 64,
        direct_io: true,
        trunk_dir: trunk.map(Path::to_path_buf),
        ..EngineOptions::default()
    }
}

/// Logits after the prompt and after each of 6 greedy steps, plus the ids chosen.
fn trace(engine: &Engine) -> Result<(Vec<Vec<f32>>, Vec<u32>), String> {
    let mut s = engine.new_session(64).map_err(|e| e.to_string())?;
    s.feed(&PROMPT).map_err(|e| e.to_string())?;
    let (mut logits, mut ids) = (vec![s.logits().to_vec()], Vec::new());
    for _ in 0..6 {
        let id = argmax(s.logits());
        ids.push(id);
        s.step(id, DecodeMode::Incremental)
            .map_err(|e| e.to_string())?;
        logits.push(s.logits().to_vec());
    }
    Ok((logits, ids))
}

/// Every BF16 tensor of the tiny model coded, in chunks of 1,000 values.
fn compressed_pack(model: &Path, out: &Path) -> TrunkPack {
    let cfg = K3Config::load(model.join("config.json")).unwrap();
    let ck = Checkpoint::open(model).unwrap();
    let b = bind_model(&ck, &cfg).unwrap();
    let c = CompressOptions {
        chunk_values: 1000,
        min_coded_bytes: 0,
    };
    write_compressed_pack_with(
        &ck,
        &b,
        &cfg,
        out,
        &PackOptions::default(),
        &c,
        &mut |_, _| {},
    )
    .unwrap()
}

fn same_logits_from_a_compressed_pack(name: &str) {
    let d = dir(name);
    let out = tempfile::tempdir().unwrap();
    let pack = compressed_pack(&d, out.path());
    assert!(pack.stored_total_bytes() < pack.total_bytes());
    let reference = trace(&Engine::open(&d, opts(None, 2, None)).unwrap()).unwrap();
    let (smallest, everything) = budget_extremes(&d).unwrap();
    let pieces = piece_ring_budget(&d)
        .unwrap()
        .expect("tiny layers split into pieces");
    let budgets = [
        (pieces, 1),
        (pieces, 2),
        (smallest, 1),
        (smallest, 2),
        (everything, 2),
    ];
    for (budget, threads) in budgets {
        let engine = Engine::open(&d, opts(Some(budget), threads, Some(out.path()))).unwrap();
        let before = engine.stats();
        assert!(
            trace(&engine).unwrap() == reference,
            "{name}: compressed pack at {budget:?}, {threads} threads"
        );
        let s = engine.stats();
        assert!(s.trunk_bytes_decoded > s.trunk_bytes_read, "{s:?}");
        let want = if budget == pieces { 2 } else { 1 };
        assert_eq!(s.trunk_pieces, want, "{name}: {budget:?}");
        if budget == smallest || budget == pieces {
            let read = s.trunk_bytes_read - before.trunk_bytes_read;
            let decoded = s.trunk_bytes_decoded - before.trunk_bytes_decoded;
            assert!(
                read > 0 && decoded > read,
                "streamed: read {read}, decoded {decoded}"
            );
        }
    }
}

#[test]
fn tiny_k3_same_logits_from_a_compressed_pack() {
    same_logits_from_a_compressed_pack("tiny-k3");
}

#[test]
fn tiny_k3_wide_same_logits_from_a_compressed_pack() {
    same_logits_from_a_compressed_pack("tiny-k3-wide");
}

#[test]
fn a_damaged_streamed_chunk_stops_the_run_naming_it() {
    let d = dir("tiny-k3");
    let out = tempfile::tempdir().unwrap();
    let pack = compressed_pack(&d, out.path());
    // The last layer streams at the smallest budget; damage its last coded chunk.
    let l = pack.num_layers() - 1;
    let e = pack.layer_entry(l).unwrap();
    let (name, off) = e
        .tensors
        .iter()
        .find_map(|t| match &t.stored {
            Some(k3_format::pack::TensorStore::Coded(c)) => {
                Some((t.name.clone(), e.file_off + c.chunks[0].off))
            }
            _ => None,
        })
        .unwrap();
    let mut bin = std::fs::read(pack.path()).unwrap();
    bin[off as usize + 20] ^= 1;
    std::fs::write(pack.path(), &bin).unwrap();
    let (smallest, _) = budget_extremes(&d).unwrap();
    let pieces = piece_ring_budget(&d)
        .unwrap()
        .expect("tiny layers split into pieces");
    for budget in [smallest, pieces] {
        let err = match Engine::open(&d, opts(Some(budget), 2, Some(out.path()))) {
            Err(e) => e.to_string(),
            Ok(engine) => trace(&engine).expect_err("a damaged chunk must stop the run"),
        };
        assert!(
            err.contains(&format!("layer {l}, tensor {name:?}, chunk 0")),
            "{budget:?}: {err}"
        );
        // The message names the chunk's bytes in trunk.bin, also when only a piece was read.
        assert!(
            err.contains(&format!("(bytes [{off}, ")),
            "{budget:?}: {err}"
        );
    }
}
