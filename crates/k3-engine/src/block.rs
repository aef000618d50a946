//! DSpark block drafting (docs/DSPARK.md, docs/STREAMING.md#dspark-block-drafts): every pass
//! the draft proposes a whole block from the target's taps, and the exact speculative loop
//! ([`Session::generate_speculative`]) verifies as many of them as the cost model says pays:
//!
//! A verifying pass with `n` drafts costs `S + u(n+1)·X` bytes — `S` the trunk, read once
//! whatever the number of positions (streamed from disk, or from memory), `X` one
//! position's routed experts, `u(m)` the union of `m` positions' experts in units of one
//! position's (`routing.rs`) — and, when the disk and compute rates are known, the
//! seconds those bytes and the draft pass take (`cost.rs`); it yields on average
//! `1 + Σ_{i≤n} Π_{j≤i} c_j` tokens, with `c_j` the confidence head's estimate that draft
//! `j` is accepted given the ones before it were. The drafter verifies the
//! `n ≤ min(draft_max, block)` that maximises tokens per second (per byte without the rates;
//! ties to the smaller `n`). Output ids are those of plain decoding whatever is proposed;
//! only the passes change.

mod cost;
mod routing;

pub use cost::{PassCost, PassSeconds, Rates};
pub use routing::Routing;

use crate::dspark::DsparkDraft;
use crate::{EngineError, Session};
use k3_model::dspark::DraftContext;
use std::time::Instant;

/// One drafting pass: what was proposed, how many were verified, how many kept.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockPass {
    /// Position of the first proposed token.
    pub position: usize,
    /// The whole block's proposals.
    pub proposed: Vec<u32>,
    /// The confidence head's estimate per proposal.
    pub confidence: Vec<f32>,
    /// Proposals sent to the exact model.
    pub verified: usize,
    /// Verified proposals the exact model accepted.
    pub kept: usize,
}

/// The block drafter of one session (kept across generations, like the hybrid drafter).
pub struct BlockDrafter {
    cost: PassCost,
    draft_max: usize,
    passes: Vec<BlockPass>,
    /// The last pass, until the next call tells how many of its drafts were kept.
    open: Option<BlockPass>,
    /// Seconds spent drafting.
    pub seconds: f64,
    failure: Option<String>,
    truth: Option<Truth>,
    /// Drafts verified per pass, fixed (benchmarks): the cost model is not consulted.
    verify: Option<usize>,
}

/// Controlled acceptance (benchmarks and tests): each proposal is replaced by the true
/// continuation with probability `p`, drawn from a fixed-seed stream.
struct Truth {
    ids: Vec<u32>,
    p: f64,
    rng: u64,
}

impl Truth {
    /// splitmix64 → uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn apply(&mut self, position: usize, ids: &mut [u32]) {
        for (i, id) in ids.iter_mut().enumerate() {
            if let Some(&t) = self.ids.get(position + i) {
                if self.uniform() < self.p {
                    *id = t;
                }
            }
        }
    }
}

impl BlockDrafter {
    pub(crate) fn new(cost: PassCost, draft_max: usize) -> BlockDrafter {
        BlockDrafter {
            cost,
            draft_max,
            passes: Vec::new(),
            open: None,
            seconds: 0.0,
            failure: None,
            truth: None,
            verify: None,
        }
    }

    /// The cost model the drafter chooses with from now on.
    pub fn set_cost(&mut self, cost: PassCost) {
        self.cost = cost;
    }

    /// At most `n` drafts verified per pass from now on.
    pub fn set_draft_max(&mut self, n: usize) {
        self.draft_max = n;
    }

    /// Every finished pass so far (the last one settles at the next call or [`Self::settle`]).
    pub fn passes(&self) -> &[BlockPass] {
        &self.passes
    }

    /// Why drafting stopped, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Settles the open pass against the conversation `tokens` (kept = how many verified
    /// proposals the conversation continued with, in order).
    pub fn settle(&mut self, tokens: &[u32]) {
        if let Some(mut p) = self.open.take() {
            let got = tokens.get(p.position..).unwrap_or(&[]);
            p.kept = p.proposed[..p.verified]
                .iter()
                .zip(got)
                .take_while(|(a, b)| a == b)
                .count();
            self.passes.push(p);
        }
    }

