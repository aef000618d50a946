//! The released tensor inventory (docs/MODEL.md#checkpoint-tensor-inventory) as [`TensorSpec`]s, for writing synthetic
//! checkpoints of any config (tests, test models, the index benchmark).

use super::expert::EXPERT_PARTS;
use super::{LM_HEAD, LM_PREFIX};
use crate::config::K3Config;
use crate::dtype::Dtype;
use crate::writer::TensorSpec;

/// Every tensor of the model in the released layout and dtypes (matrices and norm gains BF16;
/// conv taps, `A_log`, `dt_bias`, `o_norm`, router bias F32; experts U8 MXFP4).
///
/// Group 0 holds the model-level tensors; group `l + 1` holds layer `l`'s trunk and routed
/// experts. Each group is sorted by name, as safetensors writers order data, which puts a
/// layer's experts first and its trunk tensors after them in one contiguous run.
pub fn model_tensors(cfg: &K3Config) -> Vec<Vec<TensorSpec>> {
    let (v, e) = (cfg.vocab_size, cfg.hidden_size);
    let g = |s: &str| format!("{LM_PREFIX}{s}");
    let mut globals = vec![
        TensorSpec::new(g("embed_tokens.weight"), Dtype::BF16, &[v, e]),
        TensorSpec::new(g("norm.weight"), Dtype::BF16, &[e]),
        TensorSpec::new(g("output_attn_res_norm.weight"), Dtype::BF16, &[e]),
        TensorSpec::new(g("output_attn_res_proj.weight"), Dtype::BF16, &[1, e]),
        TensorSpec::new(LM_HEAD, Dtype::BF16, &[v, e]),
    ];
    globals.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = vec![globals];
    for l in 0..cfg.num_hidden_layers {
        let mut t = layer_tensors(cfg, l);
        t.sort_by(|a, b| a.name.cmp(&b.name));
        out.push(t);
    }
    out
}

fn layer_tensors(cfg: &K3Config, l: usize) -> Vec<TensorSpec> {
    let e = cfg.hidden_size;
    let mut t = Vec::new();
    let mut add = |s: &str, d: Dtype, shape: &[usize]| {
        t.push(TensorSpec::new(
            format!("{LM_PREFIX}layers.{l}.{s}"),
            d,
            shape,
        ));
    };
    for n in [
        "input_layernorm",
        "post_attention_layernorm",
        "self_attention_res_norm",
        "mlp_res_norm",
    ] {
        add(&format!("{n}.weight"), Dtype::BF16, &[e]);
    }
    add("self_attention_res_proj.weight", Dtype::BF16, &[1, e]);
    add("mlp_res_proj.weight", Dtype::BF16, &[1, e]);
    if cfg.is_mla(l) {
        mla(cfg, &mut add);
    } else {
        kda(cfg, &mut add);
    }
    if cfg.is_dense(l) {
        let di = cfg.intermediate_size;
        add("mlp.gate_proj.weight", Dtype::BF16, &[di, e]);
        add("mlp.up_proj.weight", Dtype::BF16, &[di, e]);
        add("mlp.down_proj.weight", Dtype::BF16, &[e, di]);
    } else {
        moe(cfg, &mut add);
    }
    t
}

fn kda(cfg: &K3Config, add: &mut impl FnMut(&str, Dtype, &[usize])) {
    let (e, h, d, p, k) = (
        cfg.hidden_size,
        cfg.kda_num_heads,
        cfg.kda_head_dim,
        cfg.kda_proj(),
        cfg.short_conv_kernel_size,
    );
    for n in ["q_proj", "k_proj", "v_proj", "g_proj"] {
        add(&format!("self_attn.{n}.weight"), Dtype::BF16, &[p, e]);
    }
    add("self_attn.o_proj.weight", Dtype::BF16, &[e, p]);
    for n in ["q_conv1d", "k_conv1d", "v_conv1d"] {
        add(&format!("self_attn.{n}.weight"), Dtype::F32, &[p, 1, k]);
    }
    add("self_attn.f_a_proj.weight", Dtype::BF16, &[d, e]);
    add("self_attn.f_b_proj.weight", Dtype::BF16, &[p, d]);
    add("self_attn.b_proj.weight", Dtype::BF16, &[h, e]);
    add("self_attn.A_log", Dtype::F32, &[d.max(h)]);
    add("self_attn.dt_bias", Dtype::F32, &[p]);
    add("self_attn.o_norm.weight", Dtype::F32, &[d]);
}

fn mla(cfg: &K3Config, add: &mut impl FnMut(&str, Dtype, &[usize])) {
    let (e, h) = (cfg.hidden_size, cfg.num_attention_heads);
    let (ql, kl) = (cfg.q_lora_rank, cfg.kv_lora_rank);
    add("self_attn.q_a_proj.weight", Dtype::BF16, &[ql, e]);
    add("self_attn.q_a_layernorm.weight", Dtype::BF16, &[ql]);
    add(
        "self_attn.q_b_proj.weight",
        Dtype::BF16,
        &[h * cfg.mla_qk_head(), ql],
    );
    add(
        "self_attn.kv_a_proj_with_mqa.weight",
        Dtype::BF16,
        &[cfg.mla_kv_a_width(), e],
    );
    add("self_attn.kv_a_layernorm.weight", Dtype::BF16, &[kl]);
    add(
        "self_attn.kv_b_proj.weight",
        Dtype::BF16,
        &[h * (cfg.qk_nope_head_dim + cfg.v_head_dim), kl],
    );
    add(
        "self_attn.o_proj.weight",
        Dtype::BF16,
        &[e, h * cfg.v_head_dim],
    );
    if cfg.mla_use_output_gate {
        add(
            "self_attn.g_proj.weight",
            Dtype::BF16,
            &[h * cfg.v_head_dim, e],
        );
    }
}

fn moe(cfg: &K3Config, add: &mut impl FnMut(&str, Dtype, &[usize])) {
    let (e, ne, lat, si, mi) = (
        cfg.hidden_size,
        cfg.num_experts,
        cfg.routed_expert_hidden_size,
        cfg.shared_inter(),
        cfg.moe_intermediate_size,
    );
    add("block_sparse_moe.gate.weight", Dtype::BF16, &[ne, e]);
    add(
        "block_sparse_moe.gate.e_score_correction_bias",
        Dtype::F32,
        &[ne],
    );
    add(
        "block_sparse_moe.routed_expert_down_proj.weight",
        Dtype::BF16,
        &[lat, e],
    );
    add(
        "block_sparse_moe.routed_expert_norm.weight",
        Dtype::BF16,
        &[lat],
    );
    add(
        "block_sparse_moe.routed_expert_up_proj.weight",
        Dtype::BF16,
        &[e, lat],
    );
    add(
        "block_sparse_moe.shared_experts.gate_proj.weight",
        Dtype::BF16,
        &[si, e],
    );
    add(
        "block_sparse_moe.shared_experts.up_proj.weight",
        Dtype::BF16,
        &[si, e],
    );
    add(
        "block_sparse_moe.shared_experts.down_proj.weight",
        Dtype::BF16,
        &[e, si],
    );
    let shapes = [
        [mi, lat / 2],
        [mi, lat / 32],
        [lat, mi / 2],
        [lat, mi / 32],
        [mi, lat / 2],
        [mi, lat / 32],
    ];
    for x in 0..ne {
        for (part, shape) in EXPERT_PARTS.iter().zip(shapes) {
            add(
                &format!("block_sparse_moe.experts.{x}.{part}"),
                Dtype::U8,
                &shape,
            );
        }
    }
}
