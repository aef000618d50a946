//! `config.json`: the released nested shape and the flat fixture shape (docs/MODEL.md#configuration).
//!
//! Field names mirror the Hugging Face keys (docs/MODEL.md#config-keys). Loading, aliases, lookup order and the
//! validation rules of docs/MODEL.md#config-validation live in this module too.

mod error;
mod load;
mod parse;
#[cfg(test)]
mod tests;
mod validate;

pub use error::{ConfigError, REFUSE_DEFAULTS};
pub use validate::MAX_TOPK;

use std::path::Path;

/// Which of the two accepted documents the config came from (docs/MODEL.md#config-shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigShape {
    /// Released: `text_config` + `text_config.linear_attn_config`.
    Nested,
    /// Every key at one level (upstream fixtures).
    Flat,
}

/// The language-model hyper-parameters k3 needs, named as in the checkpoint's config.
#[derive(Clone, Debug, PartialEq)]
pub struct K3Config {
    /// Hidden width E (`hidden_size`).
    pub hidden_size: usize,
    /// Decoder layers (`num_hidden_layers`).
    pub num_hidden_layers: usize,
    /// Embedding rows V (`vocab_size`).
    pub vocab_size: usize,
    /// RMSNorm epsilon (`rms_norm_eps`), used by every norm in the engine.
    pub rms_norm_eps: f64,
    /// KDA heads (`linear_attn_config.num_heads`, flat alias `kda_num_heads`).
    pub kda_num_heads: usize,
    /// KDA head width, d_k = d_v (`linear_attn_config.head_dim`, flat alias `kda_head_dim`).
    pub kda_head_dim: usize,
    /// KDA short-convolution taps K (`linear_attn_config.short_conv_kernel_size`).
    pub short_conv_kernel_size: usize,
    /// KDA decay lower bound (`linear_attn_config.gate_lower_bound`, −5).
    pub gate_lower_bound: f32,
    /// MLA heads (`num_attention_heads`).
    pub num_attention_heads: usize,
    /// MLA query low rank (`q_lora_rank`).
    pub q_lora_rank: usize,
    /// MLA key/value latent width (`kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// MLA non-positional query/key head width (`qk_nope_head_dim`).
    pub qk_nope_head_dim: usize,
    /// MLA rope-slot width (`qk_rope_head_dim`; never rotated in K3).
    pub qk_rope_head_dim: usize,
    /// MLA value head width (`v_head_dim`).
    pub v_head_dim: usize,
    /// MLA output gate `g_proj` present (`mla_use_output_gate`, default true).
    pub mla_use_output_gate: bool,
    /// Routed experts per MoE layer (`num_experts`).
    pub num_experts: usize,
    /// Experts selected per token (`num_experts_per_token`, ≤ 64).
    pub num_experts_per_token: usize,
    /// Shared experts, stored fused (`num_shared_experts`).
    pub num_shared_experts: usize,
    /// LatentMoE latent width (`routed_expert_hidden_size`).
    pub routed_expert_hidden_size: usize,
    /// Routed expert intermediate width (`moe_intermediate_size`).
    pub moe_intermediate_size: usize,
    /// Router weight scale (`routed_scaling_factor`).
    pub routed_scaling_factor: f32,
    /// Renormalise the top-k router weights (`moe_renormalize`, default true).
    pub moe_renormalize: bool,
    /// RMSNorm on the aggregated latent (`latent_moe_use_norm`, default true).
    pub latent_moe_use_norm: bool,
    /// Layers `0..first_k_dense_replace` use a dense MLP (`first_k_dense_replace`).
    pub first_k_dense_replace: usize,
    /// Dense MLP intermediate width (`intermediate_size`).
    pub intermediate_size: usize,
    /// Attention-residual block size (`attn_res_block_size`).
    pub attn_res_block_size: usize,
    /// SiTU gate cap b1 (`activation_situ_beta`, flat alias `situ_beta`).
    pub activation_situ_beta: f32,
    /// SiTU linear cap b2 (`activation_situ_linear_beta`, flat alias `situ_linear_beta`).
    pub activation_situ_linear_beta: f32,
    /// ONE-based indices of the MLA ("full attention") layers.
    pub full_attn_layers: Vec<usize>,
    /// Which document shape the values came from.
    pub shape: ConfigShape,
}

