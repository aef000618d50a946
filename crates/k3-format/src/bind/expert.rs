//! Routed MXFP4 experts (docs/MODEL.md#routed-experts): six U8 tensors per expert, located as one contiguous read
//! when they tile a span, else six reads assembled into the canonical layout.

use super::{BindError, LM_PREFIX};
use crate::config::K3Config;
use crate::dtype::Dtype;
use crate::index::Checkpoint;

/// The six tensors of an expert, in canonical order.
pub const EXPERT_PARTS: [&str; 6] = [
    "w1.weight_packed",
    "w1.weight_scale",
    "w2.weight_packed",
    "w2.weight_scale",
    "w3.weight_packed",
    "w3.weight_scale",
];

/// Elements per E8M0 scale.
const GROUP: usize = 32;

/// Expected expert geometry from the config: w1/w3 are `[inter, latent]`, w2 `[latent, inter]`
/// (logical; packed columns are half, scale columns a 32nd).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertDims {
    /// `moe_intermediate_size`.
    pub inter: usize,
    /// `routed_expert_hidden_size`.
    pub latent: usize,
}

impl ExpertDims {
    /// From the config.
    pub fn from_config(cfg: &K3Config) -> ExpertDims {
        ExpertDims {
            inter: cfg.moe_intermediate_size,
            latent: cfg.routed_expert_hidden_size,
        }
    }

    /// Expected packed shape of w1, w2, w3.
    fn packed(self, w: usize) -> [usize; 2] {
        match w {
            1 => [self.latent, self.inter / 2],
            _ => [self.inter, self.latent / 2],
        }
    }
}

/// Where one expert's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertLocation {
    /// Layer (zero-based).
    pub layer: usize,
    /// Expert index.
    pub expert: usize,
    /// Shard number.
    pub shard: usize,
    /// Absolute `(offset, len)` reads; concatenated in order they form the expert buffer.
    /// One read when the six tensors tile a span.
    pub reads: Vec<(u64, u64)>,
    /// `(offset within the buffer, len)` of w1p, w1s, w2p, w2s, w3p, w3s.
    pub parts: [(u64, u64); 6],
    /// Shapes `[rows, cols]` of the six tensors as stored (U8).
    pub shapes: [[usize; 2]; 6],
    /// Buffer size: the sum of the six tensors.
    pub total_bytes: u64,
}

impl ExpertLocation {
    /// Whether one read fetches the expert.
    pub fn is_contiguous(&self) -> bool {
        self.reads.len() == 1
    }
}

fn name(layer: usize, e: usize, part: &str) -> String {
    format!("{LM_PREFIX}layers.{layer}.block_sparse_moe.experts.{e}.{part}")
}

/// Locates and validates expert `e` of `layer`: all six tensors present, U8, 2-D, packed rows
/// == scale rows, group size 32, all in one shard, and (when `dims` is given) packed shapes
/// matching the config.
pub fn locate_expert(
    ck: &Checkpoint,
    layer: usize,
    e: usize,
    dims: Option<ExpertDims>,
) -> Result<ExpertLocation, BindError> {
    let p = find_parts(ck, layer, e, dims)?;
    Ok(layout(layer, e, p.shard, p.offs, p.shapes))
}

/// The validated six tensors of one expert.
struct Parts {
    shard: usize,
    offs: [(u64, u64); 6],
    shapes: [[usize; 2]; 6],
}

/// One looked-up part: name, shard, offset, length, shape.
type Found = (String, usize, u64, u64, [usize; 2]);

fn find_parts(
    ck: &Checkpoint,
    layer: usize,
    e: usize,
    dims: Option<ExpertDims>,
) -> Result<Parts, BindError> {
    let mut found: Vec<Found> = Vec::with_capacity(6);
    for part in EXPERT_PARTS {
        let n = name(layer, e, part);
        let Some(v) = ck.get(&n) else {
            return Err(BindError::Missing {
                tensor: n,
                count: ck.len(),
            });
        };
        if v.dtype != Dtype::U8 {
            return Err(BindError::Dtype {
                tensor: n,
                expected: "U8 (MXFP4)",
                found: v.dtype,
            });
        }
        let &[rows, cols] = v.shape else {
            return Err(BindError::Shape {
                tensor: n,
                expected: "a 2-D [rows, cols] U8 matrix".into(),
                found: v.shape.to_vec(),
            });
        };
        found.push((n, v.shard, v.offset, v.nbytes(), [rows, cols]));
    }
    for w in 0..3 {
        check_pair(&found[2 * w], &found[2 * w + 1], dims.map(|d| d.packed(w)))?;
    }
    let shard = found[0].1;
    if let Some(other) = found.iter().find(|f| f.1 != shard) {
        let paths = ck.shards();
        return Err(BindError::ExpertShards {
            layer,
            expert: e,
            first: found[0].0.clone(),
            first_shard: paths[shard].path().to_path_buf(),
            other: other.0.clone(),
            other_shard: paths[other.1].path().to_path_buf(),
        });
    }
    Ok(Parts {
        shard,
        offs: std::array::from_fn(|i| (found[i].2, found[i].3)),
        shapes: std::array::from_fn(|i| found[i].4),
    })
}

