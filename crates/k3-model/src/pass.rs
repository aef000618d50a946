//! The read-only context of one forward call, built once in [`crate::Model::forward`] and
//! shared by every layer: the geometry, the call's length and position, where routed experts
//! come from, and the optional lookahead hook. Per-call facts go here, not into every
//! signature; the `&mut` things (carried state, outputs, scratch) travel separately.

use crate::dims::Dims;
use crate::mla::MlaPath;
use crate::weights::ExpertProvider;

/// A lookahead hook: called once per MoE layer `l` with layer `l + 1` and `l`'s normed MoE
/// input `x` (`[T][E]`), right after layer `l`'s own expert reads were issued, so the reads it
/// starts queue behind them. The result of the forward never depends on it.
pub type Ahead<'a> = &'a dyn Fn(usize, &[f32]);

/// Facts every layer of one call reads.
#[derive(Clone, Copy)]
pub struct Pass<'p> {
    /// The model's widths and constants.
    pub d: &'p Dims,
    /// Tokens in the call (T).
    pub t: usize,
    /// Absolute position of the call's first token.
    pub pos: usize,
    /// The routed-expert store.
    pub experts: &'p dyn ExpertProvider,
    /// MLA formulation (latent cache with absorbed weights, or the expanded test reference).
    pub mla_path: MlaPath,
    /// Next-layer router lookahead, when on.
    pub ahead: Option<Ahead<'p>>,
}

impl<'p> Pass<'p> {
    /// A call of `t` tokens at position `pos`, latent MLA, no lookahead.
    pub fn new(d: &'p Dims, t: usize, pos: usize, experts: &'p dyn ExpertProvider) -> Self {
        Pass {
            d,
            t,
            pos,
            experts,
            mla_path: MlaPath::Latent,
            ahead: None,
        }
    }
}
