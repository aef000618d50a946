//! Elementwise activations (docs/NUMERICS.md#model-ops, docs/NUMERICS.md#transcendentals),
//! f32 with separate multiply and add.

use rayon::prelude::*;

/// `σ(x) = 1 / (1 + e^−x)` in f32, `e^−x` from k3's own [`exp`].
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
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
    let a = (b1 * tanh(g / b1)) * sigmoid(g);
    let v = b2 * tanh(u / b2);
    a * v
}

/// `|x|` below which [`tanh`] returns `x` (`tanh x = x(1 − x²/3 + …)` rounds to `x` in f32).
const TANH_TINY: f64 = 1.0 / 8192.0;
/// `2|x|` is clamped here (`tanh 20 = 1` in f64), which keeps `2^k` a normal f64.
const TANH_CLAMP: f64 = 40.0;
/// `ln 2` split so that `k · LN2_HI` is exact for every `|k| < 2^21` (its low 21 bits are
/// zero; fdlibm's split; tanh uses `k ≤ 58`, exp `|k| ≤ 159`).
const LN2_HI: f64 = 6.931_471_803_691_238e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
const INV_LN2: f64 = std::f64::consts::LOG2_E;
/// `1.5 · 2^52`: adding it rounds to an integer (ties to even) held in the low mantissa bits.
const SHIFTER: f64 = 6_755_399_441_055_744.0;

/// `e^y` in f64 for `−160·ln 2 < y < 130·ln 2` (so `2^k` below is a normal f64): `2^k · p(r)`
/// with `k = round(y / ln 2)` (ties to even, by [`SHIFTER`]), `r = (y − k·ln2_hi) − k·ln2_lo`
/// (`|r| ≤ ln2/2`) and `p` the Taylor sum to `r^11` by Horner; relative error ~1e−16. The
/// one sequence of IEEE f64 operations behind [`exp`] and [`tanh`]
/// (docs/NUMERICS.md#transcendentals).
#[inline(always)]
fn exp_f64(y: f64) -> f64 {
    let z = y * INV_LN2 + SHIFTER;
    let kf = z - SHIFTER;
    let r = (y - kf * LN2_HI) - kf * LN2_LO;
    let mut p = 1.0 / 39_916_800.0; // 1/11!
    for c in [
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    // 2^k from the rounded integer's bits (k = z's low mantissa bits − 2^51)
    let k = z.to_bits().wrapping_sub(SHIFTER.to_bits());
    p * f64::from_bits(k.wrapping_add(1023) << 52)
}

/// [`exp`]'s input range in f64: `e^−110` rounds to `+0` in f32 and `e^90` to `+inf`, and
/// `2^k` stays a normal f64 inside it.
const EXP_LO: f64 = -110.0;
const EXP_HI: f64 = 90.0;

/// k3's own f32 `e^x` (docs/NUMERICS.md#transcendentals): `(f32) e^{(f64)x}` by [`exp_f64`]
/// on `x` clamped to `[−110, 90]`, rounded once to f32 (subnormal results included); NaN
/// returns itself. No libm, no fused multiply-add, no table: the same bits on every machine,
/// SIMD width and thread count, and branch-free, so loops of it vectorise. Measured max
/// error over every finite f32: 0.5 ulp plus the f64 evaluation error.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let e = exp_f64((x as f64).clamp(EXP_LO, EXP_HI)) as f32;
    if x.is_nan() {
        x
    } else {
        e
    }
}

/// k3's own f32 `tanh` (docs/NUMERICS.md#transcendentals): one fixed sequence of IEEE f64
/// operations (no libm, no fused multiply-add, no table), so every machine, SIMD level and
/// thread count gives the same bits. `e = e^{2|x|}` as `2^k · p(r)` (`r = 2|x| − k·ln 2`,
/// `|r| ≤ ln2/2`, Taylor to `r^11`), `t = 1 − 2/(e + 1)`, rounded once to f32, sign of `x`;
/// `|x| < 2^−13` returns `x`, NaN returns itself. Measured max error over every finite f32:
/// 0.5 ulp plus the f64 evaluation error (docs/NUMERICS.md#transcendentals).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = (x as f64).abs();
    let y = (2.0 * a).min(TANH_CLAMP);
    let t = 1.0 - 2.0 / (exp_f64(y) + 1.0);
    let t = if a < TANH_TINY { a } else { t };
    let out = (t as f32).copysign(x);
    if x.is_nan() {
        x
    } else {
        out
    }
}

