//! Row dot products, numeric contract v2 (docs/NUMERICS.md#row-dot-contract-v2).
//!
//! Every row dot — f32, bf16 and MXFP4 rows alike — is one 16-lane f32 fused dot:
//!
//! * 16 f32 lanes `a[0..16]`, each starting at `+0.0`;
//! * element `i` (ascending, the whole row, including the `n % 16` tail) updates lane
//!   `i % 16` as `a = fma(w_i, x_i, a)` (one rounding, [`f32::mul_add`]); the tail simply
//!   updates fewer lanes (SIMD paths pad it with `w = −0`, `x = +0`, whose product `−0` is
//!   the exact additive identity, so the padded lanes keep their bits);
//! * the fixed tree [`reduce16`]: `b_j = a_j + a_{j+8}`, `c_j = b_j + b_{j+4}`,
//!   `d_j = c_j + c_{j+2}`, result `d_0 + d_1`.
//!
//! bf16 weights are widened exactly (`bits << 16`); MXFP4 weights are decoded exactly in f32
//! as `E2M1[code] · 2^(s−127)` ([`crate::mxfp4::decode`]); Q8 (int8) weights are widened
//! exactly (`v as f32`) and the row's f32 scale multiplies the tree's result once
//! ([`dot_q8_scalar`]). These scalar functions are the definition; SIMD paths reproduce them
//! bit for bit.
pub(crate) mod def;

pub use def::{
    dot_bf16_scalar, dot_f32_scalar, dot_mxfp4_scalar, dot_q8_scalar, lanes_bf16_scalar,
    lanes_f32_scalar, lanes_mxfp4_scalar, lanes_q8_scalar, q8_finish, reduce16, LANES,
};
use half::bf16;

/// `Σ w_i·x_i` over an f32 row in the contract order. Runs the fastest available path
/// ([`crate::simd`]); bit-identical to [`dot_f32_scalar`].
#[inline]
pub fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    crate::simd::dot_f32_at(crate::simd::active_level(), w, x)
}

/// `Σ w_i·x_i` over a bf16 row (widened by bit shift) in the contract order. Runs the
/// fastest available path ([`crate::simd`]); bit-identical to [`dot_bf16_scalar`].
#[inline]
pub fn dot_bf16(w: &[bf16], x: &[f32]) -> f32 {
    crate::simd::dot_bf16_at(crate::simd::active_level(), w, x)
}

/// One MXFP4 row: `packed` holds `x.len()/2` bytes, `scales` `x.len()/32` E8M0 bytes.
/// `x.len()` must be a multiple of 32 (binding guarantees it). Runs the fastest available
/// path ([`crate::simd`]); bit-identical to [`dot_mxfp4_scalar`].
#[inline]
pub fn dot_mxfp4(packed: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    crate::simd::dot_mxfp4_at(crate::simd::active_level(), packed, scales, x)
}

/// One Q8 row: `scale · Σ (values[i] as f32)·x[i]` — the 16 lanes and the tree over the
/// exactly widened int8 values, then one f32 multiply by the row scale. Runs the fastest
/// available path ([`crate::simd`]); bit-identical to [`dot_q8_scalar`].
#[inline]
pub fn dot_q8(values: &[i8], scale: f32, x: &[f32]) -> f32 {
    crate::simd::dot_q8_at(crate::simd::active_level(), values, scale, x)
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
        assert_eq!(dot_f32(&w, &x) as f64, naive);
        let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
        assert_eq!(dot_bf16(&wb, &x) as f64, naive);
    }

    #[test]
    fn mxfp4_dot_equals_dequantised_f32_dot() {
        let packed: Vec<u8> = (0..32).map(|i| (i * 37 % 256) as u8).collect();
        let scales = [126u8, 255];
        let x: Vec<f32> = (0..64).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let deq = crate::mxfp4::dequantize(&packed, &scales, 1, 64);
        let want = dot_f32_scalar(&deq, &x);
        assert_eq!(dot_mxfp4(&packed, &scales, &x).to_bits(), want.to_bits());
        assert_eq!(
            dot_mxfp4_scalar(&packed, &scales, &x).to_bits(),
            want.to_bits()
        );
    }

    #[test]
    fn q8_dot_is_the_scaled_dot_of_the_widened_row() {
        let v: Vec<i8> = (0..41).map(|i| (i * 37 % 255) as u8 as i8).collect();
        let x: Vec<f32> = (0..41)
            .map(|i| ((i * 7) % 11) as f32 * 0.25 - 1.0)
            .collect();
        let wide: Vec<f32> = v.iter().map(|&q| q as f32).collect();
        let want = 0.037f32 * dot_f32_scalar(&wide, &x);
        assert_eq!(dot_q8_scalar(&v, 0.037, &x).to_bits(), want.to_bits());
        assert_eq!(dot_q8(&v, 0.037, &x).to_bits(), want.to_bits());
        assert_eq!(dot_q8(&[], 2.0, &[]).to_bits(), 0f32.to_bits());
    }

    #[test]
    fn lanes_and_tree_follow_the_contract() {
        // 18 elements: lanes 0 and 1 take two products each (elements 0, 16 and 1, 17).
        let w: Vec<f32> = (0..18).map(|i| i as f32).collect();
        let x = vec![1f32; 18];
        let a = lanes_f32_scalar(&w, &x);
        assert_eq!(a[0], 16.0);
        assert_eq!(a[1], 18.0);
        assert_eq!(a[15], 15.0);
        // The tree pairs lane j with j + 8 first: with a single huge lane the small ones
        // are absorbed in a known order.
        let mut l = [0f32; LANES];
        l[0] = 1.0e8;
        l[8] = -1.0e8;
        l[4] = 1.0;
        assert_eq!(reduce16(&l), 1.0);
        // Tail elements land in their own lanes (element 16 → lane 0 after lane 0's first).
        let w = [
            1f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0,
        ];
        let x = [2f32; 17];
        assert_eq!(lanes_f32_scalar(&w, &x)[0], 8.0);
    }
}
