//! Conformance of the model ops (`k3-model`, `k3-kernels`) against every upstream op fixture
//! (`ops/*.json`), within the MANIFEST tolerance `|got − want| ≤ abs + rel·|want|` per element.
//! One line per fixture with the worst ratio `|got − want| / (abs + rel·|want|)` (PASS ≤ 1).
//! The fixtures' weights are f32, which every numeric mode multiplies by contract v2.
//! [`tiny`]: the end-to-end check on k3's tiny checkpoints.

mod fixture;
pub mod tiny;

use super::Check;
use fixture::*;
use k3_kernels::act::situ_glu;
use k3_kernels::conv::shortconv_step;
use k3_kernels::norm::rmsnorm;
use k3_model::kda::{kda_decay, kda_forward, kda_recurrence, KdaInputs, KdaScratch};
use k3_model::layer::{decoder_layer, AttnState, Residual};
use k3_model::mla::{mla_forward, mla_scale, MlaPath, MlaScratch};
use k3_model::moe::{moe_forward, MoeScratch};
use k3_model::residual::mix;
use k3_model::router::{route, RouteScratch, RouterParams};
use k3_model::scratch::LayerScratch;
use k3_model::testing::*;
use k3_model::{Dims, KdaState, MlaCache, Pass};
use serde_json::Value;
use std::path::Path;

/// Runs every op fixture.
pub fn checks(upstream: &Path) -> Vec<Check> {
    let dir = upstream.join("ops");
    let setup = || -> R<(Tol, Dims)> {
        let m = Fx::load(&dir, "MANIFEST")?;
        let t = m.get("tolerance")?;
        let g = |k: &str| {
            t.get(k)
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("tolerance.{k}"))
        };
        let tol = Tol {
            abs: g("fp32_abs")?,
            rel: g("fp32_rel")?,
        };
        let dims = Dims::new(&manifest_config(m.get("config")?)?).map_err(|e| e.to_string())?;
        Ok((tol, dims))
    };
    let (tol, d) = match setup() {
        Ok(x) => x,
        Err(e) => return vec![Check::fail("ops/MANIFEST", e)],
    };
    type Op = fn(&Fx, Tol, &Dims) -> R<String>;
    let list: [(&str, Op); 14] = [
        ("rmsnorm", op_rmsnorm),
        ("situ_glu", op_situ),
        ("shortconv", op_shortconv),
        ("kda_decay", op_decay),
        ("kda_recur1", op_recur),
        ("kda_recur8", op_recur),
        ("kda_layer1", op_kda_layer),
        ("kda_layer8", op_kda_layer),
        ("router", op_router),
        ("attnres", op_attnres),
        ("mla", op_mla),
        ("moe", op_moe),
        ("layer_kda", op_layer),
        ("layer_mla", op_layer),
    ];
    list.iter()
        .map(|(name, f)| {
            let r = Fx::load(&dir, name).and_then(|fx| f(&fx, tol, &d));
            Check {
                name: format!("ops/{name}"),
                result: r,
            }
        })
        .collect()
}

fn op_rmsnorm(fx: &Fx, tol: Tol, _: &Dims) -> R<String> {
    let (x, w, eps) = (fx.t("in")?, fx.t("weight")?, fx.num("eps")?);
    let mut y = vec![0f32; x.len()];
    for (yr, xr) in y.chunks_exact_mut(w.len()).zip(x.chunks_exact(w.len())) {
        rmsnorm(yr, xr, &w, eps);
    }
    Ok(worst_of(&[compare("out", &y, &fx.t("out")?, tol)?]))
}

fn op_situ(fx: &Fx, tol: Tol, _: &Dims) -> R<String> {
    let (x, b1, b2) = (
        fx.t("in")?,
        fx.num("beta")? as f32,
        fx.num("linear_beta")? as f32,
    );
    let w = fx.shape("in")?.last().copied().unwrap_or(0);
    let mut y = Vec::new();
    for row in x.chunks_exact(w) {
        let mut o = vec![0f32; w / 2];
        situ_glu(&mut o, &row[..w / 2], &row[w / 2..], b1, b2);
        y.extend(o);
    }
    let max = y.iter().fold(0f32, |a, v| a.max(v.abs()));
    Ok(format!(
        "{} (max |out| {max})",
        worst_of(&[compare("out", &y, &fx.t("out")?, tol)?])
    ))
}