/// Elements per parallel task of [`situ_glu`] (each element is computed alone, so the split
/// never changes a bit; a prefill's `[T][I]` spreads over every thread).
const SITU_CHUNK: usize = 2048;

/// `out[i] = situ(gate[i], up[i])` over equal-length slices; chunks of [`SITU_CHUNK`]
/// elements run in parallel on the current rayon pool.
pub fn situ_glu(out: &mut [f32], gate: &[f32], up: &[f32], b1: f32, b2: f32) {
    assert_eq!(out.len(), gate.len(), "situ_glu gate length");
    assert_eq!(out.len(), up.len(), "situ_glu up length");
    if out.len() <= SITU_CHUNK {
        return situ_chunk_best(out, gate, up, b1, b2);
    }
    out.par_chunks_mut(SITU_CHUNK)
        .zip(gate.par_chunks(SITU_CHUNK))
        .zip(up.par_chunks(SITU_CHUNK))
        .with_max_len(2) // short jobs: rayon's default leaves unshareable runs at the tail
        .for_each(|((o, g), u)| situ_chunk_best(o, g, u, b1, b2));
}

crate::simd::per_level! {
    /// [`situ_chunk`] compiled for the widest vector level in use ([`crate::simd::active_level`];
    /// the same IEEE operations at every width, so the same bits).
    fn situ_chunk_best(out: &mut [f32], gate: &[f32], up: &[f32], b1: f32, b2: f32) = situ_chunk;
}

/// [`situ`] of at most [`SITU_CHUNK`] elements, one loop: `tanh` and `exp` are branch-free
/// f64 sequences (no libm call), so it vectorises whole.
#[inline(always)]
fn situ_chunk(out: &mut [f32], gate: &[f32], up: &[f32], b1: f32, b2: f32) {
    for (o, (&g, &u)) in out.iter_mut().zip(gate.iter().zip(up)) {
        *o = situ(g, u, b1, b2);
    }
}

/// `out[i] *= σ(gate[i])` (an output gate), compiled for the vector level in use.
pub fn mul_sigmoid(out: &mut [f32], gate: &[f32]) {
    assert_eq!(out.len(), gate.len(), "mul_sigmoid lengths");
    mul_sigmoid_best(out, gate)
}

/// `x[i] = σ(x[i])`, compiled for the vector level in use.
pub fn sigmoid_inplace(x: &mut [f32]) {
    sigmoid_inplace_best(x)
}

crate::simd::per_level! {
    fn mul_sigmoid_best(out: &mut [f32], gate: &[f32]) = mul_sigmoid_any;
}

crate::simd::per_level! {
    fn sigmoid_inplace_best(x: &mut [f32]) = sigmoid_inplace_any;
}

#[inline(always)]
fn mul_sigmoid_any(out: &mut [f32], gate: &[f32]) {
    for (o, &g) in out.iter_mut().zip(gate) {
        *o *= sigmoid(g);
    }
}

