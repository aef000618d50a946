//! Transposed mat-vec over a row block: `y[c] = Σ_i W[r0+i][c]·x[i]` (i.e. `y = W_blockᵀ·x`).
//!
//! Used where a product with the TRANSPOSE of a stored `[out][in]` matrix is needed without
//! materialising the transpose (MLA weight absorption folds `kv_b`'s key half into the query).
//! Order (fixed, thread-count-free): rows ascending, `y[c] += (f64)W[r][c] · (f64)x[i]` with a
//! plain multiply and add (no fusion), f64 accumulators starting at 0. bf16 weights are widened
//! exactly (`bits << 16`); MXFP4 weights are decoded as `E2M1[code] · E8M0[scale]` (exact in f32);
//! Q8 weights are `(v as f32) · scale` ([`q8_element`], one f32 rounding).

use crate::bf16_to_f32;
use crate::matrix::{Matrix, MatrixData};
use crate::mxfp4::{e8m0_scale, E2M1, GROUP};

/// A Q8 weight `(v as f32) · scale`: one f32 multiply (the only storage whose element is
/// rounded; its row dot scales after the tree instead, docs/NUMERICS.md#q8-rows).
#[inline]
pub fn q8_element(v: i8, scale: f32) -> f32 {
    v as f32 * scale
}

/// Element `W[r][c]` of a matrix in any storage, widened to f32 exactly (Q8: [`q8_element`]).
#[inline]
pub fn element(w: &Matrix, r: usize, c: usize) -> f32 {
    let cols = w.cols;
    match w.data {
        MatrixData::F32(d) => d[r * cols + c],
        MatrixData::Bf16(d) => bf16_to_f32(d[r * cols + c]),
        MatrixData::Mxfp4 { packed, scales } => {
            let byte = packed[(r * cols + c) / 2];
            let code = if c.is_multiple_of(2) {
                byte & 0x0F
            } else {
                byte >> 4
            };
            E2M1[code as usize] * e8m0_scale(scales[(r * cols + c) / GROUP])
        }
        MatrixData::Q8 { values, scales } => q8_element(values[r * cols + c], scales[r]),
    }
}

/// `y[c] = Σ_{i ascending} (f64)W[r0+i][c]·(f64)x[i]` for `c < w.cols`, rows `r0 .. r0+x.len()`.
/// Plain multiply-add in f64 (no fma). Panics if the row block exceeds the matrix or
/// `y.len() != w.cols` (callers validate shapes first).
pub fn matvec_t_f64(y: &mut [f64], w: &Matrix, r0: usize, x: &[f32]) {
    assert_eq!(y.len(), w.cols, "matvec_t output length");
    assert!(
        r0 + x.len() <= w.rows,
        "matvec_t row block outside the matrix"
    );
    y.fill(0.0);
    let cols = w.cols;
    for (i, &xi) in x.iter().enumerate() {
        let r = r0 + i;
        let xd = xi as f64;
        match w.data {
            MatrixData::F32(d) => {
                for (yc, &wv) in y.iter_mut().zip(&d[r * cols..(r + 1) * cols]) {
                    *yc += wv as f64 * xd;
                }
            }
            MatrixData::Bf16(d) => {
                for (yc, &wv) in y.iter_mut().zip(&d[r * cols..(r + 1) * cols]) {
                    *yc += bf16_to_f32(wv) as f64 * xd;
                }
            }
            MatrixData::Mxfp4 { .. } | MatrixData::Q8 { .. } => {
                for (c, yc) in y.iter_mut().enumerate() {
                    *yc += element(w, r, c) as f64 * xd;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn transposed_product_matches_naive_in_every_storage() {
        let (rows, cols) = (6, 64);
        let wf: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 29 % 41) as f32 - 20.0) / 8.0)
            .collect();
        let x: Vec<f32> = (0..4).map(|i| i as f32 * 0.75 - 1.0).collect();
        let naive = |w: &dyn Fn(usize, usize) -> f32| -> Vec<f64> {
            (0..cols)
                .map(|c| (0..4).fold(0f64, |a, i| a + w(1 + i, c) as f64 * x[i] as f64))
                .collect()
        };
        let mut y = vec![0f64; cols];
        let m = Matrix::f32(rows, cols, &wf).unwrap();
        matvec_t_f64(&mut y, &m, 1, &x);
        assert_eq!(y, naive(&|r, c| wf[r * cols + c]));

        let wb: Vec<bf16> = wf.iter().map(|v| bf16::from_f32(*v)).collect();
        let m = Matrix::bf16(rows, cols, &wb).unwrap();
        matvec_t_f64(&mut y, &m, 1, &x);
        assert_eq!(y, naive(&|r, c| wb[r * cols + c].to_f32()));

        let packed: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 37 % 256) as u8).collect();
        let scales: Vec<u8> = (0..rows * cols / GROUP)
            .map(|i| 120 + (i % 5) as u8)
            .collect();
        let deq = crate::mxfp4::dequantize(&packed, &scales, rows, cols);
        let m = Matrix::mxfp4(rows, cols, &packed, &scales).unwrap();
        matvec_t_f64(&mut y, &m, 1, &x);
        assert_eq!(y, naive(&|r, c| deq[r * cols + c]));
    }
}
