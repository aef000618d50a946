//! Kimi Delta Attention (docs/MODEL.md#kimi-delta-attention): projections, short convs, per-head L2 norm, per-head
//! decay, the delta-rule recurrence, head-wise RMSNorm, sigmoid output gate, `o_proj`.
//!
//! Shapes: E hidden, H heads, D head width, P = H·D, K conv width, T tokens of this call.

use crate::dims::Dims;
use crate::dist::Dist;
use crate::error::{check_len, ModelError};
use crate::pass::Pass;
use crate::scratch::grow;
use crate::share::kda_split;
use crate::state::{AttnState, KdaState};
use crate::weights::KdaWeights;
use k3_kernels::act::sigmoid;
use k3_kernels::conv::shortconv_step;
use k3_kernels::kda::kda_step_head;
use k3_kernels::norm::{l2norm_inplace, rmsnorm_inplace, L2_EPS};
use k3_kernels::Matrix;
use rayon::prelude::*;

/// Preallocated buffers of one KDA call (grown to the largest T seen, never shrunk).
#[derive(Default)]
pub struct KdaScratch {
    q: Vec<f32>,     // [T][P] q projection
    k: Vec<f32>,     // [T][P]
    v: Vec<f32>,     // [T][P]
    g: Vec<f32>,     // [T][P] output-gate pre-activation
    z: Vec<f32>,     // [T][P] decay pre-activation (f_b · f_a · x)
    qc: Vec<f32>,    // [T][P] conv(q), then L2-normed and scaled
    kc: Vec<f32>,    // [T][P] conv(k), then L2-normed
    vc: Vec<f32>,    // [T][P] conv(v)
    braw: Vec<f32>,  // [T][H] beta pre-activation, then beta
    f: Vec<f32>,     // [T][D] decay low-rank code
    alpha: Vec<f32>, // [T][P] per-channel decay
    o_hm: Vec<f32>,  // [H][T][D] recurrence output, head-major
    o: Vec<f32>,     // [T][P] gated, normed output (token-major)
    u: Vec<f32>,     // [H][D] per-head read scratch
}

impl KdaScratch {
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
        grow(&mut self.u, h * dd);
    }
}

/// Checks every KDA tensor against the config: a dealt tensor may be whole or exactly this
/// rank's share of rows (crate::share::kda_split); `layer` only labels the error.
pub fn check_kda(
    d: &Dims,
    dist: &Dist<'_>,
    w: &KdaWeights,
    layer: Option<usize>,
) -> Result<(), ModelError> {
    let (e, p, h, dd, k) = (d.hidden, d.kda_proj(), d.kda_heads, d.kda_dim, d.conv_k);
    let s = kda_split(h);
    let c = |what, x: &Matrix, want, split| dist.check_dealt(layer, what, x, want, split);
    c("kda q_proj", &w.q_proj, (p, e), s.qkvg)?;
    c("kda k_proj", &w.k_proj, (p, e), s.qkvg)?;
    c("kda v_proj", &w.v_proj, (p, e), s.qkvg)?;
    c("kda g_proj", &w.g_proj, (p, e), s.qkvg)?;
    c("kda o_proj", &w.o_proj, (e, p), s.o)?;
    c("kda f_a_proj", &w.f_a_proj, (dd, e), s.f_a)?;
    c("kda f_b_proj", &w.f_b_proj, (p, dd), s.f_b)?;
    c("kda b_proj", &w.b_proj, (h, e), s.b)?;
    let v = |what, x: &[f32], want, split| dist.check_dealt_len(layer, what, x.len(), want, split);
    v("kda q_conv1d", w.q_conv, (p, k), s.small)?;
    v("kda k_conv1d", w.k_conv, (p, k), s.small)?;
    v("kda v_conv1d", w.v_conv, (p, k), s.small)?;
    if w.a_log.len() < h {
        return check_len(layer, "kda A_log (at least one per head)", w.a_log.len(), h);
    }
    v("kda dt_bias", w.dt_bias, (p, 1), s.small)?;
    check_len(layer, "kda o_norm", w.o_norm.len(), dd)
}

/// Per-channel decay of one token (docs/MODEL.md#kda-decay): for head h, channel i = h·D + d,
/// `u = expf(A_log[h]) · (z_i + dt_bias_i)`, `g_i = lb · σ(u)`, `α_i = expf(g_i)`.
/// `z`, `dt_bias`, `alpha` are `[P]`; `a_log` holds at least H values (one per HEAD).
/// `g_out`, when given, receives `g` (`[P]`).
pub fn kda_decay(
    alpha: &mut [f32],
    mut g_out: Option<&mut [f32]>,
    z: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    lb: f32,
    dim: usize,
) {
    for (i, a) in alpha.iter_mut().enumerate() {
        let ah = a_log[i / dim].exp();
        let u = ah * (z[i] + dt_bias[i]);
        let g = lb * sigmoid(u);
        if let Some(go) = g_out.as_deref_mut() {
            go[i] = g;
        }
        *a = g.exp();
    }
}

