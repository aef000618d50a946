//! Exact widenings to f32 shared by the kernels. A leaf: it imports nothing of the crate.

/// bf16 → f32 is exact: the bf16 bits become the top half of the f32
/// (docs/NUMERICS.md#row-dot-contract-v2).
#[inline(always)]
pub fn bf16_to_f32(b: half::bf16) -> f32 {
    f32::from_bits((b.to_bits() as u32) << 16)
}