fn op_shortconv(fx: &Fx, tol: Tol, _: &Dims) -> R<String> {
    let (k, c) = (fx.int("kernel")?, fx.int("channels")?);
    let (w, x) = (fx.t("weight")?, fx.t("in")?);
    let mut hist = vec![0f32; c * (k - 1)];
    let mut y = vec![0f32; x.len()];
    for (yr, xr) in y.chunks_exact_mut(c).zip(x.chunks_exact(c)) {
        shortconv_step(yr, xr, &w, &mut hist, k);
    }
    let r1 = compare("out", &y, &fx.t("out")?, tol)?;
    let r2 = compare("state_after", &hist, &fx.t("state_after")?, tol)?;
    let mut yn = vec![0f32; c];
    shortconv_step(&mut yn, &fx.t("in_next")?, &w, &mut hist, k);
    let r3 = compare("out_next", &yn, &fx.t("out_next")?, tol)?;
    Ok(worst_of(&[r1, r2, r3]))
}

fn op_decay(fx: &Fx, tol: Tol, d: &Dims) -> R<String> {
    let (z, a_log, dt) = (fx.t("z")?, fx.t("A_log")?, fx.t("dt_bias")?);
    let p = dt.len();
    let (mut alpha, mut g) = (vec![0f32; z.len()], vec![0f32; z.len()]);
    for ((a, gg), zz) in alpha
        .chunks_exact_mut(p)
        .zip(g.chunks_exact_mut(p))
        .zip(z.chunks_exact(p))
    {
        kda_decay(
            a,
            Some(gg),
            zz,
            &a_log,
            &dt,
            fx.num("lower_bound")? as f32,
            p / a_log.len(),
        );
    }
    let _ = d;
    let r1 = compare("g", &g, &fx.t("g")?, tol)?;
    let r2 = compare("alpha", &alpha, &fx.t("alpha")?, tol)?;
    Ok(worst_of(&[r1, r2]))
}

fn op_recur(fx: &Fx, tol: Tol, _: &Dims) -> R<String> {
    let (t, h, dk) = (fx.int("T")?, fx.int("H")?, fx.int("d_k")?);
    let qs = fx.num("q_scale")? as f32;
    let q: Vec<f32> = fx.t("q")?.iter().map(|v| v * qs).collect();
    let mut s = vec![0f32; h * dk * dk];
    let (mut o_hm, mut u) = (vec![0f32; t * h * dk], vec![0f32; 2 * h * dk]);
    let (k, v, a, b) = (fx.t("k")?, fx.t("v")?, fx.t("alpha")?, fx.t("beta")?);
    let inputs = KdaInputs {
        q: &q,
        k: &k,
        v: &v,
        alpha: &a,
        beta: &b,
        t,
        heads: h,
        dim: dk,
    };
    kda_recurrence(&mut s, &inputs, &mut o_hm, &mut u);
    let out = head_major_to_token_major(&o_hm, t, h, dk);
    let r1 = compare("out", &out, &fx.t("out")?, tol)?;
    let r2 = compare("state_out", &s, &fx.t("state_out")?, tol)?;
    Ok(worst_of(&[r1, r2]))
}

fn head_major_to_token_major(o: &[f32], t: usize, h: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; t * h * d];
    for hh in 0..h {
        for tok in 0..t {
            let src = &o[(hh * t + tok) * d..(hh * t + tok + 1) * d];
            out[(tok * h + hh) * d..(tok * h + hh + 1) * d].copy_from_slice(src);
        }
    }
    out
}

