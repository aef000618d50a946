//! A conversation: token ids so far, the model's carried state and the latest logits.

use crate::speculate::{SpecStats, Speculation};
use crate::{Engine, EngineError};
pub use k3_model::argmax;
use k3_model::{LogitsMode, Snapshot, State};

/// How generation advances.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DecodeMode {
    /// Carry KDA state and the latent KV cache; run one token per step (the default).
    #[default]
    Incremental,
    /// Re-run the whole sequence from a zeroed state every step (for testing).
    Recompute,
    /// Incremental, with drafted tokens verified in batches ([`crate::speculate`]): the same
    /// ids as `Incremental`, fewer forward passes when drafts are accepted.
    Speculative(Speculation),
    /// Incremental, with drafts proposed by the draft model over the quantized draft trunk
    /// (hybrid drafting, docs/STREAMING.md#hybrid-drafting) and verified like
    /// `Speculative`'s: the same ids as `Incremental`. Needs an engine opened with a draft
    /// trunk ([`crate::Engine::has_draft`]); `max_draft` bounds the adaptive draft length
    /// (the n-gram fields are unused).
    Hybrid(Speculation),
    /// Incremental, with DSpark block drafts (docs/DSPARK.md) verified like `Speculative`'s:
    /// the same ids as `Incremental`. Needs an engine opened with a draft model
    /// ([`crate::Engine::dspark`]); each pass verifies at most this many drafts, as many as
    /// the cost model chooses from the confidence head ([`crate::block`]).
    Block(usize),
}

/// One conversation with an [`Engine`].
///
/// Invariant: `state` holds exactly the effect of `fed`; a token chosen by [`Session::generate`]
/// as the last of a run is kept in `pending` and fed lazily by the next call, so ending a
/// generation never costs a forward pass whose logits nobody reads.
/// Where a feed stands, reported after every decoder layer of every prefill chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeedProgress {
    /// Tokens of the call fed before the chunk now running.
    pub tokens_done: usize,
    /// Tokens in the chunk now running.
    pub chunk: usize,
    /// Tokens in the whole call.
    pub tokens: usize,
    /// Layers of this chunk finished.
    pub layers_done: usize,
    /// Layers in the model.
    pub layers: usize,
}

impl FeedProgress {
    /// Finished share of the call's work, in token-layers (`0.0..=1.0`).
    pub fn fraction(&self) -> f64 {
        let done = self.tokens_done * self.layers + self.chunk * self.layers_done;
        done as f64 / (self.tokens * self.layers).max(1) as f64
    }
}

pub struct Session<'e> {
    engine: &'e Engine,
    state: State,
    fed: Vec<u32>,
    pending: Option<u32>,
    max_ctx: usize,
    logits: Vec<f32>,
    /// Recurrent state before the current speculative pass (allocated on first use).
    snapshot: Option<Snapshot>,
    pub(crate) spec_stats: SpecStats,
    /// This session runs the draft model (the hybrid drafter's own session).
    is_draft: bool,
    /// The draft model's session of hybrid drafting (created on first use, kept across
    /// generations so the draft's state follows the conversation).
    pub(crate) drafter: Option<Box<crate::hybrid::DraftModel<'e>>>,
    /// The target's hidden-state taps by position, kept when the engine has a DSpark draft.
    pub(crate) taps: Option<crate::dspark::TapLog>,
    /// The DSpark block drafter (created on first use, kept across generations).
    pub(crate) block: Option<Box<crate::block::BlockDrafter>>,
}

/// An ended session's scratch goes back to its engine for the next session: a new
/// session's prefill then writes pages already mapped instead of faulting its whole scratch
/// in again (docs/PERFORMANCE.md#scratch-reuse-between-sessions).
impl Drop for Session<'_> {
    fn drop(&mut self) {
        self.engine.give_back_scratch(self.state.take_scratch());
    }
}

impl<'e> Session<'e> {
    pub(crate) fn new(engine: &'e Engine, max_ctx: usize) -> Result<Self, EngineError> {
        if max_ctx == 0 {
            return Err(EngineError::Invalid(
                "context length must be at least 1".into(),
            ));
        }
        let state = match engine.take_spare_scratch() {
            Some(scratch) => engine.model.new_state_with(max_ctx, scratch),
            None => engine.model.new_state(max_ctx),
        };
        Ok(Session {
            engine,
            state,
            fed: Vec::new(),
            pending: None,
            max_ctx,
            logits: Vec::new(),
            snapshot: None,
            spec_stats: SpecStats::default(),
            is_draft: false,
            drafter: None,
            taps: engine.dspark().map(crate::dspark::TapLog::new),
            block: None,
        })
    }

