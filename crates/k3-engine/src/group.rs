//! Opening a model as one rank of a group (docs/DISTRIBUTED.md#faults): every rank must
//! open the same checkpoint with the same config, checked once at open by fingerprint, and
//! run the same numeric mode (`--numerics`, docs/NUMERICS.md#numeric-mode-fast).

use crate::EngineError;
use k3_kernels::fast::Numerics;
use k3_model::Comm;
use std::path::Path;
use xxhash_rust::xxh3::Xxh3;

/// XXH3 of `config.json`'s bytes and every file's name and length in `dir` (sorted by name):
/// a different config, a different shard set or a shard of another size changes it.
fn fingerprint(dir: &Path) -> Result<u64, EngineError> {
    let io = |path: &Path, e: std::io::Error| EngineError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let config = dir.join("config.json");
    let mut h = Xxh3::new();
    h.update(&std::fs::read(&config).map_err(|e| io(&config, e))?);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        let meta = entry.metadata().map_err(|e| io(&entry.path(), e))?;
        if meta.is_file() {
            files.push((entry.file_name(), meta.len()));
        }
    }
    files.sort();
    for (name, len) in files {
        h.update(name.as_encoded_bytes());
        h.update(&len.to_le_bytes());
    }
    Ok(h.digest())
}

/// Refuses to start unless every rank's model directory has rank 0's fingerprint and every
/// rank runs rank 0's numeric mode; every rank sees every fingerprint and mode, so every rank
/// refuses alike, naming the ranks that differ.
pub(crate) fn check_same_model(dir: &Path, comm: &dyn Comm) -> Result<(), EngineError> {
    let mine = fingerprint(dir);
    // A rank that cannot read its directory still takes part (0 never matches a digest of
    // real bytes in practice), then reports its own error.
    let gather = |v: u64| comm.allgather_u64(v).map_err(k3_model::ModelError::from);
    let all = gather(*mine.as_ref().unwrap_or(&0))?;
    let modes = gather(u64::from(k3_kernels::fast::numerics().code()))?;
    mine?;
    let differ: Vec<String> = (1..all.len())
        .filter(|&q| all[q] != all[0])
        .map(|q| format!("rank {q}"))
        .collect();
    if !differ.is_empty() {
        return Err(EngineError::Invalid(format!(
            "{}: {} opened a different checkpoint or config than rank 0 (fingerprint of config.json and the file list): every rank must open the same model",
            dir.display(),
            differ.join(", ")
        )));
    }
    match other_modes(&modes) {
        Some(why) => Err(EngineError::Invalid(format!("{}: {why}", dir.display()))),
        None => Ok(()),
    }
}

/// The refusal when a rank's numeric mode (a [`Numerics::code`] per rank) is not rank 0's.
fn other_modes(codes: &[u64]) -> Option<String> {
    let name = |c: u64| Numerics::from_code(c as u8).name();
    let differ: Vec<String> = (1..codes.len())
        .filter(|&q| codes[q] != codes[0])
        .map(|q| format!("rank {q} runs numeric mode {}", name(codes[q])))
        .collect();
    (!differ.is_empty()).then(|| {
        format!(
            "{}, rank 0 {}: every rank must run the same --numerics",
            differ.join(", "),
            name(codes[0])
        )
    })
}

#[cfg(test)]
mod tests {
    use super::other_modes;

    #[test]
    fn a_rank_in_another_numeric_mode_is_named() {
        assert_eq!(other_modes(&[0, 0, 0]), None);
        assert_eq!(other_modes(&[3, 3]), None);
        assert_eq!(
            other_modes(&[0, 3, 0, 2]).as_deref(),
            Some("rank 1 runs numeric mode fast, rank 3 runs numeric mode amx-bf16x2, rank 0 v2: every rank must run the same --numerics")
        );
    }
}
