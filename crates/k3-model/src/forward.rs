//! The whole model: embedding → 93 decoder layers → output aggregator → final norm → lm_head.
//!
//! One entry point, [`Model::forward`], serves every execution path:
//! * prefill: T tokens in one pass (mat-mats over T; MoE fetches the union of experts once);
//! * incremental decode: T = 1 with the carried [`State`] ([`Model::decode`]);
//! * full recompute: reset + the whole sequence ([`Model::recompute`]).
//!
//! All three give bit-identical logits because every op computes each token exactly as a
//! single-token call would (row-independent mat-mats, per-token sums in fixed order).

use crate::dims::{Dims, LayerKind};
use crate::dist::{Comm, Dist, Solo};
use crate::error::{check_len, ModelError};
use crate::layer::{channel_half, mixer_half, AttnState, Residual};
use crate::mla::MlaPath;
use crate::pass::{Ahead, Pass, Seq};
use crate::residual::{fold, mix};
use crate::router::{route, RouteScratch, RouterParams};
use crate::scratch::Scratch;
use crate::share::{Split, FFN_SPLIT};
use crate::state::{KdaState, MlaCache, State};
use crate::taps::Taps;
use crate::weights::{ExpertProvider, HeadWeights, WeightProvider};
use k3_format::K3Config;
use k3_kernels::norm::rmsnorm;
use std::sync::Arc;

pub use crate::logits::{argmax, Logits, LogitsMode};

/// Next-layer router lookahead is off unless asked for: at real dims it read 18 % more expert
/// bytes for 1.03× s/token (docs/PERFORMANCE.md "Router lookahead"). The one default, used by
/// [`Model::new`] and the engine's options alike.
pub const LOOKAHEAD_DEFAULT: bool = false;

/// The Kimi K3 forward pass over pluggable weight stores.
#[derive(Clone, Debug)]
pub struct Model {
    dims: Dims,
    mla_path: MlaPath,
    lookahead: bool,
    /// The ranks this model's rows and experts are dealt over (docs/DISTRIBUTED.md).
    comm: Arc<dyn Comm>,
}

