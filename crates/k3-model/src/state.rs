//! Per-session state: what a conversation carries from one call to the next.
//!
//! * KDA layers: the recurrent state `S` (`[H][D][D]` f32, row-major `S[h][k][v]`) and the
//!   short-conv histories (`[q|k|v][P][K−1]`, each channel's values oldest first); over ranks
//!   each rank holds only its heads (`H` = its heads, `P` = their channels).
//! * MLA layers: the LATENT KV cache, `[max_ctx][kv_lora + rope]` f32 per layer: per position
//!   the RMS-normalised latent followed by the (never rotated) shared rope slots.
//! * The position counter (tokens already consumed).
//!
//! Everything is allocated once in [`State::new`]; the forward pass never grows it. The buffers
//! are exposed read/write so a session can be saved and restored byte for byte.

use crate::dims::Dims;
use crate::journal::{KdaJournal, ReplayScratch};
use crate::scratch::Scratch;
use std::ops::Range;

/// The carried state one sequence's token mixer reads and updates in one layer.
pub enum AttnState<'s> {
    /// KDA recurrent + conv state.
    Kda(&'s mut KdaState),
    /// MLA latent cache; the sequence's tokens go to positions `seq.pos..seq.pos + seq.len`.
    Mla(&'s mut MlaCache),
}

/// Carried state of one KDA layer.
#[derive(Clone, Debug)]
pub struct KdaState {
    /// `[H][D][D]` recurrent state.
    s: Vec<f32>,
    /// `[3][P][K−1]` conv histories of q, k, v.
    conv: Vec<f32>,
    /// The tentative tokens of the last armed call ([`State::begin_tentative`]).
    journal: KdaJournal,
}

impl KdaState {
    /// A zeroed state for `heads` heads of width `dim` and conv kernel `conv_k`.
    pub fn new(heads: usize, dim: usize, conv_k: usize) -> Self {
        let p = heads * dim;
        KdaState {
            s: vec![0.0; heads * dim * dim],
            conv: vec![0.0; 3 * p * (conv_k - 1)],
            journal: KdaJournal::default(),
        }
    }
    /// The recurrent state `[H][D][D]`.
    pub fn recurrent(&self) -> &[f32] {
        &self.s
    }
    /// Mutable recurrent state (for restoring a session).
    pub fn recurrent_mut(&mut self) -> &mut [f32] {
        &mut self.s
    }
    /// Conv histories `[q|k|v][P][K−1]`.
    pub fn conv(&self) -> &[f32] {
        &self.conv
    }
    /// Mutable conv histories (for restoring a session).
    pub fn conv_mut(&mut self) -> &mut [f32] {
        &mut self.conv
    }
    /// Zeroes everything.
    pub fn reset(&mut self) {
        self.s.fill(0.0);
        self.conv.fill(0.0);
        self.journal.clear();
    }
    /// Copies heads `heads` of a whole state (every head: `whole_s` `[H][D][D]`,
    /// `whole_conv` `[q|k|v][P][K−1]`) into this state, which holds exactly those heads of
    /// width `dim` (a session saved by one process, loaded by one rank of several).
    pub fn load_heads(
        &mut self,
        whole_s: &[f32],
        whole_conv: &[f32],
        heads: Range<usize>,
        dim: usize,
    ) -> Result<(), crate::ModelError> {
        let per_head = dim * dim;
        let (part, whole_part) = (self.conv.len() / 3, whole_conv.len() / 3);
        let hist = part / (heads.len() * dim).max(1); // K − 1 values per channel
        let c0 = heads.start * dim * hist;
        let fits = whole_s.len() >= heads.end * per_head
            && self.s.len() == heads.len() * per_head
            && whole_conv.len().is_multiple_of(3)
            && whole_part >= c0 + part;
        if !fits {
            return Err(crate::ModelError::StateMismatch(format!(
                "KDA heads {heads:?} of width {dim} are not inside a state of {} + {} values",
                whole_s.len(),
                whole_conv.len()
            )));
        }
        self.s
            .copy_from_slice(&whole_s[heads.start * per_head..heads.end * per_head]);
        for (j, mine) in self.conv.chunks_exact_mut(part.max(1)).enumerate() {
            let src = j * whole_part + c0;
            mine.copy_from_slice(&whole_conv[src..src + part]);
        }
        Ok(())
    }
    /// Tentative tokens the journal holds (0 when none are).
    pub fn journal_tokens(&self) -> usize {
        self.journal.tokens()
    }
    /// The journal of this layer's tentative tokens.
    pub(crate) fn journal_mut(&mut self) -> &mut KdaJournal {
        &mut self.journal
    }
    /// Copies `src`'s recurrent state and conv histories (not its journal).
    fn copy_carried(&mut self, src: &KdaState) {
        self.s.copy_from_slice(&src.s);
        self.conv.copy_from_slice(&src.conv);
    }
    /// The carried buffers of `self` without any journal (a snapshot's copy).
    fn carried(&self) -> KdaState {
        KdaState {
            s: self.s.clone(),
            conv: self.conv.clone(),
            journal: KdaJournal::default(),
        }
    }
    /// Advances this state by the first `m` tentative tokens of its journal (`dims`: head
    /// width, conv width), then clears the journal.
    fn keep_journaled(
        &mut self,
        m: usize,
        dims: (usize, usize),
        work: &mut ReplayScratch,
    ) -> Result<(), crate::ModelError> {
        let journal = std::mem::take(&mut self.journal);
        let (s, q, k, v) = self.parts_mut();
        let done = journal.replay(m, s, [q, k, v], dims, work);
        self.journal = journal;
        self.journal.clear();
        done
    }
    /// `(S, q_hist, k_hist, v_hist)` borrowed at once.
    pub(crate) fn parts_mut(&mut self) -> (&mut [f32], &mut [f32], &mut [f32], &mut [f32]) {
        let n = self.conv.len() / 3;
        let (q, rest) = self.conv.split_at_mut(n);
        let (k, v) = rest.split_at_mut(n);
        (&mut self.s, q, k, v)
    }
}

/// Latent KV cache of one MLA layer: `[capacity][kv_lora + rope]` f32.
#[derive(Clone, Debug)]
pub struct MlaCache {
    rows: Vec<f32>,
    width: usize,
}

impl MlaCache {
    /// A zeroed cache of `capacity` positions, `width` floats each.
    pub fn new(capacity: usize, width: usize) -> Self {
        MlaCache {
            rows: vec![0.0; capacity * width],
            width,
        }
    }
    /// Floats per position (`kv_lora + rope`).
    pub fn row_width(&self) -> usize {
        self.width
    }
    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.rows.len() / self.width.max(1)
    }
    /// The first `n` positions, `[n][width]` (panics if `n > capacity`).
    pub fn rows(&self, n: usize) -> &[f32] {
        &self.rows[..n * self.width]
    }
    /// The first `n` positions, mutable (for restoring a session).
    pub fn rows_mut(&mut self, n: usize) -> &mut [f32] {
        &mut self.rows[..n * self.width]
    }
    /// Zeroes the cache.
    pub fn reset(&mut self) {
        self.rows.fill(0.0);
    }
}

