//! Transposed mat-vec over a row block: `y[c] = Σ_i W[r0+i][c]·x[i]` (i.e. `y = W_blockᵀ·x`).
//!
//! Used where a product with the TRANSPOSE of a stored `[out][in]` matrix is needed without
//! materialising the transpose (MLA weight absorption folds `kv_b`'s key half into the query).
//! Order (fixed, thread-count-free): rows ascending, `y[c] += (f64)W[r][c] · (f64)x[i]` with a
//! plain multiply and add (no fusion), f64 accumulators starting at 0. bf16 weights are widened
//! exactly (`bits << 16`); MXFP4 weights are decoded as `E2M1[code] · E8M0[scale]` (exact in f32);
//! Q8 weights are `(v as f32) · scale` ([`q8_element`], one f32 rounding).

use crate::matrix::{Matrix, MatrixData};
use crate::mxfp4::{e8m0_scale, E2M1, GROUP};
use crate::widen::bf16_to_f32;
use std::ops::Range;

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

/// Vectors per call of the lane kernels ([`matvec_t_f64_lanes`], [`latent_scores_lanes`]):
/// every sum of one vector runs in its own lane, so a call is [`LANES`] independent
/// accumulator chains the CPU overlaps (and the compiler vectorises across), each in the
/// order of the one-vector form.
pub const LANES: usize = 16;

/// [`matvec_t_f64`] of up to [`LANES`] vectors at once, lane-interleaved: `xt` is
/// `[n][LANES]` (`xt[i][j]` = `(f64)x_j[i]`; unused lanes 0), `yt` receives `[cols][LANES]`
/// with `yt[c][j] = Σ_{i ascending} (f64)W[r0+i][c]·xt[i][j]` — per lane exactly the
/// multiplies and adds of [`matvec_t_f64`] in its order (rows ascending from 0, no fusion),
/// so every lane's bits are those of the one-vector call. Panics if the row block exceeds
/// the matrix or the lengths disagree (callers validate shapes first).
pub fn matvec_t_f64_lanes(yt: &mut [f64], w: &Matrix, r0: usize, xt: &[f64]) {
    let (n, cols) = (xt.len() / LANES, w.cols);
    assert_eq!(xt.len(), n * LANES, "matvec_t_lanes input length");
    assert_eq!(yt.len(), cols * LANES, "matvec_t_lanes output length");
    assert!(
        r0 + n <= w.rows,
        "matvec_t_lanes row block outside the matrix"
    );
    matvec_t_lanes_best(yt, w, r0, xt)
}

crate::simd::per_level! {
    fn matvec_t_lanes_best(yt: &mut [f64], w: &Matrix, r0: usize, xt: &[f64]) = matvec_t_lanes_any;
}

/// The body of [`matvec_t_f64_lanes`], compiled once per vector level (the same IEEE
/// operations at every width: the same bits).
#[inline(always)]
fn matvec_t_lanes_any(yt: &mut [f64], w: &Matrix, r0: usize, xt: &[f64]) {
    let cols = w.cols;
    match w.data {
        MatrixData::F32(d) => lanes_blocks(yt, xt, cols, |i, c| d[(r0 + i) * cols + c] as f64),
        MatrixData::Bf16(d) => lanes_blocks(yt, xt, cols, |i, c| {
            bf16_to_f32(d[(r0 + i) * cols + c]) as f64
        }),
        MatrixData::Mxfp4 { .. } | MatrixData::Q8 { .. } => {
            lanes_blocks(yt, xt, cols, |i, c| element(w, r0 + i, c) as f64)
        }
    }
}

/// Columns per register block of [`matvec_t_f64_lanes`] (`COLS × LANES` f64 accumulators).
const COLS: usize = 4;

/// The column blocks of [`matvec_t_f64_lanes`]; `weight(i, c)` is `(f64)W[r0+i][c]`.
#[inline(always)]
fn lanes_blocks(yt: &mut [f64], xt: &[f64], cols: usize, weight: impl Fn(usize, usize) -> f64) {
    let full = cols - cols % COLS;
    for c0 in (0..full).step_by(COLS) {
        lanes_block::<COLS>(&mut yt[c0 * LANES..(c0 + COLS) * LANES], xt, |i, cc| {
            weight(i, c0 + cc)
        });
    }
    for c in full..cols {
        lanes_block::<1>(&mut yt[c * LANES..(c + 1) * LANES], xt, |i, _| weight(i, c));
    }
}