impl K3Config {
    /// Reads and validates `config.json` at `path` (either shape; see the module docs).
    pub fn load(path: impl AsRef<Path>) -> Result<K3Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::from_json_str(&text, &path.display().to_string())
    }

    /// Parses and validates config text; `source_name` (usually the path) is used in messages.
    pub fn from_json_str(text: &str, source_name: &str) -> Result<K3Config, ConfigError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ConfigError::Json {
                source_name: source_name.to_string(),
                detail: e.to_string(),
            })?;
        parse::from_value(&value, source_name)
    }

    /// The released Kimi K3 values (docs/MODEL.md#config-keys), used only as the documented fallback when no
    /// config file exists.
    pub fn released() -> K3Config {
        let mut full: Vec<usize> = (1..=23).map(|i| 4 * i).collect();
        full.push(93);
        K3Config {
            hidden_size: 7168,
            num_hidden_layers: 93,
            vocab_size: 163_840,
            rms_norm_eps: 1e-5,
            kda_num_heads: 96,
            kda_head_dim: 128,
            short_conv_kernel_size: 4,
            gate_lower_bound: -5.0,
            num_attention_heads: 96,
            q_lora_rank: 1536,
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
            mla_use_output_gate: true,
            num_experts: 896,
            num_experts_per_token: 16,
            num_shared_experts: 2,
            routed_expert_hidden_size: 3584,
            moe_intermediate_size: 3072,
            routed_scaling_factor: 1.0,
            moe_renormalize: true,
            latent_moe_use_norm: true,
            first_k_dense_replace: 1,
            intermediate_size: 33_792,
            attn_res_block_size: 12,
            activation_situ_beta: 4.0,
            activation_situ_linear_beta: 25.0,
            full_attn_layers: full,
            shape: ConfigShape::Nested,
        }
    }

    /// Number of MLA (full attention) layers.
    pub fn num_mla_layers(&self) -> usize {
        (0..self.num_hidden_layers)
            .filter(|&l| self.is_mla(l))
            .count()
    }

    /// The one-line load report of docs/MODEL.md#config-validation, e.g.
    /// `config: config.json (nested shape) | hidden=7168 layers=93 vocab=163840 | 24 MLA + 69 KDA | experts 896 top16 shared2 | latent=3584`.
    pub fn summary(&self, source: &str) -> String {
        let mla = self.num_mla_layers();
        let shape = match self.shape {
            ConfigShape::Nested => "nested",
            ConfigShape::Flat => "flat",
        };
        format!(
            "config: {source} ({shape} shape) | hidden={} layers={} vocab={} | {mla} MLA + {} KDA | experts {} top{} shared{} | latent={}",
            self.hidden_size,
            self.num_hidden_layers,
            self.vocab_size,
            self.num_hidden_layers - mla,
            self.num_experts,
            self.num_experts_per_token,
            self.num_shared_experts,
            self.routed_expert_hidden_size,
        )
    }

    /// Layer `l` (zero-based) is MLA iff `l + 1` is listed in `full_attn_layers` (docs/MODEL.md#layer-map).
    pub fn is_mla(&self, l: usize) -> bool {
        self.full_attn_layers.contains(&(l + 1))
    }
    /// Layer `l` is KDA iff it is not MLA.
    pub fn is_kda(&self, l: usize) -> bool {
        !self.is_mla(l)
    }
    /// Layer `l` has a dense MLP instead of a MoE.
    pub fn is_dense(&self, l: usize) -> bool {
        l < self.first_k_dense_replace
    }
    /// Layer `l` opens a new attention-residual block (docs/MODEL.md#decoder-layer).
    pub fn is_block_boundary(&self, l: usize) -> bool {
        l.is_multiple_of(self.attn_res_block_size)
    }
    /// KDA projection width P = heads · head_dim.
    pub fn kda_proj(&self) -> usize {
        self.kda_num_heads * self.kda_head_dim
    }
    /// MLA query/key head width (nope + rope).
    pub fn mla_qk_head(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
    /// Width of `kv_a_proj_with_mqa`'s output: latent + shared rope slots.
    pub fn mla_kv_a_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
    /// Fused shared-expert intermediate width.
    pub fn shared_inter(&self) -> usize {
        self.moe_intermediate_size * self.num_shared_experts
    }
    /// Maximum number of attention-residual block snapshots per token.
    pub fn max_blocks(&self) -> usize {
        self.num_hidden_layers / self.attn_res_block_size + 2
    }
}
