//! Errors of writing, opening and checking a packed trunk.

use std::path::PathBuf;

/// What to tell the user when a pack must be rebuilt.
const REPACK: &str = "re-run `k3 pack MODEL_DIR PACK_DIR --overwrite` (with `--draft-quant q8|mxfp4` for a draft trunk)";

/// Failure to write, open, match or verify a packed trunk (`trunk.bin` + `trunk.json`).
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// An operating-system error on a named file or directory.
    #[error("{path}: {what}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// What was being done (`"read"`, `"create"`, …).
        what: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },

    /// The output directory already holds a pack and overwriting was not asked for.
    #[error("{dir} already holds a packed trunk (trunk.json or trunk.bin): pass --overwrite to replace it, or choose another directory")]
    Exists {
        /// The output directory.
        dir: PathBuf,
    },

    /// A layer's trunk tensors are split over shards, so no single run can be copied.
    #[error("layer {layer}: trunk tensor {first:?} is in {first_shard} but {other:?} is in {other_shard}: this checkpoint cannot be packed verbatim; stream its trunk from the shards instead (no --trunk)")]
    SplitShards {
        /// Layer index.
        layer: usize,
        /// A tensor in the first shard.
        first: String,
        /// That shard file.
        first_shard: PathBuf,
        /// A tensor in another shard.
        other: String,
        /// That shard file.
        other_shard: PathBuf,
    },

    /// A layer's trunk tensors do not tile their span: other bytes sit between them.
    #[error("layer {layer}: trunk tensors span [{start}, {end}) of {shard} ({} bytes) but total {tensor_bytes} bytes: {gap_bytes} bytes in between belong to {intruders} other tensor(s) (first: {first_intruder:?}) or padding; this checkpoint cannot be packed verbatim; stream its trunk from the shards instead (no --trunk)", end - start)]
    Gaps {
        /// Layer index.
        layer: usize,
        /// The shard file.
        shard: PathBuf,
        /// Span start (absolute shard offset).
        start: u64,
        /// Span end.
        end: u64,
        /// Sum of the layer's trunk tensor sizes.
        tensor_bytes: u64,
        /// `end - start - tensor_bytes`.
        gap_bytes: u64,
        /// How many other tensors overlap the span.
        intruders: usize,
        /// The lowest-offset one (empty when only padding).
        first_intruder: String,
    },

    /// The directory holds no `trunk.json`.
    #[error("{dir}: no trunk.json{}: run `k3 pack MODEL_DIR {}` first", if *interrupted { " (but trunk.*.tmp files: a `k3 pack` was interrupted)" } else { "" }, dir.display())]
    NoPack {
        /// The directory looked in.
        dir: PathBuf,
        /// Temporary files of an unfinished pack are present.
        interrupted: bool,
    },

    /// `trunk.json` is not valid JSON or lacks a required field.
    #[error("{path}: not a k3 trunk pack index: {detail}; {REPACK}")]
    Json {
        /// The `trunk.json` file.
        path: PathBuf,
        /// The parser's message (with line and column).
        detail: String,
    },

    /// `trunk.json` has layers without a checksum: a trunk packed by upstream's packer, which
    /// writes none (docs/FORMATS.md#adopting-an-upstream-pack).
    #[error("{path}: {layers} of {of} layers have no \"checksum\": this trunk was packed by another packer (upstream's writes none); adopt it with `k3 pack MODEL_DIR --adopt {}`, which checks every layer against the checkpoint and adds the checksums", path.parent().map(|d| d.display().to_string()).unwrap_or_default())]
    NoChecksums {
        /// The `trunk.json` file.
        path: PathBuf,
        /// Layers without a checksum.
        layers: usize,
        /// Layers in all.
        of: usize,
    },

    /// An index to adopt is not in upstream's format (or is not JSON).
    #[error("{path}: not a trunk index as upstream's packer writes it ({{\"align\", \"layers\": [{{\"file_off\", \"nbytes\", \"tensors\": {{NAME: {{\"off\", \"nbytes\", \"dtype\"}}}}}}]}}): {detail}; nothing was adopted: pack the trunk with `k3 pack MODEL_DIR PACK_DIR` instead")]
    UpstreamJson {
        /// The `trunk.json` file.
        path: PathBuf,
        /// The parser's message (with line and column).
        detail: String,
    },

    /// A pack to adopt does not describe the checkpoint (a layer missing, a tensor at another
    /// offset, a run of another length, non-zero padding).
    #[error("{path}: {detail}; nothing was adopted: the pack was made from another model or download, or is damaged: pack this checkpoint's trunk with `k3 pack MODEL_DIR PACK_DIR` instead")]
    NotAdopted {
        /// The `trunk.json` (or `trunk.bin`) file.
        path: PathBuf,
        /// What differs, naming the layer (and tensor or byte).
        detail: String,
    },

    /// A layer of an adopted pack differs from the checkpoint's bytes.
    #[error("{path}: layer {layer} differs from the checkpoint at byte {at} of its {nbytes}-byte run (tensor {tensor:?}; the checkpoint's copy is {shard} at offset {shard_off}): the pack is corrupt or was made from another download; nothing was adopted: {REPACK}")]
    Differs {
        /// The `trunk.bin` file.
        path: PathBuf,
        /// Layer index.
        layer: usize,
        /// Run length.
        nbytes: u64,
        /// Offset of the first differing byte inside the run.
        at: u64,
        /// The tensor holding that byte (empty when between tensors).
        tensor: String,
        /// The shard file the layer's run is in.
        shard: PathBuf,
        /// Absolute shard offset of the differing byte.
        shard_off: u64,
    },

    /// `trunk.json` parses but its contents are inconsistent.
    #[error("{path}: {detail}; {REPACK}")]
    Invalid {
        /// The `trunk.json` file.
        path: PathBuf,
        /// What is wrong, with the numbers.
        detail: String,
    },

    /// `trunk.bin` is shorter than a layer's run.
    #[error("{path}: layer {layer} needs bytes [{file_off}, {end}) ({nbytes} bytes) but the file is {file_len} bytes ({missing} bytes missing): truncated copy; {REPACK}")]
    Truncated {
        /// The `trunk.bin` file.
        path: PathBuf,
        /// The first layer that does not fit.
        layer: usize,
        /// Its offset in the file.
        file_off: u64,
        /// Its run length.
        nbytes: u64,
        /// `file_off + nbytes`.
        end: u64,
        /// Actual file length.
        file_len: u64,
        /// `end - file_len`.
        missing: u64,
    },

    /// The pack was made from another checkpoint (or an older download of this one).
    #[error("{path} does not match this checkpoint: {detail}; the pack was made from another model or an older download: {REPACK}")]
    Mismatch {
        /// The `trunk.json` file.
        path: PathBuf,
        /// The first difference found.
        detail: String,
    },

    /// A layer's bytes in `trunk.bin` do not hash to the recorded checksum.
    #[error("{path}: layer {layer} (bytes [{file_off}, {}), {nbytes} bytes) has checksum {found} but trunk.json records {expected}: the file is corrupt; {REPACK}", file_off + nbytes)]
    Checksum {
        /// The `trunk.bin` file.
        path: PathBuf,
        /// Layer index.
        layer: usize,
        /// Its offset in the file.
        file_off: u64,
        /// Its run length.
        nbytes: u64,
        /// Recorded checksum (`algo:hex`).
        expected: String,
        /// Computed checksum (`algo:hex`).
        found: String,
    },
    /// A chunk of a compressed layer is damaged (its stored bytes do not hash to the index's
    /// value, or do not decode): refused before any of it becomes weights.
    #[error("{path}: layer {layer}, tensor {tensor:?}, chunk {chunk} (bytes [{file_off}, {}) of trunk.bin): {detail}: the file is corrupt; {REPACK}", file_off + len)]
    Chunk {
        /// The `trunk.bin` file.
        path: PathBuf,
        /// Layer index.
        layer: usize,
        /// Tensor name.
        tensor: String,
        /// Chunk index within the tensor.
        chunk: usize,
        /// Absolute offset of the chunk in `trunk.bin`.
        file_off: u64,
        /// Stored length of the chunk.
        len: u64,
        /// What is wrong.
        detail: String,
    },
}

impl PackError {
    /// An [`PackError::Io`] builder for `map_err`.
    pub(crate) fn io(
        path: impl Into<PathBuf>,
        what: &'static str,
    ) -> impl FnOnce(std::io::Error) -> PackError {
        let path = path.into();
        move |source| PackError::Io { path, what, source }
    }
}