/// The inputs of one call's recurrence: `q, k, v, alpha` are `[T][P]`, `beta` `[T][H]`; `q`
/// must be L2-normed AND scaled by 1/sqrt(D), `k` L2-normed.
pub struct KdaInputs<'a> {
    /// `[T][P]` queries.
    pub q: &'a [f32],
    /// `[T][P]` keys.
    pub k: &'a [f32],
    /// `[T][P]` values.
    pub v: &'a [f32],
    /// `[T][P]` per-channel decay factors.
    pub alpha: &'a [f32],
    /// `[T][H]` write strengths.
    pub beta: &'a [f32],
    /// Tokens.
    pub t: usize,
    /// Heads (H).
    pub heads: usize,
    /// Head dimension (D); P = H·D.
    pub dim: usize,
}

/// The delta-rule recurrence over `x.t` tokens for all heads (docs/MODEL.md#kda-recurrence),
/// heads in parallel, tokens in order within a head. `s` is `[H][D][D]`; output `o_hm` is
/// head-major `[H][T][D]`; `u` is `[H][D]` scratch.
pub fn kda_recurrence(s: &mut [f32], x: &KdaInputs<'_>, o_hm: &mut [f32], u: &mut [f32]) {
    let KdaInputs {
        q,
        k,
        v,
        alpha,
        beta,
        t,
        heads,
        dim,
    } = *x;
    let p = heads * dim;
    s.par_chunks_mut(dim * dim)
        .zip(o_hm.par_chunks_mut(t * dim))
        .zip(u.par_chunks_mut(dim))
        .enumerate()
        .for_each(|(h, ((sh, oh), uh))| {
            for tok in 0..t {
                let r = tok * p + h * dim..tok * p + (h + 1) * dim;
                kda_step_head(
                    sh,
                    &q[r.clone()],
                    &k[r.clone()],
                    &v[r.clone()],
                    &alpha[r],
                    beta[tok * heads + h],
                    uh,
                    &mut oh[tok * dim..(tok + 1) * dim],
                );
            }
        });
}

/// Short conv (+SiLU) of `t` tokens of `[P]` channels through one carried history.
fn conv_tokens(
    out: &mut [f32],
    x: &[f32],
    w: &[f32],
    hist: &mut [f32],
    p: usize,
    k: usize,
    t: usize,
) {
    for tok in 0..t {
        let r = tok * p..(tok + 1) * p;
        shortconv_step(&mut out[r.clone()], &x[r], w, hist, k);
    }
}

/// One KDA layer over `t` tokens with carried state: `x` is the normed input `[T][E]`,
/// `out` receives `[T][E]`.
pub fn kda_forward(
    pass: &Pass<'_>,
    l: usize,
    w: &KdaWeights,
    x: &[f32],
    st: &mut KdaState,
    out: &mut [f32],
    sc: &mut KdaScratch,
) -> Result<(), ModelError> {
    let one = Pass {
        batch: &[],
        ..*pass
    };
    kda_forward_batch(&one, l, w, x, &mut [AttnState::Kda(st)], out, sc)
}

/// The KDA state of sequence `i` of a batch (a mismatch is a caller's bug, reported).
fn kda_state<'a>(
    states: &'a mut [AttnState<'_>],
    i: usize,
) -> Result<&'a mut KdaState, ModelError> {
    match states.get_mut(i) {
        Some(AttnState::Kda(st)) => Ok(st),
        _ => Err(ModelError::StateMismatch(format!(
            "sequence {i} of the batch has no KDA state for this layer"
        ))),
    }
}

