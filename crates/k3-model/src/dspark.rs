//! The DSpark block drafter (docs/DSPARK.md#forward): context rows from the target's taps,
//! per-layer latent KV kept across passes, one non-causal pass over the block
//! `[last token, mask × (B−1)]`, then the Markov and confidence heads row by row. The
//! target's embedding and lm_head are read through its [`WeightProvider`].
//!
//! Numerics: every matrix product is a k3-kernels `matmul` (thread-count-free); attention is
//! the latent (absorbed) form of [`crate::mla`] — per head, f64 scores in a fixed order,
//! softmax, f32 latent context, `W_vb` row dots — without a mask; RoPE (plain or YaRN,
//! docs/DSPARK.md#rope) angles and rotations in f64, rounded once.

use crate::dspark_rope::RopeTable;
use crate::error::{check_len, ModelError};
use crate::forward::argmax;
use crate::weights::WeightProvider;
use k3_format::dspark::{DraftAct, DsparkConfig};
use k3_kernels::act::{silu, situ_glu};
use k3_kernels::attn::{add_scaled, softmax_inplace};
use k3_kernels::matrix::{matmul, matvec};
use k3_kernels::norm::rmsnorm_inplace;
use k3_kernels::tmatvec::matvec_t_f64;
use k3_kernels::Matrix;
use rayon::prelude::*;

/// One draft layer's weights (published names under `layers.{i}.`).
pub struct DsparkLayer<'a> {
    /// `[E]`
    pub input_norm: &'a [f32],
    /// `[E]`
    pub post_attn_norm: &'a [f32],
    /// `[q_lora][E]`
    pub q_a_proj: Matrix<'a>,
    /// `[q_lora]`
    pub q_a_norm: &'a [f32],
    /// `[H·(nope+rope)][q_lora]`
    pub q_b_proj: Matrix<'a>,
    /// `[kv_lora+rope][E]`
    pub kv_a_proj: Matrix<'a>,
    /// `[kv_lora]`
    pub kv_a_norm: &'a [f32],
    /// `[H·(nope+v)][kv_lora]`
    pub kv_b_proj: Matrix<'a>,
    /// `[E][H·v]`
    pub o_proj: Matrix<'a>,
    /// `[I][E]`
    pub gate_proj: Matrix<'a>,
    /// `[I][E]`
    pub up_proj: Matrix<'a>,
    /// `[E][I]`
    pub down_proj: Matrix<'a>,
}

/// A DSpark draft's weights (docs/DSPARK.md#tensors).
pub struct DsparkWeights<'a> {
    /// `[E][taps·E]`
    pub context_proj: Matrix<'a>,
    /// `[E]`
    pub context_norm: &'a [f32],
    /// Per-tap norms `[taps][E]` applied before `context_proj` (`fc_norm: true`).
    pub fc_norm: Option<Vec<&'a [f32]>>,
    /// The draft layers.
    pub layers: Vec<DsparkLayer<'a>>,
    /// `[E]`
    pub final_norm: &'a [f32],
    /// `[V][R]`: the Markov embedding of the previous token (row lookup).
    pub markov_w1: Matrix<'a>,
    /// `[V][R]`: the Markov vocabulary bias.
    pub markov_w2: Matrix<'a>,
    /// Confidence head: weight `[E(+R)]` and bias.
    pub confidence: Option<(&'a [f32], f32)>,
}

/// Every draft layer's latent KV rows of the context positions `0..len`:
/// `[layer][len][kv_lora + rope]` (latent RMS-normed, key-rope rotated).
#[derive(Clone, Debug, Default)]
pub struct DraftContext {
    width: usize,
    layers: Vec<Vec<f32>>,
}

impl DraftContext {
    /// Empty, for config `c`.
    pub fn new(c: &DsparkConfig) -> DraftContext {
        DraftContext {
            width: c.kv_width(),
            layers: vec![Vec::new(); c.num_hidden_layers],
        }
    }
    /// Context positions held.
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .map_or(0, |l| l.len() / self.width.max(1))
    }
    /// No position held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Keeps positions `0..n` (after the target rolled back).
    pub fn truncate(&mut self, n: usize) {
        let w = self.width;
        self.layers.iter_mut().for_each(|l| l.truncate(n * w));
    }
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.len() as u64 * 4).sum()
    }
}

