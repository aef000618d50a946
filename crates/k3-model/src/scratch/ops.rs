//! The buffers of each op of a layer (KDA, MLA, MoE, dense MLP), grown to the largest call
//! seen and never shrunk; [`super::Scratch`] holds one of each. A leaf: the ops borrow
//! these buffers, the pool holds them, and neither is imported here.

use crate::dims::Dims;

/// Grows `v` to at least `n` elements (zero-filled); never shrinks.
pub(crate) fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// Preallocated buffers of one KDA call (grown to the largest T seen, never shrunk).
#[derive(Default)]
pub struct KdaScratch {
    pub(crate) q: Vec<f32>, // [T][P] q projection, then the gated outputs of this rank's heads
    pub(crate) k: Vec<f32>, // [T][P]
    pub(crate) v: Vec<f32>, // [T][P]
    pub(crate) g: Vec<f32>, // [T][P] output-gate pre-activation
    pub(crate) z: Vec<f32>, // [T][P] decay pre-activation (f_b · f_a · x)
    pub(crate) qc: Vec<f32>, // [T][P] conv(q), then L2-normed and scaled
    pub(crate) kc: Vec<f32>, // [T][P] conv(k), then L2-normed
    pub(crate) vc: Vec<f32>, // [T][P] conv(v)
    pub(crate) braw: Vec<f32>, // [T][H] beta pre-activation, then beta
    pub(crate) f: Vec<f32>, // [T][D] decay low-rank code
    pub(crate) alpha: Vec<f32>, // [T][P] per-channel decay
    pub(crate) o_hm: Vec<f32>, // [H][T][D] recurrence output, head-major
    pub(crate) o: Vec<f32>, // [T][P] every rank's heads' outputs (token-major)
    pub(crate) u: Vec<f32>, // [H][2·D] per-head read scratch (u and v − u)
    /// `[H][D][D]` one layer's recurrent state after a pass's committed tokens, which its
    /// tentative tokens run on (crate::journal); grown on the first tentative pass.
    pub(crate) tentative_s: Vec<f32>,
    /// `[3][P][K−1]` the same for the conv histories.
    pub(crate) tentative_conv: Vec<f32>,
}

impl KdaScratch {
    /// Fills every buffer with NaN (tests: a reused scratch's old values never matter).
    #[cfg(test)]
    pub(crate) fn poison(&mut self) {
        let bufs = [
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.g,
            &mut self.z,
            &mut self.qc,
            &mut self.kc,
            &mut self.vc,
            &mut self.braw,
            &mut self.f,
            &mut self.alpha,
            &mut self.o_hm,
            &mut self.o,
            &mut self.u,
        ];
        bufs.into_iter().for_each(|b| b.fill(f32::NAN));
    }
    /// Bytes each further token adds (the `[T]`-sized buffers of [`KdaScratch::ensure`]).
    pub fn bytes_per_token(d: &Dims) -> u64 {
        (11 * d.kda_proj() + d.kda_heads + d.kda_dim) as u64 * 4
    }

    /// Grows every buffer to hold `t` tokens.
    pub fn ensure(&mut self, d: &Dims, t: usize) {
        let (p, h, dd) = (d.kda_proj(), d.kda_heads, d.kda_dim);
        for b in [
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.g,
            &mut self.z,
            &mut self.qc,
            &mut self.kc,
            &mut self.vc,
            &mut self.alpha,
            &mut self.o_hm,
            &mut self.o,
        ] {
            grow(b, t * p);
        }
        grow(&mut self.braw, t * h);
        grow(&mut self.f, t * dd);
        grow(&mut self.u, 2 * h * dd);
    }
}

/// Preallocated buffers of one MLA call.
#[derive(Default)]
pub struct MlaScratch {
    pub(crate) cq: Vec<f32>,  // [T][q_lora] query low-rank code (normed in place)
    pub(crate) q: Vec<f32>,   // [T][H][nope+rope]
    pub(crate) ckv: Vec<f32>, // [T][kv_lora+rope] latent + rope (latent normed in place)
    /// `[T][H_r·v]` gate pre-activation of this rank's heads, then `[T][H·v]` every head's
    /// gated output (gathered)
    pub(crate) gate: Vec<f32>,
    pub(crate) o: Vec<f32>,      // [T][H_r·v] this rank's heads' outputs
    pub(crate) q_lat: Vec<f64>,  // [H][kv_lora] absorbed query
    pub(crate) ctx: Vec<f32>,    // [H][kv_lora] probability-weighted latent
    pub(crate) scores: Vec<f32>, // [H][ctx] scores, then probabilities
}

