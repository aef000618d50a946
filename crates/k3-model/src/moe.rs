//! Stable LatentMoE (docs/MODEL.md#stable-latentmoe) for T tokens at once.
//!
//! Every token is routed, the UNION of the chosen experts (first-seen order: token order, then
//! top-k order) is fetched ONCE through [`ExpertProvider::fetch`], and each expert is computed for
//! all its tokens as soon as it arrives, into its own per-(token, slot) buffer. Only after every
//! expert has arrived is each token's aggregate summed in its own top-k order, so the result is
//! bit-identical to running the tokens one by one and independent of arrival order.

use crate::dims::Dims;
use crate::dist::Dist;
use crate::error::{check_len, check_shape, ModelError};
use crate::pass::{Pass, ROWS_PER_JOB};
use crate::router::{route, router_scores_tokens, select_topk, RouteScratch, RouterParams};
use crate::scratch::ops::ExpertScratch;
pub use crate::scratch::ops::MoeScratch;
use crate::share::FFN_SPLIT;
use crate::weights::{ExpertWeights, MoeWeights, SourceError};
use k3_kernels::act::situ_glu;
use k3_kernels::norm::rmsnorm_inplace;
use k3_kernels::{matmul, Matrix};
use rayon::prelude::*;

/// Checks the trunk part of a MoE layer against the config: a dealt tensor may be whole or
/// exactly this rank's share of rows (crate::share::FFN_SPLIT).
pub fn check_moe(
    d: &Dims,
    dist: &Dist<'_>,
    w: &MoeWeights,
    layer: Option<usize>,
) -> Result<(), ModelError> {
    let (e, l, si) = (d.hidden, d.latent, d.shared_inter);
    let m = |x: &Matrix| (x.rows, x.cols);
    check_shape(layer, "moe gate", m(&w.router), (d.n_experts, e))?;
    check_len(
        layer,
        "moe e_score_correction_bias",
        w.router_bias.len(),
        d.n_experts,
    )?;
    let c = |what, x: &Matrix, want| dist.check_dealt(layer, what, x, want, FFN_SPLIT);
    c("moe routed_expert_down_proj", &w.down_proj, (l, e))?;
    check_len(layer, "moe routed_expert_norm", w.latent_norm.len(), l)?;
    c("moe routed_expert_up_proj", &w.up_proj, (e, l))?;
    c("moe shared gate_proj", &w.shared_gate, (si, e))?;
    c("moe shared up_proj", &w.shared_up, (si, e))?;
    c("moe shared down_proj", &w.shared_down, (e, si))
}

/// Checks one routed expert against the config.
pub fn check_expert(d: &Dims, w: &ExpertWeights, layer: Option<usize>) -> Result<(), ModelError> {
    let (l, i) = (d.latent, d.moe_inter);
    check_shape(layer, "expert w1", (w.w1.rows, w.w1.cols), (i, l))?;
    check_shape(layer, "expert w3", (w.w3.rows, w.w3.cols), (i, l))?;
    check_shape(layer, "expert w2", (w.w2.rows, w.w2.cols), (l, i))
}

fn expert_err(layer: usize, expert: u32, msg: String) -> ModelError {
    let source: SourceError = msg.into();
    ModelError::Expert {
        layer,
        expert,
        source,
    }
}