    /// Up to `limit` drafts to follow `context` (the whole conversation, its last id not fed
    /// yet). Never an error: a failure stops drafting for this session.
    pub(crate) fn propose(
        &mut self,
        s: &mut Session<'_>,
        context: &[u32],
        limit: usize,
    ) -> Vec<u32> {
        self.settle(context);
        if limit == 0 || context.is_empty() || self.failure.is_some() {
            return Vec::new();
        }
        let t = Instant::now();
        let out = self.try_propose(s, context, limit);
        self.seconds += t.elapsed().as_secs_f64();
        out.unwrap_or_else(|e| {
            self.failure = Some(e.to_string());
            Vec::new()
        })
    }

    fn try_propose(
        &mut self,
        s: &mut Session<'_>,
        context: &[u32],
        limit: usize,
    ) -> Result<Vec<u32>, EngineError> {
        let engine = s.owner();
        let Some(draft) = engine.dspark() else {
            return Ok(Vec::new());
        };
        let t = context.len() - 1;
        let anchor = context[t];
        // the session's draft context must hold every position before the anchor, for the
        // ids of `context` (a rolled-back pass's rows count for the positions it got right)
        let Some(ctx) = s.taps.as_ref().and_then(|log| log.context(context, t)) else {
            return Ok(Vec::new()); // positions fed without taps (a batched pass): no draft
        };
        let block = block_at(engine, draft, ctx, t, anchor)?;
        let cap = limit.min(self.draft_max);
        // controlled acceptance: the choice sees the true acceptance rate, not the head's
        let truth_rate = self
            .truth
            .as_ref()
            .map(|t| vec![t.p as f32; block.ids.len()]);
        let verified = match (self.verify, &truth_rate, block.confidence.is_empty()) {
            (Some(n), _, _) => n.min(cap).min(block.ids.len()),
            (None, Some(rate), _) => self.cost.choose(rate, cap),
            (None, None, true) => cap.min(block.ids.len()),
            (None, None, false) => self.cost.choose(&block.confidence, cap),
        };
        let mut proposed = block.ids;
        if let Some(truth) = self.truth.as_mut() {
            truth.apply(t + 1, &mut proposed);
        }
        let drafts = proposed[..verified].to_vec();
        self.open = Some(BlockPass {
            position: t + 1,
            proposed,
            confidence: block.confidence,
            verified,
            kept: 0,
        });
        Ok(drafts)
    }
}

