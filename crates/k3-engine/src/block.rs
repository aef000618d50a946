//! DSpark block drafting (docs/DSPARK.md, docs/STREAMING.md#dspark-block-drafts): every pass
//! the draft proposes a whole block from the target's taps, and the exact speculative loop
//! ([`Session::generate_speculative`]) verifies as many of them as the cost model says pays:
//!
//! A verifying pass with `n` drafts costs `S + (n+1)·X` bytes — `S` the trunk, read once
//! whatever the number of positions (streamed from disk, or from memory), `X` the routed
//! experts each position reads — and yields on average `1 + Σ_{i≤n} Π_{j≤i} c_j` tokens,
//! with `c_j` the confidence head's estimate that draft `j` is accepted given the ones
//! before it were. The drafter verifies the `n ≤ min(draft_max, block)` that maximises
//! tokens per byte (ties to the smaller `n`). Output ids are those of plain decoding
//! whatever is proposed; only the passes change.

use crate::dspark::DsparkDraft;
use crate::{EngineError, Session};
use k3_model::dspark::DraftContext;
use std::time::Instant;

/// The byte cost of one verifying pass: `shared + (positions)·per_position`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassCost {
    /// Bytes a pass reads whatever its positions (the trunk).
    pub shared: f64,
    /// Bytes each position adds (its routed experts).
    pub per_position: f64,
}

impl PassCost {
    /// Expected tokens per byte when `n` drafts with confidences `conf[..n]` are verified.
    pub fn tokens_per_byte(&self, conf: &[f32], n: usize) -> f64 {
        let mut alive = 1.0f64;
        let mut tokens = 1.0f64;
        for &c in &conf[..n] {
            alive *= c.clamp(0.0, 1.0) as f64;
            tokens += alive;
        }
        tokens / (self.shared + (n + 1) as f64 * self.per_position)
    }

    /// The number of drafts to verify, `0 ..= cap.min(conf.len())`, maximising
    /// [`PassCost::tokens_per_byte`] (first maximum: ties go to fewer drafts).
    pub fn choose(&self, conf: &[f32], cap: usize) -> usize {
        let cap = cap.min(conf.len());
        let mut best = (0, self.tokens_per_byte(conf, 0));
        for n in 1..=cap {
            let r = self.tokens_per_byte(conf, n);
            if r > best.1 {
                best = (n, r);
            }
        }
        best.0
    }
}

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
        }
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
        let verified = match (&truth_rate, block.confidence.is_empty()) {
            (Some(rate), _) => self.cost.choose(rate, cap),
            (None, true) => cap.min(block.ids.len()),
            (None, false) => self.cost.choose(&block.confidence, cap),
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

#[cfg(test)]
mod tests {
    use super::PassCost;

    /// The released model's ratio: trunk 108.8 GB read once per pass, 16 experts × 92 MoE
    /// layers × 17.5 MB = 25.8 GB per position (docs/STREAMING.md#dspark-block-drafts).
    const RELEASED: PassCost = PassCost {
        shared: 108.8e9,
        per_position: 25.8e9,
    };

    #[test]
    fn the_cost_model_verifies_while_the_expected_gain_pays() {
        // confident drafts: every one pays
        assert_eq!(RELEASED.choose(&[0.9; 7], 7), 7);
        assert_eq!(RELEASED.choose(&[0.9; 7], 3), 3, "draft_max caps");
        // hopeless drafts: none pays (the first costs 25.8 GB for an expected 0.05 token)
        assert_eq!(RELEASED.choose(&[0.05; 7], 7), 0);
        // falling confidence: stop where the next draft's survival is worth less than its bytes
        let falling = [0.9, 0.8, 0.6, 0.3, 0.1, 0.1, 0.1];
        let n = RELEASED.choose(&falling, 7);
        assert_eq!(n, 3);
        assert!(RELEASED.tokens_per_byte(&falling, 3) > RELEASED.tokens_per_byte(&falling, 4));
        // with every byte per position (shared = 0) a draft pays only when certain
        let flat = PassCost {
            shared: 0.0,
            per_position: 1.0,
        };
        assert_eq!(flat.choose(&[0.99; 7], 7), 0);
    }
}
