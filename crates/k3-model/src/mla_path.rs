//! Which MLA formulation a forward call runs. A leaf, so the per-call context
//! ([`crate::pass::Pass`]) can name it without importing the attention itself.

/// Which attention formulation to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaPath {
    /// Weight absorption over the latent cache (the engine's path).
    Latent,
    /// Re-expand k/v per position through `kv_b` (reference for tests).
    Expanded,
}
