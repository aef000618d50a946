//! Per-rank sizes of a model known only by its config (`k3 plan --ranks N` without a model
//! directory: the release's shapes). The trunk tensors of [`k3_format::bind::model_tensors`]
//! are laid out as [`LayerTensors`] (offsets back to back, one shard) so that
//! [`k3_model::share`] deals them exactly as it deals a bound checkpoint; a test checks the
//! names and shapes against a bound tiny checkpoint.

use crate::EngineError;
use k3_format::bind::{
    AttnTensors, DenseTensors, FfnTensors, GlobalTensors, KdaTensors, LayerTensors, MlaTensors,
    MoeTensors, LM_HEAD, LM_PREFIX,
};
use k3_format::{K3Config, TensorRef};
use k3_plan::ModelSizes;
use std::collections::HashMap;

/// Tensors of one group by name, as [`TensorRef`]s laid out back to back.
struct Specs(HashMap<String, TensorRef>);

impl Specs {
    fn new(group: &[k3_format::TensorSpec]) -> Specs {
        let mut offset = 0;
        let mut map = HashMap::new();
        for s in group {
            let nbytes = s.nbytes().unwrap_or(0);
            map.insert(
                s.name.clone(),
                TensorRef {
                    name: s.name.clone(),
                    shard: 0,
                    offset,
                    nbytes,
                    dtype: s.dtype,
                    shape: s.shape.clone(),
                },
            );
            offset += nbytes;
        }
        Specs(map)
    }

    fn take(&mut self, name: &str) -> Result<TensorRef, EngineError> {
        self.0
            .remove(name)
            .ok_or_else(|| EngineError::Invalid(format!("model layout has no tensor {name}")))
    }
}

/// Layer `l`'s trunk tensors from its spec group.
fn layer(cfg: &K3Config, l: usize, s: &mut Specs) -> Result<LayerTensors, EngineError> {
    let p = format!("{LM_PREFIX}layers.{l}.");
    let mut t = |n: &str| s.take(&format!("{p}{n}"));
    let attn = if cfg.is_mla(l) {
        AttnTensors::Mla(MlaTensors {
            q_a_proj: t("self_attn.q_a_proj.weight")?,
            q_a_layernorm: t("self_attn.q_a_layernorm.weight")?,
            q_b_proj: t("self_attn.q_b_proj.weight")?,
            kv_a_proj_with_mqa: t("self_attn.kv_a_proj_with_mqa.weight")?,
            kv_a_layernorm: t("self_attn.kv_a_layernorm.weight")?,
            kv_b_proj: t("self_attn.kv_b_proj.weight")?,
            o_proj: t("self_attn.o_proj.weight")?,
            g_proj: match cfg.mla_use_output_gate {
                true => Some(t("self_attn.g_proj.weight")?),
                false => None,
            },
        })
    } else {
        AttnTensors::Kda(KdaTensors {
            q_proj: t("self_attn.q_proj.weight")?,
            k_proj: t("self_attn.k_proj.weight")?,
            v_proj: t("self_attn.v_proj.weight")?,
            g_proj: t("self_attn.g_proj.weight")?,
            o_proj: t("self_attn.o_proj.weight")?,
            q_conv1d: t("self_attn.q_conv1d.weight")?,
            k_conv1d: t("self_attn.k_conv1d.weight")?,
            v_conv1d: t("self_attn.v_conv1d.weight")?,
            f_a_proj: t("self_attn.f_a_proj.weight")?,
            f_b_proj: t("self_attn.f_b_proj.weight")?,
            b_proj: t("self_attn.b_proj.weight")?,
            a_log: t("self_attn.A_log")?,
            dt_bias: t("self_attn.dt_bias")?,
            o_norm: t("self_attn.o_norm.weight")?,
        })
    };
    let m = "block_sparse_moe.";
    let ffn = if cfg.is_dense(l) {
        FfnTensors::Dense(DenseTensors {
            gate_proj: t("mlp.gate_proj.weight")?,
            up_proj: t("mlp.up_proj.weight")?,
            down_proj: t("mlp.down_proj.weight")?,
        })
    } else {
        FfnTensors::Moe(MoeTensors {
            gate: t(&format!("{m}gate.weight"))?,
            e_score_correction_bias: t(&format!("{m}gate.e_score_correction_bias"))?,
            routed_expert_down_proj: t(&format!("{m}routed_expert_down_proj.weight"))?,
            routed_expert_norm: t(&format!("{m}routed_expert_norm.weight"))?,
            routed_expert_up_proj: t(&format!("{m}routed_expert_up_proj.weight"))?,
            shared_gate_proj: t(&format!("{m}shared_experts.gate_proj.weight"))?,
            shared_up_proj: t(&format!("{m}shared_experts.up_proj.weight"))?,
            shared_down_proj: t(&format!("{m}shared_experts.down_proj.weight"))?,
        })
    };
    Ok(LayerTensors {
        layer: l,
        input_layernorm: t("input_layernorm.weight")?,
        post_attention_layernorm: t("post_attention_layernorm.weight")?,
        self_attention_res_norm: t("self_attention_res_norm.weight")?,
        self_attention_res_proj: t("self_attention_res_proj.weight")?,
        mlp_res_norm: t("mlp_res_norm.weight")?,
        mlp_res_proj: t("mlp_res_proj.weight")?,
        attn,
        ffn,
    })
}

