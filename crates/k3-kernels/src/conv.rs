//! Causal depthwise short convolution with SiLU and carried history (docs/NUMERICS.md#model-ops,
//! "KDA conv").

use crate::act::sigmoid;

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
        out[ch] = acc * sigmoid(acc);
        if h > 0 {
            hc.copy_within(1.., 0);
            hc[h - 1] = x[ch];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