/// One block of proposals: row `i` proposes the token at `T + i + 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockDraft {
    /// Greedy proposals, `[B]`.
    pub ids: Vec<u32>,
    /// Confidence per row, `[B]` (empty without a confidence head).
    pub confidence: Vec<f32>,
    /// Markov-corrected logits, `[B][V]`.
    pub logits: Vec<f32>,
}

fn norm_rows(x: &mut [f32], width: usize, w: &[f32], eps: f64) {
    x.par_chunks_mut(width)
        .for_each(|r| rmsnorm_inplace(r, w, eps));
}

/// The DSpark graph for one config.
#[derive(Clone, Debug)]
pub struct Dspark {
    c: DsparkConfig,
    rope: RopeTable,
}

impl Dspark {
    /// The graph of `c` (already checked against the target by k3-format).
    pub fn new(c: DsparkConfig) -> Dspark {
        let rope = RopeTable::new(&c);
        Dspark { c, rope }
    }
    /// The config.
    pub fn config(&self) -> &DsparkConfig {
        &self.c
    }

    /// Latent KV rows of `x` (`[n][E]`) at positions `pos0..`: `[n][kv_lora+rope]`.
    fn latent_rows(&self, l: &DsparkLayer, x: &[f32], n: usize, pos0: usize) -> Vec<f32> {
        let (w, kl) = (self.c.kv_width(), self.c.kv_lora_rank);
        let mut a = vec![0f32; n * w];
        matmul(&mut a, &l.kv_a_proj, x, n);
        for (i, row) in a.chunks_mut(w).enumerate() {
            let (latent, k_rope) = row.split_at_mut(kl);
            rmsnorm_inplace(latent, l.kv_a_norm, self.c.rms_norm_eps);
            self.rope.rotate(k_rope, pos0 + i);
        }
        a
    }

    /// Appends context positions `ctx.len()..` from their taps (`[n][taps·E]`, in
    /// `target_layer_ids` order): `ctx_t = RMSNorm(context_proj · taps_t)` (each tap first
    /// RMS-normed by its `fc_norm` gain when the draft has them), then each layer's latent KV
    /// rows of `ctx_t`.
    pub fn extend_context(
        &self,
        w: &DsparkWeights,
        taps: &[f32],
        ctx: &mut DraftContext,
    ) -> Result<(), ModelError> {
        let e = self.c.hidden_size;
        let tw = self.c.target_layer_ids.len() * e;
        if !taps.len().is_multiple_of(tw) {
            return Err(ModelError::Shape {
                layer: None,
                what: "dspark taps",
                got: format!("{} floats", taps.len()),
                want: format!("a multiple of {tw}"),
            });
        }
        let n = taps.len() / tw;
        if n == 0 {
            return Ok(());
        }
        let normed;
        let taps = match &w.fc_norm {
            None => taps,
            Some(gains) => {
                let mut t = taps.to_vec(); // [n][taps][E]
                t.par_chunks_mut(e).enumerate().for_each(|(j, row)| {
                    rmsnorm_inplace(row, gains[j % gains.len()], self.c.rms_norm_eps)
                });
                normed = t;
                &normed[..]
            }
        };
        let mut x = vec![0f32; n * e];
        matmul(&mut x, &w.context_proj, taps, n);
        norm_rows(&mut x, e, w.context_norm, self.c.rms_norm_eps);
        let pos0 = ctx.len();
        for (l, rows) in w.layers.iter().zip(ctx.layers.iter_mut()) {
            rows.extend_from_slice(&self.latent_rows(l, &x, n, pos0));
        }
        Ok(())
    }

