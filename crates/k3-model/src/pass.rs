//! The read-only context of one forward call, built once in [`crate::Model::forward`] and
//! shared by every layer: the geometry, the call's length and position, where routed experts
//! come from, and the optional lookahead hook. Per-call facts go here, not into every
//! signature; the `&mut` things (carried state, outputs, scratch) travel separately.

use crate::dims::Dims;
use crate::dist::Dist;
use crate::error::ModelError;
use crate::mla_path::MlaPath;
use crate::weights::ExpertProvider;

/// Most token rows per rayon job of the per-row loops (norms, mixes, gates, decay): rayon's
/// default split leaves runs of up to a quarter of the rows that an idle thread cannot
/// share at a loop's tail; 4 rows (tens of µs) bound that tail.
pub(crate) const ROWS_PER_JOB: usize = 4;

/// A lookahead hook: called once per MoE layer `l` with layer `l + 1` and `l`'s normed MoE
/// input `x` (`[T][E]`), right after layer `l`'s own expert reads were issued, so the reads it
/// starts queue behind them. The result of the forward never depends on it.
pub type Ahead<'a> = &'a dyn Fn(usize, &[f32]);

/// One sequence of a batched call: rows `start..start + len` of every `[T][…]` buffer, at
/// absolute positions `pos..pos + len` of that sequence's own carried state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seq {
    /// First row of the call that belongs to the sequence.
    pub start: usize,
    /// Rows (tokens) of the sequence in the call.
    pub len: usize,
    /// Absolute position of the sequence's first token in this call.
    pub pos: usize,
}

/// Facts every layer of one call reads.
#[derive(Clone, Copy)]
pub struct Pass<'p> {
    /// The model's widths and constants.
    pub d: &'p Dims,
    /// Rows in the call (T): the tokens of every sequence, back to back.
    pub t: usize,
    /// Absolute position of the call's first token (one-sequence calls).
    pub pos: usize,
    /// The sequences of a batched call, in row order; empty = one sequence of all `t` rows at
    /// `pos`. Row-wise ops (projections, router, experts, norms) run over all `t` rows at once;
    /// the token mixers' recurrence, conv and attention run per sequence against its state.
    pub batch: &'p [Seq],
    /// The routed-expert store.
    pub experts: &'p dyn ExpertProvider,
    /// MLA formulation (latent cache with absorbed weights, or the expanded test reference).
    pub mla_path: MlaPath,
    /// Next-layer router lookahead, when on.
    pub ahead: Option<Ahead<'p>>,
    /// Which rank computes which rows and experts (docs/DISTRIBUTED.md#the-seam).
    pub dist: Dist<'p>,
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
            batch: &[],
            dist: Dist::solo(),
        }
    }

    /// Sequences in the call (1 unless batched).
    pub fn n_seqs(&self) -> usize {
        self.batch.len().max(1)
    }

    /// Refuses a token mixer of layer `l` handed `states` carried states for a call of
    /// another number of sequences (a caller's bug, reported rather than guessed around).
    pub fn check_states(&self, l: usize, states: usize) -> Result<(), ModelError> {
        if states == self.n_seqs() {
            return Ok(());
        }
        Err(ModelError::StateMismatch(format!(
            "layer {l}: {states} states for {} sequences",
            self.n_seqs()
        )))
    }

    /// Sequence `i` of the call (`i < n_seqs()`).
    pub fn seq(&self, i: usize) -> Seq {
        match self.batch.get(i) {
            Some(&s) => s,
            None => Seq {
                start: 0,
                len: self.t,
                pos: self.pos,
            },
        }
    }
}