impl Session<'_> {
    /// Controlled acceptance for benchmarks and tests (`cargo xtask bench-draft`): from now
    /// on each block proposal at position `q` is replaced by `truth[q]` with probability `p`
    /// (fixed-seed stream), and the cost model chooses from that rate instead of the
    /// confidence head's estimates (which are still reported). The DSpark pass still runs
    /// every time; the ids generated are those of plain decoding whatever `truth` holds.
    pub fn set_block_truth(
        &mut self,
        truth: Vec<u32>,
        p: f64,
        seed: u64,
    ) -> Result<(), EngineError> {
        self.ensure_block_drafter(usize::MAX)?;
        if let Some(b) = self.block.as_mut() {
            b.truth = Some(Truth {
                ids: truth,
                p,
                rng: seed,
            });
        }
        Ok(())
    }

    /// The cost model this session's block drafter chooses with (by default the engine's
    /// byte model, [`crate::Engine::pass_cost`]); a benchmark sets the one with the time
    /// terms it measured ([`PassCost::with_rates`]).
    pub fn set_pass_cost(&mut self, cost: PassCost) -> Result<(), EngineError> {
        self.ensure_block_drafter(usize::MAX)?;
        if let Some(b) = self.block.as_mut() {
            b.set_cost(cost);
        }
        Ok(())
    }

    /// Benchmarks: every pass verifies `n` drafts (fewer only where the block or the
    /// context ends), whatever the cost model would choose; the acceptance length of drafts
    /// accepted independently with probability `p` is then `(1 − p^(n+1)) / (1 − p)`.
    pub fn set_block_verify(&mut self, n: usize) -> Result<(), EngineError> {
        self.ensure_block_drafter(usize::MAX)?;
        if let Some(b) = self.block.as_mut() {
            b.verify = Some(n);
        }
        Ok(())
    }

    /// Creates the block drafter on first use (`draft_max` drafts verified per pass at most).
    pub(crate) fn ensure_block_drafter(&mut self, draft_max: usize) -> Result<(), EngineError> {
        if self.block.is_none() {
            let engine = self.owner();
            if engine.dspark().is_none() {
                return Err(EngineError::Invalid(
                    "block drafting needs a DSpark draft model: pass --draft-model DIR".into(),
                ));
            }
            self.block = Some(Box::new(BlockDrafter::new(engine.pass_cost(), draft_max)));
        }
        Ok(())
    }

    /// Up to `limit` block drafts to follow this session's history and then `tail` (ids not
    /// fed yet, the last one the anchor), chosen by the cost model as in
    /// [`crate::DecodeMode::Block`]; empty without a DSpark draft, when drafting stopped, or
    /// when some position was fed without taps (a batched pass, a restored session). For
    /// callers with their own decode loop (the server's scheduler), which verify them with
    /// [`Session::feed_verify`].
    pub fn propose_block(&mut self, tail: &[u32], limit: usize) -> Vec<u32> {
        let Some(draft) = self.owner().dspark() else {
            return Vec::new();
        };
        if tail.is_empty()
            || self
                .ensure_block_drafter(draft.graph().config().block_size)
                .is_err()
        {
            return Vec::new();
        }
        let Some(mut block) = self.block.take() else {
            return Vec::new();
        };
        let mut context = self.history().to_vec();
        context.extend_from_slice(tail);
        let limit = limit.min(self.room_after(tail.len()));
        let drafts = block.propose(self, &context, limit);
        self.block = Some(block);
        drafts
    }

    /// Settles the block drafter's last pass against the conversation so far (after the
    /// last verifying pass of a caller-run loop).
    pub fn settle_block(&mut self) {
        let tokens = self.tokens();
        if let Some(b) = self.block.as_mut() {
            b.settle(&tokens);
        }
    }

    /// The block drafter's passes in this session (`None` before the first block
    /// generation): the `--json` report's `draft.passes`.
    pub fn block_passes(&self) -> Option<&[BlockPass]> {
        self.block.as_deref().map(BlockDrafter::passes)
    }

    /// Seconds the block drafter spent drafting, and why it stopped if it did.
    pub fn block_drafting(&self) -> Option<(f64, Option<&str>)> {
        self.block.as_deref().map(|b| (b.seconds, b.failure()))
    }

    /// The block the DSpark draft proposes to follow this session's fed tokens and `anchor`
    /// (the next token, not fed), from the session's draft context (for tests and tools).
    pub fn dspark_block(
        &mut self,
        anchor: u32,
    ) -> Result<k3_model::dspark::BlockDraft, EngineError> {
        let engine = self.owner();
        let draft = engine.dspark().ok_or_else(|| {
            EngineError::Invalid("no DSpark draft model: pass --draft-model DIR".into())
        })?;
        let fed = self.history();
        let ctx = self
            .taps
            .as_ref()
            .and_then(|log| log.context(fed, fed.len()))
            .ok_or_else(|| {
                EngineError::Invalid("the draft context of the fed positions is not kept".into())
            })?;
        block_at(engine, draft, ctx, fed.len(), anchor)
    }

    /// Bytes of this session's DSpark draft context (0 without a draft model).
    pub fn dspark_context_bytes(&self) -> u64 {
        self.taps.as_ref().map_or(0, crate::dspark::TapLog::bytes)
    }
}

/// The draft's block after context positions `0..t` of `ctx` and `anchor`, on the engine's
/// pool with the target's embedding and lm_head.
fn block_at(
    engine: &crate::Engine,
    draft: &DsparkDraft,
    ctx: &DraftContext,
    t: usize,
    anchor: u32,
) -> Result<k3_model::dspark::BlockDraft, EngineError> {
    let (w, graph) = (draft.weights()?, draft.graph());
    engine.pool.install(|| {
        engine
            .with_seams(false, |target, _| {
                let hidden = graph.block_hidden(&w, target, anchor, ctx, t)?;
                graph.propose(&w, target, &hidden, anchor)
            })?
            .map_err(EngineError::from)
    })
}