impl Model {
    /// Builds the graph for `cfg`; refuses configs this build cannot run.
    pub fn new(cfg: &K3Config) -> Result<Model, ModelError> {
        Ok(Model {
            dims: Dims::new(cfg)?,
            mla_path: MlaPath::Latent,
            lookahead: LOOKAHEAD_DEFAULT,
            comm: Arc::new(Solo),
        })
    }
    /// The model's dimensions.
    pub fn dims(&self) -> &Dims {
        &self.dims
    }
    /// Selects the MLA formulation (default [`MlaPath::Latent`]; `Expanded` is a test reference).
    pub fn with_mla_path(mut self, path: MlaPath) -> Model {
        self.mla_path = path;
        self
    }
    /// Turns next-layer router lookahead on or off (default [`LOOKAHEAD_DEFAULT`]). Logits are
    /// the same either way; only which experts are read early changes.
    pub fn with_lookahead(mut self, on: bool) -> Model {
        self.lookahead = on;
        self
    }
    /// Runs this model as one rank of `comm`'s group (docs/DISTRIBUTED.md#the-seam): every
    /// rank computes its share of the trunk rows and routed experts and the results are
    /// all-gathered, so logits are bit-identical to one process. Every rank must run the
    /// same calls in the same order.
    pub fn with_comm(mut self, comm: Arc<dyn Comm>) -> Model {
        self.comm = comm;
        self
    }
    /// The group this model runs in (rank 0 of 1 unless [`Model::with_comm`]).
    pub fn comm(&self) -> &Arc<dyn Comm> {
        &self.comm
    }
    /// A fresh session able to hold `max_ctx` positions.
    /// Over ranks it holds this rank's KDA heads only (docs/DISTRIBUTED.md#the-seam).
    pub fn new_state(&self, max_ctx: usize) -> State {
        State::with_kda_heads(&self.dims, max_ctx, self.kda_heads())
    }
    /// [`Model::new_state`] reusing an earlier session's scratch ([`State::take_scratch`]).
    pub fn new_state_with(&self, max_ctx: usize, scratch: Scratch) -> State {
        State::with_scratch(&self.dims, max_ctx, self.kda_heads(), scratch)
    }
    /// The KDA heads this rank runs (and its states hold): `0..H` on one process.
    pub fn kda_heads(&self) -> std::ops::Range<usize> {
        self.dist().heads(self.dims.kda_heads)
    }
    /// Every KDA layer's state with ALL heads, in the one-process layout (what a session
    /// file holds). **A collective over ranks**: every rank must call it at the same point
    /// of the same call sequence, or the group waits (docs/DISTRIBUTED.md#the-seam). On one
    /// process it is a copy. Refuses a poisoned state.
    pub fn gather_kda_states(&self, state: &State) -> Result<Vec<KdaState>, ModelError> {
        if state.is_poisoned() {
            return Err(ModelError::StatePoisoned);
        }
        let d = &self.dims;
        let (h, dd, k) = (d.kda_heads, d.kda_dim, d.conv_k);
        let heads = Split::Heads(h);
        let (dist, s_len, part) = (self.dist(), h * dd * dd, h * dd * (k - 1));
        let mut out = Vec::with_capacity(state.kda_states().len());
        for mine in state.kda_states() {
            let mut whole = KdaState::new(h, dd, k);
            dist.allgather_cols(mine.recurrent(), s_len, heads, whole.recurrent_mut(), 1)?;
            let mine_part = mine.conv().len() / 3;
            for j in 0..3 {
                let src = &mine.conv()[j * mine_part..(j + 1) * mine_part];
                let dst = &mut whole.conv_mut()[j * part..(j + 1) * part];
                dist.allgather_cols(src, part, heads, dst, 1)?;
            }
            out.push(whole);
        }
        Ok(out)
    }
    fn dist(&self) -> Dist<'_> {
        Dist {
            comm: self.comm.as_ref(),
        }
    }

    /// One decode step: `token` at position `state.pos()`, logits of that position (`[V]`).
    pub fn decode(
        &self,
        weights: &dyn WeightProvider,
        experts: &dyn ExpertProvider,
        token: u32,
        state: &mut State,
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self
            .forward(weights, experts, &[token], state, LogitsMode::Last)?
            .data)
    }

    /// Full recompute: resets `state`, then runs `tokens` from position 0.
    pub fn recompute(
        &self,
        weights: &dyn WeightProvider,
        experts: &dyn ExpertProvider,
        tokens: &[u32],
        state: &mut State,
        mode: LogitsMode,
    ) -> Result<Logits, ModelError> {
        state.reset();
        self.forward(weights, experts, tokens, state, mode)
    }

    /// Runs `tokens` at positions `state.pos()..` with the carried state and advances it.
    /// Input errors (empty call, id ≥ vocab, context overflow, foreign or poisoned state) are
    /// reported before anything is touched; any later error poisons the state.
    pub fn forward(
        &self,
        weights: &dyn WeightProvider,
        experts: &dyn ExpertProvider,
        tokens: &[u32],
        state: &mut State,
        mode: LogitsMode,
    ) -> Result<Logits, ModelError> {
        self.forward_observed(weights, experts, tokens, state, mode, &mut |_| {})
    }

    /// [`Model::forward`], calling `on_layer(l)` after each decoder layer `l` finishes (for
    /// progress reports; the logits do not depend on it).
    pub fn forward_observed(
        &self,
        weights: &dyn WeightProvider,
        experts: &dyn ExpertProvider,
        tokens: &[u32],
        state: &mut State,
        mode: LogitsMode,
        on_layer: &mut dyn FnMut(usize),
    ) -> Result<Logits, ModelError> {
        let one = BatchItem {
            tokens,
            state,
            mode,
        };
        self.forward_one(weights, experts, one, on_layer, None)
    }

    /// One pass over several sequences (docs/MODEL.md#decoder-layer; docs/SERVER.md
    /// "Batching"): each item's tokens run at its own state's position and advance it, the
    /// trunk and the union of the batch's experts are read once, and every item's logits are
    /// bit for bit those of running it alone (row-wise ops are per-row exact, the token
    /// mixers run per sequence). Input errors of any item are reported before anything is
    /// touched; a later error poisons every item's state. The pass runs in the first item's
    /// scratch (grown to the batch's rows). The pass proper: embed → for each layer: mix
    /// residual, attention, FFN → head.
    pub fn forward_batch(
        &self,
        weights: &dyn WeightProvider,
        experts: &dyn ExpertProvider,
        items: &mut [BatchItem<'_>],
        on_layer: &mut dyn FnMut(usize),
    ) -> Result<Vec<Logits>, ModelError> {
        self.forward_batch_tapped(weights, experts, items, on_layer, None)
    }

    /// [`Model::forward`] that also copies the hidden streams `taps` asks for into
    /// `taps.rows` (`[T][taps][E]`, docs/DSPARK.md#taps). The logits are bit for bit those
    /// of [`Model::forward`]: capturing only reads the residual stream.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_tapped(
        &self,
        weights: &dyn WeightProvider,
        experts: &dyn ExpertProvider,
        tokens: &[u32],
        state: &mut State,
        mode: LogitsMode,
        on_layer: &mut dyn FnMut(usize),
        taps: &mut Taps,
    ) -> Result<Logits, ModelError> {
        let one = BatchItem {
            tokens,
            state,
            mode,
        };
        self.forward_one(weights, experts, one, on_layer, Some(taps))
    }

    /// One sequence through [`Model::forward_batch_tapped`]: its logits.
    fn forward_one(
        &self,
        weights: &dyn WeightProvider,
        experts: &dyn ExpertProvider,
        item: BatchItem<'_>,
        on_layer: &mut dyn FnMut(usize),
        taps: Option<&mut Taps>,
    ) -> Result<Logits, ModelError> {
        let mut one = [item];
        let mut logits = self.forward_batch_tapped(weights, experts, &mut one, on_layer, taps)?;
        logits.pop().ok_or(ModelError::NoTokens)
    }

    fn forward_batch_tapped(
        &self,
        weights: &dyn WeightProvider,
        experts: &dyn ExpertProvider,
        items: &mut [BatchItem<'_>],
        on_layer: &mut dyn FnMut(usize),
        taps: Option<&mut Taps>,
    ) -> Result<Vec<Logits>, ModelError> {
        if items.is_empty() {
            return Err(ModelError::NoTokens);
        }
        let mut seqs = Vec::with_capacity(items.len());
        for it in items.iter() {
            self.check_call(it.tokens, it.state)?;
            let start = seqs.last().map_or(0, |s: &Seq| s.start + s.len);
            let (len, pos) = (it.tokens.len(), it.state.pos());
            seqs.push(Seq { start, len, pos });
        }
        items.iter_mut().for_each(|it| it.state.poisoned = true); // until the pass completes
        let tokens: Vec<u32> = items.iter().flat_map(|it| it.tokens).copied().collect();
        let mut head_rows = Vec::new();
        for (it, seq) in items.iter().zip(&seqs) {
            let rows = it.mode.rows(seq.len);
            head_rows.extend(seq.start + seq.len - rows..seq.start + seq.len);
        }
        let mut parts = Vec::with_capacity(items.len());
        let mut scratch = None;
        for it in items.iter_mut() {
            let (kda, mla, sc) = it.state.split();
            parts.push((kda, mla));
            scratch.get_or_insert(sc);
        }
        let sc = scratch.ok_or(ModelError::NoTokens)?;
        let batch = if seqs.len() > 1 { &seqs[..] } else { &[] };
        let mut call = Call {
            tokens: &tokens,
            pos: seqs[0].pos,
            batch,
            head_rows: &head_rows,
            taps,
        };
        let data = self
            .run(weights, experts, &mut call, &mut parts, sc, on_layer)
            .inspect_err(|err| self.abort_group(err))?;
        let vocab = self.dims.vocab;
        let mut out = Vec::with_capacity(items.len());
        let mut row = 0;
        for (it, seq) in items.iter_mut().zip(&seqs) {
            let rows = it.mode.rows(seq.len);
            let rows_data = data[row * vocab..(row + rows) * vocab].to_vec();
            row += rows;
            it.state.advance(seq.len);
            it.state.poisoned = false;
            out.push(Logits {
                rows,
                vocab,
                data: rows_data,
            });
        }
        Ok(out)
    }

    /// A rank whose pass failed ends the group, so the other ranks' collectives fail
    /// instead of waiting (docs/DISTRIBUTED.md#faults). A failure that came FROM the group
    /// is not re-raised.
    fn abort_group(&self, err: &ModelError) {
        if self.comm.size() > 1 && !matches!(err, ModelError::Dist(_)) {
            self.comm.abort(&err.to_string());
        }
    }

    fn check_call(&self, tokens: &[u32], state: &State) -> Result<(), ModelError> {
        let d = &self.dims;
        if state.dims != *d {
            return Err(ModelError::StateMismatch(
                "state built for another geometry".into(),
            ));
        }
        if state.kda_heads() != self.kda_heads() {
            return Err(ModelError::StateMismatch(format!(
                "state holds KDA heads {:?}, this rank runs heads {:?}",
                state.kda_heads(),
                self.kda_heads()
            )));
        }
        if state.poisoned {
            return Err(ModelError::StatePoisoned);
        }
        if tokens.is_empty() {
            return Err(ModelError::NoTokens);
        }
        if let Some((index, &id)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= d.vocab)
        {
            return Err(ModelError::TokenOutOfRange {
                id,
                index,
                vocab: d.vocab,
            });
        }
        if state.pos() + tokens.len() > state.max_ctx() {
            let (pos, max_ctx) = (state.pos(), state.max_ctx());
            return Err(ModelError::ContextOverflow {
                pos,
                tokens: tokens.len(),
                max_ctx,
            });
        }
        Ok(())
    }

    /// Next-layer router lookahead: routes layer `layer`'s router on the CURRENT layer's MoE
    /// input `x` (one token; the residual stream changes little between layers) and hints
    /// the predicted experts to the store, which reads them while this layer finishes. Only
    /// when the router is in memory now (resident or pinned); decode only (T = 1), where a
    /// layer's experts are few and latency-bound.
    fn lookahead(
        &self,
        weights: &dyn WeightProvider,
        experts: &dyn ExpertProvider,
        layer: usize,
        x: &[f32],
        t: usize,
    ) {
        let d = &self.dims;
        if t != 1 || x.len() < d.hidden {
            return;
        }
        let rp = RouterParams {
            topk: d.topk,
            renorm: d.renorm,
            scale: d.routed_scale,
        };
        weights.with_router(layer, &mut |router, bias| {
            let shapes_ok =
                router.rows == d.n_experts && router.cols == d.hidden && bias.len() == d.n_experts;
            // Allocated only when the router is in memory (a few KB per pinned MoE layer).
            let (mut scores, mut taken) = (vec![0f32; d.n_experts], vec![false; d.n_experts]);
            let (mut idx, mut wts) = (vec![0u32; d.topk], vec![0f32; d.topk]);
            let sc = RouteScratch {
                scores: &mut scores,
                taken: &mut taken,
            };
            if shapes_ok && route(&x[..d.hidden], router, bias, &rp, sc, &mut idx, &mut wts) {
                // only the experts this rank runs (docs/DISTRIBUTED.md#the-seam)
                let dist = Dist {
                    comm: self.comm.as_ref(),
                };
                idx.retain(|&e| dist.owns_expert(e));
                experts.hint(layer, &idx);
            }
        });
    }

    /// The pass over `call`'s rows: embed → for each layer: mix residual, attention, FFN →
    /// head. Returns the logits of `call.head_rows`, `[rows][V]`.
    fn run(
        &self,
        weights: &dyn WeightProvider,
        experts: &dyn ExpertProvider,
        call: &mut Call<'_>,
        states: &mut [SeqStates<'_>],
        sc: &mut Scratch,
        on_layer: &mut dyn FnMut(usize),
    ) -> Result<Vec<f32>, ModelError> {
        let mut taps = call.taps.take();
        let (d, t) = (&self.dims, call.tokens.len());
        sc.ensure(d, t);
        if let Some(tp) = taps.as_deref_mut() {
            tp.start(d, t);
        }
        let predict = |next: usize, x: &[f32]| self.lookahead(weights, experts, next, x, t);
        let pass = Pass {
            d,
            t,
            pos: call.pos,
            experts,
            mla_path: self.mla_path,
            ahead: self.lookahead.then_some(&predict as Ahead<'_>),
            batch: call.batch,
            dist: Dist {
                comm: self.comm.as_ref(),
            },
        };
        let weights_err = |layer, source| ModelError::Weights { layer, source };
        // 1. embedding rows: h [T][E]
        let e = d.hidden;
        for (tok, &id) in call.tokens.iter().enumerate() {
            let row = &mut sc.h[tok * e..(tok + 1) * e];
            weights
                .embed_row(id, row)
                .map_err(|err| weights_err(None, err))?;
        }
        // 2.–3. decoder layers over the residual stream; the block stack is rebuilt every call
        let mut res = Residual {
            h: &mut sc.h,
            blocks: &mut sc.blocks,
            n_blocks: 0,
        };
        for l in 0..d.n_layers {
            let mut held = weights.layer(l).map_err(|err| weights_err(Some(l), err))?;
            // one carried-state handle per sequence (a few pointers per layer)
            let mut attn: Vec<AttnState<'_>> = states
                .iter_mut()
                .map(|(kda, mla)| match d.kinds[l] {
                    LayerKind::Kda(i) => AttnState::Kda(&mut kda[i]),
                    LayerKind::Mla(i) => AttnState::Mla(&mut mla[i]),
                })
                .collect();
            let mw = held.mixer();
            if let (Some(tp), Some(prev)) = (taps.as_deref_mut(), l.checked_sub(1)) {
                // the AttnRes stream after layer l-1 is what layer l's first mix reads
                let res_w = (mw.attn_res_norm, mw.attn_res_proj);
                tp.after_mixed(d, prev, res.h, res.blocks, res.n_blocks, res_w, t);
            }
            mixer_half(&pass, l, &mw, &mut res, &mut attn, &mut sc.layer)?;
            // done with the token mixer's weights: a store of pieces may release them now
            let cw = held.channel().map_err(|err| weights_err(Some(l), err))?;
            channel_half(&pass, l, &cw, &mut res, &mut sc.layer)?;
            if let Some(tp) = taps.as_deref_mut() {
                tp.after_layer(d, l, res.h, t);
            }
            on_layer(l);
        }
        let n_blocks = res.n_blocks;
        // 4.–5. output aggregator, final norm, lm_head: logits [rows][V]
        let mut data = vec![0f32; call.head_rows.len() * d.vocab];
        let hw = weights.head().map_err(|err| weights_err(None, err))?;
        if let (Some(tp), Some(last)) = (taps, d.n_layers.checked_sub(1)) {
            let res_w = (hw.out_res_norm, hw.out_res_proj);
            tp.after_mixed(d, last, &sc.h, &sc.blocks, n_blocks, res_w, t);
        }
        self.head(&hw, pass.dist, sc, n_blocks, call.head_rows, &mut data)?;
        Ok(data)
    }

    /// Output aggregator + final norm + lm_head for the rows `rows` of the call.
    fn head(
        &self,
        hw: &HeadWeights,
        dist: Dist<'_>,
        sc: &mut Scratch,
        n_blocks: usize,
        rows: &[usize],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let (d, e) = (&self.dims, self.dims.hidden);
        check_len(None, "norm", hw.norm.len(), e)?;
        check_len(None, "output_attn_res_norm", hw.out_res_norm.len(), e)?;
        check_len(None, "output_attn_res_proj", hw.out_res_proj.len(), e)?;
        let want = (d.vocab, e);
        dist.check_dealt(None, "lm_head", &hw.lm_head, want, FFN_SPLIT)?;
        if rows.is_empty() {
            return Ok(());
        }
        let bs = d.max_blocks * e;
        let fold_q = &mut sc.layer.fold[..e];
        fold(fold_q, hw.out_res_norm, hw.out_res_proj);
        for (r, &tok) in rows.iter().enumerate() {
            let mixed = &mut sc.layer.xn[..e];
            mix(
                mixed,
                &sc.blocks[tok * bs..(tok + 1) * bs],
                n_blocks,
                &sc.h[tok * e..(tok + 1) * e],
                fold_q,
                d.eps,
            );
            rmsnorm(&mut sc.xn_head[r * e..(r + 1) * e], mixed, hw.norm, d.eps);
        }
        let n = rows.len();
        dist.matmul(out, &hw.lm_head, &sc.xn_head[..n * e], n)
    }
}

/// One sequence of [`Model::forward_batch`]: its tokens, its carried state (advanced by the
/// call) and which of its positions get logits.
pub struct BatchItem<'s> {
    /// Tokens to run at positions `state.pos()..`.
    pub tokens: &'s [u32],
    /// The sequence's carried state.
    pub state: &'s mut State,
    /// Which of the item's positions get logits.
    pub mode: LogitsMode,
}

/// Every sequence's carried state of one call: its KDA states and MLA caches.
type SeqStates<'s> = (&'s mut [KdaState], &'s mut [MlaCache]);

/// The rows of one pass: every sequence's tokens back to back, their layout, and which rows
/// get logits.
struct Call<'c> {
    /// `[T]` token ids.
    tokens: &'c [u32],
    /// Position of the first sequence (one-sequence calls).
    pos: usize,
    /// The sequences (empty for one).
    batch: &'c [Seq],
    /// Rows whose logits are returned, ascending.
    head_rows: &'c [usize],
    /// Hidden streams to copy out (docs/DSPARK.md#taps).
    taps: Option<&'c mut Taps>,
}
