//! The AMX modes' GEMM (docs/NUMERICS.md#numeric-mode-fast): activations packed into B tiles
//! once per call, rayon tasks of 32 weight rows, each running the tile kernel over token
//! groups of 32 and writing its rows' outputs. Every output is one C element, so the task
//! split, the token grouping and the thread count change no bit.

use super::decode::{mxfp4_row_bf16_fast, split_row};
use super::def::BLOCK;
use super::tiles::{block, Backend, Block, CTILE, TILE};
use crate::matrix::data::{Matrix, MatrixData};
use crate::mxfp4::GROUP;
use rayon::prelude::*;
use std::borrow::Cow;

/// Weight rows per task (two A tiles).
const ROWS: usize = 32;
/// Tokens per B tile.
const TOKENS: usize = 16;

/// `Y[t] = W·X[t]` with `pieces` bf16 pieces per activation on `backend`.
pub(crate) fn matmul(
    backend: Backend,
    pieces: usize,
    y: &mut [f32],
    w: &Matrix,
    x: &[f32],
    t: usize,
) {
    assert_eq!(y.len(), t * w.rows, "matmul output length");
    assert_eq!(x.len(), t * w.cols, "matmul input length");
    if t == 0 || w.rows == 0 {
        return;
    }
    if w.cols == 0 {
        // An empty row's sum is the accumulator's start, +0.
        y.fill(0.0);
        return;
    }
    let kbn = w.cols.div_ceil(BLOCK);
    let tbn = t.div_ceil(TOKENS);
    let xs = pack(pieces, x, w.cols, t, kbn);
    let tpad = tbn * TOKENS;
    // yt: `[rows rounded up to 32][tpad]`, row-major (one task's rows are contiguous).
    let mut yt = vec![0.0f32; w.rows.div_ceil(ROWS) * ROWS * tpad];
    yt.par_chunks_mut(ROWS * tpad)
        .with_max_len(1)
        .enumerate()
        .for_each(|(task, yrows)| {
            let r0 = task * ROWS;
            let n = (w.rows - r0).min(ROWS);
            let (wrows, ws) = weight_rows(w, r0, n, kbn);
            for g in (0..tbn).step_by(2) {
                let nt = (tbn - g).min(2);
                let tile_of =
                    |tb: usize| &xs[tb.min(tbn - 1) * kbn * pieces * TILE..][..kbn * pieces * TILE];
                let used = (n, t - g * TOKENS);
                let blk = Block {
                    w: &wrows,
                    ws,
                    kbn,
                    pieces,
                    xs: [tile_of(g), tile_of(g + 1)],
                    nt,
                    used,
                };
                let mut out = [0.0f32; 4 * CTILE];
                block(backend, &blk, &mut out);
                for (i, tile) in out.chunks(CTILE).enumerate().filter(|(i, _)| i % 2 < nt) {
                    let (rb, tb) = (i / 2, i % 2);
                    for (m, vals) in tile.chunks(TOKENS).enumerate() {
                        let at = (rb * TOKENS + m) * tpad + (g + tb) * TOKENS;
                        yrows[at..at + TOKENS].copy_from_slice(vals);
                    }
                }
            }
        });
    let rows = w.rows;
    y.par_chunks_mut(rows)
        .enumerate()
        .for_each(|(tok, yt_row)| {
            for (o, v) in yt_row.iter_mut().enumerate() {
                *v = yt[o * tpad + tok];
            }
        });
}

/// The activations as B tiles: tile `(tb · kbn + kb) · pieces + p` holds piece `p` of tokens
/// `16 tb ..` at columns `32 kb ..`, row `k` = each token's columns `2k, 2k + 1`; `+0` past
/// the row and past the last token.
fn pack(pieces: usize, x: &[f32], cols: usize, t: usize, kbn: usize) -> Vec<u16> {
    let tbn = t.div_ceil(TOKENS);
    let mut xs = vec![0u16; tbn * kbn * pieces * TILE];
    xs.par_chunks_mut(kbn * pieces * TILE)
        .enumerate()
        .for_each(|(tb, tiles)| {
            // Each token's pieces, zero-padded to whole column blocks; read as dwords, dword
            // `16 kb + k` is the pair (columns `32 kb + 2k`, `+ 1`) of tile row `k`.
            let mut rows = vec![vec![0u16; kbn * BLOCK]; pieces];
            for n in 0..TOKENS.min(t - tb * TOKENS) {
                split_row(&x[(tb * TOKENS + n) * cols..][..cols], &mut rows);
                for (p, row) in rows.iter().enumerate() {
                    for (kb, pairs) in row.chunks_exact(BLOCK).enumerate() {
                        let tile = &mut tiles[(kb * pieces + p) * TILE..][..TILE];
                        for (k, pair) in pairs.chunks_exact(2).enumerate() {
                            tile[k * 32 + n * 2] = pair[0];
                            tile[k * 32 + n * 2 + 1] = pair[1];
                        }
                    }
                }
            }
        });
    xs
}

/// Rows `r0 .. r0 + n` as bf16 bits with their row stride: borrowed from a bf16 matrix when
/// 32 full rows of whole column blocks are there, else a zero-padded `[32][kbn · 32]` copy
/// (MXFP4 rows decoded, exactly, to bf16).
fn weight_rows<'a>(w: &Matrix<'a>, r0: usize, n: usize, kbn: usize) -> (Cow<'a, [u16]>, usize) {
    let cols = w.cols;
    let ws = kbn * BLOCK;
    match w.data {
        MatrixData::Bf16(d) if n == ROWS && cols == ws => {
            let bits: &[u16] = bytemuck::cast_slice(&d[r0 * cols..(r0 + ROWS) * cols]);
            (Cow::Borrowed(bits), cols)
        }
        MatrixData::Bf16(d) => {
            let mut buf = vec![0u16; ROWS * ws];
            for m in 0..n {
                let src: &[u16] = bytemuck::cast_slice(&d[(r0 + m) * cols..(r0 + m + 1) * cols]);
                buf[m * ws..m * ws + cols].copy_from_slice(src);
            }
            (Cow::Owned(buf), ws)
        }
        MatrixData::Mxfp4 { packed, scales } => {
            let mut buf = vec![0u16; ROWS * ws];
            for m in 0..n {
                let r = r0 + m;
                mxfp4_row_bf16_fast(
                    &packed[r * cols / 2..(r + 1) * cols / 2],
                    &scales[r * cols / GROUP..(r + 1) * cols / GROUP],
                    &mut buf[m * ws..m * ws + cols],
                );
            }
            (Cow::Owned(buf), ws)
        }
        MatrixData::F32(_) | MatrixData::Q8 { .. } => {
            panic!("the AMX modes take bf16 and MXFP4 weights only")
        }
    }
}
