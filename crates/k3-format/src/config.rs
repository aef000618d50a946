//! `config.json`: the released nested shape and the flat fixture shape (spec §1).
//!
//! Field names mirror the Hugging Face keys (spec §1.3). Loading, aliases, lookup order and the
//! validation rules of spec §1.5 live in this module too.

/// Which of the two accepted documents the config came from (spec §1.1).
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
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    /// KDA heads (`linear_attn_config.num_heads`, flat alias `kda_num_heads`).
    pub kda_num_heads: usize,
    /// KDA head width, d_k = d_v (`linear_attn_config.head_dim`, flat alias `kda_head_dim`).
    pub kda_head_dim: usize,
    pub short_conv_kernel_size: usize,
    pub gate_lower_bound: f32,
    pub num_attention_heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub mla_use_output_gate: bool,
    pub num_experts: usize,
    pub num_experts_per_token: usize,
    pub num_shared_experts: usize,
    pub routed_expert_hidden_size: usize,
    pub moe_intermediate_size: usize,
    pub routed_scaling_factor: f32,
    pub moe_renormalize: bool,
    pub latent_moe_use_norm: bool,
    pub first_k_dense_replace: usize,
    pub intermediate_size: usize,
    pub attn_res_block_size: usize,
    pub activation_situ_beta: f32,
    pub activation_situ_linear_beta: f32,
    /// ONE-based indices of the MLA ("full attention") layers.
    pub full_attn_layers: Vec<usize>,
    pub shape: ConfigShape,
}

impl K3Config {
    /// Layer `l` (zero-based) is MLA iff `l + 1` is listed in `full_attn_layers` (spec §1.4).
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
    /// Layer `l` opens a new attention-residual block (spec §4.2).
    pub fn is_block_boundary(&self, l: usize) -> bool {
        l % self.attn_res_block_size == 0
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
