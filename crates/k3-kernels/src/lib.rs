//! Numeric kernels for k3: slices in, slices out. No I/O and no knowledge of layers.
//!
//! Every reduction has one fixed order (see `docs/NUMERICS.md`), so the scalar path, the SIMD
//! paths and any thread count produce bit-identical results.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod act;
pub mod attn;
pub mod conv;
pub mod dot;
pub mod kda;
pub mod matrix;
pub mod mxfp4;
pub mod norm;

pub use matrix::{matmul, matvec, par_matvec, Matrix, MatrixData};

/// bf16 → f32 is exact: the bf16 bits become the top half of the f32 (spec §5).
#[inline(always)]
pub fn bf16_to_f32(b: half::bf16) -> f32 {
    f32::from_bits((b.to_bits() as u32) << 16)
}
pub mod simd;
pub mod tmatvec;
