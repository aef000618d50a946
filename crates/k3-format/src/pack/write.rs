//! Writing a packed trunk: contiguity check, chunked verbatim copy with hashing, atomic publish.

use super::json::{ConfigFingerprint, LayerDoc, PackDoc, SourceDoc, SourceShard, TensorDoc};
use super::{align_up, checksum_string, PackError, TrunkPack, ALIGN, DEFAULT_CHUNK};
use super::{FORMAT_NAME, FORMAT_VERSION, TRUNK_BIN, TRUNK_JSON};
use crate::bind::{LayerTensors, ModelBinding, NotContiguous, TrunkRun};
use crate::config::K3Config;
use crate::index::Checkpoint;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// Options of [`write_trunk_pack`].
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// Replace a pack already in the output directory.
    pub overwrite: bool,
    /// Copy buffer size in bytes (default 64 MiB; clamped to at least 4096).
    pub chunk_bytes: usize,
}

impl Default for PackOptions {
    fn default() -> PackOptions {
        PackOptions {
            overwrite: false,
            chunk_bytes: DEFAULT_CHUNK,
        }
    }
}

/// Packs every layer's trunk run of `ck` into `out_dir/trunk.bin` + `out_dir/trunk.json`.
///
/// Refuses before writing anything when a layer's trunk is not one contiguous run, or when
/// `out_dir` already holds a pack and `opts.overwrite` is false. Runs are copied verbatim with
/// `opts.chunk_bytes` sequential reads (the shards are not mapped), each starting at a multiple
/// of 4096, the file end padded likewise. Both files are written under `.tmp` names and renamed
/// at the end, `trunk.json` last; on error (or panic) the temporary files are removed.
/// `progress(done, total)` is called after every chunk with bytes of run data copied.
pub fn write_trunk_pack(
    ck: &Checkpoint,
    binding: &ModelBinding,
    cfg: &K3Config,
    out_dir: &Path,
    opts: &PackOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TrunkPack, PackError> {
    let runs = plan_runs(ck, binding, cfg, out_dir)?;
    prepare_dir(out_dir, opts.overwrite)?;
    let tmp = TmpFiles::new(out_dir);
    let layers = copy_runs(ck, &runs, &tmp.bin, opts.chunk_bytes.max(4096), progress)?;
    publish(ck, cfg, out_dir, tmp, layers, None)
}

/// Writes the index of the layers in `tmp.bin` (`draft`: the quantization of a draft trunk),
/// renames both files into place and opens the result.
pub(super) fn publish(
    ck: &Checkpoint,
    cfg: &K3Config,
    out_dir: &Path,
    tmp: TmpFiles,
    layers: Vec<LayerDoc>,
    draft: Option<&str>,
) -> Result<TrunkPack, PackError> {
    let doc = pack_doc(ck, cfg, ALIGN, layers, draft);
    write_json(&tmp.json, &doc)?;
    tmp.commit(out_dir)?;
    TrunkPack::open(out_dir)
}

/// [`publish`] for a compressed pack: the index says `"codec"` and version 2.
pub(super) fn publish_doc(
    ck: &Checkpoint,
    cfg: &K3Config,
    out_dir: &Path,
    tmp: TmpFiles,
    layers: Vec<LayerDoc>,
    codec: Option<&str>,
) -> Result<TrunkPack, PackError> {
    let mut doc = pack_doc(ck, cfg, ALIGN, layers, None);
    if let Some(c) = codec {
        doc.codec = Some(c.to_string());
        doc.version = super::COMPRESSED_VERSION;
    }
    write_json(&tmp.json, &doc)?;
    tmp.commit(out_dir)?;
    TrunkPack::open(out_dir)
}

/// k3's index of `layers` packed from `ck` with runs aligned to `align`.
pub(super) fn pack_doc(
    ck: &Checkpoint,
    cfg: &K3Config,
    align: u64,
    layers: Vec<LayerDoc>,
    draft: Option<&str>,
) -> PackDoc {
    PackDoc {
        align,
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        draft: draft.map(str::to_string),
        codec: None,
        source: SourceDoc {
            config: ConfigFingerprint::from_config(cfg),
            shards: ck
                .shards()
                .iter()
                .map(|s| source_shard(s.path(), s.file_len()))
                .collect(),
        },
        layers,
    }
}

/// Every layer's run, refusing a count mismatch or a non-contiguous layer.
pub(super) fn plan_runs<'b>(
    ck: &Checkpoint,
    binding: &'b ModelBinding,
    cfg: &K3Config,
    out_dir: &Path,
) -> Result<Vec<(TrunkRun, &'b LayerTensors)>, PackError> {
    if binding.layers.len() != cfg.num_hidden_layers {
        return Err(PackError::Mismatch {
            path: out_dir.join(TRUNK_JSON),
            detail: format!(
                "the binding has {} layers but the config has {}",
                binding.layers.len(),
                cfg.num_hidden_layers
            ),
        });
    }
    binding
        .layers
        .iter()
        .map(|lt| match lt.trunk_run() {
            Ok(run) => Ok((run, lt)),
            Err(e) => Err(not_contiguous(ck, lt, e)),
        })
        .collect()
}

