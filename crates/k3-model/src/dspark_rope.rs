//! The draft's RoPE (docs/DSPARK.md#rope): per-pair inverse frequencies, the cos/sin
//! magnitude and the softmax-scale factor, plain or DeepSeek YaRN as vLLM's
//! `DeepseekScalingRotaryEmbedding` computes them (in f64 here; vLLM builds its table in f32).

use k3_format::dspark::{DraftRope, DsparkConfig, Yarn};
use std::f64::consts::PI;

/// RoPE of one draft config, precomputed.
#[derive(Clone, Debug)]
pub(crate) struct RopeTable {
    /// `[rope/2]` radians per position of pair `i`.
    inv_freq: Vec<f64>,
    /// Multiplies the rotated pair (YaRN's cos/sin magnitude; 1 for plain RoPE).
    magnitude: f64,
    /// Multiplies the attention softmax scale `1/sqrt(nope+rope)` (YaRN's mscale²).
    pub(crate) softmax_factor: f64,
}

/// `0.1·m·ln(s) + 1` for a factor `s > 1`, else 1 (vLLM `yarn_get_mscale`, DeepSeek form).
fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// The (fractional) pair index at which a frequency makes `rotations` turns over the
/// original context (vLLM `yarn_find_correction_dim`).
fn correction_dim(rotations: f64, dim: f64, base: f64, max_pos: f64) -> f64 {
    dim * (max_pos / (rotations * 2.0 * PI)).ln() / (2.0 * base.ln())
}

/// YaRN inverse frequencies: pairs before the correction band (fast turning) keep theirs
/// (extrapolated), pairs after it are divided by `factor` (interpolated), a linear ramp across
/// the band.
fn yarn_inv_freq(y: &Yarn, dim: usize, base: f64) -> Vec<f64> {
    let d = dim as f64;
    let low = correction_dim(y.beta_fast, d, base, y.original_max_position_embeddings)
        .floor()
        .max(0.0);
    let mut high = correction_dim(y.beta_slow, d, base, y.original_max_position_embeddings)
        .ceil()
        .min(d - 1.0);
    if low == high {
        high += 0.001;
    }
    (0..dim / 2)
        .map(|i| {
            let pos_freq = base.powf((2 * i) as f64 / d);
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolated = (1.0 - ramp) * y.extrapolation_factor;
            let interp = 1.0 / (y.factor * pos_freq);
            interp * (1.0 - extrapolated) + extrapolated / pos_freq
        })
        .collect()
}

impl RopeTable {
    /// The table of `c`'s rope slot (`qk_rope_head_dim`, `rope_theta`, `rope`).
    pub(crate) fn new(c: &DsparkConfig) -> RopeTable {
        let (dim, theta) = (c.qk_rope_head_dim, c.rope_theta);
        match &c.rope {
            DraftRope::Plain => RopeTable {
                inv_freq: (0..dim / 2)
                    .map(|i| theta.powf(-((2 * i) as f64) / dim as f64))
                    .collect(),
                magnitude: 1.0,
                softmax_factor: 1.0,
            },
            DraftRope::Yarn(y) => {
                let all_dim = yarn_mscale(y.factor, y.mscale_all_dim);
                RopeTable {
                    inv_freq: yarn_inv_freq(y, dim, theta),
                    magnitude: yarn_mscale(y.factor, y.mscale) / all_dim * y.attn_factor,
                    softmax_factor: all_dim * all_dim,
                }
            }
        }
    }

    /// Rotates the interleaved pairs `(x[2i], x[2i+1])` of `x` (`[rope]`) by
    /// `pos · inv_freq[i]` and scales them by the magnitude (f64, rounded once).
    pub(crate) fn rotate(&self, x: &mut [f32], pos: usize) {
        for (pair, &f) in x.chunks_exact_mut(2).zip(&self.inv_freq) {
            let (sin, cos) = (pos as f64 * f).sin_cos();
            let (sin, cos) = (sin * self.magnitude, cos * self.magnitude);
            let (a, b) = (pair[0] as f64, pair[1] as f64);
            pair[0] = (a * cos - b * sin) as f32;
            pair[1] = (a * sin + b * cos) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(factor: f64) -> Yarn {
        Yarn {
            factor,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 0.707,
            mscale_all_dim: 1.0,
            extrapolation_factor: 1.0,
            attn_factor: 1.0,
        }
    }

    /// dim 8, base 50000, 4096 positions: the band is pairs 1..3 (floor 1.11, ceil 2.40),
    /// so pair 0 keeps its frequency, pair 3 is divided by the factor, pair 2 is half way.
    #[test]
    fn yarn_blends_across_the_correction_band() {
        let f = yarn_inv_freq(&yarn(8.0), 8, 50_000.0);
        let plain: Vec<f64> = (0..4)
            .map(|i| 50_000f64.powf(-(2.0 * i as f64) / 8.0))
            .collect();
        assert_eq!(f[0], plain[0]);
        assert!((f[1] - plain[1]).abs() < 1e-15);
        assert!((f[2] - (plain[2] / 8.0 * 0.5 + plain[2] * 0.5)).abs() < 1e-15);
        assert!((f[3] - plain[3] / 8.0).abs() < 1e-18);
    }

    #[test]
    fn yarn_scales_follow_mscale_and_mscale_all_dim() {
        let m = |s: f64| 0.1 * s * 8f64.ln() + 1.0;
        assert!(
            (yarn_mscale(8.0, 0.707) / yarn_mscale(8.0, 1.0) - m(0.707) / m(1.0)).abs() < 1e-15
        );
        assert_eq!(yarn_mscale(1.0, 1.0), 1.0);
    }
}