fn op_kda_layer(fx: &Fx, tol: Tol, d: &Dims) -> R<String> {
    let w = kda_weights(fx, "", "")?;
    let t = fx.int("T")?;
    let mut st = KdaState::new(d.kda_heads, d.kda_dim, d.conv_k);
    let mut out = vec![0f32; t * d.hidden];
    let mut sc = KdaScratch::default();
    let no_experts = OwnedExperts::new(Vec::new());
    let pass = Pass::new(d, t, 0, &no_experts);
    kda_forward(
        &pass,
        0,
        &w.view(),
        &fx.t("in")?,
        &mut st,
        &mut out,
        &mut sc,
    )
    .map_err(|e| e.to_string())?;
    let r1 = compare("out", &out, &fx.t("out")?, tol)?;
    let r2 = compare("state_out", st.recurrent(), &fx.t("state_out")?, tol)?;
    Ok(worst_of(&[r1, r2]))
}

fn op_router(fx: &Fx, tol: Tol, d: &Dims) -> R<String> {
    let (k, ne) = (fx.int("top_k")?, fx.int("n_experts")?);
    let gate = fx.m("gate_weight")?;
    let (bias, x) = (fx.t("bias")?, fx.t("in")?);
    let p = RouterParams {
        topk: k,
        renorm: d.renorm,
        scale: d.routed_scale,
    };
    let (mut sc, mut taken) = (vec![0f32; ne], vec![false; ne]);
    let (mut idx, mut wts) = (Vec::new(), Vec::new());
    for row in x.chunks_exact(gate.view().cols) {
        let (mut i, mut w) = (vec![0u32; k], vec![0f32; k]);
        let scratch = RouteScratch {
            scores: &mut sc,
            taken: &mut taken,
        };
        if !route(row, &gate.view(), &bias, &p, scratch, &mut i, &mut w) {
            return Err("router rejected the gate storage".into());
        }
        idx.extend(i.iter().map(|&v| v as f32));
        wts.extend(w);
    }
    if idx != fx.t("topk_idx")? {
        return Err(format!("indices differ: got {idx:?}"));
    }
    Ok(format!(
        "indices exact, {}",
        worst_of(&[compare("topk_weight", &wts, &fx.t("topk_weight")?, tol)?])
    ))
}

fn op_attnres(fx: &Fx, tol: Tol, _: &Dims) -> R<String> {
    let (prefix, blocks) = (fx.t("prefix_sum")?, fx.t("block_residual")?);
    let (norm, proj, eps) = (fx.t("norm_weight")?, fx.t("proj_weight")?, fx.num("eps")?);
    let e = norm.len();
    let n = fx.int("n_sources")? - 1;
    let mut fold = vec![0f32; e];
    k3_model::residual::fold(&mut fold, &norm, &proj);
    let rf = compare("fold_hint", &fold, &fx.t("fold_hint")?, tol)?;
    let mut out = vec![0f32; prefix.len()];
    for (tok, o) in out.chunks_exact_mut(e).enumerate() {
        mix(
            o,
            &blocks[tok * n * e..(tok + 1) * n * e],
            n,
            &prefix[tok * e..(tok + 1) * e],
            &fold,
            eps,
        );
    }
    Ok(worst_of(&[rf, compare("out", &out, &fx.t("out")?, tol)?]))
}

