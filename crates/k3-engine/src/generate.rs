//! Generation with a [`Sampler`] and [`StopConditions`]: [`Session::generate_with`].

use crate::emit::Emitter;
use crate::speculate::{draft, MAX_CUSTOM_DRAFT};
use crate::stop::{Generation, StopConditions, StopReason};
use crate::{DecodeMode, EngineError, Sampler, Session};

impl<'e> Session<'e> {
    /// Generates up to `n` tokens chosen by `sampler`, stopping early at an end id of `stop`,
    /// at one of its stop strings (matched on the decoded text so far, across tokens), or when
    /// `on_token` — which sees every generated id, an end id included — returns `false`.
    ///
    /// The repeat penalty's history is the whole conversation (prompt and generated tokens).
    /// The last generated id stays pending and is fed lazily by the next call (see
    /// [`Session`]), whatever the stop reason. When several reasons hold for the same token,
    /// the first of end id, stop string, callback, length wins. Stop strings need a
    /// tokenizer; [`Generation::text`] is `None` without one.
    ///
    /// [`DecodeMode::Speculative`] and [`DecodeMode::Hybrid`] give the same ids as
    /// [`DecodeMode::Incremental`] (and
    /// consumes the sampler's random stream identically); it only changes how many tokens
    /// each forward pass carries.
    pub fn generate_with(
        &mut self,
        n: usize,
        mode: DecodeMode,
        sampler: &mut Sampler,
        stop: &StopConditions,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError> {
        let mut emitter = self.emitter(n, stop, on_token)?;
        let reason = match mode {
            DecodeMode::Speculative(spec) if n > 0 => {
                let mut drafter =
                    |_: &mut Session<'e>, ctx: &[u32], limit: usize| draft(ctx, &spec, limit);
                let max = spec.max_draft;
                self.generate_speculative(n, max, true, &mut drafter, sampler, &mut emitter)?
            }
            DecodeMode::Block(max) if n > 0 => {
                self.ensure_block_drafter(max)?;
                let Some(mut block) = self.block.take() else {
                    return Err(EngineError::Invalid("no block drafter".into()));
                };
                block.set_draft_max(max);
                let result = {
                    let mut drafter = |s: &mut Session<'e>, ctx: &[u32], limit: usize| {
                        block.propose(s, ctx, limit)
                    };
                    let most = max.min(crate::speculate::MAX_CUSTOM_DRAFT);
                    self.generate_speculative(n, most, false, &mut drafter, sampler, &mut emitter)
                };
                block.settle(&self.tokens());
                self.block = Some(block);
                result?
            }
            DecodeMode::Hybrid(spec) if n > 0 => {
                let mut hybrid = match self.drafter.take() {
                    Some(h) => h,
                    None => Box::new(self.owner().draft_model(self.max_ctx())?),
                };
                let result = {
                    let mut drafter =
                        |_: &mut Session<'e>, ctx: &[u32], limit: usize| hybrid.propose(ctx, limit);
                    let max = spec.max_draft;
                    self.generate_speculative(n, max, true, &mut drafter, sampler, &mut emitter)
                };
                self.drafter = Some(hybrid);
                result?
            }
            _ => self.generate_plain(n, mode, sampler, &mut emitter)?,
        };
        Ok(emitter.finish(reason))
    }