/// The writer's error for a layer whose trunk is not one run, naming what sits in the gaps.
fn not_contiguous(ck: &Checkpoint, lt: &LayerTensors, e: NotContiguous) -> PackError {
    let path = |s: usize| {
        ck.shards()
            .get(s)
            .map(|s| s.path().to_path_buf())
            .unwrap_or_default()
    };
    match e {
        NotContiguous::Shards {
            layer,
            first,
            first_shard,
            other,
            other_shard,
        } => PackError::SplitShards {
            layer,
            first,
            first_shard: path(first_shard),
            other,
            other_shard: path(other_shard),
        },
        NotContiguous::Gaps {
            layer,
            shard,
            start,
            end,
            tensor_bytes,
        } => {
            let own: HashSet<&str> = lt.tensors().iter().map(|t| t.name.as_str()).collect();
            let mut intruders: Vec<(u64, String)> = ck
                .iter()
                .filter(|v| v.shard == shard && !own.contains(v.name))
                .filter(|v| v.offset < end && v.offset + v.nbytes() > start)
                .map(|v| (v.offset, v.name.to_string()))
                .collect();
            intruders.sort();
            PackError::Gaps {
                layer,
                shard: path(shard),
                start,
                end,
                tensor_bytes,
                gap_bytes: (end - start).saturating_sub(tensor_bytes),
                intruders: intruders.len(),
                first_intruder: intruders
                    .into_iter()
                    .next()
                    .map(|t| t.1)
                    .unwrap_or_default(),
            }
        }
    }
}

/// Creates `dir` if needed; refuses an existing pack unless overwriting.
pub(super) fn prepare_dir(dir: &Path, overwrite: bool) -> Result<(), PackError> {
    std::fs::create_dir_all(dir).map_err(PackError::io(dir, "create directory"))?;
    let exists = dir.join(TRUNK_JSON).exists() || dir.join(TRUNK_BIN).exists();
    if exists && !overwrite {
        return Err(PackError::Exists { dir: dir.into() });
    }
    Ok(())
}

/// The temporary output files; removed on drop unless committed.
pub(super) struct TmpFiles {
    pub(super) bin: PathBuf,
    pub(super) json: PathBuf,
    committed: bool,
}

impl TmpFiles {
    pub(super) fn new(dir: &Path) -> TmpFiles {
        TmpFiles {
            bin: dir.join(format!("{TRUNK_BIN}.tmp")),
            json: dir.join(format!("{TRUNK_JSON}.tmp")),
            committed: false,
        }
    }

    /// Removes an old `trunk.json` (so no index ever describes the wrong data), then renames
    /// the data file and finally the index into place.
    pub(super) fn commit(mut self, dir: &Path) -> Result<(), PackError> {
        let (bin, json) = (dir.join(TRUNK_BIN), dir.join(TRUNK_JSON));
        if json.exists() {
            std::fs::remove_file(&json).map_err(PackError::io(&json, "remove old"))?;
        }
        std::fs::rename(&self.bin, &bin).map_err(PackError::io(&bin, "rename into place"))?;
        std::fs::rename(&self.json, &json).map_err(PackError::io(&json, "rename into place"))?;
        self.committed = true;
        // Persist the renames; a failure here loses nothing already written.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Drop for TmpFiles {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.bin);
            let _ = std::fs::remove_file(&self.json);
        }
    }
}