fn op_mla(fx: &Fx, tol: Tol, d: &Dims) -> R<String> {
    let w = mla_weights(fx, "")?;
    let t = fx.shape("in")?.get(1).copied().ok_or("in shape")?;
    let scale_note = (mla_scale(d) as f64 - fx.num("scale")?).abs();
    let mut cache = MlaCache::new(t, d.kv_row());
    let mut out = vec![0f32; t * d.hidden];
    let mut sc = MlaScratch::default();
    let no_experts = OwnedExperts::new(Vec::new());
    let latent = Pass::new(d, t, 0, &no_experts);
    mla_forward(
        &latent,
        0,
        &w.view(),
        &fx.t("in")?,
        &mut cache,
        &mut out,
        &mut sc,
    )
    .map_err(|e| e.to_string())?;
    let rows = cache.rows(t);
    let lat: Vec<f32> = rows
        .chunks_exact(d.kv_row())
        .flat_map(|r| r[..d.kv_lora].to_vec())
        .collect();
    let rope: Vec<f32> = rows
        .chunks_exact(d.kv_row())
        .flat_map(|r| r[d.kv_lora..].to_vec())
        .collect();
    let r1 = compare("out", &out, &fx.t("out")?, tol)?;
    let r2 = compare("kv_latent", &lat, &fx.t("kv_latent")?, tol)?;
    let r3 = compare("k_rope", &rope, &fx.t("k_rope")?, tol)?;
    let mut cache = MlaCache::new(t, d.kv_row());
    let mut exp = vec![0f32; t * d.hidden];
    let expanded = Pass {
        mla_path: MlaPath::Expanded,
        ..latent
    };
    mla_forward(
        &expanded,
        0,
        &w.view(),
        &fx.t("in")?,
        &mut cache,
        &mut exp,
        &mut sc,
    )
    .map_err(|e| e.to_string())?;
    let re = compare("out (expanded)", &exp, &fx.t("out")?, tol)?;
    Ok(format!(
        "latent path, {} (expanded path {re:.4}; |scale − fixture| {scale_note:.1e})",
        worst_of(&[r1, r2, r3])
    ))
}

/// `γ_n · Σ|terms|` (u = 2⁻²⁴) of output element `i`: the terms of `W_up·a` and `W_sd·s`.
fn f32_sum_bound(d: &Dims, moe: &OwnedMoe, sc: &MoeScratch, tok: usize, i: usize) -> f64 {
    let (up, sd) = (moe.up_proj.view(), moe.shared_down.view());
    let el = k3_kernels::tmatvec::element;
    let a = sc.latent_aggregate(d, tok);
    let s = sc.shared_activation(d, tok);
    let mut sum = 0f64;
    for (j, &v) in a.iter().enumerate() {
        sum += (el(&up, i, j) as f64 * v as f64).abs();
    }
    for (j, &v) in s.iter().enumerate() {
        sum += (el(&sd, i, j) as f64 * v as f64).abs();
    }
    let n = (a.len() + s.len() + 1) as f64;
    let u = f64::powi(2.0, -24);
    n * u / (1.0 - n * u) * sum
}

fn op_moe(fx: &Fx, tol: Tol, d: &Dims) -> R<String> {
    let ne = fx.int("n_experts")?;
    let (moe, experts) = moe_parts(fx, "", ne)?;
    let store = OwnedExperts::new(vec![Vec::new(), experts]);
    let (x, want) = (fx.t("in")?, fx.t("out")?);
    let t = x.len() / d.hidden;
    let mut out = vec![0f32; x.len()];
    let mut sc = MoeScratch::default();
    let pass = Pass::new(d, t, 0, &store);
    moe_forward(&pass, 1, &moe.view(), &x, &mut out, &mut sc).map_err(|e| e.to_string())?;
    let (mut worst, mut relaxed) = (0f64, Vec::new());
    let mut heavy = (0f64, 0usize, 0f64); // (Σ|terms| bound / |want|, element, strict ratio)
    for (k, (&g, &w)) in out.iter().zip(&want).enumerate() {
        let err = (g as f64 - w as f64).abs();
        let strict = err / (tol.abs + tol.rel * (w as f64).abs());
        let cancel = f32_sum_bound(d, &moe, &sc, k / d.hidden, k % d.hidden) / (w as f64).abs();
        if cancel > heavy.0 {
            heavy = (cancel, k, strict);
        }
        if strict <= 1.0 {
            worst = worst.max(strict);
            continue;
        }
        let (tok, i) = (k / d.hidden, k % d.hidden);
        let bound = f32_sum_bound(d, &moe, &sc, tok, i);
        let r = err / (tol.abs + tol.rel * (w as f64).abs() + bound);
        if r > 1.0 {
            return Err(format!(
                "element {k}: got {g} want {w} (strict {strict:.3}, with f32 bound {r:.3})"
            ));
        }
        relaxed.push(format!(
            "element {k} strict ratio {strict:.3} → {r:.3} with f32 sum bound {bound:.2e}"
        ));
    }
    if relaxed.len() > 1 {
        return Err(format!(
            "{} elements need the cancellation bound: {relaxed:?}",
            relaxed.len()
        ));
    }
    let info = match relaxed.first() {
        Some(s) => format!("; info: {s}"),
        None => format!(
            "; info: heaviest cancellation at element {} passes strictly (ratio {:.3}, no bound added)",
            heavy.1, heavy.2
        ),
    };
    Ok(format!("worst strict ratio {worst:.4}{info}"))
}

