//! Tensor binding by released names (docs/MODEL.md#checkpoint-tensor-inventory): every trunk tensor of every layer and the
//! model-level tensors, checked for shape and dtype against the config, plus a locator for the
//! routed MXFP4 experts (docs/MODEL.md#routed-experts).
//!
//! Dtype rules: matrices are BF16 or F32; vectors (norm gains, res_proj rows, convolution taps,
//! `A_log`, `dt_bias`, biases) are BF16, F16 or F32. The binding holds no borrow: each tensor is
//! a [`TensorRef`] (shard number, absolute file offset, byte length, dtype, shape), so it can be
//! kept while shards are read through other means (pread, O_DIRECT, a packed trunk).

mod error;
mod expert;
mod layer;
mod names;
mod trunk;

pub use error::BindError;
pub use expert::{locate_expert, ExpertDims, ExpertLocation, ExpertLocator, EXPERT_PARTS};
pub use names::model_tensors;
pub use trunk::{NotContiguous, TrunkRun};

use crate::config::K3Config;
use crate::dtype::Dtype;
use crate::index::Checkpoint;
use crate::view::TensorView;

/// Prefix of every language-model tensor.
pub const LM_PREFIX: &str = "language_model.model.";
/// Name of the output head.
pub const LM_HEAD: &str = "language_model.lm_head.weight";

/// Where one bound tensor's bytes are (no borrow of the checkpoint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRef {
    /// Exact tensor name.
    pub name: String,
    /// Shard number in the [`Checkpoint`].
    pub shard: usize,
    /// Absolute offset of the first byte in the shard file.
    pub offset: u64,
    /// Byte length.
    pub nbytes: u64,
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Vec<usize>,
}

impl TensorRef {
    /// Captures a view's location.
    pub fn from_view(v: &TensorView<'_>) -> TensorRef {
        TensorRef {
            name: v.name.to_string(),
            shard: v.shard,
            offset: v.offset,
            nbytes: v.nbytes(),
            dtype: v.dtype,
            shape: v.shape.to_vec(),
        }
    }

    /// One past the last byte (absolute).
    pub fn end(&self) -> u64 {
        self.offset + self.nbytes
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The bytes, from the checkpoint this reference was bound from.
    pub fn view<'c>(&self, ck: &'c Checkpoint) -> Option<TensorView<'c>> {
        ck.get(&self.name)
    }
}

/// Model-level tensors (docs/MODEL.md#model-level-tensors).
#[derive(Clone, Debug)]
pub struct GlobalTensors {
    /// `[V, E]` token embedding.
    pub embed_tokens: TensorRef,
    /// `[E]` final norm.
    pub norm: TensorRef,
    /// `[E]` output aggregator norm.
    pub output_attn_res_norm: TensorRef,
    /// `[1, E]` (or `[E]`) output aggregator projection.
    pub output_attn_res_proj: TensorRef,
    /// `[V, E]` output head (not tied).
    pub lm_head: TensorRef,
}

/// KDA attention tensors (`self_attn.` prefix).
#[derive(Clone, Debug)]
pub struct KdaTensors {
    /// `[P, E]` query projection (P = kda heads · head_dim).
    pub q_proj: TensorRef,
    /// `[P, E]` key projection.
    pub k_proj: TensorRef,
    /// `[P, E]` value projection.
    pub v_proj: TensorRef,
    /// `[P, E]` full-rank output gate.
    pub g_proj: TensorRef,
    /// `[E, P]` output projection.
    pub o_proj: TensorRef,
    /// `[P, 1, K]` (or `[P, K]`) depthwise short-conv taps on q, oldest → newest.
    pub q_conv1d: TensorRef,
    /// `[P, 1, K]` (or `[P, K]`) taps on k.
    pub k_conv1d: TensorRef,
    /// `[P, 1, K]` (or `[P, K]`) taps on v.
    pub v_conv1d: TensorRef,
    /// `[D, E]` decay low-rank A.
    pub f_a_proj: TensorRef,
    /// `[P, D]` decay low-rank B.
    pub f_b_proj: TensorRef,
    /// `[H, E]` beta, one scalar per head.
    pub b_proj: TensorRef,
    /// `[D]` with D ≥ heads; only the first `kda_num_heads` values are used.
    pub a_log: TensorRef,
    /// `[P]` decay bias per (head, channel).
    pub dt_bias: TensorRef,
    /// `[D]` head-wise RMSNorm gain shared by all heads.
    pub o_norm: TensorRef,
}

/// Gated MLA attention tensors (`self_attn.` prefix).
#[derive(Clone, Debug)]
pub struct MlaTensors {
    /// `[q_lora, E]`.
    pub q_a_proj: TensorRef,
    /// `[q_lora]`.
    pub q_a_layernorm: TensorRef,
    /// `[H · (nope + rope), q_lora]`.
    pub q_b_proj: TensorRef,
    /// `[kv_lora + rope, E]`.
    pub kv_a_proj_with_mqa: TensorRef,
    /// `[kv_lora]`.
    pub kv_a_layernorm: TensorRef,
    /// `[H · (nope + v_head), kv_lora]`.
    pub kv_b_proj: TensorRef,
    /// `[E, H · v_head]`.
    pub o_proj: TensorRef,
    /// Present iff `mla_use_output_gate`.
    pub g_proj: Option<TensorRef>,
}