/// Packed/scale pair rules, then the config shape of the packed tensor.
fn check_pair(p: &Found, s: &Found, want: Option<[usize; 2]>) -> Result<(), BindError> {
    let ([pr, pc], [sr, sc]) = (p.4, s.4);
    if pr != sr {
        return Err(BindError::ExpertRows {
            packed: p.0.clone(),
            packed_rows: pr,
            scale: s.0.clone(),
            scale_rows: sr,
        });
    }
    let logical = pc.saturating_mul(2);
    if sc.checked_mul(GROUP) != Some(logical) {
        let group = if sc == 0 {
            "undefined (0 scale columns)".to_string()
        } else {
            fmt_ratio(logical, sc)
        };
        return Err(BindError::ExpertGroup {
            packed: p.0.clone(),
            packed_cols: pc,
            logical,
            scale: s.0.clone(),
            scale_cols: sc,
            group,
        });
    }
    if let Some(w) = want {
        if p.4 != w {
            return Err(BindError::Shape {
                tensor: p.0.clone(),
                expected: format!("{w:?} from moe_intermediate_size / routed_expert_hidden_size"),
                found: p.4.to_vec(),
            });
        }
    }
    Ok(())
}

fn fmt_ratio(a: usize, b: usize) -> String {
    if a.is_multiple_of(b) {
        (a / b).to_string()
    } else {
        format!("{:.3}", a as f64 / b as f64)
    }
}

/// One read when the tensors tile `[lo, hi)`, else six reads in canonical order.
fn layout(
    layer: usize,
    expert: usize,
    shard: usize,
    offs: [(u64, u64); 6],
    shapes: [[usize; 2]; 6],
) -> ExpertLocation {
    let lo = offs.iter().map(|o| o.0).min().unwrap_or(0);
    let hi = offs.iter().map(|o| o.0 + o.1).max().unwrap_or(0);
    let total: u64 = offs.iter().map(|o| o.1).sum();
    let (reads, parts) = if hi - lo == total {
        (vec![(lo, total)], offs.map(|(o, n)| (o - lo, n)))
    } else {
        let mut at = 0;
        let parts = offs.map(|(_, n)| {
            at += n;
            (at - n, n)
        });
        (offs.to_vec(), parts)
    };
    ExpertLocation {
        layer,
        expert,
        shard,
        reads,
        parts,
        shapes,
        total_bytes: total,
    }
}

/// Compact, validated table of every routed expert of a model (82,432 at real scale).
#[derive(Clone, Debug)]
pub struct ExpertLocator {
    first_layer: usize,
    n_layers: usize,
    n_experts: usize,
    shapes: [[usize; 2]; 6],
    lens: [u64; 6],
    /// Per expert: shard and the six absolute offsets.
    slots: Vec<(u16, [u64; 6])>,
}

impl ExpertLocator {
    /// Locates and validates every expert of layers `first_k_dense_replace..num_hidden_layers`.
    pub fn build(ck: &Checkpoint, cfg: &K3Config) -> Result<ExpertLocator, BindError> {
        let dims = ExpertDims::from_config(cfg);
        let (first, n_layers, n_experts) = (
            cfg.first_k_dense_replace,
            cfg.num_hidden_layers,
            cfg.num_experts,
        );
        let count = n_layers.saturating_sub(first) * n_experts;
        let mut slots = Vec::with_capacity(count);
        let mut shapes = [[0; 2]; 6];
        let mut lens = [0; 6];
        for layer in first..n_layers {
            for e in 0..n_experts {
                let p = find_parts(ck, layer, e, Some(dims))?;
                // Packed shapes are fixed by the config and scale shapes by the group rule, so
                // every expert has the same part lengths.
                shapes = p.shapes;
                lens = p.offs.map(|o| o.1);
                let shard = u16::try_from(p.shard).unwrap_or(u16::MAX);
                slots.push((shard, p.offs.map(|o| o.0)));
            }
        }
        Ok(ExpertLocator {
            first_layer: first,
            n_layers,
            n_experts,
            shapes,
            lens,
            slots,
        })
    }

    /// Number of experts in the table.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the model has no routed experts.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Bytes of one expert (the same for all).
    pub fn expert_bytes(&self) -> u64 {
        self.lens.iter().sum()
    }

    /// Location of expert `e` of `layer`.
    pub fn locate(&self, layer: usize, e: usize) -> Result<ExpertLocation, BindError> {
        let why = if layer < self.first_layer {
            Some(format!(
                "layer {layer} is dense (first_k_dense_replace = {})",
                self.first_layer
            ))
        } else if layer >= self.n_layers {
            Some(format!("the model has {} layers", self.n_layers))
        } else if e >= self.n_experts {
            Some(format!(
                "the model has {} experts per layer",
                self.n_experts
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(BindError::NoSuchExpert {
                layer,
                expert: e,
                why,
            });
        }
        let (shard, offs) = self.slots[(layer - self.first_layer) * self.n_experts + e];
        let offs: [(u64, u64); 6] = std::array::from_fn(|i| (offs[i], self.lens[i]));
        Ok(layout(layer, e, usize::from(shard), offs, self.shapes))
    }

    /// How many experts need more than one read.
    pub fn scattered_count(&self) -> usize {
        (0..self.slots.len())
            .filter(|&i| {
                let (_, offs) = self.slots[i];
                let lo = offs.iter().min().copied().unwrap_or(0);
                let hi = (0..6).map(|k| offs[k] + self.lens[k]).max().unwrap_or(0);
                hi - lo != self.expert_bytes()
            })
            .count()
    }
}
