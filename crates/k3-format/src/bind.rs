//! Tensor binding by released names (spec §2): every trunk tensor of every layer and the
//! model-level tensors, checked for shape and dtype against the config, plus a locator for the
//! routed MXFP4 experts (spec §2.3).
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

/// Model-level tensors (spec §2.1).
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
#[allow(missing_docs)]
pub struct KdaTensors {
    pub q_proj: TensorRef,
    pub k_proj: TensorRef,
    pub v_proj: TensorRef,
    pub g_proj: TensorRef,
    pub o_proj: TensorRef,
    pub q_conv1d: TensorRef,
    pub k_conv1d: TensorRef,
    pub v_conv1d: TensorRef,
    pub f_a_proj: TensorRef,
    pub f_b_proj: TensorRef,
    pub b_proj: TensorRef,
    /// `[D]` with D ≥ heads; only the first `kda_num_heads` values are used.
    pub a_log: TensorRef,
    pub dt_bias: TensorRef,
    pub o_norm: TensorRef,
}

/// Gated MLA attention tensors (`self_attn.` prefix).
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub struct MlaTensors {
    pub q_a_proj: TensorRef,
    pub q_a_layernorm: TensorRef,
    pub q_b_proj: TensorRef,
    pub kv_a_proj_with_mqa: TensorRef,
    pub kv_a_layernorm: TensorRef,
    pub kv_b_proj: TensorRef,
    pub o_proj: TensorRef,
    /// Present iff `mla_use_output_gate`.
    pub g_proj: Option<TensorRef>,
}

/// The attention of one layer.
#[derive(Clone, Debug)]
pub enum AttnTensors {
    /// Kimi Delta Attention.
    Kda(KdaTensors),
    /// Gated MLA (NoPE).
    Mla(MlaTensors),
}

/// Dense SiTU-GLU MLP (`mlp.` prefix).
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub struct DenseTensors {
    pub gate_proj: TensorRef,
    pub up_proj: TensorRef,
    pub down_proj: TensorRef,
}

/// LatentMoE trunk tensors (`block_sparse_moe.` prefix); routed experts are located separately.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub struct MoeTensors {
    pub gate: TensorRef,
    pub e_score_correction_bias: TensorRef,
    pub routed_expert_down_proj: TensorRef,
    pub routed_expert_norm: TensorRef,
    pub routed_expert_up_proj: TensorRef,
    pub shared_gate_proj: TensorRef,
    pub shared_up_proj: TensorRef,
    pub shared_down_proj: TensorRef,
}

/// The feed-forward of one layer.
#[derive(Clone, Debug)]
pub enum FfnTensors {
    /// Dense MLP (layers `< first_k_dense_replace`).
    Dense(DenseTensors),
    /// LatentMoE.
    Moe(MoeTensors),
}

/// Every trunk (non-expert) tensor of one decoder layer.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub struct LayerTensors {
    /// Zero-based layer index.
    pub layer: usize,
    pub input_layernorm: TensorRef,
    pub post_attention_layernorm: TensorRef,
    pub self_attention_res_norm: TensorRef,
    pub self_attention_res_proj: TensorRef,
    pub mlp_res_norm: TensorRef,
    pub mlp_res_proj: TensorRef,
    pub attn: AttnTensors,
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
    let b = layer::Binder { ck, cfg };
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