#[inline(always)]
fn sigmoid_inplace_any(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = sigmoid(*v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place of `got` against the f64 `want`.
    fn ulps(got: f32, want: f64) -> f64 {
        let ulp = f32::from_bits(got.abs().to_bits() + 1) as f64 - got.abs() as f64;
        (got as f64 - want).abs() / ulp
    }

    #[test]
    fn tanh_is_within_half_an_ulp_of_f64_on_a_sweep_of_every_binade() {
        // every 251st bit pattern of the positive finite f32 (the sign is a copysign):
        // 8.5 million inputs across every binade; the full sweep is the example `transcendental_ulp`
        let mut worst = 0f64;
        for bits in (0..0x7f80_0000u32).step_by(251) {
            let x = f32::from_bits(bits);
            let got = tanh(x);
            assert_eq!(tanh(-x).to_bits(), (-got).to_bits(), "odd at {x:e}");
            worst = worst.max(ulps(got, (x as f64).tanh()));
        }
        assert!(worst <= 0.5001, "max error {worst} ulp");
    }

    #[test]
    fn exp_is_within_half_an_ulp_of_f64_on_a_sweep_of_every_binade() {
        // every 97th bit pattern of both signs whose f32 exp is finite: across every binade
        // (the full sweep is the example `transcendental_ulp`)
        let mut worst = 0f64;
        for bits in (0..0x42b1_7218u32).step_by(97) {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                let want = (x as f64).exp();
                let got = exp(x);
                if want >= f32::MIN_POSITIVE as f64 {
                    worst = worst.max(ulps(got, want));
                } else {
                    // subnormal or zero results: within half a subnormal step
                    let step = f32::from_bits(1) as f64;
                    assert!((got as f64 - want).abs() <= 0.5001 * step, "exp({x:e})");
                }
            }
        }
        assert!(worst <= 0.5001, "max error {worst} ulp");
    }

    #[test]
    fn exp_edges() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(1.0), std::f32::consts::E);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY).to_bits(), 0);
        assert_eq!(exp(f32::MAX), f32::INFINITY);
        assert_eq!(exp(-f32::MAX).to_bits(), 0);
        assert!(exp(f32::NAN).is_nan());
        // the largest finite result, and the first input past it
        // (boundaries from the f64 exp rounded to f32)
        assert_eq!(exp(88.72283), 3.402_798_5e38);
        assert_eq!(exp(88.72284), f32::INFINITY);
        // the smallest subnormal, and the first input past it that rounds to zero
        assert_eq!(exp(-103.97208).to_bits(), 1);
        assert_eq!(exp(-103.972_084).to_bits(), 0);
        let tiny = f32::from_bits(1);
        assert_eq!(exp(tiny), 1.0);
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(sigmoid(f32::INFINITY), 1.0);
        assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn sigmoid_slices_equal_the_elementwise_definition_on_every_level() {
        let n = 1000 + 13;
        let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 30.0).collect();
        let base: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() * 4.0).collect();
        for scalar in [false, true] {
            crate::simd::set_force_scalar(scalar);
            let mut gated = base.clone();
            mul_sigmoid(&mut gated, &g);
            let mut s = g.clone();
            sigmoid_inplace(&mut s);
            for i in 0..n {
                assert_eq!(gated[i].to_bits(), (base[i] * sigmoid(g[i])).to_bits());
                assert_eq!(s[i].to_bits(), sigmoid(g[i]).to_bits(), "scalar {scalar}");
            }
        }
        crate::simd::set_force_scalar(false);
    }

    #[test]
    fn tanh_edges() {
        assert_eq!(tanh(0.0).to_bits(), 0f32.to_bits());
        assert_eq!(tanh(-0.0).to_bits(), (-0f32).to_bits());
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh(f32::MAX), 1.0);
        assert_eq!(tanh(9.5), 1.0);
        assert!(tanh(f32::NAN).is_nan());
        let tiny = f32::from_bits(1);
        assert_eq!(tanh(tiny), tiny);
    }

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
        for scalar in [false, true] {
            // the vector level in use, then the forced scalar path: the same bits
            crate::simd::set_force_scalar(scalar);
            let mut out = vec![0f32; n];
            situ_glu(&mut out, &gate, &up, 4.0, 25.0);
            for i in 0..n {
                let want = situ(gate[i], up[i], 4.0, 25.0);
                assert_eq!(
                    out[i].to_bits(),
                    want.to_bits(),
                    "element {i}, scalar {scalar}"
                );
            }
        }
        crate::simd::set_force_scalar(false);
    }
}
