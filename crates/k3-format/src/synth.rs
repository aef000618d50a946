//! Synthetic checkpoints in the released layout (docs/MODEL.md#checkpoint-tensor-inventory), for benchmarks and memory tests.
//!
//! [`write_checkpoint`] writes a nested `config.json` (`text_config` + `linear_attn_config`),
//! shards `model-0000N-of-0000M.safetensors` and `model.safetensors.index.json`, with:
//! - each layer's trunk tensors as one contiguous run in one shard (docs/FORMATS.md#packed-trunk);
//! - each routed expert's six tensors contiguous in the order w1p, w1s, w2p, w2s, w3p, w3s
//!   (docs/MODEL.md#routed-experts), possibly in another shard than its layer's trunk;
//! - the released dtypes: BF16 matrices and norm gains, F32 small vectors, U8 MXFP4 experts.
//!
//! Weights are random but well-conditioned and deterministic: every tensor draws from its own
//! SplitMix64 stream seeded by `(seed, tensor name)`, so the bytes do not depend on the shard
//! layout. Matrices are uniform with standard deviation `gain / sqrt(fan_in)`; norm gains are
//! `1 ± jitter`; MXFP4 experts are uniform random nibbles with one E8M0 scale per tensor chosen
//! so the dequantised weights have the same `1 / sqrt(fan_in)` spread. Tensors are streamed
//! to disk in chunks through one reused buffer; nothing model-sized is ever allocated.

use crate::bind::model_tensors;
use crate::config::{ConfigShape, K3Config};
use crate::error::FormatError;
use crate::writer::{encode_header, write_index, TensorSpec};
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

mod fill;
mod spec;

use fill::Filler;
pub(crate) use fill::SplitMix;
pub use spec::{MatrixDist, SynthSpec, WeightScale};

/// Bytes generated and written per step (a multiple of 16).
const CHUNK: usize = 8 << 20;

/// The scaled-down layer map: one-based MLA layers are the multiples of 4 plus the last two
/// layers (the released pattern 4, 8, …, 92, 93 for 93 layers); one layer only for `n ≤ 2`.
pub fn layer_map(n_layers: usize) -> Vec<usize> {
    if n_layers <= 2 {
        return vec![n_layers];
    }
    let mut v: Vec<usize> = (1..n_layers - 1)
        .map(|i| 4 * i)
        .take_while(|&l| l < n_layers - 1)
        .collect();
    v.extend([n_layers - 1, n_layers]);
    v
}

/// The released per-layer dimensions (docs/MODEL.md#config-keys: hidden 7168, KDA 96×128, MLA 96 heads,
/// latent 3584, expert inter 3072, dense inter 33792, top-16) with `layers` layers
/// ([`layer_map`]), `experts` routed experts per layer (top-k capped at it) and `vocab` rows.
pub fn real_dims_config(layers: usize, experts: usize, vocab: usize) -> K3Config {
    let mut c = K3Config::released();
    c.num_hidden_layers = layers;
    c.num_experts = experts;
    c.num_experts_per_token = c.num_experts_per_token.min(experts);
    c.vocab_size = vocab;
    c.full_attn_layers = layer_map(layers);
    c
}

/// The "mid" benchmark shape: the released structure at smaller widths (hidden 1024,
/// KDA 8×64, MLA 8 heads with q_lora 256 / kv_lora 128 / nope 64 / rope 32 / v 64, latent 512,
/// expert inter 512, dense inter 2048, top-4, block size 3).
pub fn mid_config(layers: usize, experts: usize, vocab: usize) -> K3Config {
    let mut c = real_dims_config(layers, experts, vocab);
    c.hidden_size = 1024;
    c.kda_num_heads = 8;
    c.kda_head_dim = 64;
    c.num_attention_heads = 8;
    c.q_lora_rank = 256;
    c.kv_lora_rank = 128;
    c.qk_nope_head_dim = 64;
    c.qk_rope_head_dim = 32;
    c.v_head_dim = 64;
    c.routed_expert_hidden_size = 512;
    c.moe_intermediate_size = 512;
    c.intermediate_size = 2048;
    c.num_experts_per_token = 4.min(experts);
    c.attn_res_block_size = 3;
    c
}

/// Shards and their tensors in file order, before anything is written.
#[derive(Clone, Debug)]
pub struct SynthPlan {
    /// Tensors of each shard, in data order.
    pub shards: Vec<Vec<TensorSpec>>,
    /// Bytes of every shard file together (headers included).
    pub total_bytes: u64,
    /// Bytes of the model-level tensors (embedding, head, final norms).
    pub global_bytes: u64,
    /// Bytes of every layer's trunk run.
    pub trunk_bytes: u64,
    /// Bytes of every routed expert.
    pub expert_bytes: u64,
}