    /// A session of the engine's draft model (hybrid drafting's drafter).
    pub(crate) fn new_draft(engine: &'e Engine, max_ctx: usize) -> Result<Self, EngineError> {
        let mut s = Session::new(engine, max_ctx)?;
        s.is_draft = true;
        s.taps = None;
        Ok(s)
    }

    /// Every token of the conversation so far (fed and generated).
    pub fn tokens(&self) -> Vec<u32> {
        let mut t = self.fed.clone();
        t.extend(self.pending);
        t
    }

    /// Logits after the last fed token (`vocab_size` values; empty before any, and after a
    /// generation ended — feed or step to get fresh ones).
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// The model state (KDA recurrent + conv state, latent KV), e.g. for saving a session.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// Mutable model state, for restoring a saved session (`session_file`).
    pub(crate) fn state_mut(&mut self) -> &mut State {
        &mut self.state
    }

    /// Installs the token history and last logits of a restored session (`session_file`);
    /// the caller has restored the state and checked `fed.len() == state.pos()`.
    pub(crate) fn restore(&mut self, fed: Vec<u32>, pending: Option<u32>, logits: Vec<f32>) {
        (self.fed, self.pending, self.logits) = (fed, pending, logits);
    }

    /// Clears the conversation (state zeroed, no tokens).
    pub fn reset(&mut self) {
        self.state.reset();
        self.fed.clear();
        self.pending = None;
        self.logits.clear();
        self.drafter = None;
    }