/// The attention of one layer.
// One value per layer (93 in all): boxing the larger variant would only add indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum AttnTensors {
    /// Kimi Delta Attention.
    Kda(KdaTensors),
    /// Gated MLA (NoPE).
    Mla(MlaTensors),
}

/// Dense SiTU-GLU MLP (`mlp.` prefix).
#[derive(Clone, Debug)]
pub struct DenseTensors {
    /// `[intermediate, E]`.
    pub gate_proj: TensorRef,
    /// `[intermediate, E]`.
    pub up_proj: TensorRef,
    /// `[E, intermediate]`.
    pub down_proj: TensorRef,
}

/// LatentMoE trunk tensors (`block_sparse_moe.` prefix); routed experts are located separately.
#[derive(Clone, Debug)]
pub struct MoeTensors {
    /// `[n_experts, E]` router.
    pub gate: TensorRef,
    /// `[n_experts]` selection-only bias.
    pub e_score_correction_bias: TensorRef,
    /// `[latent, E]`.
    pub routed_expert_down_proj: TensorRef,
    /// `[latent]` norm of the aggregated latent.
    pub routed_expert_norm: TensorRef,
    /// `[E, latent]`.
    pub routed_expert_up_proj: TensorRef,
    /// `[moe_inter · n_shared, E]` (shared experts stored fused).
    pub shared_gate_proj: TensorRef,
    /// `[moe_inter · n_shared, E]`.
    pub shared_up_proj: TensorRef,
    /// `[E, moe_inter · n_shared]`.
    pub shared_down_proj: TensorRef,
}

/// The feed-forward of one layer.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum FfnTensors {
    /// Dense MLP (layers `< first_k_dense_replace`).
    Dense(DenseTensors),
    /// LatentMoE.
    Moe(MoeTensors),
}

/// Every trunk (non-expert) tensor of one decoder layer.
#[derive(Clone, Debug)]
pub struct LayerTensors {
    /// Zero-based layer index.
    pub layer: usize,
    /// `[E]` pre-attention norm.
    pub input_layernorm: TensorRef,
    /// `[E]` pre-FFN norm.
    pub post_attention_layernorm: TensorRef,
    /// `[E]` attention-residual key norm.
    pub self_attention_res_norm: TensorRef,
    /// `[1, E]` (or `[E]`) attention-residual query row.
    pub self_attention_res_proj: TensorRef,
    /// `[E]` FFN-residual key norm.
    pub mlp_res_norm: TensorRef,
    /// `[1, E]` (or `[E]`) FFN-residual query row.
    pub mlp_res_proj: TensorRef,
    /// KDA or MLA tensors.
    pub attn: AttnTensors,
    /// Dense MLP or MoE trunk tensors.
    pub ffn: FfnTensors,
}

/// Every bound tensor of the model.
#[derive(Clone, Debug)]
pub struct ModelBinding {
    /// Model-level tensors.
    pub globals: GlobalTensors,
    /// Layers `0..num_hidden_layers`, in order.
    pub layers: Vec<LayerTensors>,
    /// Routed experts of every MoE layer, validated at bind time.
    pub experts: ExpertLocator,
}

impl ModelBinding {
    /// Byte location of routed expert `e` of layer `layer`.
    pub fn expert(&self, layer: usize, e: usize) -> Result<ExpertLocation, BindError> {
        self.experts.locate(layer, e)
    }
}

/// Binds every model-level and per-layer tensor and validates every routed expert.
pub fn bind_model(ck: &Checkpoint, cfg: &K3Config) -> Result<ModelBinding, BindError> {
    let b = layer::Binder {
        ck,
        cfg,
        sink: None,
    };
    let globals = b.globals()?;
    let layers = (0..cfg.num_hidden_layers)
        .map(|l| b.layer(l))
        .collect::<Result<Vec<_>, _>>()?;
    let experts = ExpertLocator::build(ck, cfg)?;
    Ok(ModelBinding {
        globals,
        layers,
        experts,
    })
}

/// Every problem binding would report, not just the first: each model-level and trunk tensor
/// checked by the same rules as [`bind_model`], then every routed expert with
/// [`locate_expert`]. Empty when [`bind_model`] succeeds.
pub fn bind_problems(ck: &Checkpoint, cfg: &K3Config) -> Vec<BindError> {
    let sink = std::cell::RefCell::new(Vec::new());
    let b = layer::Binder {
        ck,
        cfg,
        sink: Some(&sink),
    };
    // With a sink the binder records problems and never returns them.
    let _ = b.globals();
    for l in 0..cfg.num_hidden_layers {
        let _ = b.layer(l);
    }
    let mut out = sink.into_inner();
    let dims = ExpertDims::from_config(cfg);
    for l in cfg.first_k_dense_replace..cfg.num_hidden_layers {
        for e in 0..cfg.num_experts {
            if let Err(err) = locate_expert(ck, l, e, Some(dims)) {
                out.push(err);
            }
        }
    }
    out
}
