//! A row-major `[rows][cols]` weight matrix in one of three storages, and the mat-vec /
//! mat-mat products over it. Rows are independent, so splitting rows across threads never
//! changes a result bit.

use crate::dot::{dot_bf16, dot_f32, dot_mxfp4};
use crate::mxfp4::GROUP;
use crate::simd::{active_level, row_block, row_dots, rows_dots, token_block, Level, Row, WideX};
use half::bf16;
use rayon::prelude::*;
use std::cell::RefCell;

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

    /// Whether the storage is MXFP4.
    fn is_mxfp4(&self) -> bool {
        matches!(self.data, MatrixData::Mxfp4 { .. })
    }

    /// Row `r` in kernel form.
    #[inline]
    fn row(&self, r: usize) -> Row<'a> {
        let c = self.cols;
        match self.data {
            MatrixData::Bf16(d) => Row::Bf16(bytemuck::cast_slice(&d[r * c..(r + 1) * c])),
            MatrixData::F32(d) => Row::F32(&d[r * c..(r + 1) * c]),
            MatrixData::Mxfp4 { packed, scales } => Row::Mxfp4(
                &packed[r * c / 2..(r + 1) * c / 2],
                &scales[r * c / GROUP..(r + 1) * c / GROUP],
            ),
        }
    }
}

/// Below this many rows a mat-vec reads `x` as f32 instead of widening it once to f64.
const WIDEN_MIN_ROWS: usize = 8;

/// `x` widened to f64 (exact) when the SIMD path will reuse it across enough rows.
fn widened(level: Level, w: &Matrix, x: &[f32]) -> Option<WideX> {
    (level != Level::Scalar && w.rows >= WIDEN_MIN_ROWS).then(|| WideX::new(level, w.is_mxfp4(), x))
}

/// Rows `r0 .. r0 + ys.len()` of `W·x` on `level`, from the widened `wx` when present (same
/// bits either way).
fn rows_out(level: Level, w: &Matrix, r0: usize, ys: &mut [f32], x: &[f32], wx: Option<&WideX>) {
    let Some(wx) = wx else {
        for (i, y) in ys.iter_mut().enumerate() {
            *y = w.row_dot(r0 + i, x);
        }
        return;
    };
    match row_block(level, w.is_mxfp4()) {
        4 => row_blocks::<4>(level, w, r0, ys, wx),
        2 => row_blocks::<2>(level, w, r0, ys, wx),
        _ => row_blocks::<1>(level, w, r0, ys, wx),
    }
}

/// [`rows_out`] `R` rows per kernel call; a short last block repeats its last row.
fn row_blocks<const R: usize>(level: Level, w: &Matrix, r0: usize, ys: &mut [f32], wx: &WideX) {
    for (b, yb) in ys.chunks_mut(R).enumerate() {
        let base = r0 + b * R;
        let last = yb.len() - 1;
        let v = rows_dots::<R>(
            level,
            std::array::from_fn(|k| w.row(base + k.min(last))),
            wx,
        );
        for (y, v) in yb.iter_mut().zip(v) {
            *y = v as f32;
        }
    }
}

/// Rows per parallel task: big enough to amortise scheduling, small enough to balance (a
/// multiple of every `row_block`).
const ROWS_PER_TASK: usize = 32;

/// `y = W·x` on the calling thread. `y.len() == rows`, `x.len() == cols`.
pub fn matvec(y: &mut [f32], w: &Matrix, x: &[f32]) {
    assert_eq!(y.len(), w.rows, "matvec output length");
    assert_eq!(x.len(), w.cols, "matvec input length");
    let level = active_level();
    let wx = widened(level, w, x);
    rows_out(level, w, 0, y, x, wx.as_ref());
}

/// `y = W·x` with rows split across the current rayon pool (bit-identical to `matvec`).
pub fn par_matvec(y: &mut [f32], w: &Matrix, x: &[f32]) {
    assert_eq!(y.len(), w.rows, "matvec output length");
    assert_eq!(x.len(), w.cols, "matvec input length");
    let level = active_level();
    let wx = widened(level, w, x);
    y.par_chunks_mut(ROWS_PER_TASK)
        .enumerate()
        .for_each(|(chunk, ys)| rows_out(level, w, chunk * ROWS_PER_TASK, ys, x, wx.as_ref()));
}

