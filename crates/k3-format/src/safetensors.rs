//! One safetensors shard: `[u64 LE header_len][JSON header][data]` (docs/MODEL.md#safetensors-shards), parsed and
//! checked for integrity before anything is indexed.
//!
//! Checks, in order: the file holds the 8-byte prefix; the header fits in the file (any
//! 64-bit value, including 2^64−1, is compared without overflow or allocation); the header is
//! UTF-8 and well-formed JSON; every tensor entry has a string `dtype`, a `shape` of
//! non-negative integers and a two-number `data_offsets` (a defect there is reported as
//! [`FormatError::TensorEntry`], naming the tensor); every dtype is known; every `data_offsets` has start ≤ end; the
//! `dtype × shape` byte size (overflow-checked) equals the span; no two tensors overlap; and the
//! data section ends exactly at the largest end offset (bytes after it are refused as
//! [`FormatError::TrailingBytes`], as the reference library does). A header whose tensors tile the data section
//! without holes but end after the end of the file is reported as [`FormatError::Truncated`]
//! (a partial download); a header with holes that points past the end is reported as
//! [`FormatError::OffsetsOutOfRange`] (the header itself is suspect).

use crate::dtype::Dtype;
use crate::error::FormatError;
use crate::header::{self, DtypeTok, HeaderError, RawHeader};
use std::path::Path;

/// A parsed and validated header of one shard, borrowing names from the file bytes.
#[derive(Debug)]
pub struct ShardHeader<'a> {
    header_len: u64,
    file_len: u64,
    raw: RawHeader<'a>,
    dtypes: Vec<Dtype>,
}

/// One tensor of a [`ShardHeader`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderTensor<'h> {
    /// Tensor name (JSON escapes resolved).
    pub name: &'h str,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions; empty for a rank-0 scalar.
    pub shape: &'h [u64],
    /// Start of the data, relative to the data section.
    pub start: u64,
    /// End of the data (exclusive), relative to the data section.
    pub end: u64,
    /// Absolute file offset of the first byte (`8 + header_len + start`).
    pub offset: u64,
}

impl<'a> ShardHeader<'a> {
    /// Parses and validates `bytes`, the whole content of the shard file `shard` (the path is
    /// used only in error messages). Never panics, whatever the bytes.
    pub fn parse(shard: &Path, bytes: &'a [u8]) -> Result<Self, FormatError> {
        let file_len = bytes.len() as u64;
        let Some((prefix, rest)) = bytes.split_first_chunk::<8>() else {
            return Err(FormatError::ShortFile {
                shard: shard.into(),
                len: file_len,
            });
        };
        let header_len = u64::from_le_bytes(*prefix);
        let max = file_len - 8;
        if header_len > max {
            return Err(FormatError::HeaderBeyondFile {
                shard: shard.into(),
                header_len,
                file_len,
                max,
            });
        }
        // header_len <= rest.len(), so it fits in usize.
        let header_bytes = &rest[..header_len as usize];
        let text = std::str::from_utf8(header_bytes).map_err(|e| FormatError::NonUtf8Header {
            shard: shard.into(),
            header_len,
            offset: e.valid_up_to() as u64,
            file_offset: 8 + e.valid_up_to() as u64,
        })?;
        let raw = header::parse(text).map_err(|e| match e {
            HeaderError::Json(e) => FormatError::MalformedHeader {
                shard: shard.into(),
                header_len,
                detail: e.to_string(),
            },
            HeaderError::Tensor { name, detail } => FormatError::TensorEntry {
                shard: shard.into(),
                tensor: name,
                detail,
            },
        })?;
        let dtypes = check_entries(shard, &raw)?;
        check_layout(shard, &raw, header_len, file_len)?;
        Ok(ShardHeader {
            header_len,
            file_len,
            raw,
            dtypes,
        })
    }

    /// Length of the JSON header in bytes.
    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// Absolute file offset of the data section (`8 + header_len`).
    pub fn data_start(&self) -> u64 {
        8 + self.header_len
    }

    /// Length of the whole file.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Number of tensors (`__metadata__` excluded).
    pub fn len(&self) -> usize {
        self.raw.entries.len()
    }

    /// Whether the header lists no tensor.
    pub fn is_empty(&self) -> bool {
        self.raw.entries.is_empty()
    }

    /// Tensor `i` in header order (`i < len()`).
    pub fn tensor(&self, i: usize) -> HeaderTensor<'_> {
        let e = &self.raw.entries[i];
        HeaderTensor {
            name: &e.name,
            dtype: self.dtypes[i],
            shape: self.raw.shape(e),
            start: e.start,
            end: e.end,
            offset: self.data_start() + e.start,
        }
    }

    /// Every tensor in header order.
    pub fn iter(&self) -> impl Iterator<Item = HeaderTensor<'_>> + '_ {
        (0..self.len()).map(move |i| self.tensor(i))
    }
}

/// Byte size of `shape` elements of `dtype`, `None` on 64-bit overflow.
pub fn byte_size(dtype: Dtype, shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
}

