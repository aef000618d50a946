//! The weight matrix type: a row-major `[rows][cols]` matrix in one of four storages, its
//! shape checks and its rows in kernel form. The products over it live in [`super`]; the
//! kernels below them take this type, so it imports only leaves.

use crate::dot::def::q8_finish;
use crate::mxfp4::GROUP;
use crate::simd::layout::Row;
use half::bf16;

/// Storage of a weight matrix.
#[derive(Clone, Copy, Debug)]
pub enum MatrixData<'a> {
    /// bf16, widened inside the dot product.
    Bf16(&'a [bf16]),
    /// f32.
    F32(&'a [f32]),
    /// MXFP4: `packed` `[rows][cols/2]`, `scales` `[rows][cols/32]` (E8M0).
    Mxfp4 { packed: &'a [u8], scales: &'a [u8] },
    /// Per-row int8: `values` `[rows][cols]`, one f32 `scales[r]` per row; row `r` is
    /// `scales[r] · values[r]` (docs/NUMERICS.md#q8-rows).
    Q8 { values: &'a [i8], scales: &'a [f32] },
}

/// A borrowed row-major weight matrix: `y = W·x` means `y[o] = Σ_i W[o][i]·x[i]`.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: MatrixData<'a>,
}

impl<'a> Matrix<'a> {
    /// A bf16 matrix; `None` when the length disagrees with the shape.
    pub fn bf16(rows: usize, cols: usize, data: &'a [bf16]) -> Option<Self> {
        (data.len() == rows.checked_mul(cols)?).then_some(Matrix {
            rows,
            cols,
            data: MatrixData::Bf16(data),
        })
    }
    /// An f32 matrix; `None` when the length disagrees with the shape.
    pub fn f32(rows: usize, cols: usize, data: &'a [f32]) -> Option<Self> {
        (data.len() == rows.checked_mul(cols)?).then_some(Matrix {
            rows,
            cols,
            data: MatrixData::F32(data),
        })
    }
    /// An MXFP4 matrix; `None` unless `cols % 32 == 0` and both lengths match the shape.
    pub fn mxfp4(rows: usize, cols: usize, packed: &'a [u8], scales: &'a [u8]) -> Option<Self> {
        let ok = cols.is_multiple_of(GROUP)
            && packed.len() == rows.checked_mul(cols / 2)?
            && scales.len() == rows.checked_mul(cols / GROUP)?;
        ok.then_some(Matrix {
            rows,
            cols,
            data: MatrixData::Mxfp4 { packed, scales },
        })
    }
    /// A Q8 matrix (`values` `[rows][cols]`, `scales` `[rows]`); `None` when a length
    /// disagrees with the shape.
    pub fn q8(rows: usize, cols: usize, values: &'a [i8], scales: &'a [f32]) -> Option<Self> {
        let ok = values.len() == rows.checked_mul(cols)? && scales.len() == rows;
        ok.then_some(Matrix {
            rows,
            cols,
            data: MatrixData::Q8 { values, scales },
        })
    }

    /// Rows `r0 .. r0 + n` as a matrix of their own (the same storage, borrowed): its row
    /// `i` is this matrix's row `r0 + i`, so every product over it has the same bits. Panics
    /// when the rows are out of range.
    pub fn rows(&self, r0: usize, n: usize) -> Matrix<'a> {
        assert!(
            r0 + n <= self.rows,
            "matrix rows {r0}..{} of {}",
            r0 + n,
            self.rows
        );
        let (c, r) = (self.cols, r0..r0 + n);
        let data = match self.data {
            MatrixData::Bf16(d) => MatrixData::Bf16(&d[r.start * c..r.end * c]),
            MatrixData::F32(d) => MatrixData::F32(&d[r.start * c..r.end * c]),
            MatrixData::Mxfp4 { packed, scales } => MatrixData::Mxfp4 {
                packed: &packed[r.start * c / 2..r.end * c / 2],
                scales: &scales[r.start * c / GROUP..r.end * c / GROUP],
            },
            MatrixData::Q8 { values, scales } => MatrixData::Q8 {
                values: &values[r.start * c..r.end * c],
                scales: &scales[r],
            },
        };
        Matrix {
            rows: n,
            cols: c,
            data,
        }
    }

    /// Bytes of weight data read by one full product (for bandwidth reports).
    pub fn weight_bytes(&self) -> usize {
        match self.data {
            MatrixData::Bf16(d) => d.len() * 2,
            MatrixData::F32(d) => d.len() * 4,
            MatrixData::Mxfp4 { packed, scales } => packed.len() + scales.len(),
            MatrixData::Q8 { values, scales } => values.len() + scales.len() * 4,
        }
    }

    /// Row `r`'s output from the tree's result `d`: `d` itself, or `scales[r] · d` for Q8.
    #[inline]
    pub(crate) fn finish(&self, r: usize, d: f32) -> f32 {
        match self.data {
            MatrixData::Q8 { scales, .. } => q8_finish(scales[r], d),
            _ => d,
        }
    }

    /// Row `r` in kernel form.
    #[inline]
    pub(crate) fn row(&self, r: usize) -> Row<'a> {
        let c = self.cols;
        match self.data {
            MatrixData::Bf16(d) => Row::Bf16(bytemuck::cast_slice(&d[r * c..(r + 1) * c])),
            MatrixData::F32(d) => Row::F32(&d[r * c..(r + 1) * c]),
            MatrixData::Mxfp4 { packed, scales } => Row::Mxfp4(
                &packed[r * c / 2..(r + 1) * c / 2],
                &scales[r * c / GROUP..(r + 1) * c / GROUP],
            ),
            MatrixData::Q8 { values, .. } => Row::Q8(&values[r * c..(r + 1) * c]),
        }
    }
}
