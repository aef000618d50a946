//! Matching a pack against a checkpoint, and re-hashing its data.

use super::json::ConfigFingerprint;
use super::write::source_shard;
use super::{checksum_string, PackDtype, PackError, PackedLayer, TrunkPack, DEFAULT_CHUNK};
use crate::bind::{LayerTensors, ModelBinding};
use crate::config::K3Config;
use crate::index::Checkpoint;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use xxhash_rust::xxh3::Xxh3;

impl TrunkPack {
    /// Refuses a pack that does not describe `binding`'s trunk: the config fingerprint, the
    /// layer count, and per layer the run length and every tensor's name, dtype, shape, size
    /// and offset within the run (`offset − run start`) must all agree. The error names the
    /// first difference (config field or tensor).
    pub fn check_against(&self, binding: &ModelBinding, cfg: &K3Config) -> Result<(), PackError> {
        let mismatch = |detail: String| PackError::Mismatch {
            path: self.json_path(),
            detail,
        };
        if let Some(q) = self.draft {
            return Err(mismatch(format!(
                "this is a {} draft trunk (quantized; the exact model needs bf16): pass it as --draft-trunk, and an exact pack (`k3 pack MODEL_DIR PACK_DIR`) as --trunk",
                q.name()
            )));
        }
        self.check_model(binding, cfg, "pack")?;
        for (pl, lt) in self.layers.iter().zip(&binding.layers) {
            check_layer(pl, lt).map_err(mismatch)?;
        }
        Ok(())
    }

    /// The config fingerprint and the layer count against the checkpoint's; `what` names the
    /// pack in the message ("pack", "draft trunk").
    pub(super) fn check_model(
        &self,
        binding: &ModelBinding,
        cfg: &K3Config,
        what: &str,
    ) -> Result<(), PackError> {
        let mismatch = |detail: String| PackError::Mismatch {
            path: self.json_path(),
            detail,
        };
        let fp = ConfigFingerprint::from_config(cfg);
        if let Some((field, pack, ck)) = self.source.config.first_difference(&fp) {
            return Err(mismatch(format!(
                "config {field}: {what} has {pack}, checkpoint has {ck}"
            )));
        }
        if binding.layers.len() != self.layers.len() {
            return Err(mismatch(format!(
                "{what} has {} layers, checkpoint has {}",
                self.layers.len(),
                binding.layers.len()
            )));
        }
        Ok(())
    }

    /// Refuses a pack whose recorded source shards (file names and lengths) differ from `ck`'s:
    /// catches a re-downloaded or re-sharded checkpoint whose tensor layout happens to agree.
    pub fn check_source(&self, ck: &Checkpoint) -> Result<(), PackError> {
        let now: Vec<_> = ck
            .shards()
            .iter()
            .map(|s| source_shard(s.path(), s.file_len()))
            .collect();
        if now.len() != self.source.shards.len() {
            return Err(PackError::Mismatch {
                path: self.json_path(),
                detail: format!(
                    "pack was made from {} shard files, checkpoint has {}",
                    self.source.shards.len(),
                    now.len()
                ),
            });
        }
        match self.source.shards.iter().zip(&now).find(|(a, b)| a != b) {
            None => Ok(()),
            Some((a, b)) => Err(PackError::Mismatch {
                path: self.json_path(),
                detail: format!(
                    "pack was made from shard {} ({} bytes), checkpoint has {} ({} bytes)",
                    a.file, a.bytes, b.file, b.bytes
                ),
            }),
        }
    }