    /// The block pass: `[anchor, mask × (B−1)]` at positions `T..T+B` over the context
    /// positions `0..T` (`T ≤ ctx.len()`), embedded with the target's embedding →
    /// final-normed hidden `[B][E]`.
    pub fn block_hidden(
        &self,
        w: &DsparkWeights,
        target: &dyn WeightProvider,
        anchor: u32,
        ctx: &DraftContext,
        t: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.c;
        let (e, b) = (c.hidden_size, c.block_size);
        check_len(None, "dspark layers", w.layers.len(), c.num_hidden_layers)?;
        let t = t.min(ctx.len());
        let mut r = vec![0f32; b * e];
        for (i, row) in r.chunks_mut(e).enumerate() {
            let id = if i == 0 { anchor } else { c.mask_token_id };
            target
                .embed_row(id, row)
                .map_err(|source| ModelError::Weights {
                    layer: None,
                    source,
                })?;
        }
        let mut x = vec![0f32; b * e];
        let mut y = vec![0f32; b * e];
        for (l, ctx_rows) in w.layers.iter().zip(&ctx.layers) {
            x.copy_from_slice(&r);
            norm_rows(&mut x, e, l.input_norm, c.rms_norm_eps);
            self.attention(l, &x, &ctx_rows[..t * ctx.width], t, &mut y);
            r.iter_mut().zip(&y).for_each(|(a, &d)| *a += d);
            x.copy_from_slice(&r);
            norm_rows(&mut x, e, l.post_attn_norm, c.rms_norm_eps);
            self.mlp(l, &x, &mut y);
            r.iter_mut().zip(&y).for_each(|(a, &d)| *a += d);
        }
        norm_rows(&mut r, e, w.final_norm, c.rms_norm_eps);
        Ok(r)
    }

