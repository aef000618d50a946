//! The GEMM's activation packing and the AVX2 chunk order ([`super::isa::Isa::HALVES`]).

use super::plan::{KC, XS};
use crate::scratch;
use crate::simd::layout::{copy_in_layout, Layout};
use rayon::prelude::*;

/// Packs the `t` activation rows of `x` (`[t][cols]`) chunk-major into `buf`: chunk `c`,
/// token `j` at `(c·t + j)·XS`, columns `c·KC ..` in `lay` and, when `halves`, each chunk in
/// halves order ([`to_halves`]), `+0` beyond `cols`.
pub(super) fn pack_x<'b>(
    lay: Layout,
    halves: bool,
    x: &[f32],
    t: usize,
    cols: usize,
    buf: &'b mut Vec<f32>,
) -> &'b [f32] {
    let chunks = cols.div_ceil(KC);
    let k16 = cols.next_multiple_of(16);
    let xs = scratch::aligned_any(buf, chunks * t * XS);
    // In parallel even when small: the fork wakes the other workers while this thread
    // packs (packing on the calling thread alone delayed their first task by ~20 µs and
    // cost the 2-thread T 8 MXFP4 GEMM ~5 points; docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why).
    xs.par_chunks_mut(t * XS).enumerate().for_each(|(c, dst)| {
        let (k0, end) = (c * KC, cols.min(c * KC + KC));
        let kc = KC.min(k16 - k0);
        for (j, d) in dst.chunks_mut(XS).enumerate() {
            let src = &x[j * cols + k0..j * cols + end];
            if halves {
                let mut block = [0f32; KC];
                copy_in_layout(lay, src, &mut block[..end - k0]);
                to_halves(&block[..kc], &mut d[..kc]);
                d[kc..].fill(0.0);
            } else {
                copy_in_layout(lay, src, &mut d[..end - k0]);
                d[end - k0..].fill(0.0);
            }
        }
    });
    xs
}

/// `src` (one chunk in step order, a multiple of 16 long) into `dst` (as long) in halves
/// order ([`super::isa::Isa::HALVES`]).
pub(super) fn to_halves(src: &[f32], dst: &mut [f32]) {
    let half = src.len() / 2;
    let (lo, hi) = dst.split_at_mut(half);
    for ((b, l), h) in src
        .chunks_exact(16)
        .zip(lo.chunks_exact_mut(8))
        .zip(hi.chunks_exact_mut(8))
    {
        l.copy_from_slice(&b[..8]);
        h.copy_from_slice(&b[8..]);
    }
}
