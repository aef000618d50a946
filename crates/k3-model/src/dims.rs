//! [`Dims`]: the numeric view of a [`K3Config`] that every op reads (widths, epsilons, betas,
//! layer map), validated once.

use crate::error::ModelError;
use k3_format::K3Config;

/// Most attention-residual sources one aggregation may see (block snapshots + the running
/// prefix). The released model needs 9; the source list lives on the stack.
pub const MAX_SOURCES: usize = 64;

/// What kind of token mixer a layer has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Kimi Delta Attention; the value is the index among KDA layers (its state slot).
    Kda(usize),
    /// Gated MLA; the value is the index among MLA layers (its latent-KV slot).
    Mla(usize),
}

/// Every width and constant of the model, derived from the config (symbols of docs/MODEL.md#tensor-symbols).
#[derive(Clone, Debug, PartialEq)]
pub struct Dims {
    /// E: hidden width.
    pub hidden: usize,
    /// Decoder layers.
    pub n_layers: usize,
    /// V: vocabulary (embedding / lm_head rows).
    pub vocab: usize,
    /// RMSNorm epsilon (all norms of the model).
    pub eps: f64,
    /// Epsilon of MLA's `q_a_layernorm` / `kv_a_layernorm`: the C engine's `rms_norm_eps`
    /// (docs/MODEL.md#uncertainties item 1: HF builds them with 1e-6; kept separate so it can be switched).
    pub mla_norm_eps: f64,
    /// KDA heads.
    pub kda_heads: usize,
    /// KDA head width D (d_k = d_v).
    pub kda_dim: usize,
    /// Short-conv kernel width K.
    pub conv_k: usize,
    /// KDA decay lower bound (−5).
    pub gate_lb: f32,
    /// MLA heads.
    pub mla_heads: usize,
    /// MLA query low rank.
    pub q_lora: usize,
    /// MLA latent width (kv_lora_rank).
    pub kv_lora: usize,
    /// MLA per-head no-position width.
    pub nope: usize,
    /// MLA shared rope-slot width (never rotated).
    pub rope: usize,
    /// MLA per-head value width.
    pub v_head: usize,
    /// MLA output gate present.
    pub mla_gate: bool,
    /// Routed experts per MoE layer.
    pub n_experts: usize,
    /// Experts chosen per token.
    pub topk: usize,
    /// L: latent width of the routed experts.
    pub latent: usize,
    /// I: routed expert intermediate width.
    pub moe_inter: usize,
    /// SI: fused shared-expert intermediate width (moe_inter · n_shared).
    pub shared_inter: usize,
    /// Scale applied to the routing weights.
    pub routed_scale: f32,
    /// Renormalise the top-k weights.
    pub renorm: bool,
    /// RMSNorm on the aggregated latent.
    pub latent_norm: bool,
    /// DI: dense MLP width.
    pub dense_inter: usize,
    /// Attention-residual block size.
    pub block: usize,
    /// SiTU-GLU beta1 (gate cap).
    pub situ_b1: f32,
    /// SiTU-GLU beta2 (linear cap).
    pub situ_b2: f32,
    /// Per layer: token mixer kind and its state slot.
    pub kinds: Vec<LayerKind>,
    /// Per layer: dense MLP (`true`) or MoE.
    pub dense: Vec<bool>,
    /// Maximum block snapshots per token (`n_layers / block + 2`).
    pub max_blocks: usize,
}

impl Dims {
    /// Derives and validates the dimensions; refuses configs this build cannot run.
    pub fn new(c: &K3Config) -> Result<Dims, ModelError> {
        let bad = |m: String| Err(ModelError::ConfigUnsupported(m));
        if c.attn_res_block_size == 0 || c.short_conv_kernel_size == 0 {
            return bad("attn_res_block_size and short_conv_kernel_size must be ≥ 1".into());
        }
        if c.num_experts_per_token == 0 || c.num_experts_per_token > c.num_experts {
            return bad(format!(
                "selects {} of {} experts",
                c.num_experts_per_token, c.num_experts
            ));
        }
        if c.hidden_size == 0 || c.vocab_size == 0 || c.num_hidden_layers == 0 {
            return bad("non-positive hidden/vocab/layers".into());
        }
        let max_blocks = c.num_hidden_layers / c.attn_res_block_size + 2;
        if max_blocks + 1 > MAX_SOURCES {
            return bad(format!(
                "{max_blocks} residual blocks exceed this build's limit of {}",
                MAX_SOURCES - 1
            ));
        }
        let (mut n_kda, mut n_mla) = (0, 0);
        let kinds = (0..c.num_hidden_layers)
            .map(|l| {
                if c.is_mla(l) {
                    n_mla += 1;
                    LayerKind::Mla(n_mla - 1)
                } else {
                    n_kda += 1;
                    LayerKind::Kda(n_kda - 1)
                }
            })
            .collect();
        Ok(Dims {
            hidden: c.hidden_size,
            n_layers: c.num_hidden_layers,
            vocab: c.vocab_size,
            eps: c.rms_norm_eps,
            mla_norm_eps: c.rms_norm_eps,
            kda_heads: c.kda_num_heads,
            kda_dim: c.kda_head_dim,
            conv_k: c.short_conv_kernel_size,
            gate_lb: c.gate_lower_bound,
            mla_heads: c.num_attention_heads,
            q_lora: c.q_lora_rank,
            kv_lora: c.kv_lora_rank,
            nope: c.qk_nope_head_dim,
            rope: c.qk_rope_head_dim,
            v_head: c.v_head_dim,
            mla_gate: c.mla_use_output_gate,
            n_experts: c.num_experts,
            topk: c.num_experts_per_token,
            latent: c.routed_expert_hidden_size,
            moe_inter: c.moe_intermediate_size,
            shared_inter: c.shared_inter(),
            routed_scale: c.routed_scaling_factor,
            renorm: c.moe_renormalize,
            latent_norm: c.latent_moe_use_norm,
            dense_inter: c.intermediate_size,
            block: c.attn_res_block_size,
            situ_b1: c.activation_situ_beta,
            situ_b2: c.activation_situ_linear_beta,
            kinds,
            dense: (0..c.num_hidden_layers).map(|l| c.is_dense(l)).collect(),
            max_blocks,
        })
    }

    /// P: KDA projection width (heads · D).
    pub fn kda_proj(&self) -> usize {
        self.kda_heads * self.kda_dim
    }
    /// Query/key head width of MLA (nope + rope).
    pub fn qk_head(&self) -> usize {
        self.nope + self.rope
    }
    /// Floats per position of the latent KV cache (kv_lora + rope; 576 released).
    pub fn kv_row(&self) -> usize {
        self.kv_lora + self.rope
    }
    /// Number of KDA layers.
    pub fn n_kda(&self) -> usize {
        self.kinds
            .iter()
            .filter(|k| matches!(k, LayerKind::Kda(_)))
            .count()
    }
    /// Number of MLA layers.
    pub fn n_mla(&self) -> usize {
        self.kinds.len() - self.n_kda()
    }
    /// Layer `l` opens a residual block (snapshot + clear).
    pub fn is_boundary(&self, l: usize) -> bool {
        l.is_multiple_of(self.block)
    }
}