    /// Reads every layer's run from `trunk.bin` in 64 MiB chunks and compares its XXH3-64
    /// with the recorded checksum; the error names the first corrupt layer.
    /// `progress(done, total)` is called after every chunk with run bytes hashed.
    pub fn verify_checksums(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), PackError> {
        if self.is_compressed() {
            return self.verify_decoded(progress);
        }
        let path = self.path();
        let mut f = File::open(&path).map_err(PackError::io(&path, "open"))?;
        let total = self.total_bytes();
        let cap = usize::try_from(self.max_run_bytes()).unwrap_or(DEFAULT_CHUNK);
        let mut buf = vec![0u8; DEFAULT_CHUNK.min(cap).max(1)];
        let mut done = 0u64;
        for l in &self.layers {
            f.seek(SeekFrom::Start(l.file_off))
                .map_err(PackError::io(&path, "seek"))?;
            let mut h = Xxh3::new();
            let mut left = l.nbytes;
            while left > 0 {
                let n = buf.len().min(usize::try_from(left).unwrap_or(buf.len()));
                f.read_exact(&mut buf[..n])
                    .map_err(PackError::io(&path, "read"))?;
                h.update(&buf[..n]);
                left -= n as u64;
                done += n as u64;
                progress(done, total);
            }
            if h.digest() != l.checksum {
                return Err(PackError::Checksum {
                    path,
                    layer: l.layer,
                    file_off: l.file_off,
                    nbytes: l.nbytes,
                    expected: checksum_string(l.checksum),
                    found: checksum_string(h.digest()),
                });
            }
        }
        Ok(())
    }
}

impl TrunkPack {
    /// [`TrunkPack::verify_checksums`] of a compressed pack: per layer, reads the stored run,
    /// checks and decodes every chunk (a damaged one is named) and hashes the decoded run in
    /// order. Holds one stored run and one chunk at a time. `progress` counts decoded bytes.
    fn verify_decoded(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<(), PackError> {
        let path = self.path();
        let mut f = File::open(&path).map_err(PackError::io(&path, "open"))?;
        let total = self.total_bytes();
        let (mut done, mut stored, mut out, mut scratch) =
            (0u64, Vec::new(), Vec::new(), Vec::new());
        for l in &self.layers {
            stored.resize(l.stored_bytes as usize, 0);
            f.seek(SeekFrom::Start(l.file_off))
                .map_err(PackError::io(&path, "seek"))?;
            f.read_exact(&mut stored)
                .map_err(PackError::io(&path, "read"))?;
            let mut h = Xxh3::new();
            for job in self.decode_jobs(l.layer) {
                out.resize(job.dst.len(), 0);
                self.decode_job(l.layer, &job, &stored, &mut out, &mut scratch)?;
                h.update(&out);
                done += out.len() as u64;
                progress(done, total);
            }
            if h.digest() != l.checksum {
                return Err(PackError::Checksum {
                    path,
                    layer: l.layer,
                    file_off: l.file_off,
                    nbytes: l.nbytes,
                    expected: checksum_string(l.checksum),
                    found: checksum_string(h.digest()),
                });
            }
        }
        Ok(())
    }
}

/// One layer: each checkpoint tensor against the pack's (so the first differing tensor is
/// named), then the pack's extra tensors, then the run length.
fn check_layer(pl: &PackedLayer, lt: &LayerTensors) -> Result<(), String> {
    let l = pl.layer;
    let run = lt
        .trunk_run()
        .map_err(|e| format!("the checkpoint's layer {l} is not one run ({e})"))?;
    // In layout order, so the first tensor that differs is named (not one merely shifted).
    let mut ts = lt.tensors();
    ts.sort_by_key(|t| t.offset);
    for t in &ts {
        let Some(p) = pl.tensor(&t.name) else {
            return Err(format!(
                "tensor {:?} (layer {l}) is not in the pack",
                t.name
            ));
        };
        let (off, dtype) = (t.offset - run.start, PackDtype::St(t.dtype));
        if (p.off, p.nbytes, p.dtype, &p.shape) != (off, t.nbytes, dtype, &t.shape) {
            return Err(format!(
                "tensor {:?} (layer {l}): pack has {} {:?} ({} bytes) at run offset {}, checkpoint has {} {:?} ({} bytes) at run offset {off}",
                t.name, p.dtype, p.shape, p.nbytes, p.off, t.dtype, t.shape, t.nbytes
            ));
        }
    }
    if let Some(extra) = pl
        .tensors
        .iter()
        .find(|p| !ts.iter().any(|t| t.name == p.name))
    {
        return Err(format!(
            "tensor {:?} in the pack's layer {l} is not a trunk tensor of the checkpoint",
            extra.name
        ));
    }
    // Equal tensors tiling both runs imply equal lengths; kept as a guard for hand-edited packs.
    if run.len() != pl.nbytes {
        return Err(format!(
            "layer {l}: run is {} bytes in the pack, {} in the checkpoint",
            pl.nbytes,
            run.len()
        ));
    }
    Ok(())
}