/// `B` columns × [`LANES`] accumulators held over every row, then stored.
#[inline(always)]
fn lanes_block<const B: usize>(yt: &mut [f64], xt: &[f64], weight: impl Fn(usize, usize) -> f64) {
    let mut acc = [[0f64; LANES]; B];
    for (i, x) in xt.chunks_exact(LANES).enumerate() {
        for (cc, a) in acc.iter_mut().enumerate() {
            let wv = weight(i, cc);
            for (a, &x) in a.iter_mut().zip(x) {
                *a += wv * x;
            }
        }
    }
    for (dst, a) in yt.chunks_exact_mut(LANES).zip(&acc) {
        dst.copy_from_slice(a);
    }
}

/// Rows per step of [`latent_scores_lanes`] (independent chains: `KEYS × LANES`).
const KEYS: usize = 4;

/// MLA latent scores (the f64 dot of docs/NUMERICS.md#where-f64-stays, one accumulator per
/// (query, key)) of up to [`LANES`] queries against each row of `rows` (`[S][kl + rope]`):
/// `out[s][j] = Σ_{c<kl asc} qlt[c][j]·(f64)row_s[c] + Σ_{r asc} qrt[r][j]·(f64)row_s[kl+r]`,
/// from 0, plain multiply then add — per lane the order of the one-query loop. `qlt` is
/// `[kl][LANES]` (the absorbed queries, [`matvec_t_f64_lanes`]'s output), `qrt` `[rope][LANES]`
/// (`(f64)q_rope`), `out` `[S][LANES]`.
pub fn latent_scores_lanes(out: &mut [f64], qlt: &[f64], qrt: &[f64], rows: &[f32]) {
    let (kl, rope) = (qlt.len() / LANES, qrt.len() / LANES);
    let width = kl + rope;
    let s = out.len() / LANES;
    assert_eq!(qlt.len(), kl * LANES, "latent_scores_lanes latent length");
    assert_eq!(qrt.len(), rope * LANES, "latent_scores_lanes rope length");
    assert_eq!(rows.len(), s * width, "latent_scores_lanes rows length");
    scores_lanes_best(out, qlt, qrt, rows, kl)
}

crate::simd::per_level! {
    fn scores_lanes_best(out: &mut [f64], qlt: &[f64], qrt: &[f64], rows: &[f32], kl: usize) = scores_lanes_any;
}

/// The body of [`latent_scores_lanes`], compiled once per vector level.
#[inline(always)]
fn scores_lanes_any(out: &mut [f64], qlt: &[f64], qrt: &[f64], rows: &[f32], kl: usize) {
    let (s, width) = (out.len() / LANES, rows.len() / (out.len() / LANES).max(1));
    let full = s - s % KEYS;
    for s0 in (0..full).step_by(KEYS) {
        let r = &rows[s0 * width..(s0 + KEYS) * width];
        scores_step::<KEYS>(&mut out[s0 * LANES..(s0 + KEYS) * LANES], qlt, qrt, r, kl);
    }
    for s0 in full..s {
        let r = &rows[s0 * width..(s0 + 1) * width];
        scores_step::<1>(&mut out[s0 * LANES..(s0 + 1) * LANES], qlt, qrt, r, kl);
    }
}

/// `K` rows of [`latent_scores_lanes`] at once.
#[inline(always)]
fn scores_step<const K: usize>(out: &mut [f64], qlt: &[f64], qrt: &[f64], rows: &[f32], kl: usize) {
    let width = rows.len() / K;
    let mut acc = [[0f64; LANES]; K];
    for (c, q) in qlt.chunks_exact(LANES).enumerate() {
        for (k, a) in acc.iter_mut().enumerate() {
            let v = rows[k * width + c] as f64;
            for (a, &q) in a.iter_mut().zip(q) {
                *a += q * v;
            }
        }
    }
    for (r, q) in qrt.chunks_exact(LANES).enumerate() {
        for (k, a) in acc.iter_mut().enumerate() {
            let v = rows[k * width + kl + r] as f64;
            for (a, &q) in a.iter_mut().zip(q) {
                *a += q * v;
            }
        }
    }
    for (dst, a) in out.chunks_exact_mut(LANES).zip(&acc) {
        dst.copy_from_slice(a);
    }
}

