//! Zero-copy typed views of tensor bytes.
//!
//! Slice views (`as_bf16`, `as_f32`, …) reinterpret the mapped bytes in place and fail with an
//! error, never undefined behaviour, when the dtype differs or the bytes are not aligned for the
//! element type (safetensors does not align data: the upstream `st/` fixture's F32 tensors sit
//! at odd offsets). `to_f32_vec` copies and works at any alignment. Little-endian hosts only.

use crate::dtype::Dtype;
use crate::error::FormatError;
use half::{bf16, f16};
use std::path::Path;

/// One tensor of an indexed checkpoint, borrowing the mapped shard.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// Exact tensor name.
    pub name: &'a str,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions (empty for a rank-0 scalar).
    pub shape: &'a [usize],
    /// The tensor's bytes (`numel × dtype size`).
    pub bytes: &'a [u8],
    /// Shard number within the checkpoint.
    pub shard: usize,
    /// Shard file.
    pub shard_path: &'a Path,
    /// Absolute file offset of the first byte within the shard file.
    pub offset: u64,
}

impl<'a> TensorView<'a> {
    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        // Validated at open: numel × size fits in the file, so the product cannot overflow.
        self.shape.iter().product()
    }

    /// Number of bytes.
    pub fn nbytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Rank (number of dimensions).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The bytes as `bf16` values (dtype must be BF16, data 2-byte aligned).
    pub fn as_bf16(&self) -> Result<&'a [bf16], FormatError> {
        self.cast(Dtype::BF16)
    }

    /// The bytes as `f16` values (dtype must be F16, data 2-byte aligned).
    pub fn as_f16(&self) -> Result<&'a [f16], FormatError> {
        self.cast(Dtype::F16)
    }

    /// The bytes as `f32` values (dtype must be F32, data 4-byte aligned).
    pub fn as_f32(&self) -> Result<&'a [f32], FormatError> {
        self.cast(Dtype::F32)
    }

    /// The bytes of a U8 tensor.
    pub fn as_u8(&self) -> Result<&'a [u8], FormatError> {
        self.cast(Dtype::U8)
    }

    /// Copies the values widened to f32 from BF16, F16, F32 or U8 (any alignment; bf16 → f32
    /// is exact, `bits << 16`). Other dtypes are a [`FormatError::WrongDtype`].
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, FormatError> {
        let b = self.bytes;
        Ok(match self.dtype {
            Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            Dtype::U8 => b.iter().map(|&v| f32::from(v)).collect(),
            _ => return Err(self.wrong("BF16, F16, F32 or U8")),
        })
    }

    fn cast<T: bytemuck::AnyBitPattern>(&self, want: Dtype) -> Result<&'a [T], FormatError> {
        if self.dtype != want {
            return Err(self.wrong(want.name()));
        }
        if self.bytes.is_empty() {
            return Ok(&[]);
        }
        bytemuck::try_cast_slice(self.bytes).map_err(|_| FormatError::Unaligned {
            tensor: self.name.to_string(),
            shard: self.shard_path.to_path_buf(),
            offset: self.offset,
            align: align_of::<T>(),
            dtype: self.dtype,
        })
    }

    fn wrong(&self, wanted: &'static str) -> FormatError {
        FormatError::WrongDtype {
            tensor: self.name.to_string(),
            shard: self.shard_path.to_path_buf(),
            wanted,
            found: self.dtype,
        }
    }
}