impl MlaScratch {
    /// Fills every buffer with NaN (tests: a reused scratch's old values never matter).
    #[cfg(test)]
    pub(crate) fn poison(&mut self) {
        let bufs = [
            &mut self.cq,
            &mut self.q,
            &mut self.ckv,
            &mut self.gate,
            &mut self.o,
            &mut self.ctx,
            &mut self.scores,
        ];
        bufs.into_iter().for_each(|b| b.fill(f32::NAN));
        self.q_lat.fill(f64::NAN);
    }
    /// Bytes each further token adds (the `[T]`-sized buffers of [`MlaScratch::ensure`];
    /// the `[H][ctx]` scores are planned with the context).
    pub fn bytes_per_token(d: &Dims) -> u64 {
        let hv = d.mla_heads * d.v_head;
        (d.q_lora + d.mla_heads * d.qk_head() + d.kv_row() + 2 * hv) as u64 * 4
    }

    /// Grows every buffer for `t` tokens attending over at most `ctx` positions.
    pub fn ensure(&mut self, d: &Dims, t: usize, ctx: usize) {
        let (h, hv) = (d.mla_heads, d.mla_heads * d.v_head);
        grow(&mut self.cq, t * d.q_lora);
        grow(&mut self.q, t * h * d.qk_head());
        grow(&mut self.ckv, t * d.kv_row());
        grow(&mut self.gate, t * hv);
        grow(&mut self.o, t * hv);
        if self.q_lat.len() < h * d.kv_lora {
            self.q_lat.resize(h * d.kv_lora, 0.0);
        }
        grow(&mut self.ctx, h * d.kv_lora);
        grow(&mut self.scores, h * ctx);
    }
}

/// Buffers of one routed expert over the tokens routed to it (n ≤ T rows).
#[derive(Default)]
pub(crate) struct ExpertScratch {
    pub(crate) gz: Vec<f32>, // [n][L] gathered inputs
    pub(crate) gg: Vec<f32>, // [n][I] w1 · z
    pub(crate) gu: Vec<f32>, // [n][I] w3 · z
    pub(crate) ga: Vec<f32>, // [n][I] SiTU-GLU
    pub(crate) gy: Vec<f32>, // [n][L] w2 · a
}

/// Preallocated buffers of one MoE call.
#[derive(Default)]
pub struct MoeScratch {
    pub(crate) scores: Vec<f32>,   // [NE] sigmoid router scores of one token
    pub(crate) taken: Vec<bool>,   // [NE] top-k scratch
    pub(crate) idx: Vec<u32>,      // [T][K] chosen experts, descending choice
    pub(crate) wts: Vec<f32>,      // [T][K] routing weights
    pub(crate) z: Vec<f32>,        // [T][L] latent input (routed_expert_down_proj · x)
    pub(crate) ybuf: Vec<f32>,     // [T][K][L] expert output per (token, slot)
    pub(crate) filled: Vec<bool>,  // [T][K] slot computed
    pub(crate) union: Vec<u32>,    // [≤T·K] distinct experts, first-seen order
    pub(crate) users: Vec<usize>,  // [≤T] slots (t·K + j) of the expert being computed
    pub(crate) one: ExpertScratch, // buffers of the expert being computed
    pub(crate) acc: Vec<f32>,      // [T][L] weighted aggregate, normed in place
    pub(crate) sg: Vec<f32>,       // [T][SI] shared gate
    pub(crate) su: Vec<f32>,       // [T][SI] shared up
    pub(crate) sa: Vec<f32>,       // [T][SI] shared activation
    pub(crate) sd: Vec<f32>,       // [T][E] shared output
}

