//! One rank's share of the checkpoint as a binding of its own (docs/DISTRIBUTED.md#memory-per-rank).
//!
//! [`k3_model::share`] says which rows of each trunk tensor rank `r` of `N` reads. Here every
//! bound tensor is replaced by exactly that share: the same name, its first byte moved to the
//! share's first byte, its first dimension and byte length cut to the share's rows. Every
//! store then works on the share binding unchanged — the planner sizes the rank's trunk from
//! it, the trunk store gathers only the share byte ranges into its pins and ring slots
//! (compacted, back to back: `crate::gather`), the head reads only the rank's `lm_head` rows —
//! and the model receives share-rowed matrices, which its products accept
//! (docs/DISTRIBUTED.md#the-seam).

use crate::EngineError;
use k3_format::bind::{AttnTensors, FfnTensors, LayerTensors};
use k3_format::{ModelBinding, TensorRef};
use k3_model::share::{global_shares, layer_shares, TensorShare};
use std::collections::HashMap;

/// `t` cut to `share`'s rows. An empty share keeps the tensor's first byte as its offset, so
/// no two tensors' shares ever start at the same byte (the gathered run map is keyed by it).
fn cut(t: &TensorRef, share: &TensorShare<'_>) -> TensorRef {
    if share.is_whole() {
        return t.clone();
    }
    let bytes = share.byte_range();
    let mut shape = t.shape.clone();
    if let Some(first) = shape.first_mut() {
        *first = share.rows.len();
    }
    TensorRef {
        name: t.name.clone(),
        shard: t.shard,
        offset: if bytes.is_empty() {
            t.offset
        } else {
            t.offset + bytes.start
        },
        nbytes: bytes.end - bytes.start,
        dtype: t.dtype,
        shape,
    }
}

/// Every trunk tensor of `lt`, mutably, in [`LayerTensors::tensors`]' set (order irrelevant).
fn tensors_mut(lt: &mut LayerTensors) -> Vec<&mut TensorRef> {
    let mut v = vec![
        &mut lt.input_layernorm,
        &mut lt.post_attention_layernorm,
        &mut lt.self_attention_res_norm,
        &mut lt.self_attention_res_proj,
        &mut lt.mlp_res_norm,
        &mut lt.mlp_res_proj,
    ];
    match &mut lt.attn {
        AttnTensors::Kda(k) => v.extend([
            &mut k.q_proj,
            &mut k.k_proj,
            &mut k.v_proj,
            &mut k.g_proj,
            &mut k.o_proj,
            &mut k.q_conv1d,
            &mut k.k_conv1d,
            &mut k.v_conv1d,
            &mut k.f_a_proj,
            &mut k.f_b_proj,
            &mut k.b_proj,
            &mut k.a_log,
            &mut k.dt_bias,
            &mut k.o_norm,
        ]),
        AttnTensors::Mla(m) => {
            v.extend([
                &mut m.q_a_proj,
                &mut m.q_a_layernorm,
                &mut m.q_b_proj,
                &mut m.kv_a_proj_with_mqa,
                &mut m.kv_a_layernorm,
                &mut m.kv_b_proj,
                &mut m.o_proj,
            ]);
            v.extend(m.g_proj.as_mut());
        }
    }
    match &mut lt.ffn {
        FfnTensors::Dense(d) => v.extend([&mut d.gate_proj, &mut d.up_proj, &mut d.down_proj]),
        FfnTensors::Moe(m) => v.extend([
            &mut m.gate,
            &mut m.e_score_correction_bias,
            &mut m.routed_expert_down_proj,
            &mut m.routed_expert_norm,
            &mut m.routed_expert_up_proj,
            &mut m.shared_gate_proj,
            &mut m.shared_up_proj,
            &mut m.shared_down_proj,
        ]),
    }
    v
}

/// Replaces every tensor named in `cuts` by its cut; refuses when a tensor has no cut or a
/// cut names no tensor (the share list and the binding disagree).
fn apply(
    what: &str,
    tensors: Vec<&mut TensorRef>,
    mut cuts: HashMap<String, TensorRef>,
) -> Result<(), EngineError> {
    for t in tensors {
        let cut = cuts.remove(&t.name).ok_or_else(|| {
            EngineError::Invalid(format!("{what}: no rank share for tensor {}", t.name))
        })?;
        *t = cut;
    }
    match cuts.keys().next() {
        Some(extra) => Err(EngineError::Invalid(format!(
            "{what}: rank share for {extra}, which the binding does not hold"
        ))),
        None => Ok(()),
    }
}

fn cuts_of(shares: &[TensorShare<'_>]) -> HashMap<String, TensorRef> {
    shares
        .iter()
        .map(|s| (s.tensor.name.clone(), cut(s.tensor, s)))
        .collect()
}

/// Layer `lt` with every trunk tensor cut to what `rank` of `size` reads.
pub fn share_layer(
    lt: &LayerTensors,
    rank: usize,
    size: usize,
) -> Result<LayerTensors, EngineError> {
    let mut mine = lt.clone();
    let cuts = cuts_of(&layer_shares(lt, rank, size));
    apply(&format!("layer {}", lt.layer), tensors_mut(&mut mine), cuts)?;
    Ok(mine)
}

/// The binding of what `rank` of `size` reads: every trunk and model-level tensor cut to its
/// share ([`k3_model::share`]); routed experts are unchanged (the rank fetches only those it
/// owns). With `size == 1` the binding itself.
pub fn share_binding(
    b: &ModelBinding,
    rank: usize,
    size: usize,
) -> Result<ModelBinding, EngineError> {
    let mut out = b.clone();
    if size <= 1 {
        return Ok(out);
    }
    for (lt, mine) in b.layers.iter().zip(out.layers.iter_mut()) {
        *mine = share_layer(lt, rank, size)?;
    }
    let cuts = cuts_of(&global_shares(&b.globals, rank, size));
    let g = &mut out.globals;
    let globals = vec![
        &mut g.embed_tokens,
        &mut g.norm,
        &mut g.output_attn_res_norm,
        &mut g.output_attn_res_proj,
        &mut g.lm_head,
    ];
    apply("model-level tensors", globals, cuts)?;
    Ok(out)
}

/// Routed experts `rank` of `size` owns, over every MoE layer of `b`.
pub fn owned_experts(b: &ModelBinding, rank: usize, size: usize) -> u64 {
    let per_layer = b.experts.len() as u64 / moe_layers(b).max(1);
    let owned = (0..per_layer as u32)
        .filter(|&e| k3_model::share::owns_expert(e, rank, size))
        .count() as u64;
    owned * moe_layers(b)
}

fn moe_layers(b: &ModelBinding) -> u64 {
    b.layers
        .iter()
        .filter(|lt| matches!(lt.ffn, FfnTensors::Moe(_)))
        .count() as u64
}
