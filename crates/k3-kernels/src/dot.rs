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

use crate::bf16_to_f32;
use crate::mxfp4::{decode, GROUP};
use half::bf16;

/// Lanes of every row dot.
pub const LANES: usize = 16;

/// The fixed reduction tree over the 16 lanes (in lane order).
#[inline]
pub fn reduce16(a: &[f32; LANES]) -> f32 {
    let b: [f32; 8] = std::array::from_fn(|j| a[j] + a[j + 8]);
    let c: [f32; 4] = std::array::from_fn(|j| b[j] + b[j + 4]);
    let d = [c[0] + c[2], c[1] + c[3]];
    d[0] + d[1]
}

/// The 16 lanes of the dot of a row (element `i` given by `w(i)`) with `x`.
#[inline(always)]
fn lanes16(w: impl Fn(usize) -> f32, x: &[f32]) -> [f32; LANES] {
    let mut a = [0f32; LANES];
    for (i, &xi) in x.iter().enumerate() {
        let l = &mut a[i % LANES];
        *l = w(i).mul_add(xi, *l);
    }
    a
}

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

/// The scalar definition of [`dot_f32`] (the 16 lanes before the tree).
pub fn lanes_f32_scalar(w: &[f32], x: &[f32]) -> [f32; LANES] {
    assert_eq!(w.len(), x.len(), "dot length");
    lanes16(|i| w[i], x)
}

/// The scalar definition of [`dot_bf16`] (the 16 lanes before the tree).
pub fn lanes_bf16_scalar(w: &[bf16], x: &[f32]) -> [f32; LANES] {
    assert_eq!(w.len(), x.len(), "dot length");
    lanes16(|i| bf16_to_f32(w[i]), x)
}

/// The scalar definition of [`dot_mxfp4`] (the 16 lanes before the tree). Panics unless
/// `packed.len() * 2 == x.len() == scales.len() * 32`.
pub fn lanes_mxfp4_scalar(packed: &[u8], scales: &[u8], x: &[f32]) -> [f32; LANES] {
    assert!(
        packed.len() * 2 == x.len() && scales.len() * GROUP == x.len(),
        "mxfp4 row lengths"
    );
    let code = |i: usize| {
        let b = packed[i / 2];
        if i.is_multiple_of(2) {
            b & 0x0F
        } else {
            b >> 4
        }
    };
    lanes16(|i| decode(code(i), scales[i / GROUP]), x)
}

/// The scalar definition of the lanes of [`dot_q8`] (before the tree and the scale): the
/// lanes of the f32 dot of the widened row.
pub fn lanes_q8_scalar(values: &[i8], x: &[f32]) -> [f32; LANES] {
    assert_eq!(values.len(), x.len(), "dot length");
    lanes16(|i| values[i] as f32, x)
}

/// The Q8 row scale applied to the tree's result: `scale · d`, one f32 multiply (the one
/// expression every path uses).
#[inline(always)]
pub fn q8_finish(scale: f32, d: f32) -> f32 {
    scale * d
}

/// The scalar definition of [`dot_f32`].
pub fn dot_f32_scalar(w: &[f32], x: &[f32]) -> f32 {
    reduce16(&lanes_f32_scalar(w, x))
}

/// The scalar definition of [`dot_bf16`].
pub fn dot_bf16_scalar(w: &[bf16], x: &[f32]) -> f32 {
    reduce16(&lanes_bf16_scalar(w, x))
}

/// The scalar definition of [`dot_mxfp4`].
pub fn dot_mxfp4_scalar(packed: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    reduce16(&lanes_mxfp4_scalar(packed, scales, x))
}

/// The scalar definition of [`dot_q8`]: `scale · reduce16(lanes_q8_scalar(values, x))`.
pub fn dot_q8_scalar(values: &[i8], scale: f32, x: &[f32]) -> f32 {
    q8_finish(scale, reduce16(&lanes_q8_scalar(values, x)))
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