/// Per-entry checks: dtype known, start ≤ end, size matches span. Returns the dtypes.
fn check_entries(shard: &Path, raw: &RawHeader<'_>) -> Result<Vec<Dtype>, FormatError> {
    let mut dtypes = Vec::with_capacity(raw.entries.len());
    for e in &raw.entries {
        let dtype = match &e.dtype {
            DtypeTok::Known(d) => *d,
            DtypeTok::Unknown(s) => {
                return Err(FormatError::UnknownDtype {
                    shard: shard.into(),
                    tensor: e.name.to_string(),
                    dtype: s.to_string(),
                })
            }
        };
        if e.start > e.end {
            return Err(FormatError::OffsetsReversed {
                shard: shard.into(),
                tensor: e.name.to_string(),
                start: e.start,
                end: e.end,
            });
        }
        let shape = raw.shape(e);
        let Some(expected) = byte_size(dtype, shape) else {
            return Err(FormatError::ShapeOverflow {
                shard: shard.into(),
                tensor: e.name.to_string(),
                dtype,
                shape: shape.to_vec(),
                elem: dtype.size(),
            });
        };
        let span = e.end - e.start;
        if expected != span {
            return Err(FormatError::SizeMismatch {
                shard: shard.into(),
                tensor: e.name.to_string(),
                dtype,
                shape: shape.to_vec(),
                expected,
                start: e.start,
                end: e.end,
                span,
            });
        }
        dtypes.push(dtype);
    }
    Ok(dtypes)
}

/// Layout checks: no overlaps, data present up to the largest end offset.
fn check_layout(
    shard: &Path,
    raw: &RawHeader<'_>,
    header_len: u64,
    file_len: u64,
) -> Result<(), FormatError> {
    let mut spans: Vec<(u64, u64, usize)> = raw
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.end > e.start)
        .map(|(i, e)| (e.start, e.end, i))
        .collect();
    spans.sort_unstable();
    check_overlaps(shard, raw, &spans)?;
    // Whether the non-empty tensors tile [0, tile_end) with no hole.
    let mut tile_end = 0u64;
    let mut gapless = true;
    for &(s, e, _) in &spans {
        gapless &= s == tile_end;
        tile_end = e;
    }
    let last = raw.entries.iter().enumerate().max_by_key(|(_, e)| e.end);
    let data_len = file_len - 8 - header_len;
    let data_end = last.map_or(0, |(_, e)| e.end);
    if data_end < data_len {
        let expected_len = 8 + header_len + data_end;
        return Err(FormatError::TrailingBytes {
            shard: shard.into(),
            expected_len,
            file_len,
            extra: file_len - expected_len,
        });
    }
    let Some((last, e)) = last else { return Ok(()) };
    if e.end <= data_len {
        return Ok(());
    }
    let name = raw.entries[last].name.to_string();
    if gapless && e.end == tile_end {
        let expected_len = (8 + header_len).saturating_add(e.end);
        return Err(FormatError::Truncated {
            shard: shard.into(),
            expected_len,
            file_len,
            missing: expected_len - file_len,
            last_tensor: name,
            data_end: e.end,
        });
    }
    Err(FormatError::OffsetsOutOfRange {
        shard: shard.into(),
        tensor: name,
        end: e.end,
        data_len,
        header_len,
        file_len,
    })
}

/// `spans` sorted by start: any overlap shows between neighbours.
fn check_overlaps(
    shard: &Path,
    raw: &RawHeader<'_>,
    spans: &[(u64, u64, usize)],
) -> Result<(), FormatError> {
    for w in spans.windows(2) {
        let ((s0, e0, i0), (s1, e1, i1)) = (w[0], w[1]);
        if s1 < e0 && raw.entries[i0].name == raw.entries[i1].name {
            // One name listed twice at overlapping offsets: a duplicate, not two tensors.
            return Err(FormatError::DuplicateTensor {
                tensor: raw.entries[i0].name.to_string(),
                first: shard.into(),
                second: shard.into(),
            });
        }
        if s1 < e0 {
            return Err(FormatError::OffsetsOverlap {
                shard: shard.into(),
                first: raw.entries[i0].name.to_string(),
                first_start: s0,
                first_end: e0,
                second: raw.entries[i1].name.to_string(),
                second_start: s1,
                second_end: e1,
                overlap: e0.min(e1) - s1,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::{encode_header, TensorSpec};

    fn shard(extra: usize) -> Vec<u8> {
        let (mut b, data) = encode_header(&[TensorSpec::new("a", Dtype::F32, &[2])]).unwrap();
        b.resize(b.len() + data as usize + extra, 7);
        b
    }

    /// Regression (found by `cargo xtask fuzz safetensors`): bytes after the data
    /// section used to be accepted; they are refused naming the shard and both lengths.
    #[test]
    fn trailing_bytes_are_refused_with_counts() {
        assert!(ShardHeader::parse(Path::new("s.safetensors"), &shard(0)).is_ok());
        let b = shard(5);
        let err = ShardHeader::parse(Path::new("s.safetensors"), &b).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, FormatError::TrailingBytes { extra: 5, .. }),
            "{msg}"
        );
        assert!(msg.starts_with("s.safetensors: 5 extra bytes"), "{msg}");
        assert!(
            msg.contains(&format!("file has {} bytes", b.len())) && msg.contains("re-download")
        );
        // A header with no tensors must be followed by nothing either.
        let (mut empty, _) = encode_header(&[]).unwrap();
        assert!(ShardHeader::parse(Path::new("e"), &empty).is_ok());
        empty.push(0);
        assert!(ShardHeader::parse(Path::new("e"), &empty).is_err());
    }
}