/// One MoE layer `l` over `pass.t` tokens: `x` normed input `[T][E]`, `out` receives `[T][E]`.
/// The lookahead hook in `pass` (if any) is called once; the result does not depend on it.
pub fn moe_forward(
    pass: &Pass<'_>,
    l: usize,
    w: &MoeWeights,
    x: &[f32],
    out: &mut [f32],
    sc: &mut MoeScratch,
) -> Result<(), ModelError> {
    let (d, t, layer) = (pass.d, pass.t, l);
    check_moe(d, &pass.dist, w, Some(layer))?;
    sc.ensure(d, t);
    let (e, k, lat, si) = (d.hidden, d.topk, d.latent, d.shared_inter);
    // 1. route every token on the full normed input
    let rp = RouterParams {
        topk: k,
        renorm: d.renorm,
        scale: d.routed_scale,
    };
    let unsupported = || ModelError::ConfigUnsupported(format!("layer {layer}: MXFP4 router gate"));
    if t > 1 {
        // a prefill: every token's scores at once (each score the bits of routing alone)
        let ne = d.n_experts;
        let mut scores = vec![0f32; t * ne];
        if !router_scores_tokens(&mut scores, &w.router, x, t) {
            return Err(unsupported());
        }
        for (tok, s) in scores.chunks_exact(ne).enumerate() {
            let (idx, wts) = (
                &mut sc.idx[tok * k..(tok + 1) * k],
                &mut sc.wts[tok * k..(tok + 1) * k],
            );
            select_topk(s, w.router_bias, &rp, &mut sc.taken, idx, wts);
        }
    } else {
        // one token (decode): experts in parallel inside `route`
        let ok = route(
            &x[..e],
            &w.router,
            w.router_bias,
            &rp,
            RouteScratch {
                scores: &mut sc.scores[..d.n_experts],
                taken: &mut sc.taken,
            },
            &mut sc.idx[..k],
            &mut sc.wts[..k],
        );
        if !ok {
            return Err(unsupported());
        }
    }
    // 2. latent down-projection
    //    with the shared expert's gate and up (same input; one all-gather over ranks)
    let mut jobs = [
        (&mut sc.z[..t * lat], &w.down_proj),
        (&mut sc.sg[..t * si], &w.shared_gate),
        (&mut sc.su[..t * si], &w.shared_up),
    ];
    pass.dist.matmuls(&mut jobs, x, t)?;
    // 3. experts: union fetched once, each computed for all its tokens as it arrives
    run_experts(pass, layer, x, sc)?;
    if pass.experts.drops_missing() {
        drop_undelivered(d, t, sc);
    }
    // 4. aggregate in each token's top-k order, then RMSNorm on the aggregate
    //    (tokens in parallel: each token's sum is its own, in its own order)
    let (wts, ybuf) = (&sc.wts, &sc.ybuf);
    sc.acc[..t * lat]
        .par_chunks_mut(lat)
        .enumerate()
        .with_max_len(ROWS_PER_JOB)
        .for_each(|(tok, acc)| {
            acc.fill(0.0);
            for j in 0..k {
                let wj = wts[tok * k + j];
                let y = &ybuf[(tok * k + j) * lat..(tok * k + j + 1) * lat];
                acc.iter_mut().zip(y).for_each(|(a, &y)| *a += wj * y);
            }
            if d.latent_norm {
                rmsnorm_inplace(acc, w.latent_norm, d.eps);
            }
        });
    // 5. up-projection, 6. shared experts (gate and up of the ORIGINAL input, step 2), unweighted
    let out = &mut out[..t * e];
    let dist = pass.dist;
    dist.matmul(out, &w.up_proj, &sc.acc[..t * lat], t)?;
    situ_glu(
        &mut sc.sa[..t * si],
        &sc.sg[..t * si],
        &sc.su[..t * si],
        d.situ_b1,
        d.situ_b2,
    );
    dist.matmul(&mut sc.sd[..t * e], &w.shared_down, &sc.sa[..t * si], t)?;
    out.par_chunks_mut(e)
        .zip(sc.sd[..t * e].par_chunks(e))
        .with_max_len(ROWS_PER_JOB)
        .for_each(|(o, sd)| o.iter_mut().zip(sd).for_each(|(o, &s)| *o += s));
    Ok(())
}

/// Fetches the union of the routed experts once and fills `ybuf[t][j]` for every slot; calls
/// the lookahead hook (for layer + 1) at the first delivered expert, after this layer's reads.
fn run_experts(
    pass: &Pass<'_>,
    layer: usize,
    x: &[f32],
    sc: &mut MoeScratch,
) -> Result<(), ModelError> {
    let (d, t, k) = (pass.d, pass.t, pass.d.topk);
    let mut ahead = pass.ahead.filter(|_| layer + 1 < d.n_layers);
    sc.union.clear();
    for &ex in &sc.idx[..t * k] {
        // each rank fetches and runs only the experts it owns (docs/DISTRIBUTED.md#the-seam)
        if !sc.union.contains(&ex) && pass.dist.owns_expert(ex) {
            sc.union.push(ex);
        }
    }
    sc.filled[..t * k].fill(false);
    let mut failure: Option<ModelError> = None;
    let MoeScratch {
        idx,
        z,
        ybuf,
        filled,
        union,
        users,
        one,
        ..
    } = sc;
    let mut on_ready = |i: usize, ew: &ExpertWeights<'_>| {
        if let Some(hook) = ahead.take() {
            hook(layer + 1, x);
        }
        if failure.is_some() {
            return;
        }
        let Some(&ex) = union.get(i) else {
            failure = Some(expert_err(
                layer,
                u32::MAX,
                format!("store delivered unknown index {i}"),
            ));
            return;
        };
        if let Err(err) = check_expert(d, ew, Some(layer)) {
            failure = Some(err);
            return;
        }
        users.clear();
        users.extend((0..t * k).filter(|&s| idx[s] == ex));
        compute_expert(d, ew, users, z, ybuf, one);
        users.iter().for_each(|&s| filled[s] = true);
    };
    if let Err(fe) = pass.experts.fetch(layer, union, &mut on_ready) {
        return Err(ModelError::Expert {
            layer,
            expert: fe.expert,
            source: fe.source,
        });
    }
    if let Some(err) = failure {
        return Err(err);
    }
    if pass.dist.is_split() {
        gather_slots(pass, sc)?;
    }
    let MoeScratch { idx, filled, .. } = sc;
    if let Some(s) = (0..t * k).find(|&s| !filled[s] && !pass.experts.drops_missing()) {
        return Err(expert_err(
            layer,
            idx[s],
            "the store never delivered this expert".into(),
        ));
    }
    Ok(())
}

