//! Writing safetensors shards: for test models, fixtures and the index benchmark.
//!
//! Tensors are written back to back in the given order, after a JSON header padded with spaces
//! so the data section starts on an 8-byte boundary (so `as_f32`/`as_bf16` views work on
//! written files).

use crate::dtype::Dtype;
use crate::error::FormatError;
use crate::safetensors::byte_size;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

mod rewrite;
pub use rewrite::{copy_rewritten, read_shards, write_shards, ShardDoc, TensorDoc};

/// A tensor to write: name, dtype and shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Exact tensor name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// A spec from parts.
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: &[usize]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// Data bytes, `None` on overflow.
    pub fn nbytes(&self) -> Option<u64> {
        let dims: Vec<u64> = self.shape.iter().map(|&d| d as u64).collect();
        byte_size(self.dtype, &dims)
    }
}

/// The bytes before the data section (`[u64 LE header_len][padded JSON]`) and the data length.
pub fn encode_header(tensors: &[TensorSpec]) -> Result<(Vec<u8>, u64), FormatError> {
    let mut json = String::with_capacity(64 + tensors.len() * 128);
    json.push('{');
    let mut off = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        let n = t.nbytes().ok_or(FormatError::TooLarge {
            what: "tensor byte size",
            value: u64::MAX,
            limit: u64::MAX,
        })?;
        let name = serde_json::to_string(&t.name).unwrap_or_else(|_| "\"\"".into());
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            "{name}:{{\"dtype\":\"{}\",\"shape\":{:?},\"data_offsets\":[{off},{}]}}",
            t.dtype.name(),
            t.shape,
            off + n
        ));
        off += n;
    }
    json.push('}');
    while !(8 + json.len()).is_multiple_of(8) {
        json.push(' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    Ok((out, off))
}

/// Writes a complete shard; `fill(i, spec, buf)` provides tensor `i`'s bytes.
pub fn write_shard(
    path: &Path,
    tensors: &[TensorSpec],
    mut fill: impl FnMut(usize, &TensorSpec, &mut [u8]),
) -> Result<(), FormatError> {
    let io = |e| FormatError::io(path, e);
    let (head, _) = encode_header(tensors)?;
    let mut w = BufWriter::new(File::create(path).map_err(io)?);
    w.write_all(&head).map_err(io)?;
    let mut buf = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        buf.clear();
        buf.resize(t.nbytes().unwrap_or(0) as usize, 0);
        fill(i, t, &mut buf);
        w.write_all(&buf).map_err(io)?;
    }
    w.flush().map_err(io)
}

/// Writes the header and extends the file to its full length without writing data (a sparse
/// file on most filesystems). Returns the file length.
pub fn write_sparse_shard(path: &Path, tensors: &[TensorSpec]) -> Result<u64, FormatError> {
    create_sparse_shard(path, tensors).map(|(_, _, len)| len)
}

/// [`write_sparse_shard`], keeping the file open for writing some tensors' data: returns the
/// file, the header's length (where the data starts) and the file length.
pub fn create_sparse_shard(
    path: &Path,
    tensors: &[TensorSpec],
) -> Result<(File, u64, u64), FormatError> {
    let io = |e| FormatError::io(path, e);
    let (head, data_len) = encode_header(tensors)?;
    let mut f = File::create(path).map_err(io)?;
    f.write_all(&head).map_err(io)?;
    let len = head.len() as u64 + data_len;
    f.set_len(len).map_err(io)?;
    Ok((f, head.len() as u64, len))
}

/// Writes `model.safetensors.index.json` mapping each tensor name to its shard file name.
pub fn write_index<'a>(
    path: &Path,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(), FormatError> {
    let io = |e| FormatError::io(path, e);
    let mut w = BufWriter::new(File::create(path).map_err(io)?);
    w.write_all(b"{\"metadata\":{},\"weight_map\":{")
        .map_err(io)?;
    for (i, (tensor, shard)) in entries.into_iter().enumerate() {
        let t = serde_json::to_string(tensor).unwrap_or_default();
        let s = serde_json::to_string(shard).unwrap_or_default();
        let sep = if i > 0 { "," } else { "" };
        write!(w, "{sep}{t}:{s}").map_err(io)?;
    }
    w.write_all(b"}}").map_err(io)?;
    w.flush().map_err(io)
}
