//! Kimi Delta Attention (docs/MODEL.md#kimi-delta-attention): projections, short convs, per-head L2 norm, per-head
//! decay, the delta-rule recurrence, head-wise RMSNorm, sigmoid output gate, `o_proj`.
//!
//! Shapes: E hidden, H heads, D head width, P = H·D, K conv width, T tokens of this call.

use crate::dims::Dims;
use crate::dist::Dist;
use crate::error::{check_len, ModelError};
use crate::pass::{Pass, ROWS_PER_JOB};
pub use crate::scratch::ops::KdaScratch;
use crate::share::{kda_split, Split};
use crate::state::{AttnState, KdaState};
use crate::weights::KdaWeights;
use k3_kernels::act::{mul_sigmoid, sigmoid_inplace};
use k3_kernels::conv::shortconv_step;
use k3_kernels::kda::{kda_head_tokens, HeadTokens};
use k3_kernels::norm::{l2norm_inplace, rmsnorm_inplace, L2_EPS};
use k3_kernels::Matrix;
use rayon::prelude::*;
use std::ops::Range;

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
/// `u = exp(A_log[h]) · (z_i + dt_bias_i)`, `g_i = lb · σ(u)`, `α_i = exp(g_i)`
/// (`k3_kernels::kda::decay`). `z`, `dt_bias`, `alpha` are `[P]`; `a_log` holds at least H
/// values (one per HEAD). `g_out`, when given, receives `g` (`[P]`).
pub fn kda_decay(
    alpha: &mut [f32],
    g_out: Option<&mut [f32]>,
    z: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    lb: f32,
    dim: usize,
) {
    k3_kernels::kda::decay(alpha, g_out, z, a_log, dt_bias, lb, dim)
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
/// head-major `[H][T][D]`; `u` is `[H][2·D]` scratch. Each head's tokens run in one call
/// of `k3_kernels::kda::kda_head_tokens` (one sweep of its state per token).
pub fn kda_recurrence(s: &mut [f32], x: &KdaInputs<'_>, o_hm: &mut [f32], u: &mut [f32]) {
    let (t, dim) = (x.t, x.dim);
    s.par_chunks_mut(dim * dim)
        .zip(o_hm.par_chunks_mut(t * dim))
        .zip(u.par_chunks_mut(2 * dim))
        .enumerate()
        .with_max_len(1) // one head per job: rayon's default leaves runs a thread can't share
        .for_each(|(h, ((sh, oh), uh))| kda_head_tokens(sh, &x.head(h), oh, uh));
}

/// [`kda_recurrence`] whose tokens `committed..` are tentative (crate::journal): each head
/// runs tokens `..committed` on its state `s`, then copies it into `w` (`[H][D][D]`) and runs
/// the rest on the copy. Outputs and the state after the committed tokens are those of one
/// call over all tokens: a token's update never looks ahead, and splitting a head's tokens
/// only separates the sweep that wrote the last committed token from the one that decays
/// for the next (the same operations on every element, in the same order).
fn kda_recurrence_tentative(
    s: &mut [f32],
    w: &mut [f32],
    x: &KdaInputs<'_>,
    committed: usize,
    o_hm: &mut [f32],
    u: &mut [f32],
) {
    let (t, dim) = (x.t, x.dim);
    let (now, later) = (x.rows(0..committed), x.rows(committed..t));
    s.par_chunks_mut(dim * dim)
        .zip(w.par_chunks_mut(dim * dim))
        .zip(o_hm.par_chunks_mut(t * dim))
        .zip(u.par_chunks_mut(2 * dim))
        .enumerate()
        .with_max_len(1)
        .for_each(|(h, (((sh, wh), oh), uh))| {
            let (o_now, o_later) = oh.split_at_mut(committed * dim);
            kda_head_tokens(sh, &now.head(h), o_now, uh);
            wh.copy_from_slice(sh);
            kda_head_tokens(wh, &later.head(h), o_later, uh);
        });
}

impl<'a> KdaInputs<'a> {
    /// The inputs of tokens `r` alone.
    fn rows(&self, r: Range<usize>) -> KdaInputs<'a> {
        let (p, h) = (self.heads * self.dim, self.heads);
        let rows = |a: &'a [f32]| &a[r.start * p..r.end * p];
        KdaInputs {
            q: rows(self.q),
            k: rows(self.k),
            v: rows(self.v),
            alpha: rows(self.alpha),
            beta: &self.beta[r.start * h..r.end * h],
            t: r.len(),
            ..*self
        }
    }
    /// Head `h`'s view of the call's tokens.
    fn head(&self, h: usize) -> HeadTokens<'a> {
        HeadTokens {
            q: self.q,
            k: self.k,
            v: self.v,
            alpha: self.alpha,
            beta: self.beta,
            tokens: self.t,
            dim: self.dim,
            stride: self.heads * self.dim,
            offset: h * self.dim,
            beta_stride: self.heads,
            beta_offset: h,
        }
    }
}