/// Row dots of up to [`LANES`] vectors at once, lane-interleaved:
/// `out[r − rows.start][j] = Σ_{i ascending} (f64)W[r][i]·xt[i][j]` for the rows `rows` of `w`, from 0, plain
/// multiply then add — per lane the sequential f64 row dot (the router's logit,
/// docs/NUMERICS.md#where-f64-stays) in its order. `xt` is `[cols][LANES]` (unused lanes 0),
/// `out` `[rows][LANES]`. F32 and bf16 storage only (`false`, nothing written, otherwise).
pub fn row_dots_f64_lanes(out: &mut [f64], w: &Matrix, rows: Range<usize>, xt: &[f64]) -> bool {
    assert_eq!(xt.len(), w.cols * LANES, "row_dots_lanes input length");
    assert!(rows.end <= w.rows, "row_dots_lanes rows outside the matrix");
    assert_eq!(
        out.len(),
        rows.len() * LANES,
        "row_dots_lanes output length"
    );
    if !matches!(w.data, MatrixData::F32(_) | MatrixData::Bf16(_)) {
        return false;
    }
    row_dots_lanes_best(out, w, rows, xt)
}

crate::simd::per_level! {
    fn row_dots_lanes_best(out: &mut [f64], w: &Matrix, rows: Range<usize>, xt: &[f64]) -> bool = row_dots_lanes_any;
}

/// The body of [`row_dots_f64_lanes`], compiled once per vector level.
#[inline(always)]
fn row_dots_lanes_any(out: &mut [f64], w: &Matrix, rows: Range<usize>, xt: &[f64]) -> bool {
    let (cols, r0, n) = (w.cols, rows.start, rows.len());
    match w.data {
        MatrixData::F32(d) => row_blocks(out, xt, n, |r, i| d[(r0 + r) * cols + i] as f64),
        MatrixData::Bf16(d) => row_blocks(out, xt, n, |r, i| {
            bf16_to_f32(d[(r0 + r) * cols + i]) as f64
        }),
        MatrixData::Mxfp4 { .. } | MatrixData::Q8 { .. } => return false,
    }
    true
}

/// The row blocks of [`row_dots_f64_lanes`]; `weight(r, i)` is `(f64)W[r][i]`.
#[inline(always)]
fn row_blocks(out: &mut [f64], xt: &[f64], rows: usize, weight: impl Fn(usize, usize) -> f64) {
    let full = rows - rows % KEYS;
    for r0 in (0..full).step_by(KEYS) {
        let dst = &mut out[r0 * LANES..(r0 + KEYS) * LANES];
        row_block::<KEYS>(dst, xt, |k, i| weight(r0 + k, i));
    }
    for r in full..rows {
        row_block::<1>(&mut out[r * LANES..(r + 1) * LANES], xt, |_, i| {
            weight(r, i)
        });
    }
}