/// The recurrent part of a [`State`] (every KDA layer's state and conv history, and the
/// position), copied so tokens fed speculatively can be taken back. The latent KV cache needs
/// no copy: rows past a restored position are rewritten before any attention reads them.
#[derive(Clone, Debug)]
pub struct Snapshot {
    kda: Vec<KdaState>,
    pos: usize,
}

impl Snapshot {
    /// The position the snapshot was taken at.
    pub fn pos(&self) -> usize {
        self.pos
    }
}

/// Everything one session carries, plus its preallocated scratch.
pub struct State {
    pub(crate) dims: Dims,
    /// The KDA heads every [`KdaState`] holds (all of them on one process; a rank's own
    /// heads over ranks, docs/DISTRIBUTED.md#the-seam).
    kda_heads: Range<usize>,
    kda: Vec<KdaState>,
    mla: Vec<MlaCache>,
    pos: usize,
    /// Tentative tokens at the end of the next forward call ([`State::begin_tentative`]).
    tentative: usize,
    max_ctx: usize,
    pub(crate) poisoned: bool,
    pub(crate) scratch: Scratch,
}

impl State {
    /// A fresh session able to hold `max_ctx` positions. Allocates every carried buffer now
    /// (latent KV: `n_mla · max_ctx · (kv_lora + rope)` floats) and the single-token scratch.
    pub fn new(dims: &Dims, max_ctx: usize) -> Self {
        State::with_kda_heads(dims, max_ctx, 0..dims.kda_heads)
    }
    /// [`State::new`] holding only KDA heads `kda_heads` (a rank's heads,
    /// [`crate::Dist::heads`]): its recurrent states and conv histories are those heads'.
    /// The latent MLA caches are whole (shared by every head).
    pub fn with_kda_heads(dims: &Dims, max_ctx: usize, kda_heads: Range<usize>) -> Self {
        State::with_scratch(dims, max_ctx, kda_heads, Scratch::new(dims, max_ctx))
    }
    /// [`State::with_kda_heads`] with `scratch` (an earlier session's, [`Scratch::refit`]
    /// here) instead of a fresh one.
    pub fn with_scratch(
        dims: &Dims,
        max_ctx: usize,
        kda_heads: Range<usize>,
        scratch: Scratch,
    ) -> Self {
        let kda = (0..dims.n_kda())
            .map(|_| KdaState::new(kda_heads.len(), dims.kda_dim, dims.conv_k))
            .collect();
        let mla = (0..dims.n_mla())
            .map(|_| MlaCache::new(max_ctx, dims.kv_row()))
            .collect();
        State {
            dims: dims.clone(),
            kda_heads,
            kda,
            mla,
            pos: 0,
            tentative: 0,
            max_ctx,
            poisoned: false,
            scratch: scratch.refit(dims, max_ctx),
        }
    }
    /// Hands the scratch over for a later session ([`State::with_scratch`]); this state keeps
    /// an empty one (grown again by its next call, if any).
    pub fn take_scratch(&mut self) -> Scratch {
        std::mem::take(&mut self.scratch)
    }
    /// Back to an empty conversation (zero state, position 0, not poisoned).
    pub fn reset(&mut self) {
        self.kda.iter_mut().for_each(KdaState::reset);
        self.mla.iter_mut().for_each(MlaCache::reset);
        self.pos = 0;
        self.tentative = 0;
        self.poisoned = false;
    }
    /// Tokens consumed so far (the next token's absolute position).
    pub fn pos(&self) -> usize {
        self.pos
    }
    /// Sets the position counter when restoring a session; refuses values above `max_ctx`.
    pub fn set_pos(&mut self, pos: usize) -> Result<(), crate::ModelError> {
        if pos > self.max_ctx {
            return Err(crate::ModelError::ContextOverflow {
                pos,
                tokens: 0,
                max_ctx: self.max_ctx,
            });
        }
        self.pos = pos;
        self.poisoned = false;
        Ok(())
    }
    /// After a forward call of `t` tokens: the position moves past its committed ones.
    pub(crate) fn advance(&mut self, t: usize) {
        self.pos += t - self.tentative.min(t);
        self.tentative = 0;
        self.kda.iter_mut().for_each(|k| k.journal.call_done());
    }
    /// Positions this session can hold.
    pub fn max_ctx(&self) -> usize {
        self.max_ctx
    }
    /// `true` after a forward failed half-way (call [`State::reset`]).
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }
    /// The geometry this state was built for.
    pub fn dims(&self) -> &Dims {
        &self.dims
    }
    /// The KDA heads this state holds (`0..H` unless it belongs to one rank of several).
    pub fn kda_heads(&self) -> Range<usize> {
        self.kda_heads.clone()
    }
    /// KDA layer states, in layer order (index = `LayerKind::Kda` slot).
    pub fn kda_states(&self) -> &[KdaState] {
        &self.kda
    }
    /// Mutable KDA layer states.
    pub fn kda_states_mut(&mut self) -> &mut [KdaState] {
        &mut self.kda
    }
    /// MLA latent caches, in layer order (index = `LayerKind::Mla` slot); valid rows `0..pos()`.
    pub fn mla_caches(&self) -> &[MlaCache] {
        &self.mla
    }
    /// Mutable MLA latent caches.
    pub fn mla_caches_mut(&mut self) -> &mut [MlaCache] {
        &mut self.mla
    }
    /// Copies the recurrent state into `snap` (allocated on first use, reused afterwards).
    /// Refused on a poisoned state.
    pub fn snapshot_into(&self, snap: &mut Option<Snapshot>) -> Result<(), crate::ModelError> {
        if self.poisoned {
            return Err(crate::ModelError::StatePoisoned);
        }
        match snap {
            Some(s) if s.kda.len() == self.kda.len() => {
                for (dst, src) in s.kda.iter_mut().zip(&self.kda) {
                    dst.copy_carried(src);
                }
                s.pos = self.pos;
            }
            _ => {
                *snap = Some(Snapshot {
                    kda: self.kda.iter().map(KdaState::carried).collect(),
                    pos: self.pos,
                })
            }
        }
        Ok(())
    }
    /// Makes the last `tail` tokens of the next forward call tentative (crate::journal): they
    /// run through every layer and give their logits, but the carried state and position
    /// advance by the call's other tokens only, until [`State::keep_tentative`].
    pub fn begin_tentative(&mut self, tail: usize) {
        self.kda.iter_mut().for_each(|k| k.journal.arm(tail));
        self.tentative = tail;
    }
    /// Keeps the first `kept` tentative tokens of the last armed call, as if the call had
    /// fed only them after its committed ones, and forgets the rest. Their latent KV rows
    /// were written by the call; the KDA layers advance from their journals.
    pub fn keep_tentative(&mut self, kept: usize) -> Result<(), crate::ModelError> {
        let have = self.kda.iter().map(|k| k.journal.tokens()).min();
        let end = self.pos + kept;
        if have.is_some_and(|n| n < kept) || end > self.max_ctx {
            return Err(crate::ModelError::StateMismatch(format!(
                "{kept} tentative tokens kept but the last pass left {}",
                have.unwrap_or(0)
            )));
        }
        let dims = (self.dims.kda_dim, self.dims.conv_k);
        let mut work = ReplayScratch::default();
        for k in &mut self.kda {
            k.keep_journaled(kept, dims, &mut work)?;
        }
        self.pos = end;
        Ok(())
    }
    /// Returns to `snap` (taken from this state, at or before the current position): the
    /// tokens fed since are forgotten, bit for bit. Clears a poisoned flag.
    pub fn rollback(&mut self, snap: &Snapshot) -> Result<(), crate::ModelError> {
        let same_shape = snap.kda.len() == self.kda.len()
            && snap
                .kda
                .iter()
                .zip(&self.kda)
                .all(|(a, b)| a.s.len() == b.s.len() && a.conv.len() == b.conv.len());
        if !same_shape || snap.pos > self.max_ctx {
            return Err(crate::ModelError::StateMismatch(
                "snapshot taken from another geometry".into(),
            ));
        }
        for (dst, src) in self.kda.iter_mut().zip(&snap.kda) {
            dst.copy_carried(src);
        }
        self.pos = snap.pos;
        self.poisoned = false;
        Ok(())
    }
    /// Splits the borrow: carried buffers and scratch at once.
    pub(crate) fn split(&mut self) -> (&mut [KdaState], &mut [MlaCache], &mut Scratch) {
        (&mut self.kda, &mut self.mla, &mut self.scratch)
    }
}
