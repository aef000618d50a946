//! The on-disk `trunk.json` document and the config fingerprint.

use crate::config::K3Config;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `trunk.json`.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct PackDoc {
    /// Alignment of every `file_off`.
    pub align: u64,
    /// Always [`super::FORMAT_NAME`].
    pub format: String,
    /// Always [`super::FORMAT_VERSION`].
    pub version: u32,
    /// `"q8"` or `"mxfp4"` for a draft trunk (docs/FORMATS.md#draft-trunk); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<String>,
    /// The codec of a compressed pack (version 2, docs/FORMATS.md#compressed-trunk); absent
    /// in a plain one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codec: Option<String>,
    /// Provenance.
    pub source: SourceDoc,
    /// One entry per layer, in order.
    pub layers: Vec<LayerDoc>,
}

/// `"source"` of `trunk.json`.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SourceDoc {
    /// Shape-determining config values.
    pub config: ConfigFingerprint,
    /// Shard files of the source checkpoint.
    pub shards: Vec<SourceShard>,
}

/// One entry of `"layers"`.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LayerDoc {
    /// Layer index; must equal the entry's position.
    pub layer: usize,
    /// Offset of the run in `trunk.bin`.
    pub file_off: u64,
    /// Run length (decoded, in a compressed pack).
    pub nbytes: u64,
    /// Bytes the run takes in `trunk.bin` in a compressed pack; absent in a plain one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<u64>,
    /// `"<algo>:<hex>"`; absent in a pack written by upstream's packer, which
    /// [`super::adopt_trunk_pack`] fills in (docs/FORMATS.md#adopting-an-upstream-pack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// Shard file name the run came from.
    pub source_shard: String,
    /// Absolute offset of the run in that shard.
    pub source_offset: u64,
    /// Tensors by full name.
    pub tensors: BTreeMap<String, TensorDoc>,
}

/// One entry of a layer's `"tensors"`.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct TensorDoc {
    /// Offset within the run.
    pub off: u64,
    /// Byte length.
    pub nbytes: u64,
    /// Dtype spelling (`"BF16"`, `"F32"`, …, `"I8R"`).
    pub dtype: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Where and how the tensor is stored in a compressed pack; absent in a plain one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<StoredDoc>,
}

/// A tensor's `"stored"` entry in a compressed pack: raw bytes at `off` of the stored run, or
/// (with `lengths`) bf16 chunks coded with the Huffman code of those exponent code lengths.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StoredDoc {
    /// Offset of the raw bytes within the stored run (raw tensors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off: Option<u64>,
    /// 256 hex digits: the exponent code length of each byte value (coded tensors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lengths: Option<String>,
    /// Values per chunk (the last chunk holds the rest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_values: Option<u64>,
    /// `[offset within the stored run, stored length, "xxh3-64:<hex>" of the stored bytes]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<Vec<(u64, u64, String)>>,
}

/// `trunk.json` as upstream's packer writes it (docs/FORMATS.md#adopting-an-upstream-pack):
/// only the fields it always writes; any others (`n_layers`, `layer`, `shard`, `shape`, k3's
/// own fields, …) are ignored, since none can be relied on.
#[derive(Debug, Deserialize)]
pub(super) struct UpstreamDoc {
    /// Alignment of every `file_off`.
    pub align: u64,
    /// One entry per layer, in order.
    pub layers: Vec<UpstreamLayer>,
}

/// One entry of upstream's `"layers"`.
#[derive(Debug, Deserialize)]
pub(super) struct UpstreamLayer {
    /// Offset of the run in `trunk.bin`.
    pub file_off: u64,
    /// The run's length, rounded up to 4096 by upstream's packer (or exact).
    pub nbytes: u64,
    /// Tensors by full name.
    pub tensors: BTreeMap<String, UpstreamTensor>,
}