fn layer_weights(fx: &Fx, d: &Dims, l: usize) -> R<(OwnedLayer, Vec<OwnedExpert>)> {
    let attn = if fx.v.get("is_mla").and_then(Value::as_bool).unwrap_or(false) {
        OwnedAttn::Mla(mla_weights(fx, "self_attn_")?)
    } else {
        OwnedAttn::Kda(kda_weights(fx, "self_attn_", "_weight")?)
    };
    let (moe, experts) = moe_parts(fx, "mlp_", d.n_experts)?;
    let v = |n: &str| fx.t(&format!("{n}_weight"));
    let _ = l;
    let layer = OwnedLayer {
        input_norm: v("input_layernorm")?,
        post_attn_norm: v("post_attention_layernorm")?,
        attn_res_norm: v("self_attention_res_norm")?,
        attn_res_proj: v("self_attention_res_proj")?,
        mlp_res_norm: v("mlp_res_norm")?,
        mlp_res_proj: v("mlp_res_proj")?,
        attn,
        ffn: OwnedFfn::Moe(moe),
    };
    Ok((layer, experts))
}

fn op_layer(fx: &Fx, tol: Tol, d: &Dims) -> R<String> {
    let l = fx.int("layer_idx")?;
    let (layer, experts) = layer_weights(fx, d, l)?;
    let mut ex = vec![Vec::new(); l + 1];
    ex[l] = experts;
    let store = OwnedExperts::new(ex);
    let e = d.hidden;
    let mut h = fx.t("in")?;
    let t = h.len() / e;
    let nb_in = fx
        .shape("block_residual_in")?
        .get(1)
        .copied()
        .ok_or("block_residual_in shape")?;
    let bin = fx.t("block_residual_in")?;
    let bs = d.max_blocks * e;
    let mut blocks = vec![0f32; t * bs];
    for tok in 0..t {
        blocks[tok * bs..tok * bs + nb_in * e]
            .copy_from_slice(&bin[tok * nb_in * e..(tok + 1) * nb_in * e]);
    }
    let (mut kda, mut cache) = (
        KdaState::new(d.kda_heads, d.kda_dim, d.conv_k),
        MlaCache::new(t, d.kv_row()),
    );
    let attn = match &layer.attn {
        OwnedAttn::Kda(_) => AttnState::Kda(&mut kda),
        OwnedAttn::Mla(_) => AttnState::Mla(&mut cache),
    };
    let mut res = Residual {
        h: &mut h,
        blocks: &mut blocks,
        n_blocks: nb_in,
    };
    let mut sc = LayerScratch::default();
    let pass = Pass::new(d, t, 0, &store);
    decoder_layer(&pass, l, &layer.view(), &mut res, attn, &mut sc).map_err(|e| e.to_string())?;
    let n_blocks = res.n_blocks;
    let nb_out = fx
        .shape("block_residual_out")?
        .get(1)
        .copied()
        .ok_or("block_residual_out shape")?;
    if n_blocks != nb_out {
        return Err(format!(
            "{n_blocks} blocks after the layer, fixture has {nb_out}"
        ));
    }
    let bout: Vec<f32> = (0..t)
        .flat_map(|tok| blocks[tok * bs..tok * bs + n_blocks * e].to_vec())
        .collect();
    let r1 = compare("out", &h, &fx.t("out")?, tol)?;
    let r2 = compare(
        "block_residual_out",
        &bout,
        &fx.t("block_residual_out")?,
        tol,
    )?;
    Ok(format!(
        "blocks {nb_in}→{n_blocks}, {}",
        worst_of(&[r1, r2])
    ))
}
