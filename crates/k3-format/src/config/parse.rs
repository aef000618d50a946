//! Builds a [`K3Config`] from a parsed document: lookup (docs/MODEL.md#config-key-lookup, docs/MODEL.md#config-keys), then validation (docs/MODEL.md#config-validation).

use super::error::ConfigError;
use super::load::{Doc, Order};
use super::validate as v;
use super::K3Config;
use serde_json::Value;
use std::fmt::Write;

/// The integer fields, read in docs/MODEL.md#config-keys table order.
struct Ints {
    hidden: i64,
    layers: i64,
    vocab: i64,
    kda_heads: i64,
    kda_dim: i64,
    conv_k: i64,
    n_heads: i64,
    q_lora: i64,
    kv_lora: i64,
    nope: i64,
    rope: i64,
    v_head: i64,
    experts: i64,
    topk: i64,
    shared: i64,
    latent: i64,
    moe_inter: i64,
    first_dense: i64,
    dense_inter: i64,
    block: i64,
}

/// The float fields.
struct Floats {
    eps: f64,
    gate_lb: f64,
    routed_scale: f64,
    b1: f64,
    b2: f64,
}

fn read_ints(d: &mut Doc<'_>) -> Ints {
    use Order::{LinTxtRoot as Lin, TxtLinRoot as Txt};
    Ints {
        hidden: d.int("hidden_size", None, Txt),
        layers: d.int("num_hidden_layers", None, Txt),
        vocab: d.int("vocab_size", None, Txt),
        kda_heads: d.int("num_heads", Some("kda_num_heads"), Lin),
        kda_dim: d.int("head_dim", Some("kda_head_dim"), Lin),
        conv_k: d.int("short_conv_kernel_size", None, Txt),
        n_heads: d.int("num_attention_heads", None, Txt),
        q_lora: d.int("q_lora_rank", None, Txt),
        kv_lora: d.int("kv_lora_rank", None, Txt),
        nope: d.int("qk_nope_head_dim", None, Txt),
        rope: d.int("qk_rope_head_dim", None, Txt),
        v_head: d.int("v_head_dim", None, Txt),
        experts: d.int("num_experts", None, Txt),
        topk: d.int("num_experts_per_token", None, Txt),
        shared: d.int("num_shared_experts", None, Txt),
        latent: d.int("routed_expert_hidden_size", None, Txt),
        moe_inter: d.int("moe_intermediate_size", None, Txt),
        first_dense: d.int("first_k_dense_replace", None, Txt),
        dense_inter: d.int("intermediate_size", None, Txt),
        block: d.int("attn_res_block_size", None, Txt),
    }
}

fn read_floats(d: &mut Doc<'_>) -> Floats {
    Floats {
        eps: d.float("rms_norm_eps", None),
        gate_lb: d.float("gate_lower_bound", None),
        routed_scale: d.float("routed_scaling_factor", None),
        b1: d.float("activation_situ_beta", Some("situ_beta")),
        b2: d.float("activation_situ_linear_beta", Some("situ_linear_beta")),
    }
}

/// Parses and validates one document.
pub(super) fn from_value(value: &Value, source: &str) -> Result<K3Config, ConfigError> {
    let mut d = Doc::new(value, source)?;
    // Table order of docs/MODEL.md#config-keys for the missing-keys report.
    let i = read_ints(&mut d);
    let f = read_floats(&mut d);
    let list = d.layer_list();
    if !d.missing.is_empty() {
        return Err(missing_error(&d));
    }
    if let Some(e) = d.bad.take() {
        return Err(e);
    }
    let list = list.map(Vec::as_slice).unwrap_or_default();
    build(&d, &i, &f, list)
}

fn missing_error(d: &Doc<'_>) -> ConfigError {
    let mut list = String::new();
    for (key, why) in d.missing.iter().take(32) {
        let _ = writeln!(list, "  {key}: {why}");
    }
    if d.missing.len() > 32 {
        let _ = writeln!(list, "  … and {} more", d.missing.len() - 32);
    }
    ConfigError::Missing {
        source_name: d.source.clone(),
        count: d.missing.len(),
        list: list.trim_end().to_string(),
        keys: d
            .missing
            .iter()
            .map(|(k, _)| k.split(' ').next().unwrap_or(k).to_string())
            .collect(),
    }
}