/// Copies every run into `bin_path`, returning the layer entries.
fn copy_runs(
    ck: &Checkpoint,
    runs: &[(TrunkRun, &LayerTensors)],
    bin_path: &Path,
    chunk: usize,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<LayerDoc>, PackError> {
    let total: u64 = runs.iter().map(|(r, _)| r.len()).sum();
    let longest = runs.iter().map(|(r, _)| r.len()).max().unwrap_or(0);
    let mut buf = vec![0u8; chunk.min(usize::try_from(longest).unwrap_or(chunk)).max(1)];
    let mut out = File::create(bin_path).map_err(PackError::io(bin_path, "create"))?;
    let (mut pos, mut done) = (0u64, 0u64);
    let mut layers = Vec::with_capacity(runs.len());
    for &(run, lt) in runs {
        pos = pad_to(&mut out, bin_path, pos, ALIGN)?;
        let shard = &ck.shards()[run.shard];
        let hash = copy_one(shard.path(), run, &mut out, bin_path, &mut buf, &mut |n| {
            done += n;
            progress(done, total);
        })?;
        layers.push(layer_doc(lt, run, pos, hash, shard.path()));
        pos += run.len();
    }
    pad_to(&mut out, bin_path, pos, ALIGN)?;
    out.sync_all().map_err(PackError::io(bin_path, "sync"))?;
    Ok(layers)
}

/// Copies one run with chunked reads, returning its XXH3-64.
fn copy_one(
    shard: &Path,
    run: TrunkRun,
    out: &mut File,
    out_path: &Path,
    buf: &mut [u8],
    step: &mut dyn FnMut(u64),
) -> Result<u64, PackError> {
    let mut src = File::open(shard).map_err(PackError::io(shard, "open"))?;
    src.seek(SeekFrom::Start(run.start))
        .map_err(PackError::io(shard, "seek"))?;
    let mut hasher = Xxh3::new();
    let mut left = run.len();
    while left > 0 {
        let n = buf.len().min(usize::try_from(left).unwrap_or(buf.len()));
        src.read_exact(&mut buf[..n])
            .map_err(PackError::io(shard, "read"))?;
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(PackError::io(out_path, "write"))?;
        left -= n as u64;
        step(n as u64);
    }
    Ok(hasher.digest())
}

/// Writes zeros from `pos` up to the next multiple of `align`; returns the new position.
fn pad_to(out: &mut File, path: &Path, pos: u64, align: u64) -> Result<u64, PackError> {
    let to = align_up(pos, align);
    let zeros = vec![0u8; (to - pos) as usize];
    out.write_all(&zeros)
        .map_err(PackError::io(path, "write"))?;
    Ok(to)
}

/// The `trunk.json` entry of one copied layer.
pub(super) fn layer_doc(
    lt: &LayerTensors,
    run: TrunkRun,
    file_off: u64,
    hash: u64,
    shard: &Path,
) -> LayerDoc {
    let tensors: BTreeMap<String, TensorDoc> = lt
        .tensors()
        .into_iter()
        .map(|t| {
            let doc = TensorDoc {
                off: t.offset - run.start,
                nbytes: t.nbytes,
                dtype: t.dtype.name().into(),
                shape: t.shape.clone(),
                stored: None,
            };
            (t.name.clone(), doc)
        })
        .collect();
    LayerDoc {
        layer: lt.layer,
        file_off,
        nbytes: run.len(),
        stored_bytes: None,
        checksum: Some(checksum_string(hash)),
        source_shard: file_name(shard),
        source_offset: run.start,
        tensors,
    }
}

/// A shard's file name (lossy) and length.
pub(super) fn source_shard(path: &Path, bytes: u64) -> SourceShard {
    SourceShard {
        file: file_name(path),
        bytes,
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Writes and syncs the index.
pub(super) fn write_json(path: &Path, doc: &PackDoc) -> Result<(), PackError> {
    let text = serde_json::to_string_pretty(doc).map_err(|e| PackError::Json {
        path: path.into(),
        detail: e.to_string(),
    })?;
    let mut f = File::create(path).map_err(PackError::io(path, "create"))?;
    f.write_all(text.as_bytes())
        .map_err(PackError::io(path, "write"))?;
    f.write_all(b"\n").map_err(PackError::io(path, "write"))?;
    f.sync_all().map_err(PackError::io(path, "sync"))
}
