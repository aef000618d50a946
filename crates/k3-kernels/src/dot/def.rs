//! The scalar definition of the row dots (numeric contract v2, docs/NUMERICS.md#row-dot-contract-v2):
//! the 16 lanes, the fixed tree and the Q8 scale. Every SIMD path reproduces these bit for
//! bit. A leaf: only the element decoders ([`crate::mxfp4`]) lie below it.

use crate::mxfp4::{decode, GROUP};
use crate::widen::bf16_to_f32;
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

/// The scalar definition of `dot_f32` (the 16 lanes before the tree).
pub fn lanes_f32_scalar(w: &[f32], x: &[f32]) -> [f32; LANES] {
    assert_eq!(w.len(), x.len(), "dot length");
    lanes16(|i| w[i], x)
}

/// The scalar definition of `dot_bf16` (the 16 lanes before the tree).
pub fn lanes_bf16_scalar(w: &[bf16], x: &[f32]) -> [f32; LANES] {
    assert_eq!(w.len(), x.len(), "dot length");
    lanes16(|i| bf16_to_f32(w[i]), x)
}

/// The scalar definition of `dot_mxfp4` (the 16 lanes before the tree). Panics unless
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

/// The scalar definition of the lanes of `dot_q8` (before the tree and the scale): the
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

/// The scalar definition of `dot_f32`.
pub fn dot_f32_scalar(w: &[f32], x: &[f32]) -> f32 {
    reduce16(&lanes_f32_scalar(w, x))
}

/// The scalar definition of `dot_bf16`.
pub fn dot_bf16_scalar(w: &[bf16], x: &[f32]) -> f32 {
    reduce16(&lanes_bf16_scalar(w, x))
}

/// The scalar definition of `dot_mxfp4`.
pub fn dot_mxfp4_scalar(packed: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    reduce16(&lanes_mxfp4_scalar(packed, scales, x))
}

/// The scalar definition of `dot_q8`: `scale · reduce16(lanes_q8_scalar(values, x))`.
pub fn dot_q8_scalar(values: &[i8], scale: f32, x: &[f32]) -> f32 {
    q8_finish(scale, reduce16(&lanes_q8_scalar(values, x)))
}
