//! Kimi K3 as released, sized before it is downloaded (docs/MODELS.md#sizing-the-release):
//! the disk the checkpoint, the packed trunk and a q8 draft trunk take, computed from the
//! released tensor shapes (`k3_format::released::layout`, the same layout the released-
//! geometry tests plan), and the planner sizes of the release.

use crate::EngineError;
use k3_format::{Dtype, K3Config, TensorSpec};
use k3_plan::ModelSizes;
use k3_store::io::align_up;

/// Disk the release takes, bytes.
pub struct ReleaseDisk {
    /// The 96 safetensors shards (headers included).
    pub checkpoint: u64,
    /// `k3 pack`'s trunk.bin: every layer's trunk run, each 4096-aligned.
    pub packed_trunk: u64,
    /// `k3 pack --draft-quant q8`: every trunk matrix but the router gate as per-row int8
    /// with an f32 scale, the rest verbatim (docs/FORMATS.md#draft-trunk).
    pub draft_q8: u64,
}

/// Is `t` a routed expert's tensor (MXFP4 bytes, never in a trunk pack)?
fn is_expert(t: &TensorSpec) -> bool {
    t.dtype == Dtype::U8
}

/// The release's disk needs, from its tensor shapes.
pub fn release_disk() -> Result<ReleaseDisk, EngineError> {
    let cfg = K3Config::released();
    let bad = |e: k3_format::FormatError| EngineError::Invalid(format!("released layout: {e}"));
    let mut checkpoint = 0;
    for (_, specs) in k3_format::released::layout(&cfg) {
        let (header, data) = k3_format::writer::encode_header(&specs).map_err(bad)?;
        checkpoint += header.len() as u64 + data;
    }
    let packed_trunk = ModelSizes::k3_estimate()
        .layer_run_bytes
        .iter()
        .map(|&b| align_up(b))
        .sum();
    // Groups: [globals, layer 0, layer 1, …]; only the layers' trunk tensors are drafted.
    let draft_q8 = k3_format::bind::model_tensors(&cfg)
        .iter()
        .skip(1)
        .map(|layer| {
            let run: u64 = layer
                .iter()
                .filter(|t| !is_expert(t))
                .map(|t| draft_tensor_bytes(t).next_multiple_of(64))
                .sum();
            align_up(run)
        })
        .sum();
    Ok(ReleaseDisk {
        checkpoint,
        packed_trunk,
        draft_q8,
    })
}

/// A trunk tensor's bytes in a q8 draft pack.
fn draft_tensor_bytes(t: &TensorSpec) -> u64 {
    let router = t.name.ends_with("block_sparse_moe.gate.weight");
    let matrix = t.dtype == Dtype::BF16 && t.shape.len() == 2 && t.shape.iter().all(|&d| d > 1);
    let q8 = k3_format::pack::quantized_bytes(k3_format::pack::PackDtype::I8R, &t.shape);
    match (matrix && !router, q8) {
        (true, Some(b)) => b,
        _ => t.nbytes().unwrap_or(0),
    }
}

/// The release's planner sizes and its MoE layer count (92: every layer but the dense first).
pub fn released_sizes() -> (ModelSizes, f64) {
    let cfg = K3Config::released();
    let moe = cfg
        .num_hidden_layers
        .saturating_sub(cfg.first_k_dense_replace) as f64;
    (ModelSizes::k3_estimate(), moe)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented figures: a 1.56 TB checkpoint (docs/MODEL.md#real-model-sizing) and a
    /// 108.81 GB packed trunk (docs/QUICKSTART.md). A q8 draft is half the bf16 matrices plus a
    /// 4-byte scale per row, with the verbatim router gates, vectors and f32 tensors: just over
    /// half the trunk (docs/PERFORMANCE.md#hybrid-drafting measured 0.50× on the bench model).
    #[test]
    fn release_disk_matches_the_documented_sizes() {
        let Ok(d) = release_disk() else {
            panic!("the released layout does not encode")
        };
        let tb = d.checkpoint as f64 / 1e12;
        assert!((1.55..1.57).contains(&tb), "checkpoint {tb} TB");
        assert_eq!((d.packed_trunk as f64 / 1e7).round() / 100.0, 108.81);
        let ratio = d.draft_q8 as f64 / d.packed_trunk as f64;
        assert!((0.50..0.52).contains(&ratio), "q8 draft / trunk = {ratio}");
    }
}
