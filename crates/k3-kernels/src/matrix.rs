//! A row-major `[rows][cols]` weight matrix in one of three storages, and the mat-vec /
//! mat-mat products over it. Rows are independent, so splitting rows across threads never
//! changes a result bit.

use crate::dot::{dot_bf16, dot_f32, dot_mxfp4};
use crate::mxfp4::GROUP;
use half::bf16;
use rayon::prelude::*;

/// Storage of a weight matrix.
#[derive(Clone, Copy, Debug)]
pub enum MatrixData<'a> {
    /// bf16, widened inside the dot product.
    Bf16(&'a [bf16]),
    /// f32.
    F32(&'a [f32]),
    /// MXFP4: `packed` `[rows][cols/2]`, `scales` `[rows][cols/32]` (E8M0).
    Mxfp4 { packed: &'a [u8], scales: &'a [u8] },
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
        (data.len() == rows.checked_mul(cols)?).then_some(Matrix { rows, cols, data: MatrixData::Bf16(data) })
    }
    /// An f32 matrix; `None` when the length disagrees with the shape.
    pub fn f32(rows: usize, cols: usize, data: &'a [f32]) -> Option<Self> {
        (data.len() == rows.checked_mul(cols)?).then_some(Matrix { rows, cols, data: MatrixData::F32(data) })
    }
    /// An MXFP4 matrix; `None` unless `cols % 32 == 0` and both lengths match the shape.
    pub fn mxfp4(rows: usize, cols: usize, packed: &'a [u8], scales: &'a [u8]) -> Option<Self> {
        let ok = cols % GROUP == 0
            && packed.len() == rows.checked_mul(cols / 2)?
            && scales.len() == rows.checked_mul(cols / GROUP)?;
        ok.then_some(Matrix { rows, cols, data: MatrixData::Mxfp4 { packed, scales } })
    }

    /// Bytes of weight data read by one full product (for bandwidth reports).
    pub fn weight_bytes(&self) -> usize {
        match self.data {
            MatrixData::Bf16(d) => d.len() * 2,
            MatrixData::F32(d) => d.len() * 4,
            MatrixData::Mxfp4 { packed, scales } => packed.len() + scales.len(),
        }
    }

    /// `Σ_i W[r][i]·x[i]` in the fixed order of `dot`, rounded to f32.
    #[inline]
    pub fn row_dot(&self, r: usize, x: &[f32]) -> f32 {
        let c = self.cols;
        let acc = match self.data {
            MatrixData::Bf16(d) => dot_bf16(&d[r * c..(r + 1) * c], x),
            MatrixData::F32(d) => dot_f32(&d[r * c..(r + 1) * c], x),
            MatrixData::Mxfp4 { packed, scales } => dot_mxfp4(
                &packed[r * c / 2..(r + 1) * c / 2],
                &scales[r * c / GROUP..(r + 1) * c / GROUP],
                x,
            ),
        };
        acc as f32
    }
}

/// Rows per parallel task: big enough to amortise scheduling, small enough to balance.
const ROWS_PER_TASK: usize = 32;

/// `y = W·x` on the calling thread. `y.len() == rows`, `x.len() == cols`.
pub fn matvec(y: &mut [f32], w: &Matrix, x: &[f32]) {
    assert_eq!(y.len(), w.rows, "matvec output length");
    assert_eq!(x.len(), w.cols, "matvec input length");
    for (r, out) in y.iter_mut().enumerate() {
        *out = w.row_dot(r, x);
    }
}

/// `y = W·x` with rows split across the current rayon pool (bit-identical to `matvec`).
pub fn par_matvec(y: &mut [f32], w: &Matrix, x: &[f32]) {
    assert_eq!(y.len(), w.rows, "matvec output length");
    assert_eq!(x.len(), w.cols, "matvec input length");
    y.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(chunk, ys)| {
        let r0 = chunk * ROWS_PER_TASK;
        for (i, out) in ys.iter_mut().enumerate() {
            *out = w.row_dot(r0 + i, x);
        }
    });
}

/// `Y[t] = W·X[t]` for `t` tokens: `x` is `[t][cols]`, `y` is `[t][rows]`. Each weight row is
/// read once for all tokens; every output equals the `matvec` one bit for bit.
pub fn matmul(y: &mut [f32], w: &Matrix, x: &[f32], t: usize) {
    assert_eq!(y.len(), t * w.rows, "matmul output length");
    assert_eq!(x.len(), t * w.cols, "matmul input length");
    let (rows, cols) = (w.rows, w.cols);
    let results: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .map(|chunk| {
            let r0 = chunk * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(rows);
            let mut block = vec![0f32; (r1 - r0) * t];
            for r in r0..r1 {
                for tok in 0..t {
                    block[(r - r0) * t + tok] = w.row_dot(r, &x[tok * cols..(tok + 1) * cols]);
                }
            }
            (r0, block)
        })
        .collect();
    for (r0, block) in results {
        let n = block.len() / t.max(1);
        for i in 0..n {
            for tok in 0..t {
                y[tok * rows + r0 + i] = block[i * t + tok];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_equals_matvec_per_token() {
        let (rows, cols, t) = (70, 45, 3);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 31 % 97) as f32 - 48.0) / 17.0).collect();
        let x: Vec<f32> = (0..t * cols).map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0).collect();
        let m = Matrix::f32(rows, cols, &w).unwrap();
        let mut y = vec![0f32; t * rows];
        matmul(&mut y, &m, &x, t);
        for tok in 0..t {
            let mut yv = vec![0f32; rows];
            matvec(&mut yv, &m, &x[tok * cols..(tok + 1) * cols]);
            assert_eq!(&y[tok * rows..(tok + 1) * rows], &yv[..]);
            let mut yp = vec![0f32; rows];
            par_matvec(&mut yp, &m, &x[tok * cols..(tok + 1) * cols]);
            assert_eq!(yp, yv);
        }
    }
}
