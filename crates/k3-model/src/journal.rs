//! Tentative tokens: the drafts at the end of a verifying pass run through every layer, but
//! the carried KDA state keeps only the pass's committed tokens until the sampler has judged
//! the drafts (docs/STREAMING.md#keeping-accepted-drafts).
//!
//! In a pass armed with [`crate::State::begin_tentative`]`(n)`, each KDA layer runs the
//! committed tokens on its carried state, then copies that state (the recurrent `S` and the
//! conv histories, one layer at a time, into the call's scratch) and runs the last `n` tokens
//! on the copy, which the next layer overwrites. The journal keeps what those `n` tokens fed
//! in: their pre-conv q, k, v rows and the recurrence's normed keys, values, decays and write
//! strengths. [`crate::State::keep_tentative`]`(j)` then advances the carried state by the
//! first `j` of them from the journal: the conv histories take the same inputs and the
//! recurrence runs the same kernel over the same rows, tokens in order, so every bit equals
//! the state one-token decoding leaves (a multi-token pass already equals it, and a token's
//! update never looks ahead). No weight is read, and no copy of the whole state is held.
//!
//! Per tentative token and layer the journal keeps `6·P + H` floats of this rank's heads:
//! 295 KB a layer at the released P = 12,288, 20.3 MB a token over 69 KDA layers.

use crate::kda::{kda_recurrence, KdaInputs};
use crate::ModelError;
use k3_kernels::conv::shortconv_push;

/// One KDA layer's journal of the tentative tokens of the last armed pass (rows of this
/// rank's `P` channels and `H` heads).
#[derive(Clone, Debug, Default)]
pub struct KdaJournal {
    /// Tentative tokens at the end of the next forward call (0 once it ran).
    tail: usize,
    /// Tokens whose conv inputs are kept.
    conv_tokens: usize,
    /// Tokens whose recurrence inputs are kept.
    rec_tokens: usize,
    /// `[T][P]` pre-conv q, k and v rows.
    raw: [Vec<f32>; 3],
    /// `[T][P]` recurrence keys (L2-normed), values (post-conv) and decays.
    kva: [Vec<f32>; 3],
    /// `[T][H]` write strengths.
    beta: Vec<f32>,
}

/// Buffers a replay works in, shared by every layer of one [`crate::State::keep_tentative`]:
/// zero queries (the replay's outputs are not wanted), the outputs, the per-head read scratch.
#[derive(Default)]
pub(crate) struct ReplayScratch {
    zeros: Vec<f32>,
    o_hm: Vec<f32>,
    u: Vec<f32>,
}

impl KdaJournal {
    /// The next forward call's last `tail` tokens are tentative; forgets earlier rows.
    pub(crate) fn arm(&mut self, tail: usize) {
        self.clear();
        self.tail = tail;
    }
    /// Forgets the rows (their memory stays for the next pass).
    pub(crate) fn clear(&mut self) {
        self.tail = 0;
        self.conv_tokens = 0;
        self.rec_tokens = 0;
        self.raw.iter_mut().for_each(Vec::clear);
        self.kva.iter_mut().for_each(Vec::clear);
        self.beta.clear();
    }
    /// The forward call ran: later calls are committed whole.
    pub(crate) fn call_done(&mut self) {
        self.tail = 0;
    }
    /// Tentative tokens among a call's `len` for this layer's sequence.
    pub(crate) fn tail_of(&self, len: usize) -> usize {
        self.tail.min(len)
    }
    /// Keeps the pre-conv rows `[T][P]` of q, k and v of the tentative tokens.
    pub(crate) fn record_conv_inputs(&mut self, rows: [&[f32]; 3], p: usize) {
        if p == 0 {
            return;
        }
        for (kept, r) in self.raw.iter_mut().zip(rows) {
            kept.extend_from_slice(r);
        }
        self.conv_tokens += rows[0].len() / p;
    }
    /// Keeps the recurrence inputs (keys, values, decays, write strengths) of the tentative
    /// tokens `x`.
    pub(crate) fn record_recurrence(&mut self, x: &KdaInputs<'_>) {
        for (kept, r) in self.kva.iter_mut().zip([x.k, x.v, x.alpha]) {
            kept.extend_from_slice(r);
        }
        self.beta.extend_from_slice(x.beta);
        self.rec_tokens += x.t;
    }
    /// Tentative tokens that can be kept.
    pub fn tokens(&self) -> usize {
        self.conv_tokens.min(self.rec_tokens)
    }
    /// Advances `s` (`[H][D][D]`) and the conv histories (`[q|k|v][P][K−1]`) by the first
    /// `m` journaled tokens, heads of width `dim`, conv width `conv_k`.
    pub(crate) fn replay(
        &self,
        m: usize,
        s: &mut [f32],
        hist: [&mut [f32]; 3],
        (dim, conv_k): (usize, usize),
        work: &mut ReplayScratch,
    ) -> Result<(), ModelError> {
        if m > self.tokens() {
            return Err(ModelError::StateMismatch(format!(
                "{m} tentative tokens kept but the KDA journal holds {}",
                self.tokens()
            )));
        }
        if m == 0 || dim == 0 || s.is_empty() {
            return Ok(());
        }
        let heads = s.len() / (dim * dim);
        let p = heads * dim;
        for (h, raw) in hist.into_iter().zip(&self.raw) {
            for row in raw[..m * p].chunks_exact(p) {
                shortconv_push(row, h, conv_k);
            }
        }
        work.zeros.resize(m * p, 0.0); // never written: zeros stay zeros
        work.o_hm.resize(m * p, 0.0);
        work.u.resize(2 * p, 0.0);
        let inputs = KdaInputs {
            q: &work.zeros[..m * p],
            k: &self.kva[0][..m * p],
            v: &self.kva[1][..m * p],
            alpha: &self.kva[2][..m * p],
            beta: &self.beta[..m * heads],
            t: m,
            heads,
            dim,
        };
        kda_recurrence(s, &inputs, &mut work.o_hm[..m * p], &mut work.u[..2 * p]);
        Ok(())
    }
}
