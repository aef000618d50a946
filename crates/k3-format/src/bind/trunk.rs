//! A layer's trunk tensors as one byte run (docs/FORMATS.md#packed-trunk): the unit the trunk packer copies and the
//! streaming store reads with a single pread.

use super::{AttnTensors, FfnTensors, LayerTensors, TensorRef};
use std::fmt;

/// A layer's trunk tensors tile `[start, end)` of one shard file exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrunkRun {
    /// Shard number.
    pub shard: usize,
    /// Absolute offset of the first byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl TrunkRun {
    /// Run length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }
    /// Whether the run is empty.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Why a layer's trunk is not one contiguous run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotContiguous {
    /// Tensors of the layer live in different shards.
    Shards {
        /// Layer index.
        layer: usize,
        /// A tensor in the first shard.
        first: String,
        /// That shard.
        first_shard: usize,
        /// A tensor in another shard.
        other: String,
        /// That shard.
        other_shard: usize,
    },
    /// The span holds bytes that belong to no trunk tensor of this layer.
    Gaps {
        /// Layer index.
        layer: usize,
        /// Shard number.
        shard: usize,
        /// Span start.
        start: u64,
        /// Span end.
        end: u64,
        /// Sum of the trunk tensors' sizes.
        tensor_bytes: u64,
    },
}

impl fmt::Display for NotContiguous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotContiguous::Shards { layer, first, first_shard, other, other_shard } => write!(
                f,
                "layer {layer}: trunk tensor {first:?} is in shard {first_shard} but {other:?} is in shard {other_shard}"
            ),
            NotContiguous::Gaps { layer, shard, start, end, tensor_bytes } => write!(
                f,
                "layer {layer}: trunk tensors span [{start}, {end}) of shard {shard} ({} bytes) but total {tensor_bytes} bytes: {} bytes in between belong to other tensors or padding",
                end - start,
                (end - start).saturating_sub(*tensor_bytes)
            ),
        }
    }
}

impl std::error::Error for NotContiguous {}

impl LayerTensors {
    /// Every trunk tensor, in the upstream binder's request order (docs/MODEL.md#binding-rules).
    pub fn tensors(&self) -> Vec<&TensorRef> {
        let mut v = vec![
            &self.input_layernorm,
            &self.post_attention_layernorm,
            &self.self_attention_res_norm,
            &self.self_attention_res_proj,
            &self.mlp_res_norm,
            &self.mlp_res_proj,
        ];
        match &self.attn {
            AttnTensors::Mla(m) => {
                v.extend([
                    &m.q_a_proj,
                    &m.q_a_layernorm,
                    &m.q_b_proj,
                    &m.kv_a_proj_with_mqa,
                ]);
                v.extend([&m.kv_a_layernorm, &m.kv_b_proj, &m.o_proj]);
                v.extend(m.g_proj.as_ref());
            }
            AttnTensors::Kda(k) => {
                v.extend([&k.q_proj, &k.k_proj, &k.v_proj, &k.g_proj, &k.o_proj]);
                v.extend([
                    &k.q_conv1d,
                    &k.k_conv1d,
                    &k.v_conv1d,
                    &k.f_a_proj,
                    &k.f_b_proj,
                ]);
                v.extend([&k.b_proj, &k.a_log, &k.dt_bias, &k.o_norm]);
            }
        }
        match &self.ffn {
            FfnTensors::Dense(d) => v.extend([&d.gate_proj, &d.up_proj, &d.down_proj]),
            FfnTensors::Moe(m) => {
                v.extend([
                    &m.gate,
                    &m.e_score_correction_bias,
                    &m.routed_expert_down_proj,
                ]);
                v.extend([
                    &m.routed_expert_up_proj,
                    &m.routed_expert_norm,
                    &m.shared_gate_proj,
                ]);
                v.extend([&m.shared_up_proj, &m.shared_down_proj]);
            }
        }
        v
    }

    /// Total bytes of the trunk tensors.
    pub fn trunk_bytes(&self) -> u64 {
        self.tensors().iter().map(|t| t.nbytes).sum()
    }

    /// The layer's trunk as one contiguous byte run in one shard (tensors tiling the span with
    /// no gap), or why it is not one.
    pub fn trunk_run(&self) -> Result<TrunkRun, NotContiguous> {
        let ts = self.tensors();
        let first = ts[0];
        if let Some(other) = ts.iter().find(|t| t.shard != first.shard) {
            return Err(NotContiguous::Shards {
                layer: self.layer,
                first: first.name.clone(),
                first_shard: first.shard,
                other: other.name.clone(),
                other_shard: other.shard,
            });
        }
        let start = ts.iter().map(|t| t.offset).min().unwrap_or(0);
        let end = ts.iter().map(|t| t.end()).max().unwrap_or(0);
        let tensor_bytes: u64 = ts.iter().map(|t| t.nbytes).sum();
        if end - start != tensor_bytes {
            return Err(NotContiguous::Gaps {
                layer: self.layer,
                shard: first.shard,
                start,
                end,
                tensor_bytes,
            });
        }
        Ok(TrunkRun {
            shard: first.shard,
            start,
            end,
        })
    }
}