    /// Checks a generation request and builds its [`Emitter`].
    fn emitter<'s, F: FnMut(u32) -> bool>(
        &self,
        n: usize,
        stop: &'s StopConditions,
        on_token: F,
    ) -> Result<Emitter<'s, F>, EngineError>
    where
        'e: 's,
    {
        let tokenizer = self.owner().tokenizer();
        if tokenizer.is_none() && stop.stop_strings.iter().any(|s| !s.is_empty()) {
            return Err(EngineError::Invalid(
                "stop strings need a tokenizer (tiktoken.model or tokenizer.json in the model directory, or --tok)".into(),
            ));
        }
        if n > 0 && self.logits().is_empty() {
            return Err(EngineError::Invalid(
                "generate needs fresh logits: feed a prompt first".into(),
            ));
        }
        let decoder = tokenizer.map(|t| t.stream_decoder());
        Ok(Emitter::new(stop, decoder, n, on_token))
    }

    /// [`Session::generate_with`] in speculative mode with your own drafter (a small model,
    /// a retrieval index, …): `drafter(context, limit)` proposes up to `limit` tokens to
    /// follow `context` (the whole conversation so far; `limit` ≤ [`MAX_CUSTOM_DRAFT`],
    /// adapted to how well drafts are accepted). Whatever it proposes, the ids are those of
    /// plain incremental decoding; good drafts only save forward passes.
    pub fn generate_with_drafter(
        &mut self,
        n: usize,
        sampler: &mut Sampler,
        stop: &StopConditions,
        mut drafter: impl FnMut(&[u32], usize) -> Vec<u32>,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError> {
        let mut emitter = self.emitter(n, stop, on_token)?;
        let reason = if n > 0 {
            let max = MAX_CUSTOM_DRAFT;
            let mut custom = |_: &mut Session<'e>, ctx: &[u32], limit: usize| drafter(ctx, limit);
            self.generate_speculative(n, max, true, &mut custom, sampler, &mut emitter)?
        } else {
            StopReason::Length
        };
        Ok(emitter.finish(reason))
    }

    /// Samples the next id and hands it to `emitter` (the caller's callback, end ids, stop
    /// strings). Over several ranks (docs/DISTRIBUTED.md) rank 0's id AND rank 0's verdict
    /// (go on, or stop and why) are broadcast and every rank continues with them, so a
    /// callback that only rank 0 can answer (Ctrl-C, a client that left) stops every rank at
    /// the same token and the ranks never diverge.
    pub(crate) fn sample_emit<F: FnMut(u32) -> bool>(
        &self,
        sampler: &mut Sampler,
        logits: &[f32],
        history: &[u32],
        emitter: &mut Emitter<'_, F>,
    ) -> Result<(u32, Option<StopReason>), EngineError> {
        let id = sampler.try_sample(logits, history)?;
        let stopped = emitter.push(id);
        let comm = self.owner().comm();
        if comm.size() == 1 {
            return Ok((id, stopped));
        }
        let mut shared = vec![id, verdict_code(&stopped)];
        comm.broadcast_u32(0, &mut shared)
            .map_err(k3_model::ModelError::from)?;
        let rank = comm.rank();
        let diverged = |what: String| {
            EngineError::Invalid(format!(
                "rank {rank} {what}: the ranks diverged (same model, seed and flags on every rank?)"
            ))
        };
        let (root_id, root_verdict) = match shared[..] {
            [i, v] => (i, v),
            _ => {
                return Err(EngineError::Invalid(
                    "rank 0 broadcast no sampled id".into(),
                ))
            }
        };
        if root_id != id {
            // logits are bit-identical on every rank, so a deterministic sampler agrees
            return Err(diverged(format!(
                "sampled id {id} where rank 0 sampled {root_id}"
            )));
        }
        // A follower's own callback is not consulted: rank 0 owns the product.
        let local = stopped.filter(|r| !matches!(r, StopReason::Callback));
        match (root_verdict, local) {
            (VERDICT_GO_ON, None) => Ok((id, None)),
            (VERDICT_CALLBACK, None) => Ok((id, Some(StopReason::Callback))),
            (v, Some(r)) if v == verdict_code(&Some(r.clone())) => Ok((id, Some(r))),
            (v, r) => Err(diverged(format!(
                "stopped as {r:?} at id {id} where rank 0's verdict was {v}"
            ))),
        }
    }

    /// One forward pass per generated token.
    fn generate_plain<F: FnMut(u32) -> bool>(
        &mut self,
        n: usize,
        mode: DecodeMode,
        sampler: &mut Sampler,
        emitter: &mut Emitter<'_, F>,
    ) -> Result<StopReason, EngineError> {
        for i in 0..n {
            let (id, stopped) =
                self.sample_emit(sampler, self.logits(), self.history(), emitter)?;
            if stopped.is_some() || i + 1 == n {
                self.keep_pending(id)?;
                return Ok(stopped.unwrap_or(StopReason::Length));
            }
            self.step(id, mode)?;
        }
        Ok(StopReason::Length)
    }
}

/// Rank 0's verdict on a generated id, as broadcast: go on, or which stop.
const VERDICT_GO_ON: u32 = 0;
const VERDICT_CALLBACK: u32 = 3;

fn verdict_code(stopped: &Option<StopReason>) -> u32 {
    match stopped {
        None => VERDICT_GO_ON,
        Some(StopReason::EndToken(_)) => 1,
        Some(StopReason::StopText(_)) => 2,
        Some(StopReason::Callback) => VERDICT_CALLBACK,
        Some(_) => 4,
    }
}