/// Channels per short-conv task: 3 convs × P / 1024 tasks (36 at the released P = 12,288)
/// balance two threads where the three whole convs side by side left one thread idle a
/// third of the time.
const CONV_BLOCK: usize = 1024;

/// One short conv (+SiLU) over `[T][P]` rows: `out`, `x`, taps `w` `[P][k]`, carried history
/// `hist` `[P][k−1]`.
type ConvJob<'a> = (&'a mut [f32], &'a [f32], &'a [f32], &'a mut [f32]);

/// The convs of `jobs` over `t` tokens of `p` channels, split into blocks of
/// [`CONV_BLOCK`] channels that run in parallel; each block carries its own channels'
/// history through the tokens in order, so every output is the one-token step's.
fn conv_tokens(jobs: [ConvJob<'_>; 3], p: usize, k: usize, t: usize) {
    if p == 0 {
        return; // a rank without heads (docs/DISTRIBUTED.md#the-seam)
    }
    let mut tasks = Vec::new();
    for (out, x, w, hist) in jobs {
        let blocks = p.div_ceil(CONV_BLOCK);
        let mut rows: Vec<Vec<&mut [f32]>> = (0..blocks).map(|_| Vec::with_capacity(t)).collect();
        for row in out.chunks_mut(p).take(t) {
            for (b, piece) in row.chunks_mut(CONV_BLOCK).enumerate() {
                rows[b].push(piece);
            }
        }
        let mut rest = hist;
        for (b, outs) in rows.into_iter().enumerate() {
            let width = CONV_BLOCK.min(p - b * CONV_BLOCK);
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(width * (k - 1));
            rest = tail;
            tasks.push((outs, x, w, mine, b * CONV_BLOCK));
        }
    }
    tasks
        .into_par_iter()
        .with_max_len(1)
        .for_each(|(outs, x, w, hist, c0)| {
            for (tok, out) in outs.into_iter().enumerate() {
                let c1 = c0 + out.len();
                let xr = &x[tok * p + c0..tok * p + c1];
                shortconv_step(out, xr, &w[c0 * k..c1 * k], hist, k);
            }
        });
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

/// The KDA state of sequence `i` of a batch, checked to hold `heads` heads of `dim` (this
/// rank's heads, docs/DISTRIBUTED.md#the-seam); a mismatch is a caller's bug, reported.
fn kda_state<'a>(
    states: &'a mut [AttnState<'_>],
    i: usize,
    (heads, dim, conv_k): (usize, usize, usize),
) -> Result<&'a mut KdaState, ModelError> {
    match states.get_mut(i) {
        Some(AttnState::Kda(st))
            if st.recurrent().len() == heads * dim * dim
                && st.conv().len() == 3 * heads * dim * (conv_k - 1) =>
        {
            Ok(st)
        }
        Some(AttnState::Kda(_)) => Err(ModelError::StateMismatch(format!(
            "sequence {i} of the batch carries a KDA state for another number of heads \
             than this rank's {heads}"
        ))),
        _ => Err(ModelError::StateMismatch(format!(
            "sequence {i} of the batch has no KDA state for this layer"
        ))),
    }
}

