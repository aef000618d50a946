//! Errors of the safetensors shard index and the typed tensor views.
//!
//! Every integrity failure is its own variant, and every message names the shard file (or index
//! file) and the numbers involved, then says what to do about it.

use crate::dtype::Dtype;
use std::path::PathBuf;

/// Failure to open, index or read a safetensors checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// An operating-system error on a named file or directory.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// The directory holds no `*.safetensors` file and no index.
    #[error("{dir}: no *.safetensors shards and no model.safetensors.index.json: point at the checkpoint directory")]
    NoShards {
        /// The directory searched.
        dir: PathBuf,
    },

    /// The file is too short to hold even the 8-byte header length.
    #[error("{shard}: file is {len} bytes, shorter than the 8-byte header length: truncated, re-download")]
    ShortFile {
        /// The shard file.
        shard: PathBuf,
        /// Its length in bytes.
        len: u64,
    },

    /// The header length prefix points past the end of the file.
    #[error("{shard}: header length {header_len} does not fit in the {file_len}-byte file (at most {max} bytes of header are possible): not a safetensors file, or truncated; re-download")]
    HeaderBeyondFile {
        /// The shard file.
        shard: PathBuf,
        /// The 64-bit little-endian header length read from the first 8 bytes.
        header_len: u64,
        /// The file length.
        file_len: u64,
        /// `file_len - 8`.
        max: u64,
    },

    /// The JSON header is not valid UTF-8.
    #[error("{shard}: JSON header ({header_len} bytes) is not UTF-8: invalid byte at header offset {offset} (file offset {file_offset}): corrupt shard, re-download")]
    NonUtf8Header {
        /// The shard file.
        shard: PathBuf,
        /// Header length in bytes.
        header_len: u64,
        /// Offset of the first invalid byte within the header.
        offset: u64,
        /// The same position as a file offset.
        file_offset: u64,
    },

    /// The JSON header does not parse, or is not an object of tensor entries.
    #[error(
        "{shard}: malformed JSON header ({header_len} bytes): {detail}: corrupt shard, re-download"
    )]
    MalformedHeader {
        /// The shard file.
        shard: PathBuf,
        /// Header length in bytes.
        header_len: u64,
        /// What the JSON parser reported (with line and column).
        detail: String,
    },

    /// One tensor's entry is malformed: a field missing, repeated, of the wrong type, or a
    /// negative or fractional number.
    #[error("{shard}: tensor {tensor:?}: {detail}: corrupt header, re-download")]
    TensorEntry {
        /// The shard file.
        shard: PathBuf,
        /// The tensor name.
        tensor: String,
        /// What is wrong, naming the field.
        detail: String,
    },

    /// A tensor uses a dtype string this reader does not know.
    #[error("{shard}: tensor {tensor:?}: unknown dtype {dtype:?} (known: BF16 F16 F32 F64 U8 I8 U16 I16 U32 I32 U64 I64 BOOL F8_E4M3 F8_E5M2 F8_E8M0)")]
    UnknownDtype {
        /// The shard file.
        shard: PathBuf,
        /// The tensor name.
        tensor: String,
        /// The dtype string as written.
        dtype: String,
    },

    /// `data_offsets` has `start > end`.
    #[error("{shard}: tensor {tensor:?} has data_offsets [{start}, {end}] with start > end: corrupt header, re-download")]
    OffsetsReversed {
        /// The shard file.
        shard: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Declared start (relative to the data section).
        start: u64,
        /// Declared end.
        end: u64,
    },

    /// `dtype × shape` does not fit in 64 bits.
    #[error("{shard}: tensor {tensor:?} {dtype} shape {shape:?}: element count times {elem} bytes overflows 64 bits: corrupt header")]
    ShapeOverflow {
        /// The shard file.
        shard: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Declared dtype.
        dtype: Dtype,
        /// Declared shape.
        shape: Vec<u64>,
        /// Bytes per element.
        elem: usize,
    },

    /// `dtype × shape` bytes differ from the `data_offsets` span.
    #[error("{shard}: tensor {tensor:?} {dtype} shape {shape:?} needs {expected} bytes but data_offsets [{start}, {end}] span {span} bytes: corrupt header, re-download")]
    SizeMismatch {
        /// The shard file.
        shard: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Declared dtype.
        dtype: Dtype,
        /// Declared shape.
        shape: Vec<u64>,
        /// `numel × dtype size`.
        expected: u64,
        /// Declared start.
        start: u64,
        /// Declared end.
        end: u64,
        /// `end - start`.
        span: u64,
    },

    /// Two tensors' byte ranges overlap.
    #[error("{shard}: tensors {first:?} [{first_start}, {first_end}] and {second:?} [{second_start}, {second_end}] overlap by {overlap} bytes: corrupt header, re-download")]
    OffsetsOverlap {
        /// The shard file.
        shard: PathBuf,
        /// The tensor that starts first.
        first: String,
        /// Its start.
        first_start: u64,
        /// Its end.
        first_end: u64,
        /// The overlapping tensor.
        second: String,
        /// Its start.
        second_start: u64,
        /// Its end.
        second_end: u64,
        /// Bytes shared by both.
        overlap: u64,
    },

    /// A tensor ends beyond the data section although the header's layout has holes, so the
    /// header itself is inconsistent (see [`FormatError::Truncated`] for a short file).
    #[error("{shard}: tensor {tensor:?} data_offsets end {end} is beyond the {data_len}-byte data section (header {header_len} bytes, file {file_len} bytes): corrupt header or truncated file, re-download")]
    OffsetsOutOfRange {
        /// The shard file.
        shard: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Declared end.
        end: u64,
        /// Bytes after the header in the file.
        data_len: u64,
        /// Header length.
        header_len: u64,
        /// File length.
        file_len: u64,
    },

    /// The header describes a consistent layout that ends after the end of the file: a partial
    /// download. Upstream silently reads garbage here; k3 refuses.
    #[error("{shard}: truncated, re-download: the header declares {expected_len} bytes but the file has {file_len} ({missing} bytes missing; last tensor {last_tensor:?} ends at data offset {data_end})")]
    Truncated {
        /// The shard file.
        shard: PathBuf,
        /// `8 + header_len + data end` as declared.
        expected_len: u64,
        /// Actual file length.
        file_len: u64,
        /// `expected_len - file_len`.
        missing: u64,
        /// The tensor with the largest end offset.
        last_tensor: String,
        /// Its end offset relative to the data section.
        data_end: u64,
    },

    /// Bytes after the end of the data the header describes: appended, mis-copied or the
    /// wrong file. Never read as weights, but refused (as the reference safetensors library
    /// refuses a data buffer the header does not cover exactly).
    #[error("{shard}: {extra} extra bytes after the data, re-download: the header's data ends at file offset {expected_len} but the file has {file_len} bytes (appended or mis-copied data, or the wrong file)")]
    TrailingBytes {
        /// The shard file.
        shard: PathBuf,
        /// `8 + header_len + data end` as declared.
        expected_len: u64,
        /// Actual file length.
        file_len: u64,
        /// `file_len - expected_len`.
        extra: u64,
    },

    /// The same tensor name appears twice (in two shards, or twice in one header).
    #[error("tensor {tensor:?} appears in both {first} and {second}: duplicate tensor names make lookup ambiguous; remove the stray shard")]
    DuplicateTensor {
        /// The tensor name.
        tensor: String,
        /// Where it was seen first.
        first: PathBuf,
        /// Where it was seen again.
        second: PathBuf,
    },

    /// `model.safetensors.index.json` is not valid JSON or has no `weight_map` object.
    #[error("{index}: malformed index: {detail}: re-download model.safetensors.index.json")]
    IndexMalformed {
        /// The index file.
        index: PathBuf,
        /// What is wrong.
        detail: String,
    },

    /// The index names a shard path that leaves the checkpoint directory.
    #[error("{index}: tensor {tensor:?} maps to shard path {shard:?}, which is absolute or leaves the checkpoint directory: refusing to open it")]
    IndexBadShardPath {
        /// The index file.
        index: PathBuf,
        /// The tensor whose entry is bad.
        tensor: String,
        /// The path as written.
        shard: String,
    },

    /// Shards named in the index are not on disk.
    #[error("{index}: {count} shard file(s) named in weight_map are missing on disk: {names}: incomplete download, re-download them")]
    ShardMissing {
        /// The index file.
        index: PathBuf,
        /// How many are missing.
        count: usize,
        /// The first few missing paths, comma separated.
        names: String,
    },

    /// A tensor listed in the index is not in the shard the index assigns it to.
    #[error("{index}: tensor {tensor:?} is listed in weight_map under {shard} but that shard's header does not contain it{found}: index and shards disagree, re-download")]
    TensorMissingFromShard {
        /// The index file.
        index: PathBuf,
        /// The tensor name.
        tensor: String,
        /// The shard the index names.
        shard: PathBuf,
        /// `" (it is in <other shard>)"` when found elsewhere, else empty.
        found: String,
    },

    /// More shards or more name bytes than the compact index can address.
    #[error("{what}: {value} exceeds the index limit {limit}")]
    TooLarge {
        /// What overflowed.
        what: &'static str,
        /// The value reached.
        value: u64,
        /// The limit.
        limit: u64,
    },

    /// Lookup of a name that no shard holds.
    #[error("tensor {tensor:?} is not in the checkpoint ({count} tensors in {shards} shards)")]
    TensorNotFound {
        /// The name looked up.
        tensor: String,
        /// Tensors indexed.
        count: usize,
        /// Shards indexed.
        shards: usize,
    },

    /// A typed view was requested for a tensor of another dtype.
    #[error("tensor {tensor:?} in {shard} is {found}, not {wanted}")]
    WrongDtype {
        /// The tensor name.
        tensor: String,
        /// Its shard.
        shard: PathBuf,
        /// The dtype asked for.
        wanted: &'static str,
        /// The dtype it has.
        found: Dtype,
    },

    /// A typed slice view is impossible because the bytes are not aligned for the element type.
    #[error("tensor {tensor:?} in {shard} at file offset {offset} is not {align}-byte aligned for a {dtype} slice view: use to_f32_vec() (copies) instead")]
    Unaligned {
        /// The tensor name.
        tensor: String,
        /// Its shard.
        shard: PathBuf,
        /// Absolute file offset of its data.
        offset: u64,
        /// Required alignment.
        align: usize,
        /// Its dtype.
        dtype: Dtype,
    },
}

impl FormatError {
    /// Wraps an I/O error with the path it concerns.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io {
            path: path.into(),
            source,
        }
    }
}
