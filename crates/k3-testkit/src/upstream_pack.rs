//! A small writer of trunk packs in upstream's format, written from the format's description
//! (docs/FORMATS.md#adopting-an-upstream-pack), independent of k3's packer: `trunk.json` is
//! `{"align": 4096, "layers": [{"file_off", "nbytes", "tensors": {NAME: {"off", "nbytes",
//! "dtype"}}}]}` with `nbytes` rounded up to 4096; `trunk.bin` holds each layer's run copied
//! from its shard, zero padded. The runs are found from the safetensors headers alone: a
//! layer's trunk is every `language_model.model.layers.{L}.` tensor but the routed experts.
//! Shared by k3-format's and k3-cli's adopt tests.

use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// One tensor of a shard, from its header.
#[derive(Clone, Debug)]
pub struct ShardTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Value,
    /// Absolute byte range in the shard file.
    pub begin: u64,
    pub end: u64,
}

/// One layer's run: its shard, its absolute byte range and its tensors.
#[derive(Clone, Debug)]
pub struct Run {
    pub shard: PathBuf,
    pub start: u64,
    pub end: u64,
    pub tensors: Vec<ShardTensor>,
}

/// How to write the pack.
#[derive(Clone, Copy, Debug, Default)]
pub struct Style {
    /// Add the fields derived packers add (`n_layers`, `layer`, `shard`, `run_start`,
    /// `run_bytes`, a tensor `shape`).
    pub extra_fields: bool,
    /// Write each run's exact length as `nbytes` instead of rounding it up to 4096.
    pub exact_nbytes: bool,
    /// End `trunk.bin` at the last run's end (no padding after it), as a packer that pads
    /// before each run leaves it; `nbytes` is still rounded up.
    pub no_tail_padding: bool,
}

/// Every tensor of a safetensors file: 8-byte little-endian header length, JSON header,
/// `data_offsets` relative to the end of the header.
pub fn shard_tensors(path: &Path) -> Vec<ShardTensor> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n as usize]).unwrap();
    let base = 8 + n;
    header
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(name, v)| ShardTensor {
            name,
            dtype: v["dtype"].as_str().unwrap().to_string(),
            shape: v["shape"].clone(),
            begin: base + v["data_offsets"][0].as_u64().unwrap(),
            end: base + v["data_offsets"][1].as_u64().unwrap(),
        })
        .collect()
}

/// Layer number of a trunk tensor name, `None` for anything else (routed experts included).
fn trunk_layer(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("language_model.model.layers.")?;
    let (l, _) = rest.split_once('.')?;
    (!name.contains(".experts.")).then(|| l.parse().ok())?
}

/// Every layer's run in `model_dir`, in layer order.
pub fn runs(model_dir: &Path) -> Vec<Run> {
    let mut shards: Vec<PathBuf> = std::fs::read_dir(model_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    shards.sort();
    let mut by_layer: Vec<Option<Run>> = Vec::new();
    for shard in &shards {
        for t in shard_tensors(shard) {
            let Some(l) = trunk_layer(&t.name) else {
                continue;
            };
            if by_layer.len() <= l {
                by_layer.resize(l + 1, None);
            }
            let run = by_layer[l].get_or_insert_with(|| Run {
                shard: shard.clone(),
                start: t.begin,
                end: t.end,
                tensors: Vec::new(),
            });
            assert_eq!(&run.shard, shard, "layer {l} spans two shards");
            run.start = run.start.min(t.begin);
            run.end = run.end.max(t.end);
            run.tensors.push(t);
        }
    }
    let runs: Vec<Run> = by_layer.into_iter().map(Option::unwrap).collect();
    for (l, r) in runs.iter().enumerate() {
        let sum: u64 = r.tensors.iter().map(|t| t.end - t.begin).sum();
        assert_eq!(sum, r.end - r.start, "layer {l}'s trunk is not one run");
    }
    runs
}

/// Writes upstream's `trunk.bin` and `trunk.json` for `model_dir` into `out` (created);
/// returns the runs and the index as written.
pub fn write_upstream_pack(model_dir: &Path, out: &Path, style: Style) -> (Vec<Run>, Value) {
    std::fs::create_dir_all(out).unwrap();
    let runs = runs(model_dir);
    let mut bin: Vec<u8> = Vec::new();
    let mut layers = Vec::new();
    for (l, r) in runs.iter().enumerate() {
        let data = std::fs::read(&r.shard).unwrap();
        let file_off = bin.len() as u64;
        bin.extend_from_slice(&data[r.start as usize..r.end as usize]);
        let len = r.end - r.start;
        let padded = len.div_ceil(4096) * 4096;
        bin.resize((file_off + padded) as usize, 0);
        let mut tensors = Map::new();
        for t in &r.tensors {
            let mut e =
                json!({"off": t.begin - r.start, "nbytes": t.end - t.begin, "dtype": t.dtype});
            if style.extra_fields {
                e["shape"] = t.shape.clone();
            }
            tensors.insert(t.name.clone(), e);
        }
        let nbytes = if style.exact_nbytes { len } else { padded };
        let mut entry = json!({"file_off": file_off, "nbytes": nbytes, "tensors": tensors});
        if style.extra_fields {
            entry["layer"] = json!(l);
            entry["shard"] = json!(r.shard.file_name().unwrap().to_string_lossy());
            entry["run_start"] = json!(r.start);
            entry["run_bytes"] = json!(len);
        }
        layers.push(entry);
    }
    let mut doc = json!({"align": 4096, "layers": layers});
    if style.extra_fields {
        doc["n_layers"] = json!(runs.len());
    }
    if style.no_tail_padding {
        let last = runs.last().unwrap();
        let at = layers.last().unwrap()["file_off"].as_u64().unwrap();
        bin.truncate((at + last.end - last.start) as usize);
    }
    std::fs::write(out.join("trunk.bin"), &bin).unwrap();
    std::fs::write(out.join("trunk.json"), serde_json::to_string(&doc).unwrap()).unwrap();
    (runs, doc)
}

/// Rewrites `out/trunk.json` with `edit` applied to the index.
pub fn edit_index(out: &Path, edit: impl FnOnce(&mut Value)) {
    let path = out.join("trunk.json");
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut doc);
    std::fs::write(&path, serde_json::to_string(&doc).unwrap()).unwrap();
}

/// XORs byte `at` of `out/trunk.bin` with `mask`.
pub fn flip_bin_byte(out: &Path, at: u64, mask: u8) {
    let path = out.join("trunk.bin");
    let mut b = std::fs::read(&path).unwrap();
    b[at as usize] ^= mask;
    std::fs::write(&path, b).unwrap();
}