/// `Y[t] = W·X[t]` for `t` tokens: `x` is `[t][cols]`, `y` is `[t][rows]`. Every output equals
/// the `matvec` one bit for bit.
///
/// Tiled as (block of `ROWS_PER_TASK` rows) × (all tokens), one rayon task per row block:
/// the block's weights come from memory once and stay cache-resident while the tokens pass
/// over them a few at a time (each weight row is widened once per token block and dotted
/// with every token of it). MXFP4 on a level with multi-row mat-vec kernels (AVX2) instead
/// widens every token once per call and runs the block through the mat-vec row kernels token
/// by token (decoding MXFP4 there is cheaper than sharing one decode across two tokens).
/// Outputs are written in place; besides those widened tokens the only allocation is one
/// slot table per call.
pub fn matmul(y: &mut [f32], w: &Matrix, x: &[f32], t: usize) {
    assert_eq!(y.len(), t * w.rows, "matmul output length");
    assert_eq!(x.len(), t * w.cols, "matmul input length");
    if t == 0 || w.rows == 0 {
        return;
    }
    let level = active_level();
    // MXFP4 on a level with a multi-row kernel: every token through the mat-vec path
    // (activations widened once per call; the tile's weights stay cache-resident).
    let wxs: Vec<WideX> = if w.is_mxfp4() && row_block(level, true) > 1 {
        x.chunks(w.cols.max(1))
            .take(t)
            .map(|xt| WideX::new(level, true, xt))
            .collect()
    } else {
        Vec::new()
    };
    let nchunks = w.rows.div_ceil(ROWS_PER_TASK);
    // slots[c * t + tok] = the part of token `tok`'s output owned by row block `c`.
    let mut slots: Vec<Option<&mut [f32]>> = (0..nchunks * t).map(|_| None).collect();
    for (tok, yt) in y.chunks_mut(w.rows).enumerate() {
        for (c, part) in yt.chunks_mut(ROWS_PER_TASK).enumerate() {
            slots[c * t + tok] = Some(part);
        }
    }
    slots.par_chunks_mut(t).enumerate().for_each(|(c, outs)| {
        let r0 = c * ROWS_PER_TASK;
        if wxs.is_empty() {
            matmul_tile(level, w, x, r0, outs);
            return;
        }
        for ((tok, out), wx) in outs.iter_mut().enumerate().zip(&wxs) {
            let xt = &x[tok * w.cols..(tok + 1) * w.cols];
            rows_out(
                level,
                w,
                r0,
                out.as_deref_mut().unwrap_or_default(),
                xt,
                Some(wx),
            );
        }
    });
}

thread_local! {
    /// Per-thread f64 copy of the current token block (reused across calls).
    static XBUF: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

/// Rows `r0..` of every token; `outs[tok]` receives the rows of token `tok`.
fn matmul_tile(level: Level, w: &Matrix, x: &[f32], r0: usize, outs: &mut [Option<&mut [f32]>]) {
    let cols = w.cols;
    if level == Level::Scalar {
        for (tok, out) in outs.iter_mut().enumerate() {
            let xt = &x[tok * cols..(tok + 1) * cols];
            for (i, o) in out.as_deref_mut().into_iter().flatten().enumerate() {
                *o = w.row_dot(r0 + i, xt);
            }
        }
        return;
    }
    let nb = token_block(level);
    XBUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        let mut tok = 0;
        while tok < outs.len() {
            let n = if outs.len() - tok >= nb { nb } else { 1 };
            buf.clear();
            buf.extend(x[tok * cols..(tok + n) * cols].iter().map(|&v| v as f64));
            let outs = &mut outs[tok..tok + n];
            match n {
                4 => token_block_rows::<4>(level, w, r0, &buf, outs),
                2 => token_block_rows::<2>(level, w, r0, &buf, outs),
                _ => token_block_rows::<1>(level, w, r0, &buf, outs),
            }
            tok += n;
        }
    });
}

/// Every row of the tile against the `N` widened tokens in `xb` (`[N][cols]`).
fn token_block_rows<const N: usize>(
    level: Level,
    w: &Matrix,
    r0: usize,
    xb: &[f64],
    outs: &mut [Option<&mut [f32]>],
) {
    let cols = w.cols;
    let xs: [&[f64]; N] = std::array::from_fn(|k| &xb[k * cols..(k + 1) * cols]);
    let nrows = outs[0].as_deref().map_or(0, <[f32]>::len);
    for i in 0..nrows {
        let v = row_dots(level, w.row(r0 + i), xs);
        for (out, vk) in outs.iter_mut().zip(v) {
            if let Some(o) = out.as_deref_mut() {
                o[i] = vk as f32;
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
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 31 % 97) as f32 - 48.0) / 17.0)
            .collect();
        let x: Vec<f32> = (0..t * cols)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0)
            .collect();
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
