//! Fixture documents (`{shape, data}` tensors), the MANIFEST tolerance and config, and
//! builders of owned weights from fixture tensor names.

use k3_format::{ConfigShape, K3Config};
use k3_model::testing::*;
use serde_json::Value;
use std::path::Path;

pub type R<T> = Result<T, String>;

/// Per-element tolerance from MANIFEST.json.
#[derive(Clone, Copy)]
pub struct Tol {
    pub abs: f64,
    pub rel: f64,
}

/// One fixture document.
pub struct Fx {
    pub v: Value,
}

impl Fx {
    pub fn load(dir: &Path, name: &str) -> R<Fx> {
        let p = dir.join(format!("{name}.json"));
        let s = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(Fx {
            v: serde_json::from_str(&s).map_err(|e| format!("{}: {e}", p.display()))?,
        })
    }
    pub fn get(&self, k: &str) -> R<&Value> {
        self.v.get(k).ok_or_else(|| format!("missing key {k}"))
    }
    pub fn num(&self, k: &str) -> R<f64> {
        self.get(k)?
            .as_f64()
            .ok_or_else(|| format!("{k} is not a number"))
    }
    pub fn int(&self, k: &str) -> R<usize> {
        Ok(self.num(k)? as usize)
    }
    pub fn t(&self, k: &str) -> R<Vec<f32>> {
        let d = self
            .get(k)?
            .get("data")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{k}.data"))?;
        d.iter()
            .map(|x| {
                x.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| format!("{k}: non-number"))
            })
            .collect()
    }
    pub fn shape(&self, k: &str) -> R<Vec<usize>> {
        let s = self
            .get(k)?
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{k}.shape"))?;
        Ok(s.iter()
            .filter_map(Value::as_u64)
            .map(|x| x as usize)
            .collect())
    }
    /// An f32 matrix; 1-row tensors such as `[1, E]` are fine.
    pub fn m(&self, k: &str) -> R<OwnedMatrix> {
        let s = self.shape(k)?;
        let (rows, cols) = match s.as_slice() {
            [r, c] => (*r, *c),
            [r, 1, c] => (*r, *c),
            _ => return Err(format!("{k}: unexpected shape {s:?}")),
        };
        Ok(OwnedMatrix::f32(rows, cols, self.t(k)?))
    }
}

/// Worst ratio of `got` vs `want`; `Err` when any element is outside the tolerance.
pub fn compare(what: &str, got: &[f32], want: &[f32], tol: Tol) -> R<f64> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} values, fixture has {}",
            got.len(),
            want.len()
        ));
    }
    let mut worst = (0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let r = (g as f64 - w as f64).abs() / (tol.abs + tol.rel * (w as f64).abs());
        if r.is_nan() || r > worst.0 {
            worst = (r, i);
        }
    }
    if worst.0 <= 1.0 {
        Ok(worst.0)
    } else {
        let i = worst.1;
        Err(format!(
            "{what}: element {i} got {} want {} (ratio {:.3})",
            got[i], want[i], worst.0
        ))
    }
}

pub fn worst_of(parts: &[f64]) -> String {
    format!(
        "worst ratio {:.4}",
        parts.iter().fold(0f64, |a, &b| a.max(b))
    )
}

