//! Rewriting a checkpoint: read every shard of a directory into memory (tensors in file
//! order), let the caller change names, shapes, bytes or their order, write it back. Used to
//! derive doctored checkpoints from the tiny fixtures in tests and fuzzing.

use super::{write_index, write_shard, TensorSpec};
use crate::error::FormatError;
use crate::index::{Checkpoint, INDEX_FILE};
use std::path::Path;

/// One tensor of a shard being rewritten: spec plus bytes.
#[derive(Clone, Debug)]
pub struct TensorDoc {
    /// Name, dtype and shape as they will be written.
    pub spec: TensorSpec,
    /// The tensor's bytes (truncated or zero-padded to the spec's size when written).
    pub data: Vec<u8>,
}

/// A shard being rewritten: its file name and its tensors in file order.
#[derive(Clone, Debug)]
pub struct ShardDoc {
    /// File name inside the checkpoint directory.
    pub file: String,
    /// Tensors in the order they will be written.
    pub tensors: Vec<TensorDoc>,
}

/// Reads every shard of the checkpoint in `dir`, tensors in offset order.
pub fn read_shards(dir: &Path) -> Result<Vec<ShardDoc>, FormatError> {
    let ck = Checkpoint::open(dir)?;
    let mut docs = Vec::new();
    for (si, shard) in ck.shards().iter().enumerate() {
        let file = shard
            .path()
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut views: Vec<_> = ck.iter().filter(|v| v.shard == si).collect();
        views.sort_by_key(|v| v.offset);
        let tensors = views
            .iter()
            .map(|v| TensorDoc {
                spec: TensorSpec::new(v.name, v.dtype, v.shape),
                data: v.bytes.to_vec(),
            })
            .collect();
        docs.push(ShardDoc { file, tensors });
    }
    Ok(docs)
}

/// Writes `docs` as shards into `dir`, and, when `index` is set, an index listing exactly what
/// the shards hold (otherwise the directory's index file is left as it is).
pub fn write_shards(dir: &Path, docs: &[ShardDoc], index: bool) -> Result<(), FormatError> {
    let mut entries = Vec::new();
    for d in docs {
        let specs: Vec<TensorSpec> = d.tensors.iter().map(|t| t.spec.clone()).collect();
        write_shard(&dir.join(&d.file), &specs, |i, _, buf| {
            let src = &d.tensors[i].data;
            let n = buf.len().min(src.len());
            buf[..n].copy_from_slice(&src[..n]);
        })?;
        entries.extend(specs.iter().map(|s| (s.name.clone(), d.file.clone())));
    }
    if index {
        let listed = entries.iter().map(|(t, s)| (t.as_str(), s.as_str()));
        write_index(&dir.join(INDEX_FILE), listed)?;
    }
    Ok(())
}

/// Copies every file of the checkpoint in `src` to `dst`, then rewrites the shards through
/// `edit` (the index is rewritten to match what the shards hold).
pub fn copy_rewritten(
    src: &Path,
    dst: &Path,
    edit: impl FnOnce(&mut Vec<ShardDoc>),
) -> Result<(), FormatError> {
    std::fs::create_dir_all(dst).map_err(|e| FormatError::io(dst, e))?;
    let entries = std::fs::read_dir(src).map_err(|e| FormatError::io(src, e))?;
    for entry in entries {
        let p = entry.map_err(|e| FormatError::io(src, e))?.path();
        if let Some(name) = p.file_name() {
            std::fs::copy(&p, dst.join(name)).map_err(|e| FormatError::io(&p, e))?;
        }
    }
    let mut docs = read_shards(src)?;
    edit(&mut docs);
    write_shards(dst, &docs, true)
}