/// [`kda_forward`] over the sequences of `pass` (`states[i]` carries `pass.seq(i)`): the
/// projections, norms, gates and `o_proj` run over all rows at once; the short convs and the
/// recurrence run per sequence on its own history, so every row equals its solo result.
pub fn kda_forward_batch(
    pass: &Pass<'_>,
    l: usize,
    w: &KdaWeights,
    x: &[f32],
    states: &mut [AttnState<'_>],
    out: &mut [f32],
    sc: &mut KdaScratch,
) -> Result<(), ModelError> {
    let (d, t) = (pass.d, pass.t);
    check_kda(d, &pass.dist, w, Some(l))?;
    pass.check_states(l, states.len())?;
    sc.ensure(d, t);
    let (p, h, dd, k) = (d.kda_proj(), d.kda_heads, d.kda_dim, d.conv_k);
    let tp = t * p;
    // 1. projections (one weight pass for all T rows)
    //    (the six of x in one all-gather over ranks, docs/DISTRIBUTED.md#the-seam)
    let mut jobs = [
        (&mut sc.q[..tp], &w.q_proj),
        (&mut sc.k[..tp], &w.k_proj),
        (&mut sc.v[..tp], &w.v_proj),
        (&mut sc.g[..tp], &w.g_proj),
        (&mut sc.braw[..t * h], &w.b_proj),
        (&mut sc.f[..t * dd], &w.f_a_proj),
    ];
    pass.dist.matmuls(&mut jobs, x, t)?;
    pass.dist
        .matmul(&mut sc.z[..tp], &w.f_b_proj, &sc.f[..t * dd], t)?;
    // 2. causal short convs with each sequence's carried histories
    for i in 0..pass.n_seqs() {
        let seq = pass.seq(i);
        let r = seq.start * p..(seq.start + seq.len) * p;
        let (_, qh, kh, vh) = kda_state(states, i)?.parts_mut();
        let n = seq.len;
        conv_tokens(
            &mut sc.qc[r.clone()],
            &sc.q[r.clone()],
            w.q_conv,
            qh,
            p,
            k,
            n,
        );
        conv_tokens(
            &mut sc.kc[r.clone()],
            &sc.k[r.clone()],
            w.k_conv,
            kh,
            p,
            k,
            n,
        );
        conv_tokens(&mut sc.vc[r.clone()], &sc.v[r], w.v_conv, vh, p, k, n);
    }
    // 3. per-head L2 norm of q and k; q scaled by 1/sqrt(D)
    let q_scale = 1.0 / (dd as f32).sqrt();
    for head in sc.qc[..tp].chunks_exact_mut(dd) {
        l2norm_inplace(head, L2_EPS);
        head.iter_mut().for_each(|v| *v *= q_scale);
    }
    for head in sc.kc[..tp].chunks_exact_mut(dd) {
        l2norm_inplace(head, L2_EPS);
    }
    // 4. beta = σ(b_proj x), one per head; 5. per-channel decay
    sc.braw[..t * h].iter_mut().for_each(|b| *b = sigmoid(*b));
    for tok in 0..t {
        let r = tok * p..(tok + 1) * p;
        kda_decay(
            &mut sc.alpha[r.clone()],
            None,
            &sc.z[r],
            w.a_log,
            w.dt_bias,
            d.gate_lb,
            dd,
        );
    }
    // 6. recurrence per sequence, heads in parallel; o_hm holds each sequence's rows
    //    head-major (`[H][len][D]` from row `start·P`)
    for i in 0..pass.n_seqs() {
        let seq = pass.seq(i);
        let (r, rh) = (
            seq.start * p..(seq.start + seq.len) * p,
            seq.start * h..(seq.start + seq.len) * h,
        );
        let inputs = KdaInputs {
            q: &sc.qc[r.clone()],
            k: &sc.kc[r.clone()],
            v: &sc.vc[r.clone()],
            alpha: &sc.alpha[r.clone()],
            beta: &sc.braw[rh],
            t: seq.len,
            heads: h,
            dim: dd,
        };
        let (s, ..) = kda_state(states, i)?.parts_mut();
        kda_recurrence(s, &inputs, &mut sc.o_hm[r], &mut sc.u[..h * dd]);
    }
    // 7. head-wise RMSNorm, 8. sigmoid gate (after the norm)
    for i in 0..pass.n_seqs() {
        let seq = pass.seq(i);
        let base = seq.start * p;
        for j in 0..seq.len {
            let tok = seq.start + j;
            for head in 0..h {
                let o = &mut sc.o[tok * p + head * dd..tok * p + (head + 1) * dd];
                let src = base + (head * seq.len + j) * dd;
                o.copy_from_slice(&sc.o_hm[src..src + dd]);
                rmsnorm_inplace(o, w.o_norm, d.eps);
                let g = &sc.g[tok * p + head * dd..tok * p + (head + 1) * dd];
                o.iter_mut().zip(g).for_each(|(o, &g)| *o *= sigmoid(g));
            }
        }
    }
    // 9. output projection
    pass.dist
        .matmul(&mut out[..t * d.hidden], &w.o_proj, &sc.o[..tp], t)?;
    Ok(())
}