/// Progress reported after every tensor written.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Bytes written so far (all shards, headers included).
    pub bytes_written: u64,
    /// Bytes the checkpoint will have.
    pub total_bytes: u64,
    /// Shard being written (zero-based).
    pub shard: usize,
    /// Number of shards.
    pub n_shards: usize,
}

/// What [`write_checkpoint`] wrote.
#[derive(Clone, Debug)]
pub struct SynthSummary {
    /// Shard files written.
    pub n_shards: usize,
    /// Tensors written.
    pub n_tensors: usize,
    /// Bytes of all shard files (headers included).
    pub total_bytes: u64,
    /// Model-level tensor bytes.
    pub global_bytes: u64,
    /// Trunk bytes (all layers).
    pub trunk_bytes: u64,
    /// Routed expert bytes (all layers).
    pub expert_bytes: u64,
    /// Wall-clock seconds spent writing.
    pub seconds: f64,
}

fn too_large() -> FormatError {
    FormatError::TooLarge {
        what: "synthetic tensor byte size",
        value: u64::MAX,
        limit: u64::MAX,
    }
}

fn bytes_of(items: &[TensorSpec]) -> Result<u64, FormatError> {
    items.iter().try_fold(0u64, |acc, t| {
        t.nbytes()
            .and_then(|n| acc.checked_add(n))
            .ok_or_else(too_large)
    })
}

/// Expert index of a routed-expert tensor name (`…experts.{e}.w1…`).
fn expert_index(name: &str) -> Option<usize> {
    let rest = name.split(".experts.").nth(1)?;
    rest.split('.').next()?.parse().ok()
}

/// Lays the tensors of `spec` out in shards (see [`SynthPlan`]); writes nothing.
pub fn plan(spec: &SynthSpec) -> Result<SynthPlan, FormatError> {
    let groups = model_tensors(&spec.config);
    // Atomic items, in file order: each global tensor, then per layer the trunk run followed
    // by its experts in numeric order (each the six tensors w1p..w3s, already name-sorted).
    let mut items: Vec<(u8, Vec<TensorSpec>)> = Vec::new();
    let mut groups = groups.into_iter();
    for t in groups.next().unwrap_or_default() {
        items.push((0, vec![t]));
    }
    for group in groups {
        let (experts, trunk): (Vec<_>, Vec<_>) = group
            .into_iter()
            .partition(|t| t.name.contains(".experts."));
        items.push((1, trunk));
        let mut per_expert: Vec<Vec<TensorSpec>> = Vec::new();
        for t in experts {
            match per_expert.last_mut() {
                Some(last) if last.len() < 6 => last.push(t),
                _ => per_expert.push(vec![t]),
            }
        }
        per_expert.sort_by_key(|e| e.first().and_then(|t| expert_index(&t.name)));
        items.extend(per_expert.into_iter().map(|e| (2, e)));
    }
    let mut shards: Vec<Vec<TensorSpec>> = Vec::new();
    let mut open: Vec<TensorSpec> = Vec::new();
    let (mut open_bytes, mut sums) = (0u64, [0u64; 3]);
    for (kind, item) in items {
        let n = bytes_of(&item)?;
        sums[kind as usize] += n;
        if !open.is_empty() && open_bytes + n > spec.shard_bytes {
            shards.push(std::mem::take(&mut open));
            open_bytes = 0;
        }
        open_bytes += n;
        open.extend(item);
    }
    if !open.is_empty() {
        shards.push(open);
    }
    let mut total_bytes = 0u64;
    for s in &shards {
        let (head, data) = encode_header(s)?;
        total_bytes += head.len() as u64 + data;
    }
    Ok(SynthPlan {
        shards,
        total_bytes,
        global_bytes: sums[0],
        trunk_bytes: sums[1],
        expert_bytes: sums[2],
    })
}

/// Shard file name `model-0000N-of-0000M.safetensors` (N one-based).
pub fn shard_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
}

