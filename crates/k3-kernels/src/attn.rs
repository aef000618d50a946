//! Softmax and the block attention-residual mix (docs/NUMERICS.md#model-ops,
//! docs/NUMERICS.md#where-f64-stays).

use crate::norm::rms_inv;

/// In-place softmax with an f64 denominator: `e = exp(s − max)` in f32,
/// `Z = Σ (f64)e` sequential, `p = (f32)(e / Z)`.
pub fn softmax_inplace(s: &mut [f32]) {
    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    exp_shifted_best(s, m);
    let z: f64 = s.iter().fold(0.0, |z, &v| z + v as f64);
    for v in s.iter_mut() {
        *v = (*v as f64 / z) as f32;
    }
}

crate::simd::per_level! {
    fn exp_shifted_best(s: &mut [f32], m: f32) = exp_shifted_any;
}

/// `s[i] = exp(s[i] − m)` (k3's own `act::exp`), compiled for the vector level in use.
#[inline(always)]
fn exp_shifted_any(s: &mut [f32], m: f32) {
    for v in s.iter_mut() {
        *v = crate::act::exp(*v - m);
    }
}

/// `acc[i] += p · row[i]` (f32 product rounded, then added: no fusion) — one key's term of
/// an attention context sum; compiled for the vector level in use (the same operations at
/// every width, so the same bits).
pub fn add_scaled(acc: &mut [f32], p: f32, row: &[f32]) {
    assert_eq!(acc.len(), row.len(), "add_scaled lengths");
    add_scaled_best(acc, p, row)
}

crate::simd::per_level! {
    fn add_scaled_best(acc: &mut [f32], p: f32, row: &[f32]) = add_scaled_any;
}

#[inline(always)]
fn add_scaled_any(acc: &mut [f32], p: f32, row: &[f32]) {
    for (a, &c) in acc.iter_mut().zip(row) {
        *a += p * c;
    }
}

/// Attention-residual aggregation over `sources` (each `[n]`):
/// key of source s = RMS-normalised source; `score_s = (f32) Σ (f64)(v_i·inv_s)·(f64)fold_i`;
/// `p = softmax(score)` (f64 denominator); `out_i = Σ_s p_s·v_i^{(s)}` in f32, source order,
/// from 0. VALUES are the raw sources. `fold = res_norm ⊙ res_proj`. `scores` is scratch
/// of at least `sources.len()`.
pub fn attn_res(out: &mut [f32], sources: &[&[f32]], fold: &[f32], eps: f64, scores: &mut [f32]) {
    let n = out.len();
    assert!(!sources.is_empty(), "attn_res needs at least one source");
    assert_eq!(fold.len(), n, "attn_res fold length");
    let scores = &mut scores[..sources.len()];
    for (sc, src) in scores.iter_mut().zip(sources) {
        assert_eq!(src.len(), n, "attn_res source length");
        let inv = rms_inv(src, eps);
        let mut acc = 0f64;
        for (&v, &f) in src.iter().zip(fold) {
            acc += ((v * inv) as f64) * (f as f64);
        }
        *sc = acc as f32;
    }
    softmax_inplace(scores);
    out.fill(0.0);
    for (&p, src) in scores.iter().zip(sources) {
        for (o, &v) in out.iter_mut().zip(src.iter()) {
            *o += p * v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_scaled_is_the_same_at_every_level() {
        let row: Vec<f32> = (0..531).map(|i| (i as f32 * 0.31).sin() * 7.0).collect();
        let run = |scalar: bool| {
            crate::simd::set_force_scalar(scalar);
            let mut acc: Vec<f32> = (0..531).map(|i| (i as f32 * 0.17).cos()).collect();
            add_scaled(&mut acc, 0.377, &row);
            add_scaled(&mut acc, -1.3e-3, &row);
            acc.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let (vector, scalar) = (run(false), run(true));
        crate::simd::set_force_scalar(false);
        assert_eq!(vector, scalar);
        let mut one = [1.5f32];
        add_scaled(&mut one, 0.1, &[3.0]);
        assert_eq!(one[0], 1.5 + 0.1f32 * 3.0);
    }

    #[test]
    fn softmax_is_the_definition_at_every_level() {
        let row: Vec<f32> = (0..203).map(|i| (i as f32 * 0.29).sin() * 12.0).collect();
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = row.iter().map(|&v| crate::act::exp(v - m)).collect();
        let z = e.iter().fold(0f64, |z, &v| z + v as f64);
        for scalar in [false, true] {
            crate::simd::set_force_scalar(scalar);
            let mut s = row.clone();
            softmax_inplace(&mut s);
            for (i, (&got, &ei)) in s.iter().zip(&e).enumerate() {
                let want = (ei as f64 / z) as f32;
                assert_eq!(got.to_bits(), want.to_bits(), "{i}, scalar {scalar}");
            }
        }
        crate::simd::set_force_scalar(false);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut s = [1.0f32, 2.0, 3.0];
        softmax_inplace(&mut s);
        assert!((s.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(s[2] > s[1] && s[1] > s[0]);
    }

    #[test]
    fn single_source_passes_through() {
        let src = [1.0f32, -2.0, 3.0];
        let fold = [0.1f32, 0.2, 0.3];
        let mut out = [0f32; 3];
        let mut sc = [0f32; 1];
        attn_res(&mut out, &[&src], &fold, 1e-5, &mut sc);
        assert_eq!(out, src);
    }
}