    pub(crate) fn check_ids(&self, ids: &[u32]) -> Result<(), EngineError> {
        let vocab = self.engine.config.vocab_size;
        if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
            return Err(EngineError::Invalid(format!(
                "token id {id} at position {i} is out of range: the model's vocab_size is {vocab} (ids 0..={})",
                vocab - 1
            )));
        }
        let total = self.fed.len() + usize::from(self.pending.is_some()) + ids.len();
        if total > self.max_ctx {
            return Err(EngineError::Invalid(format!(
                "{total} tokens would exceed the session's context of {} positions: raise --ctx or shorten the prompt",
                self.max_ctx
            )));
        }
        Ok(())
    }

    /// Runs `ids` (preceded by any pending token) through the model with carried state.
    fn run(&mut self, ids: &[u32], mode: LogitsMode) -> Result<Vec<f32>, EngineError> {
        self.run_observed(ids, mode, &mut |_| {})
    }

    /// Feeds the pending token and `ids` in chunks of the plan's prefill chunk (one pass
    /// when the call fits one), keeping the logits rows `mode` asks for (they are the last
    /// rows of the call, so each chunk computes its share of them); reports each finished
    /// layer of each chunk to `on_progress`.
    fn run_observed(
        &mut self,
        ids: &[u32],
        mode: LogitsMode,
        on_progress: &mut (dyn FnMut(FeedProgress) + Send),
    ) -> Result<Vec<f32>, EngineError> {
        let mut batch = Vec::with_capacity(ids.len() + 1);
        batch.extend(self.pending.take());
        batch.extend_from_slice(ids);
        let e = self.engine;
        let (tokens, layers) = (batch.len(), e.config.num_hidden_layers);
        let first_row = tokens - mode.rows(tokens);
        let mut out = Vec::with_capacity(mode.rows(tokens) * e.config.vocab_size);
        let mut start = 0;
        for chunk in batch.chunks(e.prefill_chunk()) {
            let rows = (start + chunk.len()).saturating_sub(start.max(first_row));
            let mut on_layer = |l: usize| {
                on_progress(FeedProgress {
                    tokens_done: start,
                    chunk: chunk.len(),
                    tokens,
                    layers_done: l + 1,
                    layers,
                })
            };
            let (state, draft, pos) = (&mut self.state, self.is_draft, self.fed.len());
            let taps = self.taps.as_mut().map(|log| &mut log.taps);
            let logits = e.pool.install(|| {
                e.with_seams(draft, |w, x| {
                    let mode = LogitsMode::Tail(rows);
                    match taps {
                        Some(t) => {
                            e.model
                                .forward_tapped(w, x, chunk, state, mode, &mut on_layer, t)
                        }
                        None => e
                            .model
                            .forward_observed(w, x, chunk, state, mode, &mut on_layer),
                    }
                })
            })??;
            if let (Some(log), Some(d)) = (self.taps.as_mut(), e.dspark()) {
                e.pool.install(|| log.record(d, pos, chunk))?;
            }
            self.fed.extend_from_slice(chunk);
            out.extend_from_slice(&logits.data);
            start += chunk.len();
        }
        Ok(out)
    }

    /// Feeds `ids` (prefill in one pass per planner chunk: [`Engine::prefill_chunk`]) and
    /// keeps the logits of the last one.
    pub fn feed(&mut self, ids: &[u32]) -> Result<(), EngineError> {
        self.feed_with_progress(ids, &mut |_| {})
    }

    /// [`Session::feed`], reporting each finished layer of each prefill chunk (for a
    /// progress bar; the logits do not depend on it).
    pub fn feed_with_progress(
        &mut self,
        ids: &[u32],
        on_progress: &mut (dyn FnMut(FeedProgress) + Send),
    ) -> Result<(), EngineError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.check_ids(ids)?;
        self.logits = self.run_observed(ids, LogitsMode::Last, on_progress)?;
        Ok(())
    }

    /// Encodes `text` with the engine's tokenizer (control-token text stays plain text unless
    /// `allow_specials`) and feeds it; returns the ids fed.
    pub fn feed_text(&mut self, text: &str, allow_specials: bool) -> Result<Vec<u32>, EngineError> {
        let tok = self.engine.tokenizer().ok_or_else(|| {
            EngineError::Invalid(
                "this model directory has no tokenizer (tiktoken.model or tokenizer.json)".into(),
            )
        })?;
        let ids = tok.encode(text, allow_specials);
        self.feed(&ids)?;
        Ok(ids)
    }

    /// Feeds `ids` and returns the logits at EVERY fed position (`[ids.len()][vocab]`,
    /// teacher forcing; a pending generated token is fed first and its row included).
    pub fn feed_all_logits(&mut self, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.check_ids(ids)?;
        let all = self.run(ids, LogitsMode::All)?;
        let v = self.engine.config.vocab_size;
        self.logits = all[all.len().saturating_sub(v)..].to_vec();
        Ok(all)
    }

    /// Appends one token and computes the next logits, incrementally or by recomputing the
    /// whole sequence from a zeroed state.
    pub fn step(&mut self, id: u32, mode: DecodeMode) -> Result<(), EngineError> {
        self.check_ids(&[id])?;
        match mode {
            DecodeMode::Incremental
            | DecodeMode::Speculative(_)
            | DecodeMode::Hybrid(_)
            | DecodeMode::Block(_) => self.logits = self.run(&[id], LogitsMode::Last)?,
            DecodeMode::Recompute => {
                let mut all = std::mem::take(&mut self.fed);
                all.extend(self.pending.take());
                all.push(id);
                self.state.reset();
                self.logits = self.run(&all, LogitsMode::Last)?;
            }
        }
        Ok(())
    }

    /// Greedy generation of up to `n` tokens (ties → lowest id), ignoring end ids: the
    /// shortcut for [`Session::generate_with`] with [`crate::Sampler::greedy`] and
    /// [`crate::StopConditions::none`]. `on_token` sees each new id and returns `false` to
    /// stop. Returns the generated ids.
    pub fn generate(
        &mut self,
        n: usize,
        mode: DecodeMode,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>, EngineError> {
        let mut sampler = crate::Sampler::greedy();
        Ok(self
            .generate_with(
                n,
                mode,
                &mut sampler,
                &crate::StopConditions::none(),
                on_token,
            )?
            .ids)
    }

    /// Speculative-decoding counters since the session was created.
    pub fn spec_stats(&self) -> SpecStats {
        self.spec_stats
    }

    /// Positions left after `extra` more tokens (for clamping drafts).
    pub(crate) fn room_after(&self, extra: usize) -> usize {
        self.max_ctx
            .saturating_sub(self.fed.len() + usize::from(self.pending.is_some()) + extra)
    }

    /// Feeds `ids` and returns the logits of the last `tail` of them (`[tail][vocab]`; none
    /// when `tail == 0`). Leaves [`Session::logits`] alone.
    pub(crate) fn run_tail(&mut self, ids: &[u32], tail: usize) -> Result<Vec<f32>, EngineError> {
        self.check_ids(ids)?;
        let mode = match tail {
            0 => LogitsMode::None,
            n => LogitsMode::Tail(n),
        };
        self.run(ids, mode)
    }

    /// Remembers the recurrent state (before a speculative pass).
    pub(crate) fn snapshot(&mut self) -> Result<(), EngineError> {
        self.state.snapshot_into(&mut self.snapshot)?;
        Ok(())
    }

    /// Whether a [`Session::snapshot`] was taken.
    pub(crate) fn has_snapshot(&self) -> bool {
        self.snapshot.is_some()
    }

    /// Context positions of the session.
    pub(crate) fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    /// Counters of the draft model behind [`DecodeMode::Hybrid`] (`None` before the first
    /// hybrid generation).
    pub fn draft_stats(&self) -> Option<crate::DraftStats> {
        self.drafter.as_ref().map(|d| d.stats())
    }

    /// Why hybrid drafting stopped for this session, if a draft-model error stopped it.
    pub fn draft_failure(&self) -> Option<&str> {
        self.drafter.as_ref().and_then(|d| d.failure())
    }

    /// Returns to the last [`Session::snapshot`]: tokens fed since are forgotten.
    pub(crate) fn rollback(&mut self) -> Result<(), EngineError> {
        let snap = self.snapshot.as_ref().ok_or_else(|| {
            EngineError::Invalid("speculative rollback without a snapshot".into())
        })?;
        self.state.rollback(snap)?;
        self.fed.truncate(snap.pos());
        Ok(())
    }

    /// A verifying pass: feeds `ids` (after any pending id) in ONE pass and returns the
    /// logits of its last `rows` ids, its last `drafts` ids tentative (k3_model::journal):
    /// they give their logits but stay out of the state until [`Session::keep_drafts`].
    pub(crate) fn run_verify(
        &mut self,
        ids: &[u32],
        drafts: usize,
        rows: usize,
    ) -> Result<Vec<f32>, EngineError> {
        let fed = ids.len() + usize::from(self.pending.is_some());
        if fed > self.engine.prefill_chunk() || drafts > ids.len() {
            return Err(EngineError::Invalid(format!(
                "a verifying pass of {fed} ids with {drafts} drafts does not fit one pass of {}",
                self.engine.prefill_chunk()
            )));
        }
        self.state.begin_tentative(drafts);
        let out = self.run_tail(ids, rows);
        if out.is_ok() {
            self.fed.truncate(self.fed.len() - drafts);
        }
        out
    }

    /// After [`Session::run_verify`]: `kept`, a prefix of its drafts, enters the state
    /// (advanced from the pass's journal; no pass runs), the other drafts are forgotten.
    pub(crate) fn keep_drafts(&mut self, kept: &[u32]) -> Result<(), EngineError> {
        let state = &mut self.state;
        self.engine
            .pool
            .install(|| state.keep_tentative(kept.len()))?;
        self.fed.extend_from_slice(kept);
        if let Some(log) = self.taps.as_mut() {
            log.clear_from(self.fed.len());
        }
        Ok(())
    }

    /// The engine this session runs on (for `generate_with`).
    /// Takes the pending token (to run it first) for a batched feed.
    pub(crate) fn take_pending(&mut self) -> Option<u32> {
        self.pending.take()
    }

    /// Records tokens a batched pass ran, and the logits it left (when it gave any).
    pub(crate) fn record_batched(&mut self, ran: &[u32], logits: Option<Vec<f32>>) {
        if let Some(log) = self.taps.as_mut() {
            log.clear_from(self.fed.len()); // a batched pass records no taps
        }
        self.fed.extend_from_slice(ran);
        if let Some(l) = logits {
            self.logits = l;
        }
    }

    pub(crate) fn owner(&self) -> &'e Engine {
        self.engine
    }

    /// The tokens fed so far (excludes a pending token): what a [`crate::Sampler`]'s
    /// penalties look back on.
    pub fn history(&self) -> &[u32] {
        &self.fed
    }

    /// Ends a generation at `id`: kept pending (fed lazily by the next call), logits cleared.
    /// [`Session::tokens`] includes it, so a saved session is exactly the conversation.
    pub fn keep_pending(&mut self, id: u32) -> Result<(), EngineError> {
        self.check_ids(&[id])?;
        self.pending = Some(id);
        self.logits.clear();
        Ok(())
    }
}
