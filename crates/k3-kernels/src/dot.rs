//! Row dot products with the fixed reduction orders of spec §5.
//!
//! * f32 / bf16 rows: 16 f64 accumulators, element `i` → lane `i % 16` with an explicit fused
//!   multiply-add, reduced as `b_j = (a_j + a_{j+4}) + (a_{j+8} + a_{j+12})`,
//!   `(b0 + b1) + (b2 + b3)`, then the tail elements fused in sequentially.
//! * MXFP4 rows: per 32-group, 8 f64 lanes (element `i` → lane `i % 8`), reduced
//!   `((s0+s4)+(s1+s5)) + ((s2+s6)+(s3+s7))`, then `acc += sub * scale` (not fused).
//!
//! These scalar functions are the definition; SIMD paths must reproduce them bit for bit.

use crate::bf16_to_f32;
use crate::mxfp4::{e8m0_scale, E2M1, GROUP};
use half::bf16;

/// Lanes of the f32/bf16 dot product.
pub const LANES: usize = 16;

#[inline(always)]
fn reduce16(a: &[f64; LANES]) -> f64 {
    let b0 = (a[0] + a[4]) + (a[8] + a[12]);
    let b1 = (a[1] + a[5]) + (a[9] + a[13]);
    let b2 = (a[2] + a[6]) + (a[10] + a[14]);
    let b3 = (a[3] + a[7]) + (a[11] + a[15]);
    (b0 + b1) + (b2 + b3)
}

/// Generic 16-lane dot of a weight row (converted by `w`) with `x`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // the index order IS the contract here
fn dot16(n: usize, w: impl Fn(usize) -> f32, x: &[f32]) -> f64 {
    let mut a = [0f64; LANES];
    let full = n / LANES * LANES;
    let mut i = 0;
    while i < full {
        for (l, lane) in a.iter_mut().enumerate() {
            *lane = (w(i + l) as f64).mul_add(x[i + l] as f64, *lane);
        }
        i += LANES;
    }
    let mut acc = reduce16(&a);
    for j in full..n {
        acc = (w(j) as f64).mul_add(x[j] as f64, acc);
    }
    acc
}

/// `Σ w_i·x_i` over an f32 row, in the fixed order; returns the f64 sum. Runs the fastest
/// available path ([`crate::simd`]); bit-identical to [`dot_f32_scalar`].
#[inline]
pub fn dot_f32(w: &[f32], x: &[f32]) -> f64 {
    crate::simd::dot_f32_at(crate::simd::active_level(), w, x)
}

/// `Σ w_i·x_i` over a bf16 row (widened by bit shift), in the fixed order. Runs the fastest
/// available path ([`crate::simd`]); bit-identical to [`dot_bf16_scalar`].
#[inline]
pub fn dot_bf16(w: &[bf16], x: &[f32]) -> f64 {
    crate::simd::dot_bf16_at(crate::simd::active_level(), w, x)
}

/// One MXFP4 row: `packed` holds `x.len()/2` bytes, `scales` `x.len()/32` E8M0 bytes.
/// `x.len()` must be a multiple of 32 (binding guarantees it). Runs the fastest available
/// path ([`crate::simd`]); bit-identical to [`dot_mxfp4_scalar`].
#[inline]
pub fn dot_mxfp4(packed: &[u8], scales: &[u8], x: &[f32]) -> f64 {
    crate::simd::dot_mxfp4_at(crate::simd::active_level(), packed, scales, x)
}

/// The scalar definition of [`dot_f32`].
pub fn dot_f32_scalar(w: &[f32], x: &[f32]) -> f64 {
    debug_assert_eq!(w.len(), x.len());
    dot16(w.len(), |i| w[i], x)
}

/// The scalar definition of [`dot_bf16`].
pub fn dot_bf16_scalar(w: &[bf16], x: &[f32]) -> f64 {
    debug_assert_eq!(w.len(), x.len());
    dot16(w.len(), |i| bf16_to_f32(w[i]), x)
}

/// The scalar definition of [`dot_mxfp4`].
pub fn dot_mxfp4_scalar(packed: &[u8], scales: &[u8], x: &[f32]) -> f64 {
    debug_assert_eq!(x.len() % GROUP, 0);
    debug_assert_eq!(packed.len() * 2, x.len());
    debug_assert_eq!(scales.len() * GROUP, x.len());
    let mut acc = 0f64;
    for (g, &s) in scales.iter().enumerate() {
        let codes = &packed[g * GROUP / 2..(g + 1) * GROUP / 2];
        let xs = &x[g * GROUP..(g + 1) * GROUP];
        let mut l = [0f64; 8];
        for (j, &byte) in codes.iter().enumerate() {
            let e = 2 * j;
            let lo = E2M1[(byte & 0x0F) as usize] as f64;
            let hi = E2M1[(byte >> 4) as usize] as f64;
            l[e % 8] = lo.mul_add(xs[e] as f64, l[e % 8]);
            l[(e + 1) % 8] = hi.mul_add(xs[e + 1] as f64, l[(e + 1) % 8]);
        }
        let sub = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        acc += sub * e8m0_scale(s) as f64;
    }
    acc
}

/// Plain sequential f64 dot without fusion (router logits, spec §4.6: `Σ (double)w·(double)x`).
pub fn dot_seq_f64(w: &[f32], x: &[f32]) -> f64 {
    let mut acc = 0f64;
    for (a, b) in w.iter().zip(x) {
        acc += *a as f64 * *b as f64;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive_on_exact_values() {
        let w: Vec<f32> = (0..37).map(|i| (i as f32) * 0.5 - 4.0).collect();
        let x: Vec<f32> = (0..37).map(|i| 1.0 + (i % 5) as f32).collect();
        let naive: f64 = w
            .iter()
            .zip(&x)
            .map(|(a, b)| (*a as f64) * (*b as f64))
            .sum();
        assert_eq!(dot_f32(&w, &x), naive);
        let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
        assert_eq!(dot_bf16(&wb, &x), naive);
    }

    #[test]
    fn mxfp4_dot_equals_dequantised_dot() {
        let packed: Vec<u8> = (0..32).map(|i| (i * 37 % 256) as u8).collect();
        let scales = [126u8, 255];
        let x: Vec<f32> = (0..64).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let deq = crate::mxfp4::dequantize(&packed, &scales, 1, 64);
        let want: f64 = deq
            .iter()
            .zip(&x)
            .map(|(a, b)| (*a as f64) * (*b as f64))
            .sum();
        assert_eq!(dot_mxfp4(&packed, &scales, &x), want);
    }
}