impl MoeScratch {
    /// Fills every buffer with NaN, `true` or the largest index (tests: a reused scratch's old
    /// values never matter).
    #[cfg(test)]
    pub(crate) fn poison(&mut self) {
        let one = &mut self.one;
        let bufs = [
            &mut self.scores,
            &mut self.wts,
            &mut self.z,
            &mut self.ybuf,
            &mut self.acc,
            &mut self.sg,
            &mut self.su,
            &mut self.sa,
            &mut self.sd,
            &mut one.gz,
            &mut one.gg,
            &mut one.gu,
            &mut one.ga,
            &mut one.gy,
        ];
        bufs.into_iter().for_each(|b| b.fill(f32::NAN));
        self.taken.fill(true);
        self.filled.fill(true);
        self.idx.fill(u32::MAX);
        self.union.fill(u32::MAX);
        self.users.fill(usize::MAX);
    }
    /// Bytes each further token adds (the `[T]`-sized buffers of [`MoeScratch::ensure`]:
    /// ids, weights, flags and union per slot; latent, expert and shared activations).
    pub fn bytes_per_token(d: &Dims) -> u64 {
        let (k, l, i, si) = (d.topk, d.latent, d.moe_inter, d.shared_inter);
        let per_slot = 4 + 4 + 1 + 4 + 4 * l; // idx, wts, filled, union, ybuf row
        let floats = 4 * l + 3 * i + 3 * si + d.hidden; // z, gz, gy, acc; gg/gu/ga; shared
        (k * per_slot + 8 + 4 * floats) as u64
    }

    /// Grows every buffer for `t` tokens.
    pub fn ensure(&mut self, d: &Dims, t: usize) {
        let (k, l, i, si) = (d.topk, d.latent, d.moe_inter, d.shared_inter);
        grow(&mut self.scores, d.n_experts);
        self.taken.resize(self.taken.len().max(d.n_experts), false);
        self.idx.resize(self.idx.len().max(t * k), 0);
        grow(&mut self.wts, t * k);
        grow(&mut self.z, t * l);
        grow(&mut self.ybuf, t * k * l);
        self.filled.resize(self.filled.len().max(t * k), false);
        self.union.reserve((t * k).saturating_sub(self.union.len()));
        self.users.reserve(t.saturating_sub(self.users.len()));
        for b in [&mut self.one.gz, &mut self.one.gy, &mut self.acc] {
            grow(b, t * l);
        }
        for b in [&mut self.one.gg, &mut self.one.gu, &mut self.one.ga] {
            grow(b, t * i);
        }
        for b in [&mut self.sg, &mut self.su, &mut self.sa] {
            grow(b, t * si);
        }
        grow(&mut self.sd, t * d.hidden);
    }
    /// The normed latent aggregate of token `t` after the last call (`[L]`, diagnostics).
    pub fn latent_aggregate(&self, d: &Dims, t: usize) -> &[f32] {
        &self.acc[t * d.latent..(t + 1) * d.latent]
    }
    /// The shared-expert activation of token `t` after the last call (`[SI]`, diagnostics).
    pub fn shared_activation(&self, d: &Dims, t: usize) -> &[f32] {
        &self.sa[t * d.shared_inter..(t + 1) * d.shared_inter]
    }
}

/// Preallocated buffers of one dense-MLP call.
#[derive(Default)]
pub struct DenseScratch {
    pub(crate) g: Vec<f32>, // [T][DI] gate_proj · x
    pub(crate) u: Vec<f32>, // [T][DI] up_proj · x
    pub(crate) a: Vec<f32>, // [T][DI] SiTU-GLU
}

impl DenseScratch {
    /// Fills every buffer with NaN (tests: a reused scratch's old values never matter).
    #[cfg(test)]
    pub(crate) fn poison(&mut self) {
        [&mut self.g, &mut self.u, &mut self.a]
            .into_iter()
            .for_each(|b| b.fill(f32::NAN));
    }
    /// Bytes each further token adds.
    pub fn bytes_per_token(d: &Dims) -> u64 {
        3 * d.dense_inter as u64 * 4
    }

    /// Grows every buffer for `t` tokens.
    pub fn ensure(&mut self, d: &Dims, t: usize) {
        for b in [&mut self.g, &mut self.u, &mut self.a] {
            grow(b, t * d.dense_inter);
        }
    }
}
