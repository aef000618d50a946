//! Adopting a trunk packed by upstream's packer (docs/FORMATS.md#adopting-an-upstream-pack):
//! its `trunk.json` is `{"align", "layers": [{"file_off", "nbytes", "tensors": {NAME: {"off",
//! "nbytes", "dtype"}}}]}`, with `nbytes` rounded up to 4096. Every layer is matched with the
//! checkpoint's run by tensor names and within-run offsets and compared byte for byte (the
//! padding must be zeros); only then is k3's `trunk.json` (checksums, provenance, shapes, all
//! taken from the checkpoint) written in its place, upstream's kept as `trunk.json.upstream`.
//! `trunk.bin` is never copied or written.

use super::json::{LayerDoc, PackDoc};
use super::upstream::{check_placement, match_layers, read_upstream, Matched};
use super::write::{layer_doc, pack_doc, write_json};
use super::{PackError, TrunkPack, DEFAULT_CHUNK, FORMAT_NAME, TRUNK_BIN, TRUNK_JSON};
use crate::bind::ModelBinding;
use crate::config::K3Config;
use crate::index::Checkpoint;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// Where upstream's original index is kept after adopting.
pub const UPSTREAM_JSON: &str = "trunk.json.upstream";

/// Adopts the pack in `dir` for the checkpoint `ck`: reads its `trunk.json` as upstream's
/// packer writes it (extra fields are ignored), matches each entry with the checkpoint's layer
/// of the same number (tensor names, within-run offsets, sizes, dtypes, run length exact or
/// rounded up to 4096), compares every run in `trunk.bin` with the checkpoint's bytes and its
/// padding with zeros, and only then writes k3's `trunk.json` atomically. Any difference is
/// refused naming the layer (and tensor or byte), and nothing is written. An index that is not
/// k3's is first renamed to [`UPSTREAM_JSON`]. `progress(done, total)` counts bytes compared.
pub fn adopt_trunk_pack(
    ck: &Checkpoint,
    binding: &ModelBinding,
    cfg: &K3Config,
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TrunkPack, PackError> {
    let json = dir.join(TRUNK_JSON);
    let (up, original) = read_upstream(dir)?;
    let matched = match_layers(&json, &up, binding)?;
    let bin = dir.join(TRUNK_BIN);
    let bin_len = std::fs::metadata(&bin)
        .map_err(PackError::io(&bin, "stat"))?
        .len();
    check_placement(&bin, bin_len, &matched)?;
    let total = matched.iter().map(|m| m.in_file(bin_len)).sum();
    let mut cmp = Comparer::new(&bin, bin_len, &matched)?;
    let mut done = 0u64;
    let mut layers: Vec<LayerDoc> = Vec::with_capacity(matched.len());
    for m in &matched {
        let shard = ck.shards()[m.run.shard].path();
        let hash = cmp.layer(m, shard, &mut |n| {
            done += n;
            progress(done, total);
        })?;
        layers.push(layer_doc(m.lt, m.run, m.file_off, hash, shard));
    }
    let keep_original = !is_k3_index(&original);
    publish(
        dir,
        &pack_doc(ck, cfg, up.align, layers, None),
        keep_original,
    )?;
    let pack = TrunkPack::open(dir)?;
    pack.check_against(binding, cfg)?;
    pack.check_source(ck)?;
    Ok(pack)
}

/// Whether `text` is already k3's index (then no `.upstream` copy is kept).
fn is_k3_index(text: &str) -> bool {
    serde_json::from_str::<PackDoc>(text).is_ok_and(|d| d.format == FORMAT_NAME)
}

/// Reads a layer from `trunk.bin` and from its shard side by side.
struct Comparer {
    bin_path: PathBuf,
    bin: File,
    bin_len: u64,
    a: Vec<u8>,
    b: Vec<u8>,
}

impl Comparer {
    fn new(bin_path: &Path, bin_len: u64, layers: &[Matched<'_>]) -> Result<Comparer, PackError> {
        let bin = File::open(bin_path).map_err(PackError::io(bin_path, "open"))?;
        let longest = layers.iter().map(|m| m.nbytes).max().unwrap_or(0);
        let n = DEFAULT_CHUNK
            .min(usize::try_from(longest).unwrap_or(DEFAULT_CHUNK))
            .max(1);
        Ok(Comparer {
            bin_path: bin_path.into(),
            bin,
            bin_len,
            a: vec![0; n],
            b: vec![0; n],
        })
    }

    /// Compares layer `m`'s run with `shard` and its padding (as far as the file goes) with
    /// zeros; returns the run's XXH3-64 (of the run only: k3's index records the exact length).
    fn layer(
        &mut self,
        m: &Matched<'_>,
        shard: &Path,
        step: &mut dyn FnMut(u64),
    ) -> Result<u64, PackError> {
        let mut src = File::open(shard).map_err(PackError::io(shard, "open"))?;
        src.seek(SeekFrom::Start(m.run.start))
            .map_err(PackError::io(shard, "seek"))?;
        self.bin
            .seek(SeekFrom::Start(m.file_off))
            .map_err(PackError::io(&self.bin_path, "seek"))?;
        let mut hasher = Xxh3::new();
        let (run_len, mut pos) = (m.run.len(), 0u64);
        while pos < run_len {
            let n = self.chunk(run_len - pos);
            let (a, b) = (&mut self.a[..n], &mut self.b[..n]);
            self.bin
                .read_exact(a)
                .map_err(PackError::io(&self.bin_path, "read"))?;
            src.read_exact(b).map_err(PackError::io(shard, "read"))?;
            if let Some(i) = a.iter().zip(b.iter()).position(|(x, y)| x != y) {
                return Err(differs(m, &self.bin_path, shard, pos + i as u64));
            }
            hasher.update(a);
            pos += n as u64;
            step(n as u64);
        }
        let padded_end = m.in_file(self.bin_len);
        while pos < padded_end {
            let n = self.chunk(padded_end - pos);
            let a = &mut self.a[..n];
            self.bin
                .read_exact(a)
                .map_err(PackError::io(&self.bin_path, "read"))?;
            if let Some(i) = a.iter().position(|&x| x != 0) {
                return Err(PackError::NotAdopted {
                    path: self.bin_path.clone(),
                    detail: format!(
                        "layer {}: byte {} of its {}-byte entry is {:#04x}, but bytes [{run_len}, {}) after the {run_len}-byte run are padding and must be zero",
                        m.lt.layer, pos + i as u64, m.nbytes, a[i], m.nbytes
                    ),
                });
            }
            pos += n as u64;
            step(n as u64);
        }
        Ok(hasher.digest())
    }

    /// Bytes to read next when `left` remain.
    fn chunk(&self, left: u64) -> usize {
        self.a
            .len()
            .min(usize::try_from(left).unwrap_or(usize::MAX))
    }
}

/// The error for layer `m`'s run differing from the checkpoint at run byte `at`.
fn differs(m: &Matched<'_>, bin: &Path, shard: &Path, at: u64) -> PackError {
    let tensor =
        m.lt.tensors()
            .into_iter()
            .find(|t| t.offset - m.run.start <= at && at < t.offset - m.run.start + t.nbytes)
            .map(|t| t.name.clone())
            .unwrap_or_default();
    PackError::Differs {
        path: bin.into(),
        layer: m.lt.layer,
        nbytes: m.run.len(),
        at,
        tensor,
        shard: shard.into(),
        shard_off: m.run.start + at,
    }
}

/// Writes `trunk.json.tmp`, keeps the original index as [`UPSTREAM_JSON`] when asked, and
/// renames the new index into place.
fn publish(dir: &Path, doc: &PackDoc, keep_original: bool) -> Result<(), PackError> {
    let json = dir.join(TRUNK_JSON);
    let tmp = dir.join(format!("{TRUNK_JSON}.tmp"));
    if let Err(e) = write_json(&tmp, doc) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if keep_original {
        let keep = dir.join(UPSTREAM_JSON);
        std::fs::rename(&json, &keep).map_err(PackError::io(&keep, "rename"))?;
    }
    std::fs::rename(&tmp, &json).map_err(PackError::io(&json, "rename into place"))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
