//! Numeric kernels for k3: slices in, slices out. No I/O and no knowledge of layers.
//!
//! Every reduction has one fixed order (docs/NUMERICS.md#kernels), so the scalar path, the
//! SIMD paths and any thread count produce bit-identical results. Row dots follow numeric
//! contract v2: f32 accumulation in 16 fixed lanes (docs/NUMERICS.md#row-dot-contract-v2).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod act;
pub mod attn;
pub mod conv;
pub mod dot;
pub mod fast;
pub mod kda;
pub mod matrix;
pub mod mxfp4;
pub mod norm;
pub mod probe;
pub mod quant;
mod scratch;
pub mod simd;
pub mod tmatvec;
mod widen;

pub use matrix::{matmul, matmul_at, matvec, par_matvec, Matrix, MatrixData};
pub use widen::bf16_to_f32;