    /// Non-causal latent MLA of the block `x` (`[B][E]`, normed) over the layer's context
    /// rows and the block's own rows → `out` `[B][E]`.
    fn attention(&self, l: &DsparkLayer, x: &[f32], ctx_rows: &[f32], t: usize, out: &mut [f32]) {
        let c = &self.c;
        let (b, h) = (c.block_size, c.num_attention_heads);
        let (nope, rp, vh) = (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
        let qh = nope + rp;
        let mut cq = vec![0f32; b * c.q_lora_rank];
        matmul(&mut cq, &l.q_a_proj, x, b);
        norm_rows(&mut cq, c.q_lora_rank, l.q_a_norm, c.rms_norm_eps);
        let mut q = vec![0f32; b * h * qh];
        matmul(&mut q, &l.q_b_proj, &cq, b);
        for (i, row) in q.chunks_mut(h * qh).enumerate() {
            for head in row.chunks_mut(qh) {
                self.rope.rotate(&mut head[nope..], t + i);
            }
        }
        let mut rows = ctx_rows.to_vec();
        rows.extend_from_slice(&self.latent_rows(l, x, b, t));
        let mut o = vec![0f32; b * h * vh];
        o.par_chunks_mut(vh).enumerate().for_each(|(j, oh)| {
            let (i, head) = (j / h, j % h);
            let qrow = &q[(i * h + head) * qh..(i * h + head + 1) * qh];
            self.attend_head(&l.kv_b_proj, &rows, head, qrow, oh);
        });
        matmul(out, &l.o_proj, &o, b);
    }

    /// One head of one query over `rows` (`[S][kv_lora+rope]`), latent form, no mask.
    fn attend_head(&self, kv_b: &Matrix, rows: &[f32], head: usize, q: &[f32], o: &mut [f32]) {
        let c = &self.c;
        let (kl, kvr, nope, vh) = (
            c.kv_lora_rank,
            c.kv_width(),
            c.qk_nope_head_dim,
            c.v_head_dim,
        );
        let qk = (nope + c.qk_rope_head_dim) as f64;
        let scale = (self.rope.softmax_factor / qk.sqrt()) as f32;
        let kv0 = head * (nope + vh);
        let mut q_lat = vec![0f64; kl];
        matvec_t_f64(&mut q_lat, kv_b, kv0, &q[..nope]);
        let mut scores: Vec<f32> = rows
            .chunks_exact(kvr)
            .map(|r| {
                let mut acc = 0f64;
                for (&a, &v) in q_lat.iter().zip(&r[..kl]) {
                    acc += a * v as f64;
                }
                for (&a, &v) in q[nope..].iter().zip(&r[kl..]) {
                    acc += a as f64 * v as f64;
                }
                acc as f32 * scale
            })
            .collect();
        softmax_inplace(&mut scores);
        let mut cx = vec![0f32; kl];
        for (r, &p) in rows.chunks_exact(kvr).zip(&scores) {
            add_scaled(&mut cx, p, &r[..kl]);
        }
        matvec(o, &kv_b.rows(kv0 + nope, vh), &cx);
    }

    /// The dense MLP of `x` (`[B][E]`, normed) → `out`.
    fn mlp(&self, l: &DsparkLayer, x: &[f32], out: &mut [f32]) {
        let (b, i) = (self.c.block_size, self.c.intermediate_size);
        let (mut g, mut u) = (vec![0f32; b * i], vec![0f32; b * i]);
        matmul(&mut g, &l.gate_proj, x, b);
        matmul(&mut u, &l.up_proj, x, b);
        let mut a = vec![0f32; b * i];
        match self.c.act {
            DraftAct::Silu => a
                .iter_mut()
                .zip(g.iter().zip(&u))
                .for_each(|(a, (&g, &u))| *a = silu(g) * u),
            DraftAct::Situ { b1, b2 } => situ_glu(&mut a, &g, &u, b1, b2),
        }
        matmul(out, &l.down_proj, &a, b);
    }

    /// The heads over `hidden` (`[B][E]`), left to right: logits `lm_head·hidden_i +
    /// markov_w2·markov_w1[prev_i]`, greedy proposal, confidence `sigmoid(w·[hidden_i, m_i]
    /// + b)`; `prev_0 = anchor`, `prev_{i+1}` = proposal `i`.
    pub fn propose(
        &self,
        w: &DsparkWeights,
        target: &dyn WeightProvider,
        hidden: &[f32],
        anchor: u32,
    ) -> Result<BlockDraft, ModelError> {
        let c = &self.c;
        let (b, v, rank) = (c.block_size, c.vocab_size, c.markov_rank);
        let head = target.head().map_err(|source| ModelError::Weights {
            layer: None,
            source,
        })?;
        let mut logits = vec![0f32; b * v];
        matmul(&mut logits, &head.lm_head, hidden, b);
        let (mut ids, mut confidence) = (Vec::with_capacity(b), Vec::with_capacity(b));
        let (mut m, mut bias) = (vec![0f32; rank], vec![0f32; v]);
        let mut prev = anchor;
        for (i, z) in logits.chunks_mut(v).enumerate() {
            markov_row(&w.markov_w1, prev as usize, &mut m);
            matvec(&mut bias, &w.markov_w2, &m);
            z.iter_mut().zip(&bias).for_each(|(z, &d)| *z += d);
            if let Some((cw, cb)) = w.confidence {
                let h = &hidden[i * c.hidden_size..(i + 1) * c.hidden_size];
                let extra: &[f32] = if c.confidence_with_markov { &m } else { &[] };
                let feats = h.iter().chain(extra);
                let s: f64 = cw
                    .iter()
                    .zip(feats)
                    .map(|(&a, &x)| a as f64 * x as f64)
                    .sum();
                confidence.push((1.0 / (1.0 + (-(s + cb as f64)).exp())) as f32);
            }
            prev = argmax(z);
            ids.push(prev);
        }
        Ok(BlockDraft {
            ids,
            confidence,
            logits,
        })
    }
}

/// Row `r` of `w` widened to f32 (`out.len() == w.cols`).
fn markov_row(w: &Matrix, r: usize, out: &mut [f32]) {
    // one-hot row read through the kernels' transposed mat-vec: exact for a single 1.0
    let mut acc = vec![0f64; out.len()];
    matvec_t_f64(&mut acc, w, r, &[1.0]);
    out.iter_mut().zip(&acc).for_each(|(o, &a)| *o = a as f32);
}