/// One entry of an upstream layer's `"tensors"`.
#[derive(Debug, Deserialize)]
pub(super) struct UpstreamTensor {
    /// Offset within the run.
    pub off: u64,
    /// Byte length.
    pub nbytes: u64,
    /// Dtype spelling (`"BF16"`, `"F32"`, …).
    pub dtype: String,
}

/// One shard file of the checkpoint a pack was made from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceShard {
    /// File name (no directory).
    pub file: String,
    /// File length in bytes.
    pub bytes: u64,
}

/// The config values that determine the trunk's tensor set and shapes: two checkpoints with
/// different fingerprints cannot share a pack. Each field is the [`K3Config`] field of the same
/// name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigFingerprint {
    /// Hidden width E.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Embedding rows V.
    pub vocab_size: usize,
    /// KDA heads.
    pub kda_num_heads: usize,
    /// KDA head width.
    pub kda_head_dim: usize,
    /// KDA short-convolution taps.
    pub short_conv_kernel_size: usize,
    /// MLA heads.
    pub num_attention_heads: usize,
    /// MLA query low rank.
    pub q_lora_rank: usize,
    /// MLA key/value latent width.
    pub kv_lora_rank: usize,
    /// MLA non-positional query/key head width.
    pub qk_nope_head_dim: usize,
    /// MLA rope-slot width.
    pub qk_rope_head_dim: usize,
    /// MLA value head width.
    pub v_head_dim: usize,
    /// MLA output gate present.
    pub mla_use_output_gate: bool,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Shared experts (stored fused).
    pub num_shared_experts: usize,
    /// LatentMoE latent width.
    pub routed_expert_hidden_size: usize,
    /// Routed expert intermediate width.
    pub moe_intermediate_size: usize,
    /// Layers below this use a dense MLP.
    pub first_k_dense_replace: usize,
    /// Dense MLP intermediate width.
    pub intermediate_size: usize,
    /// One-based indices of the MLA layers.
    pub full_attn_layers: Vec<usize>,
}

impl ConfigFingerprint {
    /// The fingerprint of `cfg`.
    pub fn from_config(cfg: &K3Config) -> ConfigFingerprint {
        ConfigFingerprint {
            hidden_size: cfg.hidden_size,
            num_hidden_layers: cfg.num_hidden_layers,
            vocab_size: cfg.vocab_size,
            kda_num_heads: cfg.kda_num_heads,
            kda_head_dim: cfg.kda_head_dim,
            short_conv_kernel_size: cfg.short_conv_kernel_size,
            num_attention_heads: cfg.num_attention_heads,
            q_lora_rank: cfg.q_lora_rank,
            kv_lora_rank: cfg.kv_lora_rank,
            qk_nope_head_dim: cfg.qk_nope_head_dim,
            qk_rope_head_dim: cfg.qk_rope_head_dim,
            v_head_dim: cfg.v_head_dim,
            mla_use_output_gate: cfg.mla_use_output_gate,
            num_experts: cfg.num_experts,
            num_shared_experts: cfg.num_shared_experts,
            routed_expert_hidden_size: cfg.routed_expert_hidden_size,
            moe_intermediate_size: cfg.moe_intermediate_size,
            first_k_dense_replace: cfg.first_k_dense_replace,
            intermediate_size: cfg.intermediate_size,
            full_attn_layers: cfg.full_attn_layers.clone(),
        }
    }

    /// The first differing field as `(name, self's value, other's value)`, or `None` if equal.
    pub fn first_difference(&self, other: &ConfigFingerprint) -> Option<(String, String, String)> {
        let (a, b) = (serde_json::to_value(self), serde_json::to_value(other));
        let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (a, b) else {
            return (self != other).then(|| ("config".into(), "?".into(), "?".into()));
        };
        a.iter().find_map(|(k, va)| {
            let vb = b.get(k).cloned().unwrap_or_default();
            (*va != vb).then(|| (k.clone(), va.to_string(), vb.to_string()))
        })
    }
}
