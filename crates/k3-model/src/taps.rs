//! Hidden-state taps for a DSpark draft (docs/DSPARK.md#taps): the target's stream after some
//! layers, copied out of a forward pass. Capturing only READS the residual stream and the
//! block stack into its own buffer, so the pass's logits do not change by a bit (tested).

use crate::dims::Dims;
use crate::residual::{fold, mix};
pub use k3_format::dspark::TapStream;

/// What to tap, and the rows of the last call: `rows` is `[T][layers.len()][E]` (the call's
/// tokens in order, taps in `layers` order).
#[derive(Clone, Debug)]
pub struct Taps {
    /// Tapped layers (0-based), in concatenation order.
    pub layers: Vec<usize>,
    /// Which stream.
    pub stream: TapStream,
    /// `[T][layers.len()][E]` after a call.
    pub rows: Vec<f32>,
}

impl Taps {
    /// Taps `layers` on `stream`; no rows yet.
    pub fn new(layers: Vec<usize>, stream: TapStream) -> Taps {
        Taps {
            layers,
            stream,
            rows: Vec::new(),
        }
    }

    /// Floats per position (`layers.len() · E`).
    pub fn width(&self, d: &Dims) -> usize {
        self.layers.len() * d.hidden
    }

    /// Sizes `rows` for a call of `t` tokens.
    pub(crate) fn start(&mut self, d: &Dims, t: usize) {
        self.rows.clear();
        self.rows.resize(t * self.width(d), 0.0);
    }

    /// Which tap slots read the stream after layer `l`.
    fn slots(&self, l: usize) -> impl Iterator<Item = usize> + '_ {
        self.layers
            .iter()
            .enumerate()
            .filter(move |&(_, &id)| id == l)
            .map(|(i, _)| i)
    }

    /// Called once layer `l` has run: `h` `[T][E]` is its output (`prefix`). Captures the
    /// `prefix` stream only (the AttnRes stream needs the next consumer's weights:
    /// [`Taps::after_mixed`]).
    pub(crate) fn after_layer(&mut self, d: &Dims, l: usize, h: &[f32], t: usize) {
        if self.stream != TapStream::Prefix {
            return;
        }
        let (e, w) = (d.hidden, self.width(d));
        let slots: Vec<usize> = self.slots(l).collect();
        for tok in 0..t {
            for &i in &slots {
                self.rows[tok * w + i * e..tok * w + (i + 1) * e]
                    .copy_from_slice(&h[tok * e..(tok + 1) * e]);
            }
        }
    }

    /// The AttnRes stream after layer `l`: `attn_res([blocks[0..n), h], norm ⊙ proj)` per
    /// token, with the next consumer's aggregation weights (layer `l+1`'s
    /// `self_attention_res_*`, or the model-level `output_attn_res_*` after the last layer) —
    /// the same mix that consumer computes, into a separate buffer.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn after_mixed(
        &mut self,
        d: &Dims,
        l: usize,
        h: &[f32],
        blocks: &[f32],
        n_blocks: usize,
        (norm, proj): (&[f32], &[f32]),
        t: usize,
    ) {
        if self.stream != TapStream::AttnRes {
            return;
        }
        let slots: Vec<usize> = self.slots(l).collect();
        if slots.is_empty() {
            return;
        }
        let (e, w, bs) = (d.hidden, self.width(d), d.max_blocks * d.hidden);
        let mut q = vec![0f32; e];
        fold(&mut q, norm, proj);
        let mut out = vec![0f32; e];
        for tok in 0..t {
            let blk = &blocks[tok * bs..(tok + 1) * bs];
            mix(
                &mut out,
                blk,
                n_blocks,
                &h[tok * e..(tok + 1) * e],
                &q,
                d.eps,
            );
            for &i in &slots {
                self.rows[tok * w + i * e..tok * w + (i + 1) * e].copy_from_slice(&out);
            }
        }
    }
}
