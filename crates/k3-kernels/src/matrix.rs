//! A row-major `[rows][cols]` weight matrix in one of four storages, and the mat-vec /
//! mat-mat products over it (docs/NUMERICS.md#matvec-and-matmul). Every output is one row
//! dot of the contract; rows are independent, so splitting rows across threads never changes
//! a result bit, and `matmul` over T tokens equals `matvec` per token bit for bit.

pub(crate) mod data;

pub use data::{Matrix, MatrixData};

use crate::dot::{dot_bf16, dot_f32, dot_mxfp4, dot_q8};
use crate::mxfp4::GROUP;
use crate::simd::gemm::kind_of;
use crate::simd::{active_level, layout, matvec_rows, rows_lanes, with_layout, Level};
use rayon::prelude::*;

impl Matrix<'_> {
    /// `Σ_i W[r][i]·x[i]`: the row dot of the contract (docs/NUMERICS.md#row-dot-contract-v2).
    #[inline]
    pub fn row_dot(&self, r: usize, x: &[f32]) -> f32 {
        let c = self.cols;
        match self.data {
            MatrixData::Bf16(d) => dot_bf16(&d[r * c..(r + 1) * c], x),
            MatrixData::F32(d) => dot_f32(&d[r * c..(r + 1) * c], x),
            MatrixData::Mxfp4 { packed, scales } => dot_mxfp4(
                &packed[r * c / 2..(r + 1) * c / 2],
                &scales[r * c / GROUP..(r + 1) * c / GROUP],
                x,
            ),
            MatrixData::Q8 { values, scales } => dot_q8(&values[r * c..(r + 1) * c], scales[r], x),
        }
    }
}

/// Rows `r0 .. r0 + ys.len()` of `W·x` on `level`; `x` is in the level's layout for the
/// storage (`simd::layout`).
fn rows_out(level: Level, w: &Matrix, r0: usize, ys: &mut [f32], x: &[f32]) {
    match matvec_rows(level, kind_of(w)) {
        4 => row_blocks::<4>(level, w, r0, ys, x),
        2 => row_blocks::<2>(level, w, r0, ys, x),
        _ => row_blocks::<1>(level, w, r0, ys, x),
    }
}

/// [`rows_out`] `R` rows per kernel call; a short last block repeats its last row (rows never
/// share lanes, so the block size changes no bit).
fn row_blocks<const R: usize>(level: Level, w: &Matrix, r0: usize, ys: &mut [f32], x: &[f32]) {
    for (b, yb) in ys.chunks_mut(R).enumerate() {
        let base = r0 + b * R;
        let last = yb.len() - 1;
        let lanes = rows_lanes::<R>(level, std::array::from_fn(|k| w.row(base + k.min(last))), x);
        for (k, (y, l)) in yb.iter_mut().zip(&lanes).enumerate() {
            *y = w.finish(base + k, crate::dot::def::reduce16(l));
        }
    }
}

/// Rows per parallel mat-vec task: big enough to amortise scheduling, small enough to
/// balance (a multiple of every `matvec_rows`).
const ROWS_PER_TASK: usize = 32;

fn check_matvec(y: &[f32], w: &Matrix, x: &[f32]) {
    assert_eq!(y.len(), w.rows, "matvec output length");
    assert_eq!(x.len(), w.cols, "matvec input length");
}

/// `y = W·x` on the calling thread. `y.len() == rows`, `x.len() == cols`.
pub fn matvec(y: &mut [f32], w: &Matrix, x: &[f32]) {
    matvec_at(active_level(), y, w, x, false);
}

/// `y = W·x` with rows split across the current rayon pool (bit-identical to `matvec`).
pub fn par_matvec(y: &mut [f32], w: &Matrix, x: &[f32]) {
    matvec_at(active_level(), y, w, x, true);
}

/// [`matvec`] (`par = false`) or [`par_matvec`] on a given level. Panics on shape mismatch
/// or an unsupported level.
pub(crate) fn matvec_at(level: Level, y: &mut [f32], w: &Matrix, x: &[f32], par: bool) {
    check_matvec(y, w, x);
    if w.rows == 0 {
        return;
    }
    if let Some(pieces) = crate::fast::takes(w) {
        return crate::fast::matmul(y, w, x, 1, pieces);
    }
    let lay = layout(level, kind_of(w));
    // Mat-vec kernels pad a partial last block themselves: only the layout may need a copy.
    with_layout(lay, x, |xs| {
        if par {
            y.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(c, ys)| rows_out(level, w, c * ROWS_PER_TASK, ys, xs));
        } else {
            rows_out(level, w, 0, y, xs);
        }
    });
}

/// `Y[t] = W·X[t]` for `t` tokens: `x` is `[t][cols]`, `y` is `[t][rows]`. Every output equals
/// the `matvec` one bit for bit.
///
/// `t == 1` is `par_matvec`. Otherwise (SIMD levels) one rayon task per block of rows runs
/// register-blocked microkernels over f32 weight panels — bf16 widened and MXFP4 decoded
/// once per panel and shared by every token (`simd::gemm`). Outputs are written in place; the
/// scratch buffers are per thread and reused across calls.
pub fn matmul(y: &mut [f32], w: &Matrix, x: &[f32], t: usize) {
    matmul_at(active_level(), y, w, x, t);
}

/// [`matmul`] on a given level (the same bits on every level; benchmarks use it to time a
/// level below the detected one). Panics on shape mismatch or an unsupported level.
pub fn matmul_at(level: Level, y: &mut [f32], w: &Matrix, x: &[f32], t: usize) {
    assert_eq!(y.len(), t * w.rows, "matmul output length");
    assert_eq!(x.len(), t * w.cols, "matmul input length");
    assert!(
        level.is_supported(),
        "kernel level {} is not supported",
        level.name()
    );
    if t == 0 || w.rows == 0 {
        return;
    }
    if let Some(pieces) = crate::fast::takes(w) {
        // An AMX numeric mode (opt-in): every T, T = 1 included, on the tiles.
        return crate::fast::matmul(y, w, x, t, pieces);
    }
    if t == 1 {
        return matvec_at(level, y, w, x, true);
    }
    if w.cols == 0 || level == Level::Scalar {
        // Per token: the scalar mat-vec (an empty row's dot is the tree of `+0` lanes).
        let (rows, cols) = (w.rows, w.cols);
        return y
            .par_chunks_mut(rows)
            .enumerate()
            .for_each(|(tok, yt)| matvec_at(level, yt, w, &x[tok * cols..(tok + 1) * cols], true));
    }
    crate::simd::gemm::matmul(level, y, w, x, t);
}

#[cfg(test)]
mod tests;