/// The model-level tensors and every layer's trunk tensors of `cfg`'s layout.
pub fn spec_tensors(cfg: &K3Config) -> Result<(GlobalTensors, Vec<LayerTensors>), EngineError> {
    let groups = k3_format::bind::model_tensors(cfg);
    let mut g = Specs::new(groups.first().map_or(&[][..], |v| v.as_slice()));
    let mut gt = |n: &str| g.take(&format!("{LM_PREFIX}{n}"));
    let globals = GlobalTensors {
        embed_tokens: gt("embed_tokens.weight")?,
        norm: gt("norm.weight")?,
        output_attn_res_norm: gt("output_attn_res_norm.weight")?,
        output_attn_res_proj: gt("output_attn_res_proj.weight")?,
        lm_head: g.take(LM_HEAD)?,
    };
    let layers = groups
        .iter()
        .skip(1)
        .enumerate()
        .map(|(l, group)| layer(cfg, l, &mut Specs::new(group)))
        .collect::<Result<_, _>>()?;
    Ok((globals, layers))
}

/// `whole` (the model's sizes, e.g. [`ModelSizes::k3_estimate`]) for each rank of `size`:
/// each layer's trunk and `lm_head` cut to the rank's share of `cfg`'s layout, the expert pool
/// to the experts it owns. With `size == 1`, `[whole]`.
pub fn rank_sizes_of_config(
    cfg: &K3Config,
    whole: &ModelSizes,
    size: usize,
) -> Result<Vec<ModelSizes>, EngineError> {
    if size <= 1 {
        return Ok(vec![whole.clone()]);
    }
    let (globals, layers) = spec_tensors(cfg)?;
    (0..size)
        .map(|rank| one_rank(cfg, whole, &globals, &layers, rank, size))
        .collect()
}

/// Bytes of a layer's vectors widened to f32 (what `planning::model_sizes` counts).
fn widened(lt: &LayerTensors) -> u64 {
    let (vecs, _) = crate::layer_view::layer_tensors(lt);
    vecs.iter().map(|t| t.numel() as u64 * 4).sum()
}

fn one_rank(
    cfg: &K3Config,
    whole: &ModelSizes,
    globals: &GlobalTensors,
    layers: &[LayerTensors],
    rank: usize,
    size: usize,
) -> Result<ModelSizes, EngineError> {
    let bytes = |s: &k3_model::share::TensorShare<'_>| s.byte_range().end - s.byte_range().start;
    let mut sizes = whole.clone();
    let runs = sizes
        .layer_run_bytes
        .iter_mut()
        .zip(sizes.widen_bytes.iter_mut());
    for ((run, widen), lt) in runs.zip(layers) {
        let share = crate::rank_share::share_layer(lt, rank, size)?;
        *run = *run - lt.trunk_bytes() + share.trunk_bytes();
        *widen = *widen - widened(lt) + widened(&share);
    }
    let head = k3_model::share::global_shares(globals, rank, size);
    let lm_share = head
        .iter()
        .find(|s| s.tensor.name == LM_HEAD)
        .map_or(0, bytes);
    sizes.head_bytes = sizes.head_bytes - globals.lm_head.nbytes + lm_share;
    let moe = whole.n_routed_experts / (cfg.num_experts as u64).max(1);
    let owned = (0..cfg.num_experts as u32)
        .filter(|&e| k3_model::share::owns_expert(e, rank, size))
        .count() as u64;
    sizes.n_routed_experts = owned * moe;
    let heads_share = |whole| crate::planning::kda_state_share(cfg, whole, rank, size);
    sizes.kda_state_bytes = heads_share(whole.kda_state_bytes);
    sizes.journal_bytes_per_draft = heads_share(whole.journal_bytes_per_draft);
    sizes.tentative_state_bytes = heads_share(whole.tentative_state_bytes);
    // A rank's share of a layer is rows cut from several tensors, not one contiguous run, so
    // it streams whole (as `planning::rank_sizes` finds from the share binding): no pieces.
    sizes.layer_piece_bytes.clear();
    Ok(sizes)
}