/// The nested (released-shape) `config.json` text for `cfg`.
pub fn config_json(cfg: &K3Config) -> String {
    let n = cfg.num_hidden_layers;
    let kda: Vec<usize> = (1..=n)
        .filter(|l| !cfg.full_attn_layers.contains(l))
        .collect();
    let lin = serde_json::json!({
        "num_heads": cfg.kda_num_heads,
        "head_dim": cfg.kda_head_dim,
        "short_conv_kernel_size": cfg.short_conv_kernel_size,
        "gate_lower_bound": cfg.gate_lower_bound,
        "full_attn_layers": cfg.full_attn_layers,
        "kda_layers": kda
    });
    let moe = serde_json::json!({
        "num_experts": cfg.num_experts,
        "num_experts_per_token": cfg.num_experts_per_token,
        "num_shared_experts": cfg.num_shared_experts,
        "routed_expert_hidden_size": cfg.routed_expert_hidden_size,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "routed_scaling_factor": cfg.routed_scaling_factor,
        "moe_renormalize": cfg.moe_renormalize,
        "latent_moe_use_norm": cfg.latent_moe_use_norm,
        "first_k_dense_replace": cfg.first_k_dense_replace,
        "intermediate_size": cfg.intermediate_size,
        "moe_router_activation_func": "sigmoid",
        "num_expert_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "moe_layer_freq": 1
    });
    let mut text = serde_json::json!({
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": n,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_attention_heads,
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "mla_use_output_gate": cfg.mla_use_output_gate,
        "mla_use_nope": true,
        "attn_res_block_size": cfg.attn_res_block_size,
        "activation_situ_beta": cfg.activation_situ_beta,
        "activation_situ_linear_beta": cfg.activation_situ_linear_beta,
        "hidden_act": "situ",
        "use_full_rank_gate": true,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"
    });
    if let (Some(t), Some(m)) = (text.as_object_mut(), moe.as_object()) {
        t.extend(m.clone());
        t.insert("linear_attn_config".into(), lin);
    }
    let v = serde_json::json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "mxfp4",
            "format": "mxfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                "weights": {"group_size": 32, "num_bits": 4, "type": "float"}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"]
        },
        "text_config": text,
        "vision_config": {"model_type": "kimi_k3_vision", "note": "synthetic: no vision tower"}
    });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// Writes the checkpoint of `spec` into `dir` (created if needed; existing files of the same
/// names are replaced) and calls `progress` after every tensor.
pub fn write_checkpoint(
    dir: &Path,
    spec: &SynthSpec,
    mut progress: impl FnMut(&Progress),
) -> Result<SynthSummary, FormatError> {
    let t0 = Instant::now();
    std::fs::create_dir_all(dir).map_err(|e| FormatError::io(dir, e))?;
    let cfg_path = dir.join("config.json");
    let text = config_json(&spec.config);
    // The written document must read back as the same model, or the checkpoint is useless.
    let back = K3Config::from_json_str(&text, "synthetic config.json").map_err(|e| {
        FormatError::io(
            &cfg_path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
        )
    })?;
    let mut want = spec.config.clone();
    want.shape = ConfigShape::Nested;
    if back != want {
        let msg = "the config does not survive a config.json round trip (check full_attn_layers)";
        return Err(FormatError::io(
            &cfg_path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, msg),
        ));
    }
    std::fs::write(&cfg_path, text).map_err(|e| FormatError::io(&cfg_path, e))?;

    let plan = plan(spec)?;
    let n = plan.shards.len();
    let mut buf = vec![0u8; CHUNK];
    let mut done = Progress {
        bytes_written: 0,
        total_bytes: plan.total_bytes,
        shard: 0,
        n_shards: n,
    };
    let mut index: Vec<(String, String)> = Vec::new();
    for (i, tensors) in plan.shards.iter().enumerate() {
        let name = shard_name(i, n);
        let path = dir.join(&name);
        let io = |e| FormatError::io(&path, e);
        let (head, _) = encode_header(tensors)?;
        let mut f = File::create(&path).map_err(io)?;
        f.write_all(&head).map_err(io)?;
        done.shard = i;
        done.bytes_written += head.len() as u64;
        for t in tensors {
            let mut fill = Filler::new(t, spec);
            let mut left = t.nbytes().ok_or_else(too_large)?;
            while left > 0 {
                let step = left.min(CHUNK as u64) as usize;
                fill.fill(&mut buf[..step]);
                f.write_all(&buf[..step]).map_err(io)?;
                left -= step as u64;
            }
            done.bytes_written += t.nbytes().unwrap_or(0);
            index.push((t.name.clone(), name.clone()));
            progress(&done);
        }
        f.flush().map_err(io)?;
    }
    let idx = dir.join(crate::index::INDEX_FILE);
    write_index(&idx, index.iter().map(|(t, s)| (t.as_str(), s.as_str())))?;
    Ok(SynthSummary {
        n_shards: n,
        n_tensors: index.len(),
        total_bytes: plan.total_bytes,
        global_bytes: plan.global_bytes,
        trunk_bytes: plan.trunk_bytes,
        expert_bytes: plan.expert_bytes,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests;
