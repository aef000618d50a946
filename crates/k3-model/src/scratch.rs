//! Per-session scratch: every per-call buffer, allocated when the session is created (sized for
//! one token, or an ended session's scratch reused) and grown only when a longer prefill
//! arrives; decode never allocates here.

pub(crate) mod ops;

use crate::dims::Dims;
pub(crate) use ops::grow;
pub use ops::{DenseScratch, KdaScratch, MlaScratch, MoeScratch};

/// All scratch of one forward call.
#[derive(Default)]
pub struct Scratch {
    /// `[T][E]` hidden state entering / leaving each layer.
    pub(crate) h: Vec<f32>,
    /// `[T][maxb][E]` block snapshots per token (rebuilt every call, never carried).
    pub(crate) blocks: Vec<f32>,
    /// Layer-level buffers.
    pub(crate) layer: LayerScratch,
    /// `[T][V]` or `[V]` logits of the head.
    pub(crate) xn_head: Vec<f32>,
}

/// Buffers of one decoder layer.
#[derive(Default)]
pub struct LayerScratch {
    /// `[T][E]` running residual ("prefix_sum").
    pub prefix: Vec<f32>,
    /// `[T][E]` normed input of the attention / FFN.
    pub xn: Vec<f32>,
    /// `[T][E]` attention or FFN output.
    pub y: Vec<f32>,
    /// `[E]` folded residual query (`norm ⊙ proj`).
    pub fold: Vec<f32>,
    /// KDA buffers.
    pub kda: KdaScratch,
    /// MLA buffers.
    pub mla: MlaScratch,
    /// MoE buffers.
    pub moe: MoeScratch,
    /// Dense-MLP buffers.
    pub dense: DenseScratch,
}

impl LayerScratch {
    /// Grows the layer buffers (not the op buffers) for `t` tokens.
    pub fn ensure(&mut self, d: &Dims, t: usize) {
        for b in [&mut self.prefix, &mut self.xn, &mut self.y] {
            grow(b, t * d.hidden);
        }
        grow(&mut self.fold, d.hidden);
    }
}

impl Scratch {
    /// Bytes each further token of one call adds to the whole scratch (every op's per-token
    /// buffers live at once): what a prefill chunk costs per token. The planner sizes the
    /// chunk with it (docs/STREAMING.md "Prefill chunks").
    pub fn bytes_per_token(d: &Dims) -> u64 {
        let model = (2 + d.max_blocks) * d.hidden; // h, xn_head, blocks
        let layer = 3 * d.hidden; // prefix, xn, y
        (model + layer) as u64 * 4
            + KdaScratch::bytes_per_token(d)
            + MlaScratch::bytes_per_token(d)
            + MoeScratch::bytes_per_token(d)
            + DenseScratch::bytes_per_token(d)
    }

    /// Scratch for a session of `max_ctx` positions, sized for single-token decode.
    pub fn new(d: &Dims, max_ctx: usize) -> Self {
        Scratch::default().refit(d, max_ctx)
    }
    /// An earlier session's scratch, for a new session of `max_ctx` positions: kept as it
    /// is (grown by that session's calls) and grown to what [`Scratch::new`] would hold, so
    /// the new session's prefill writes pages already mapped instead of faulting them in
    /// again (docs/PERFORMANCE.md#scratch-reuse-between-sessions). No buffer
    /// is read before it is written in a call, so the old contents never matter.
    pub fn refit(mut self, d: &Dims, max_ctx: usize) -> Self {
        self.ensure(d, 1);
        self.layer.kda.ensure(d, 1);
        self.layer.mla.ensure(d, 1, max_ctx);
        self.layer.moe.ensure(d, 1);
        self.layer.dense.ensure(d, 1);
        self
    }
    /// Fills every buffer with NaN (or `true`, or the largest index): tests that a reused
    /// scratch's old values never reach a result.
    #[cfg(test)]
    pub(crate) fn poison(&mut self) {
        let l = &mut self.layer;
        let bufs = [
            &mut self.h,
            &mut self.blocks,
            &mut self.xn_head,
            &mut l.prefix,
            &mut l.xn,
            &mut l.y,
            &mut l.fold,
        ];
        bufs.into_iter().for_each(|b| b.fill(f32::NAN));
        l.kda.poison();
        l.mla.poison();
        l.moe.poison();
        l.dense.poison();
    }
    /// Grows the model-level buffers for `t` tokens.
    pub fn ensure(&mut self, d: &Dims, t: usize) {
        grow(&mut self.h, t * d.hidden);
        grow(&mut self.blocks, t * d.max_blocks * d.hidden);
        grow(&mut self.xn_head, t * d.hidden);
        self.layer.ensure(d, t);
    }
}