/// Positivity of every dimension other than rule 1's three, in [`Ints`] order.
fn dims(s: &str, i: &Ints) -> Result<[usize; 15], ConfigError> {
    let dims = [
        ("num_heads", i.kda_heads, 1),
        ("head_dim", i.kda_dim, 1),
        ("num_attention_heads", i.n_heads, 1),
        ("q_lora_rank", i.q_lora, 1),
        ("kv_lora_rank", i.kv_lora, 1),
        ("qk_nope_head_dim", i.nope, 1),
        ("qk_rope_head_dim", i.rope, 0),
        ("v_head_dim", i.v_head, 1),
        ("num_experts", i.experts, 1),
        ("num_experts_per_token", i.topk, 1),
        ("num_shared_experts", i.shared, 0),
        ("routed_expert_hidden_size", i.latent, 1),
        ("moe_intermediate_size", i.moe_inter, 1),
        ("first_k_dense_replace", i.first_dense, 0),
        ("intermediate_size", i.dense_inter, 1),
    ];
    let mut u = [0usize; 15];
    for (slot, (key, value, min)) in u.iter_mut().zip(dims) {
        *slot = v::at_least(s, key, value, min)?;
    }
    Ok(u)
}

fn build(d: &Doc<'_>, i: &Ints, f: &Floats, list: &[Value]) -> Result<K3Config, ConfigError> {
    let s = d.source.as_str();
    // Rule 1 first (layers/hidden/vocab), then every other dimension.
    let layers = v::at_least(s, "num_hidden_layers", i.layers, 1)?;
    let hidden = v::at_least(s, "hidden_size", i.hidden, 1)?;
    let vocab = v::at_least(s, "vocab_size", i.vocab, 1)?;
    let [kda_heads, kda_dim, n_heads, q_lora, kv_lora, nope, rope, v_head, experts, topk, shared, latent, moe_inter, first_dense, dense_inter] =
        dims(s, i)?;
    let full_attn_layers = v::layer_map(s, list, layers)?;
    v::topk(s, topk, experts)?;
    let block = v::block(s, i.block)?;
    let conv_k = v::conv_kernel(s, i.conv_k)?;
    if first_dense > layers {
        return Err(ConfigError::FirstDenseTooLarge {
            source_name: s.into(),
            value: first_dense,
            layers,
        });
    }
    Ok(K3Config {
        hidden_size: hidden,
        num_hidden_layers: layers,
        vocab_size: vocab,
        rms_norm_eps: v::float(s, "rms_norm_eps", f.eps, true)?,
        kda_num_heads: kda_heads,
        kda_head_dim: kda_dim,
        short_conv_kernel_size: conv_k,
        gate_lower_bound: v::float(s, "gate_lower_bound", f.gate_lb, false)? as f32,
        num_attention_heads: n_heads,
        q_lora_rank: q_lora,
        kv_lora_rank: kv_lora,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope,
        v_head_dim: v_head,
        mla_use_output_gate: d.boolean("mla_use_output_gate", true),
        num_experts: experts,
        num_experts_per_token: topk,
        num_shared_experts: shared,
        routed_expert_hidden_size: latent,
        moe_intermediate_size: moe_inter,
        routed_scaling_factor: v::float(s, "routed_scaling_factor", f.routed_scale, false)? as f32,
        moe_renormalize: d.boolean("moe_renormalize", true),
        latent_moe_use_norm: d.boolean("latent_moe_use_norm", true),
        first_k_dense_replace: first_dense,
        intermediate_size: dense_inter,
        attn_res_block_size: block,
        activation_situ_beta: v::float(s, "activation_situ_beta", f.b1, true)? as f32,
        activation_situ_linear_beta: v::float(s, "activation_situ_linear_beta", f.b2, true)? as f32,
        full_attn_layers,
        shape: d.shape,
    })
}
