//! Elementwise activations (docs/NUMERICS.md#model-ops, docs/NUMERICS.md#transcendentals),
//! f32 with separate multiply and add.

use rayon::prelude::*;

/// `σ(x) = 1 / (1 + e^−x)` in f32.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x·σ(x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// SiTU-GLU: `y = (b1·tanh(g/b1))·σ(g) · (b2·tanh(u/b2))` — the sigmoid takes the UNCAPPED
/// gate `g`, so `|y| ≤ b1·b2`.
#[inline(always)]
pub fn situ(g: f32, u: f32, b1: f32, b2: f32) -> f32 {
    let a = (b1 * (g / b1).tanh()) * sigmoid(g);
    let v = b2 * (u / b2).tanh();
    a * v
}

/// Elements per parallel task of [`situ_glu`] (each element is computed alone, so the split
/// never changes a bit; a prefill's `[T][I]` spreads over every thread).
const SITU_CHUNK: usize = 2048;

/// `out[i] = situ(gate[i], up[i])` over equal-length slices; chunks of [`SITU_CHUNK`]
/// elements run in parallel on the current rayon pool.
pub fn situ_glu(out: &mut [f32], gate: &[f32], up: &[f32], b1: f32, b2: f32) {
    assert_eq!(out.len(), gate.len(), "situ_glu gate length");
    assert_eq!(out.len(), up.len(), "situ_glu up length");
    let serial = |out: &mut [f32], gate: &[f32], up: &[f32]| {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = situ(g, u, b1, b2);
        }
    };
    if out.len() <= SITU_CHUNK {
        return serial(out, gate, up);
    }
    out.par_chunks_mut(SITU_CHUNK)
        .zip(gate.par_chunks(SITU_CHUNK))
        .zip(up.par_chunks(SITU_CHUNK))
        .for_each(|((o, g), u)| serial(o, g, u));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn situ_saturates_at_b1_b2() {
        assert!((situ(1000.0, 1000.0, 4.0, 25.0) - 100.0).abs() < 1e-4);
        assert_eq!(situ(0.0, 3.0, 4.0, 25.0), 0.0);
    }

    #[test]
    fn parallel_situ_glu_equals_the_elementwise_definition() {
        let n = 5 * SITU_CHUNK + 17; // several chunks and a short tail
        let gate: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() * 40.0).collect();
        let mut out = vec![0f32; n];
        situ_glu(&mut out, &gate, &up, 4.0, 25.0);
        for i in 0..n {
            let want = situ(gate[i], up[i], 4.0, 25.0);
            assert_eq!(out[i].to_bits(), want.to_bits(), "element {i}");
        }
    }
}