/// The fixture model's config (MANIFEST `config`, flat names).
pub fn manifest_config(c: &Value) -> R<K3Config> {
    let n = |k: &str| {
        c.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("MANIFEST config.{k}"))
    };
    let u = |k: &str| n(k).map(|x| x as usize);
    let b = |k: &str| c.get(k).and_then(Value::as_bool).unwrap_or(true);
    let full = c
        .get("full_attn_layers")
        .and_then(Value::as_array)
        .ok_or("MANIFEST full_attn_layers")?;
    Ok(K3Config {
        hidden_size: u("hidden_size")?,
        num_hidden_layers: u("num_hidden_layers")?,
        vocab_size: u("vocab_size")?,
        rms_norm_eps: n("rms_norm_eps")?,
        kda_num_heads: u("kda_num_heads")?,
        kda_head_dim: u("kda_head_dim")?,
        short_conv_kernel_size: u("short_conv_kernel_size")?,
        gate_lower_bound: n("gate_lower_bound")? as f32,
        num_attention_heads: u("num_attention_heads")?,
        q_lora_rank: u("q_lora_rank")?,
        kv_lora_rank: u("kv_lora_rank")?,
        qk_nope_head_dim: u("qk_nope_head_dim")?,
        qk_rope_head_dim: u("qk_rope_head_dim")?,
        v_head_dim: u("v_head_dim")?,
        mla_use_output_gate: b("mla_use_output_gate"),
        num_experts: u("num_experts")?,
        num_experts_per_token: u("num_experts_per_token")?,
        num_shared_experts: u("num_shared_experts")?,
        routed_expert_hidden_size: u("routed_expert_hidden_size")?,
        moe_intermediate_size: u("moe_intermediate_size")?,
        routed_scaling_factor: n("routed_scaling_factor")? as f32,
        moe_renormalize: b("moe_renormalize"),
        latent_moe_use_norm: b("latent_moe_use_norm"),
        first_k_dense_replace: u("first_k_dense_replace")?,
        intermediate_size: u("intermediate_size")?,
        attn_res_block_size: u("attn_res_block_size")?,
        activation_situ_beta: n("situ_beta")? as f32,
        activation_situ_linear_beta: n("situ_linear_beta")? as f32,
        full_attn_layers: full
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as usize)
            .collect(),
        shape: ConfigShape::Flat,
    })
}

pub fn kda_weights(fx: &Fx, pre: &str, sfx: &str) -> R<OwnedKda> {
    let m = |n: &str| fx.m(&format!("{pre}{n}{sfx}"));
    let v = |n: &str| fx.t(&format!("{pre}{n}{sfx}"));
    let conv = if sfx.is_empty() { "_conv" } else { "_conv1d" };
    let (fa, fb) = if sfx.is_empty() {
        ("f_a", "f_b")
    } else {
        ("f_a_proj", "f_b_proj")
    };
    Ok(OwnedKda {
        q_proj: m("q_proj")?,
        k_proj: m("k_proj")?,
        v_proj: m("v_proj")?,
        g_proj: m("g_proj")?,
        o_proj: m("o_proj")?,
        q_conv: v(&format!("q{conv}"))?,
        k_conv: v(&format!("k{conv}"))?,
        v_conv: v(&format!("v{conv}"))?,
        f_a_proj: m(fa)?,
        f_b_proj: m(fb)?,
        b_proj: m("b_proj")?,
        a_log: fx.t(&format!("{pre}A_log"))?,
        dt_bias: fx.t(&format!("{pre}dt_bias"))?,
        o_norm: v("o_norm")?,
    })
}

pub fn mla_weights(fx: &Fx, pre: &str) -> R<OwnedMla> {
    let m = |n: &str| fx.m(&format!("{pre}{n}_weight"));
    let v = |n: &str| fx.t(&format!("{pre}{n}_weight"));
    Ok(OwnedMla {
        q_a_proj: m("q_a_proj")?,
        q_a_norm: v("q_a_layernorm")?,
        q_b_proj: m("q_b_proj")?,
        kv_a_proj: m("kv_a_proj_with_mqa")?,
        kv_a_norm: v("kv_a_layernorm")?,
        kv_b_proj: m("kv_b_proj")?,
        o_proj: m("o_proj")?,
        g_proj: Some(m("g_proj")?),
    })
}

pub fn moe_parts(fx: &Fx, pre: &str, ne: usize) -> R<(OwnedMoe, Vec<OwnedExpert>)> {
    let m = |n: &str| fx.m(&format!("{pre}{n}"));
    let bias = if pre.is_empty() {
        "e_score_correction_bias"
    } else {
        "mlp_e_score_correction_bias"
    };
    let moe = OwnedMoe {
        router: m("gate_weight")?,
        router_bias: fx.t(bias)?,
        down_proj: m("down_weight")?,
        latent_norm: fx.t(&format!("{pre}norm_weight"))?,
        up_proj: m("up_weight")?,
        shared_gate: m("shared_w1_weight")?,
        shared_up: m("shared_w3_weight")?,
        shared_down: m("shared_w2_weight")?,
    };
    let experts = (0..ne)
        .map(|e| {
            Ok(OwnedExpert {
                w1: m(&format!("experts_{e}_w1_weight"))?,
                w2: m(&format!("experts_{e}_w2_weight"))?,
                w3: m(&format!("experts_{e}_w3_weight"))?,
            })
        })
        .collect::<R<Vec<_>>>()?;
    Ok((moe, experts))
}