/// This rank's part of a per-channel tensor (checked by [`check_kda`]).
fn local<'v>(
    pass: &Pass<'_>,
    what: &'static str,
    v: &'v [f32],
    (total, width): (usize, usize),
    split: Split,
) -> Result<&'v [f32], ModelError> {
    pass.dist
        .share_of_slice(v, total, width, split)
        .ok_or(ModelError::Shape {
            layer: None,
            what,
            got: format!("[{}]", v.len()),
            want: format!("[{}] or this rank's share", total * width),
        })
}

/// [`kda_forward`] over the sequences of `pass` (`states[i]` carries `pass.seq(i)`): the
/// projections, norms, gates and `o_proj` run over all rows at once; the short convs and the
/// recurrence run per sequence on its own history, so every row equals its solo result.
///
/// Over ranks (docs/DISTRIBUTED.md#the-seam) this rank runs only its heads
/// ([`Dist::heads`]): their q/k/v/g/β/decay rows, convs, recurrence (its states hold only
/// them), norm and gate; the gated head outputs are all-gathered in head order and `o_proj`
/// is row-dealt. `f_a_proj` (low rank, shared by heads) is row-dealt and gathered.
pub fn kda_forward_batch(
    pass: &Pass<'_>,
    l: usize,
    w: &KdaWeights,
    x: &[f32],
    states: &mut [AttnState<'_>],
    out: &mut [f32],
    sc: &mut KdaScratch,
) -> Result<(), ModelError> {
    let (d, t, dist) = (pass.d, pass.t, &pass.dist);
    check_kda(d, dist, w, Some(l))?;
    pass.check_states(l, states.len())?;
    sc.ensure(d, t);
    let z = BatchSizes::of(pass);
    let split = kda_split(d.kda_heads);
    // 1. projections (one weight pass for all T rows): this rank's heads' rows, kept local;
    //    the low-rank decay code f_a is row-dealt and gathered (every head needs all of it)
    let mut jobs = [
        (&mut sc.q[..z.tpl], &w.q_proj, z.p, split.qkvg),
        (&mut sc.k[..z.tpl], &w.k_proj, z.p, split.qkvg),
        (&mut sc.v[..z.tpl], &w.v_proj, z.p, split.qkvg),
        (&mut sc.g[..z.tpl], &w.g_proj, z.p, split.qkvg),
        (&mut sc.braw[..t * z.hl], &w.b_proj, d.kda_heads, split.b),
    ];
    dist.local_matmuls(&mut jobs, x, t)?;
    dist.matmul(&mut sc.f[..t * z.dd], &w.f_a_proj, x, t)?;
    let mut decay = [(&mut sc.z[..z.tpl], &w.f_b_proj, z.p, split.f_b)];
    dist.local_matmuls(&mut decay, &sc.f[..t * z.dd], t)?;
    // 2. causal short convs with each sequence's carried histories (this rank's channels)
    batch_convs(pass, w, states, sc, &z)?;
    // 3. per-head L2 norm of q and k, q scaled by 1/sqrt(D); 4. beta = σ(b_proj x);
    // 5. per-channel decay (A_log of this rank's heads)
    batch_norms_and_decay(pass, w, sc, &z)?;
    // 6. recurrence per sequence, heads in parallel
    batch_recurrence(pass, states, sc, &z)?;
    // 7. head-wise RMSNorm, 8. sigmoid gate (after the norm), into this rank's `[T][P_r]`
    batch_gated_outputs(pass, w, sc, &z);
    // 9. every rank's heads in head order, then the output projection (rows dealt)
    dist.allgather_cols(&sc.q[..z.tpl], z.p, split.qkvg, &mut sc.o[..t * z.p], t)?;
    dist.matmul(&mut out[..t * d.hidden], &w.o_proj, &sc.o[..t * z.p], t)?;
    Ok(())
}

/// The sizes one batched KDA step works in: `P = H·D` projection width, `k` conv taps, and
/// this rank's `hl` heads (`pl = hl·D` channels) over `t` rows.
struct BatchSizes {
    p: usize,
    dd: usize,
    k: usize,
    hl: usize,
    pl: usize,
    tpl: usize,
    heads: std::ops::Range<usize>,
}

impl BatchSizes {
    fn of(pass: &Pass<'_>) -> BatchSizes {
        let d = pass.d;
        let heads = pass.dist.heads(d.kda_heads);
        let (hl, dd) = (heads.len(), d.kda_dim);
        BatchSizes {
            p: d.kda_proj(),
            dd,
            k: d.conv_k,
            hl,
            pl: hl * dd,
            tpl: pass.t * hl * dd,
            heads,
        }
    }

    fn state_shape(&self) -> (usize, usize, usize) {
        (self.hl, self.dd, self.k)
    }
}

/// Step 2: each sequence's q, k and v short convs on its own carried histories.
fn batch_convs(
    pass: &Pass<'_>,
    w: &KdaWeights,
    states: &mut [AttnState<'_>],
    sc: &mut KdaScratch,
    z: &BatchSizes,
) -> Result<(), ModelError> {
    let split = kda_split(pass.d.kda_heads);
    let taps = |what, v| local(pass, what, v, (z.p, z.k), split.small);
    let (q_conv, k_conv) = (
        taps("kda q_conv1d", w.q_conv)?,
        taps("kda k_conv1d", w.k_conv)?,
    );
    let v_conv = taps("kda v_conv1d", w.v_conv)?;
    let taps = [q_conv, k_conv, v_conv];
    for i in 0..pass.n_seqs() {
        let seq = pass.seq(i);
        let st = kda_state(states, i, z.state_shape())?;
        let tail = st.journal_mut().tail_of(seq.len);
        let cut = seq.start + seq.len - tail;
        let (_, qh, kh, vh) = st.parts_mut();
        conv_rows(sc, seq.start..cut, taps, [qh, kh, vh], z);
        if tail > 0 {
            // tentative tokens: journaled, then run on a copy of the histories
            let r = cut * z.pl..(seq.start + seq.len) * z.pl;
            let raw = [&sc.q[r.clone()], &sc.k[r.clone()], &sc.v[r]];
            st.journal_mut().record_conv_inputs(raw, z.pl);
            let mut copy = std::mem::take(&mut sc.tentative_conv);
            copy.clear();
            copy.extend_from_slice(st.conv());
            let n = copy.len() / 3;
            let (qh, rest) = copy.split_at_mut(n);
            let (kh, vh) = rest.split_at_mut(n);
            conv_rows(sc, cut..seq.start + seq.len, taps, [qh, kh, vh], z);
            sc.tentative_conv = copy;
        }
    }
    Ok(())
}

/// The q, k and v short convs of token rows `tokens` on histories `hist` (`[P][K−1]` each);
/// their channel blocks run in parallel.
fn conv_rows(
    sc: &mut KdaScratch,
    tokens: Range<usize>,
    taps: [&[f32]; 3],
    hist: [&mut [f32]; 3],
    z: &BatchSizes,
) {
    let r = tokens.start * z.pl..tokens.end * z.pl;
    let [qh, kh, vh] = hist;
    let (qc, kc, vc) = (
        &mut sc.qc[r.clone()],
        &mut sc.kc[r.clone()],
        &mut sc.vc[r.clone()],
    );
    let (xq, xk, xv) = (&sc.q[r.clone()], &sc.k[r.clone()], &sc.v[r]);
    let jobs = [
        (qc, xq, taps[0], qh),
        (kc, xk, taps[1], kh),
        (vc, xv, taps[2], vh),
    ];
    conv_tokens(jobs, z.pl, z.k, tokens.len());
}

/// Steps 3–5, tokens in parallel (every norm is one head's own): q and k L2-normed per
/// head (q scaled by 1/sqrt(D)), beta = σ(b), and the per-channel decay.
fn batch_norms_and_decay(
    pass: &Pass<'_>,
    w: &KdaWeights,
    sc: &mut KdaScratch,
    z: &BatchSizes,
) -> Result<(), ModelError> {
    let (d, t, dd, pl, tpl) = (pass.d, pass.t, z.dd, z.pl, z.tpl);
    let q_scale = 1.0 / (dd as f32).sqrt();
    sc.qc[..tpl]
        .par_chunks_mut(pl.max(1))
        .with_max_len(ROWS_PER_JOB)
        .for_each(|row| {
            for head in row.chunks_exact_mut(dd) {
                l2norm_inplace(head, L2_EPS);
                head.iter_mut().for_each(|v| *v *= q_scale);
            }
        });
    sc.kc[..tpl]
        .par_chunks_mut(pl.max(1))
        .with_max_len(ROWS_PER_JOB)
        .for_each(|row| {
            row.chunks_exact_mut(dd)
                .for_each(|head| l2norm_inplace(head, L2_EPS));
        });
    sigmoid_inplace(&mut sc.braw[..t * z.hl]);
    let split = kda_split(d.kda_heads);
    let dt_bias = local(pass, "kda dt_bias", w.dt_bias, (z.p, 1), split.small)?;
    let a_log = &w.a_log[z.heads.clone()];
    sc.alpha[..tpl]
        .par_chunks_mut(pl.max(1))
        .zip(sc.z[..tpl].par_chunks(pl.max(1)))
        .with_max_len(ROWS_PER_JOB)
        .for_each(|(alpha, zr)| kda_decay(alpha, None, zr, a_log, dt_bias, d.gate_lb, dd));
    Ok(())
}

/// Step 6: the recurrence per sequence, heads in parallel; `o_hm` holds each sequence's rows
/// head-major (`[H][len][D]` from row `start·P`).
fn batch_recurrence(
    pass: &Pass<'_>,
    states: &mut [AttnState<'_>],
    sc: &mut KdaScratch,
    z: &BatchSizes,
) -> Result<(), ModelError> {
    for i in 0..pass.n_seqs() {
        let seq = pass.seq(i);
        let (r, rh) = (
            seq.start * z.pl..(seq.start + seq.len) * z.pl,
            seq.start * z.hl..(seq.start + seq.len) * z.hl,
        );
        let inputs = KdaInputs {
            q: &sc.qc[r.clone()],
            k: &sc.kc[r.clone()],
            v: &sc.vc[r.clone()],
            alpha: &sc.alpha[r.clone()],
            beta: &sc.braw[rh],
            t: seq.len,
            heads: z.hl,
            dim: z.dd,
        };
        let st = kda_state(states, i, z.state_shape())?;
        let tail = st.journal_mut().tail_of(seq.len);
        let (o_hm, u) = (&mut sc.o_hm[r], &mut sc.u[..2 * z.pl]);
        if tail == 0 {
            let (s, ..) = st.parts_mut();
            kda_recurrence(s, &inputs, o_hm, u);
            continue;
        }
        st.journal_mut()
            .record_recurrence(&inputs.rows(seq.len - tail..seq.len));
        let mut copy = std::mem::take(&mut sc.tentative_s);
        copy.resize(st.recurrent().len(), 0.0);
        let (s, ..) = st.parts_mut();
        kda_recurrence_tentative(s, &mut copy, &inputs, seq.len - tail, o_hm, u);
        sc.tentative_s = copy;
    }
    Ok(())
}

/// Steps 7–8: each head's output RMS-normed, then gated by σ(g), into `q`'s `[T][P_r]` rows
/// (its projections are consumed by then); tokens in parallel.
fn batch_gated_outputs(pass: &Pass<'_>, w: &KdaWeights, sc: &mut KdaScratch, z: &BatchSizes) {
    let (dd, pl, eps) = (z.dd, z.pl, pass.d.eps);
    let (o_hm, gate) = (&sc.o_hm, &sc.g);
    for i in 0..pass.n_seqs() {
        let seq = pass.seq(i);
        let base = seq.start * pl;
        let mine = &mut sc.q[base..base + seq.len * pl];
        mine.par_chunks_mut(pl.max(1))
            .enumerate()
            .with_max_len(ROWS_PER_JOB)
            .for_each(|(j, row)| {
                let tok = seq.start + j;
                for (head, o) in row.chunks_exact_mut(dd).enumerate() {
                    let src = base + (head * seq.len + j) * dd;
                    o.copy_from_slice(&o_hm[src..src + dd]);
                    rmsnorm_inplace(o, w.o_norm, eps);
                    let g = &gate[tok * pl + head * dd..tok * pl + (head + 1) * dd];
                    mul_sigmoid(o, g);
                }
            });
    }
}
