//! Hybrid drafting's drafter (docs/STREAMING.md#hybrid-drafting): the draft model — the
//! same graph over the quantized draft trunk, with cache-only experts — proposes greedy
//! continuations, and [`Session::generate_speculative`] verifies them with the exact model
//! in one pass (the same ids as plain decoding, whatever the draft proposes).
//!
//! The draft keeps its own state, which follows the conversation lazily: each call feeds
//! what the context gained since the draft last saw it. Before the last context token it
//! snapshots the state; when the exact model rejects a draft, the next call rolls back to
//! that snapshot (a prefix of every later context) and feeds the accepted tokens in one
//! pass, so a rejected draft costs no re-prefill.

use crate::{argmax, Engine, EngineError, Session};
use std::time::Instant;

/// Counters of a session's draft model.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DraftStats {
    /// Forward passes of the draft model.
    pub passes: u64,
    /// Tokens those passes fed (context catch-up and drafts).
    pub tokens_fed: u64,
    /// Seconds spent in the draft model.
    pub seconds: f64,
    /// Times the draft state rolled back to its snapshot after a rejected draft.
    pub rollbacks: u64,
}

/// The draft model with its own session, following a conversation: a drafter for
/// [`Session::generate_with_drafter`] (`|ctx, limit| draft.propose(ctx, limit)`), which is what
/// [`crate::DecodeMode::Hybrid`] runs. Made by [`Engine::draft_model`].
pub struct DraftModel<'e> {
    draft: Session<'e>,
    /// `draft.logits()` belong to the end of `draft.history()` (false after a rollback).
    fresh: bool,
    stats: DraftStats,
    failure: Option<String>,
}

impl<'e> DraftModel<'e> {
    /// A drafter on `engine`'s draft model for contexts of up to `max_ctx` positions.
    fn new(engine: &'e Engine, max_ctx: usize) -> Result<Self, EngineError> {
        if !engine.has_draft() {
            return Err(EngineError::Invalid(
                "hybrid drafting needs a draft trunk: pass --draft-trunk DIR (made by `k3 pack --draft-quant q8 MODEL_DIR DIR`)".into(),
            ));
        }
        Ok(DraftModel {
            draft: Session::new_draft(engine, max_ctx)?,
            fresh: false,
            stats: DraftStats::default(),
            failure: None,
        })
    }

    /// Counters of the draft model so far.
    pub fn stats(&self) -> DraftStats {
        self.stats
    }

    /// Why drafting stopped, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Up to `limit` greedy draft tokens to follow `context` (the whole conversation so far).
    /// A draft failure stops drafting for this draft model (recorded in
    /// [`DraftModel::failure`], never an error).
    pub fn propose(&mut self, context: &[u32], limit: usize) -> Vec<u32> {
        if limit == 0 || context.is_empty() || self.failure.is_some() {
            return Vec::new();
        }
        let t = Instant::now();
        let drafts = self.try_propose(context, limit);
        self.stats.seconds += t.elapsed().as_secs_f64();
        drafts.unwrap_or_else(|e| {
            self.failure = Some(e.to_string());
            Vec::new()
        })
    }

    fn try_propose(&mut self, context: &[u32], limit: usize) -> Result<Vec<u32>, EngineError> {
        self.catch_up(context)?;
        let mut drafts = vec![argmax(self.draft.logits())];
        while drafts.len() < limit {
            let last = drafts[drafts.len() - 1];
            self.feed(&[last])?;
            drafts.push(argmax(self.draft.logits()));
        }
        Ok(drafts)
    }

    /// Brings the draft state to the end of `context` with fresh logits.
    fn catch_up(&mut self, context: &[u32]) -> Result<(), EngineError> {
        if !context.starts_with(self.draft.history()) && self.draft.has_snapshot() {
            self.draft.rollback()?;
            self.stats.rollbacks += 1;
            self.fresh = false;
        }
        if !context.starts_with(self.draft.history()) {
            self.draft.reset();
            self.fresh = false;
        }
        let seen = self.draft.history().len();
        if seen == context.len() && self.fresh {
            return Ok(());
        }
        if seen == context.len() {
            // Stale logits at the very end (not reached by the speculative loop): start over.
            self.draft.reset();
        }
        let rest = &context[self.draft.history().len()..];
        let (head, last) = rest.split_at(rest.len() - 1);
        if !head.is_empty() {
            self.feed(head)?;
        }
        self.draft.snapshot()?;
        self.feed(last)
    }

    fn feed(&mut self, ids: &[u32]) -> Result<(), EngineError> {
        self.draft.feed(ids)?;
        self.stats.passes += ids.len().div_ceil(self.draft.owner().prefill_chunk()) as u64;
        self.stats.tokens_fed += ids.len() as u64;
        self.fresh = true;
        Ok(())
    }
}

impl Engine {
    /// The draft model over this engine's draft trunk, for contexts of up to `max_ctx`
    /// positions; refused without a draft trunk ([`Engine::has_draft`]).
    pub fn draft_model(&self, max_ctx: usize) -> Result<DraftModel<'_>, EngineError> {
        DraftModel::new(self, max_ctx)
    }
}

impl Session<'_> {
    /// Up to `limit` tokens the draft model proposes to follow this session's history and
    /// then `tail` (ids not fed yet, e.g. the last sampled one); empty when the engine has
    /// no draft trunk or drafting stopped. For callers that run their own decode loop (the
    /// server's scheduler); [`Session::generate_with`] with [`crate::DecodeMode::Hybrid`]
    /// does all of this itself.
    pub fn propose_drafts(&mut self, tail: &[u32], limit: usize) -> Vec<u32> {
        if limit == 0 || !self.owner().has_draft() {
            return Vec::new();
        }
        if self.drafter.is_none() {
            match DraftModel::new(self.owner(), self.max_ctx()) {
                Ok(d) => self.drafter = Some(Box::new(d)),
                Err(_) => return Vec::new(),
            }
        }
        let mut context = self.history().to_vec();
        context.extend_from_slice(tail);
        let limit = limit.min(self.room_after(tail.len()));
        match self.drafter.as_mut() {
            Some(d) => d.propose(&context, limit),
            None => Vec::new(),
        }
    }

    /// Feeds `ids` (a pending id first, if any) in ONE pass, its last `drafts` ids tentative
    /// (k3_model::journal), and returns the logits after every one of them
    /// (`[ids.len()][vocab]`): a verifying pass over drafts. Follow with
    /// [`Session::keep_verified`] naming the drafts the reply keeps.
    pub fn feed_verify(&mut self, ids: &[u32], drafts: usize) -> Result<Vec<f32>, EngineError> {
        if let Some(p) = self.take_pending() {
            self.run_tail(&[p], 0)?;
        }
        let rows = self.run_verify(ids, drafts, ids.len())?;
        self.spec_stats.passes += 1;
        Ok(rows)
    }

    /// After [`Session::feed_verify`]: `kept` (a prefix of its drafts) enters the state,
    /// advanced from the pass's journal without another pass; the other drafts never do
    /// (counted as a rejection when there were any).
    pub fn keep_verified(&mut self, kept: &[u32], rejected: bool) -> Result<(), EngineError> {
        self.spec_stats.rollbacks += u64::from(rejected);
        self.keep_drafts(kept)
    }
}
