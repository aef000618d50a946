//! Causal depthwise short convolution with SiLU and carried history (docs/NUMERICS.md#model-ops,
//! "KDA conv").

use crate::act::silu;

/// One token through the conv for `c` channels with kernel `k`:
/// `acc = w[c][k−1]·x + Σ_{j<k−1} w[c][j]·hist[c][j]` (current tap first, then oldest→newest),
/// `out = acc·σ(acc)`; the history shifts left and takes the PRE-conv input `x`.
/// `w` is `[c][k]` (taps oldest→newest), `hist` is `[c][k−1]` (oldest first).
pub fn shortconv_step(out: &mut [f32], x: &[f32], w: &[f32], hist: &mut [f32], k: usize) {
    let c = x.len();
    assert!(k >= 1, "conv kernel width must be ≥ 1");
    assert_eq!(out.len(), c, "shortconv output length");
    assert_eq!(w.len(), c * k, "shortconv weight length");
    assert_eq!(hist.len(), c * (k - 1), "shortconv history length");
    let h = k - 1;
    for ch in 0..c {
        let wc = &w[ch * k..(ch + 1) * k];
        let hc = &mut hist[ch * h..(ch + 1) * h];
        let mut acc = wc[k - 1] * x[ch];
        for j in 0..h {
            acc += wc[j] * hc[j];
        }
        out[ch] = acc;
        if h > 0 {
            hc.copy_within(1.., 0);
            hc[h - 1] = x[ch];
        }
    }
    silu_inplace_best(out);
}

/// The history update of [`shortconv_step`] alone, for `c = x.len()` channels: each
/// channel's `hist[c]` (`[k−1]`, oldest first) shifts left and takes `x[c]`. Rebuilds the
/// history after a prefix of tokens whose outputs are already known.
pub fn shortconv_push(x: &[f32], hist: &mut [f32], k: usize) {
    let h = k.saturating_sub(1);
    assert_eq!(hist.len(), x.len() * h, "shortconv history length");
    if h == 0 {
        return;
    }
    for (hc, &xc) in hist.chunks_exact_mut(h).zip(x) {
        hc.copy_within(1.., 0);
        hc[h - 1] = xc;
    }
}

crate::simd::per_level! {
    /// `x = x·σ(x)` in place (SiLU), compiled for the vector level in use.
    fn silu_inplace_best(x: &mut [f32]) = silu_inplace_any;
}

#[inline(always)]
fn silu_inplace_any(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = silu(*v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::sigmoid;

    /// Many channels (past a vector's width, with a tail) at the level in use and on the
    /// forced scalar path: each output is the per-channel definition.
    #[test]
    fn every_level_computes_the_definition() {
        let (c, k) = (203, 4);
        let w: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.41).sin()).collect();
        for scalar in [false, true] {
            crate::simd::set_force_scalar(scalar);
            let mut hist: Vec<f32> = (0..c * (k - 1))
                .map(|i| (i as f32 * 0.7).cos() * 3.0)
                .collect();
            for tok in 0..3 {
                let x: Vec<f32> = (0..c)
                    .map(|i| ((i + tok) as f32 * 0.13).sin() * 9.0)
                    .collect();
                let before = hist.clone();
                let mut out = vec![0f32; c];
                shortconv_step(&mut out, &x, &w, &mut hist, k);
                for ch in 0..c {
                    let mut acc = w[ch * k + k - 1] * x[ch];
                    for j in 0..k - 1 {
                        acc += w[ch * k + j] * before[ch * (k - 1) + j];
                    }
                    let want = acc * sigmoid(acc);
                    assert_eq!(
                        out[ch].to_bits(),
                        want.to_bits(),
                        "channel {ch}, scalar {scalar}"
                    );
                }
            }
        }
        crate::simd::set_force_scalar(false);
    }

    #[test]
    fn push_is_the_history_update_of_a_step() {
        let (c, k) = (37, 4);
        let w: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.3).cos()).collect();
        let mut stepped: Vec<f32> = (0..c * (k - 1)).map(|i| i as f32 * 0.5).collect();
        let mut pushed = stepped.clone();
        for tok in 0..5 {
            let x: Vec<f32> = (0..c).map(|i| ((i * 7 + tok) as f32).sin()).collect();
            let mut out = vec![0f32; c];
            shortconv_step(&mut out, &x, &w, &mut stepped, k);
            shortconv_push(&x, &mut pushed, k);
            assert_eq!(pushed, stepped, "token {tok}");
        }
    }

    #[test]
    fn history_carries_pre_conv_input() {
        let w = [0.0, 0.0, 1.0, 0.0]; // only tap j=2 (newest history) is non-zero
        let mut hist = [0f32; 3];
        let mut out = [0f32; 1];
        shortconv_step(&mut out, &[5.0], &w, &mut hist, 4);
        assert_eq!(out[0], 0.0);
        assert_eq!(hist, [0.0, 0.0, 5.0]);
        shortconv_step(&mut out, &[1.0], &w, &mut hist, 4);
        assert_eq!(out[0], 5.0 * sigmoid(5.0));
    }
}