/// `K` rows × [`LANES`] accumulators over every column, then stored.
#[inline(always)]
fn row_block<const K: usize>(out: &mut [f64], xt: &[f64], weight: impl Fn(usize, usize) -> f64) {
    let mut acc = [[0f64; LANES]; K];
    for (i, x) in xt.chunks_exact(LANES).enumerate() {
        for (k, a) in acc.iter_mut().enumerate() {
            let wv = weight(k, i);
            for (a, &x) in a.iter_mut().zip(x) {
                *a += wv * x;
            }
        }
    }
    for (dst, a) in out.chunks_exact_mut(LANES).zip(&acc) {
        dst.copy_from_slice(a);
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

    /// Every lane of the lane kernels equals its one-vector loop bit for bit.
    #[test]
    fn lane_kernels_equal_the_one_vector_loops() {
        for scalar in [false, true] {
            // the vector level in use, then the forced scalar path: the same bits
            crate::simd::set_force_scalar(scalar);
            lane_kernels_check();
        }
        crate::simd::set_force_scalar(false);
    }

    fn lane_kernels_check() {
        let (rows, cols, n) = (9, 10, 7); // 10 columns: two full blocks and a tail of 2
        let wf: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 7.0 * 1.37f32.powi((i % 9) as i32))
            .collect();
        let wb: Vec<bf16> = wf.iter().map(|v| bf16::from_f32(*v)).collect();
        let x = |j: usize, i: usize| ((j * 31 + i * 17) % 23) as f32 / 3.3 - 3.0;
        let mut xt = vec![0f64; n * LANES];
        for i in 0..n {
            for j in 0..LANES - 3 {
                xt[i * LANES + j] = x(j, i) as f64;
            }
        }
        for m in [
            Matrix::f32(rows, cols, &wf).unwrap(),
            Matrix::bf16(rows, cols, &wb).unwrap(),
        ] {
            let mut yt = vec![0f64; cols * LANES];
            matvec_t_f64_lanes(&mut yt, &m, 2, &xt);
            let mut y = vec![0f64; cols];
            for j in 0..LANES - 3 {
                let xj: Vec<f32> = (0..n).map(|i| x(j, i)).collect();
                matvec_t_f64(&mut y, &m, 2, &xj);
                for c in 0..cols {
                    assert_eq!(
                        yt[c * LANES + j].to_bits(),
                        y[c].to_bits(),
                        "lane {j} col {c}"
                    );
                }
            }
        }
        // row dots: 9 rows (two blocks of 4 and a tail of 1) against LANES − 3 vectors of 10
        let xt: Vec<f64> = (0..cols * LANES)
            .map(|k| {
                if k % LANES < LANES - 3 {
                    x(k % LANES, k / LANES) as f64
                } else {
                    0.0
                }
            })
            .collect();
        for m in [
            Matrix::f32(rows, cols, &wf).unwrap(),
            Matrix::bf16(rows, cols, &wb).unwrap(),
        ] {
            let mut out = vec![0f64; rows * LANES];
            assert!(row_dots_f64_lanes(&mut out, &m, 0..rows, &xt));
            let mut part = vec![0f64; 3 * LANES];
            assert!(row_dots_f64_lanes(&mut part, &m, 5..8, &xt));
            assert_eq!(part[..], out[5 * LANES..8 * LANES]);
            for r in 0..rows {
                for j in 0..LANES - 3 {
                    let mut acc = 0f64;
                    for i in 0..cols {
                        acc += element(&m, r, i) as f64 * x(j, i) as f64;
                    }
                    assert_eq!(
                        out[r * LANES + j].to_bits(),
                        acc.to_bits(),
                        "row {r} lane {j}"
                    );
                }
            }
        }
        // scores: 7 rows (one block of 4 and a tail of 3), kl 10, rope 3
        let (kl, rope, s) = (10, 3, 7);
        let qlt: Vec<f64> = (0..kl * LANES)
            .map(|i| (i as f64 * 0.731).sin() * 5.0)
            .collect();
        let qrt: Vec<f64> = (0..rope * LANES)
            .map(|i| (i as f32 * 0.377).cos() as f64)
            .collect();
        let data: Vec<f32> = (0..s * (kl + rope))
            .map(|i| (i as f32 * 0.19).sin() * 3.0)
            .collect();
        let mut out = vec![0f64; s * LANES];
        latent_scores_lanes(&mut out, &qlt, &qrt, &data);
        for k in 0..s {
            let row = &data[k * (kl + rope)..(k + 1) * (kl + rope)];
            for j in 0..LANES {
                let mut acc = 0f64;
                for c in 0..kl {
                    acc += qlt[c * LANES + j] * row[c] as f64;
                }
                for r in 0..rope {
                    acc += qrt[r * LANES + j] * row[kl + r] as f64;
                }
                assert_eq!(
                    out[k * LANES + j].to_bits(),
                    acc.to_bits(),
                    "row {k} lane {j}"
                );
            }
        }
    }
}
