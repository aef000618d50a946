//! The Kimi K3 graph: KDA, gated MLA (latent KV cache), Stable LatentMoE, block attention
//! residuals. Weights arrive through [`weights::WeightProvider`] and
//! [`weights::ExpertProvider`]; the model never opens a file.
//!
//! Reading order follows the paper: [`kda`], [`mla`], [`router`], [`moe`], [`dense`],
//! [`residual`], [`layer`], [`forward`]; carried session state lives in [`state`].
//!
//! # Parallelism policy
//! Work is split with rayon only across INDEPENDENT outputs: matrix rows (`par_matvec`,
//! `matmul`), KDA heads, MLA heads, router experts. No reduction is ever split across threads
//! and every sum has one fixed order (documented per op and in `docs/NUMERICS.md`), so logits
//! are bit-identical at any thread count, for prefill vs decode vs recompute, and for any
//! order in which an expert store delivers experts. Routed experts are computed one at a time
//! as they arrive (rows in parallel inside each).
//!
//! # Distribution
//! Across processes (or in-process ranks) the same rule holds one level up: [`dist`] deals
//! trunk rows and routed experts over the ranks of a [`Comm`] and all-gathers in rank order,
//! never splitting a dot product, so every rank's logits equal one process's
//! (docs/DISTRIBUTED.md#the-seam).

#![forbid(unsafe_code)]
// Untrusted data must never reach an unwrap/expect (docs/RELIABILITY.md); tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod dense;
pub mod dims;
pub mod dist;
pub mod dist_cost;
pub mod dspark;
mod dspark_rope;
pub mod error;
pub mod forward;
pub mod journal;
pub mod kda;
pub mod layer;
pub mod local;
mod logits;
pub mod mla;
mod mla_path;
pub mod moe;
pub mod pass;
pub mod residual;
pub mod router;
pub mod scratch;
pub mod share;
pub mod state;
pub mod taps;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod weights;

#[cfg(test)]
mod tests;

pub use dims::{Dims, LayerKind};
pub use dist::{Comm, CommError, Dist, Solo};
pub use error::ModelError;
pub use forward::{argmax, BatchItem, Logits, LogitsMode, Model, LOOKAHEAD_DEFAULT};
pub use local::LocalComm;
pub use mla::MlaPath;
pub use pass::{Ahead, Pass, Seq};
pub use state::{KdaState, MlaCache, Snapshot, State};
pub use taps::{TapStream, Taps};