/// Cache-only experts (a draft model): every slot the store did not deliver gets weight 0
/// and a zero output, and the token's delivered weights are scaled by `Σ all / Σ delivered`
/// (f64, then rounded once), so they keep the sum the full top-k had. A token with no
/// delivered expert gets a zero aggregate.
fn drop_undelivered(d: &Dims, t: usize, sc: &mut MoeScratch) {
    let (k, lat) = (d.topk, d.latent);
    for tok in 0..t {
        let slots = tok * k..(tok + 1) * k;
        let all: f64 = sc.wts[slots.clone()].iter().map(|&w| w as f64).sum();
        let kept: f64 = slots
            .clone()
            .filter(|&s| sc.filled[s])
            .map(|s| sc.wts[s] as f64)
            .sum();
        let factor = if kept > 0.0 { all / kept } else { 0.0 };
        for s in slots {
            if sc.filled[s] {
                sc.wts[s] = (sc.wts[s] as f64 * factor) as f32;
            } else {
                sc.wts[s] = 0.0;
                sc.ybuf[s * lat..(s + 1) * lat].fill(0.0);
            }
        }
    }
}

/// `y = w2 · SiTU-GLU(w1 z, w3 z)` for the tokens of `slots` (`t·K + j`), scattered into `ybuf`.
fn compute_expert(
    d: &Dims,
    ew: &ExpertWeights,
    slots: &[usize],
    z: &[f32],
    ybuf: &mut [f32],
    sc: &mut ExpertScratch,
) {
    let ExpertScratch { gz, gg, gu, ga, gy } = sc;
    let (k, l, i, n) = (d.topk, d.latent, d.moe_inter, slots.len());
    gz[..n * l]
        .par_chunks_mut(l)
        .zip(slots)
        .for_each(|(row, &s)| row.copy_from_slice(&z[s / k * l..(s / k + 1) * l]));
    matmul(&mut gg[..n * i], &ew.w1, &gz[..n * l], n);
    matmul(&mut gu[..n * i], &ew.w3, &gz[..n * l], n);
    situ_glu(
        &mut ga[..n * i],
        &gg[..n * i],
        &gu[..n * i],
        d.situ_b1,
        d.situ_b2,
    );
    matmul(&mut gy[..n * l], &ew.w2, &ga[..n * i], n);
    for (r, &s) in slots.iter().enumerate() {
        ybuf[s * l..(s + 1) * l].copy_from_slice(&gy[r * l..(r + 1) * l]);
    }
}

/// All-gathers every slot's expert output from the rank owning its expert: rank `q` sends,
/// for each of its slots in slot order, a delivered flag and the `[L]` row; every rank then
/// holds every slot exactly as one process computes it.
fn gather_slots(pass: &Pass<'_>, sc: &mut MoeScratch) -> Result<(), ModelError> {
    let (d, t) = (pass.d, pass.t);
    let (k, lat, dist) = (d.topk, d.latent, pass.dist);
    let n = dist.comm.size();
    let slots = 0..t * k;
    let owner = |s: usize| dist.expert_owner(sc.idx[s]);
    let mut counts = vec![0usize; n];
    slots.clone().for_each(|s| counts[owner(s)] += lat + 1);
    let me = dist.comm.rank();
    let mut mine = Vec::with_capacity(counts[me]);
    for s in slots.clone().filter(|&s| owner(s) == me) {
        mine.push(if sc.filled[s] { 1.0 } else { 0.0 });
        mine.extend_from_slice(&sc.ybuf[s * lat..(s + 1) * lat]);
    }
    let mut all = vec![0f32; counts.iter().sum()];
    dist.comm.allgather_f32(&mine, &counts, &mut all)?;
    let mut offset: Vec<usize> = counts
        .iter()
        .scan(0, |acc, &c| {
            let start = *acc;
            *acc += c;
            Some(start)
        })
        .collect();
    for s in slots {
        let q = owner(s);
        let part = &all[offset[q]..offset[q] + lat + 1];
        sc.filled[s] = part[0] != 0.0;
        sc.ybuf[s * lat..(s + 1) * lat].copy_from_slice(&part[1..]);
        offset[q] += lat + 1;
    }
    Ok(())
}
