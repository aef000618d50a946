//! Adopting a trunk packed by upstream's packer (docs/FORMATS.md#adopting-an-upstream-pack):
//! the same files as k3's pack but no `checksum` per layer. Every layer is compared byte for
//! byte with the checkpoint's run, then k3's `trunk.json` (with checksums) replaces upstream's,
//! which is kept as `trunk.json.upstream`. `trunk.bin` is never copied or written.

use super::json::PackDoc;
use super::read::open_doc;
use super::{checksum_string, PackError, PackedLayer, TrunkPack, DEFAULT_CHUNK, TRUNK_JSON};
use crate::bind::ModelBinding;
use crate::config::K3Config;
use crate::index::Checkpoint;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// Where upstream's original index is kept after adopting.
pub const UPSTREAM_JSON: &str = "trunk.json.upstream";

/// Adopts the pack in `dir` for the checkpoint `ck`: validates its `trunk.json` as
/// [`TrunkPack::open`] does (checksums may be missing), refuses a pack of another model
/// ([`TrunkPack::check_against`], [`TrunkPack::check_source`]), compares every layer's bytes in
/// `trunk.bin` with the checkpoint's run (the error names the first differing layer, byte and
/// tensor) and only then writes `trunk.json` with XXH3-64 checksums, atomically. A `trunk.json`
/// without checksums is first renamed to [`UPSTREAM_JSON`]. `progress(done, total)` counts run
/// bytes compared.
pub fn adopt_trunk_pack(
    ck: &Checkpoint,
    binding: &ModelBinding,
    cfg: &K3Config,
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TrunkPack, PackError> {
    let (pack, mut doc) = open_doc(dir, false)?;
    pack.check_against(binding, cfg)?;
    pack.check_source(ck)?;
    let total = pack.total_bytes();
    let mut cmp = Comparer::new(&pack)?;
    let mut done = 0u64;
    for (pl, lt) in pack.layers().iter().zip(&binding.layers) {
        let run = lt.trunk_run().map_err(|e| PackError::Mismatch {
            path: pack.json_path(),
            detail: format!("the checkpoint's layer {} is not one run ({e})", pl.layer),
        })?;
        let shard = ck.shards()[run.shard].path();
        let hash = cmp.layer(pl, shard, run.start, &mut |n| {
            done += n;
            progress(done, total);
        })?;
        doc.layers[pl.layer].checksum = Some(checksum_string(hash));
    }
    publish(dir, &doc)?;
    TrunkPack::open(dir)
}

/// Reads a layer from `trunk.bin` and from its shard side by side.
struct Comparer {
    bin_path: PathBuf,
    bin: File,
    a: Vec<u8>,
    b: Vec<u8>,
}

impl Comparer {
    fn new(pack: &TrunkPack) -> Result<Comparer, PackError> {
        let bin_path = pack.path();
        let bin = File::open(&bin_path).map_err(PackError::io(&bin_path, "open"))?;
        let cap = usize::try_from(pack.max_run_bytes()).unwrap_or(DEFAULT_CHUNK);
        let n = DEFAULT_CHUNK.min(cap).max(1);
        Ok(Comparer {
            bin_path,
            bin,
            a: vec![0; n],
            b: vec![0; n],
        })
    }

    /// Compares layer `pl`'s run with `shard` from `start`; returns the run's XXH3-64.
    fn layer(
        &mut self,
        pl: &PackedLayer,
        shard: &Path,
        start: u64,
        step: &mut dyn FnMut(u64),
    ) -> Result<u64, PackError> {
        let mut src = File::open(shard).map_err(PackError::io(shard, "open"))?;
        src.seek(SeekFrom::Start(start))
            .map_err(PackError::io(shard, "seek"))?;
        self.bin
            .seek(SeekFrom::Start(pl.file_off))
            .map_err(PackError::io(&self.bin_path, "seek"))?;
        let mut hasher = Xxh3::new();
        let mut pos = 0u64;
        while pos < pl.nbytes {
            let n = self
                .a
                .len()
                .min(usize::try_from(pl.nbytes - pos).unwrap_or(usize::MAX));
            let (a, b) = (&mut self.a[..n], &mut self.b[..n]);
            self.bin
                .read_exact(a)
                .map_err(PackError::io(&self.bin_path, "read"))?;
            src.read_exact(b).map_err(PackError::io(shard, "read"))?;
            if let Some(i) = a.iter().zip(b.iter()).position(|(x, y)| x != y) {
                let at = pos + i as u64;
                let tensor = pl
                    .tensors
                    .iter()
                    .find(|t| t.off <= at && at < t.off + t.nbytes)
                    .map(|t| t.name.clone())
                    .unwrap_or_default();
                return Err(PackError::Differs {
                    path: self.bin_path.clone(),
                    layer: pl.layer,
                    nbytes: pl.nbytes,
                    at,
                    tensor,
                    shard: shard.into(),
                    shard_off: start + at,
                });
            }
            hasher.update(a);
            pos += n as u64;
            step(n as u64);
        }
        Ok(hasher.digest())
    }
}

/// Writes `trunk.json.tmp`, keeps an index without checksums as [`UPSTREAM_JSON`], and
/// renames the new index into place.
fn publish(dir: &Path, doc: &PackDoc) -> Result<(), PackError> {
    let json = dir.join(TRUNK_JSON);
    let tmp = dir.join(format!("{TRUNK_JSON}.tmp"));
    let text = serde_json::to_string_pretty(doc).map_err(|e| PackError::Json {
        path: json.clone(),
        detail: e.to_string(),
    })?;
    let written = File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()
        })
        .map_err(PackError::io(&tmp, "write"));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let original = std::fs::read_to_string(&json).map_err(PackError::io(&json, "read"))?;
    let had_sums = serde_json::from_str::<PackDoc>(&original)
        .is_ok_and(|d| d.layers.iter().all(|l| l.checksum.is_some()));
    if !had_sums {
        let keep = dir.join(UPSTREAM_JSON);
        std::fs::rename(&json, &keep).map_err(PackError::io(&keep, "rename"))?;
    }
    std::fs::rename(&tmp, &json).map_err(PackError::io(&json, "rename into place"))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
