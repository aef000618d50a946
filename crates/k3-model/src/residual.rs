//! Block attention residuals (docs/MODEL.md#attention-residual-attn_res, docs/MODEL.md#decoder-layer): softmax over RMS-normed sources
//! scored against a folded query, mixing the RAW sources.

use crate::dims::MAX_SOURCES;
use k3_kernels::attn::attn_res;

/// `fold = norm ⊙ proj` (f32 elementwise product; `out`, `norm`, `proj` are `[E]`).
pub fn fold(out: &mut [f32], norm: &[f32], proj: &[f32]) {
    for ((o, &n), &p) in out.iter_mut().zip(norm).zip(proj) {
        *o = n * p;
    }
}

/// Mixes one token's sources `[blocks[0..n), prefix]` into `out` (`[E]`): `blocks` holds at
/// least `n` snapshots of width `E` back to back. Sources are passed in that order, so the
/// softmax and the f32 weighted sum run blocks first, prefix last. `n + 1 ≤ MAX_SOURCES`
/// (guaranteed by [`crate::Dims::new`]).
pub fn mix(out: &mut [f32], blocks: &[f32], n: usize, prefix: &[f32], fold: &[f32], eps: f64) {
    let e = out.len();
    let mut refs: [&[f32]; MAX_SOURCES] = [&[]; MAX_SOURCES];
    for (b, r) in refs.iter_mut().take(n).enumerate() {
        *r = &blocks[b * e..(b + 1) * e];
    }
    refs[n] = prefix;
    let mut scores = [0f32; MAX_SOURCES];
    attn_res(out, &refs[..n + 1], fold, eps, &mut scores);
}
