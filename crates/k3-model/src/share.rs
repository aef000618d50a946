//! Which rows of each trunk tensor one rank reads (docs/DISTRIBUTED.md#shares).
//!
//! This is the other half of the seam in [`crate::dist`]: `dist` says which rows a rank
//! COMPUTES, this module says which rows of each checkpoint tensor that takes, so that a store
//! can read, pin and stream only those bytes. The two must agree; the test
//! `tests::share::poisoned_rows_outside_the_share_change_nothing` proves it by running every
//! rank with each tensor's rows outside its share set to NaN and comparing logits bit for bit
//! with one process.
//!
//! A tensor's share is a contiguous range of its rows (first dimension): a row-major tensor's
//! share is one contiguous byte range, `[rows.start·row_bytes, rows.end·row_bytes)`.

use crate::dist::row_share;
use k3_format::bind::{AttnTensors, FfnTensors, GlobalTensors, LayerTensors, TensorRef};
use std::ops::Range;

/// Rows `rows` (of dimension 0) of `tensor` are read by this rank.
#[derive(Debug, Clone)]
pub struct TensorShare<'a> {
    /// The checkpoint tensor.
    pub tensor: &'a TensorRef,
    /// Rows of its first dimension this rank reads; `0..shape[0]` for a tensor read whole.
    pub rows: Range<usize>,
}

impl TensorShare<'_> {
    /// Bytes of the tensor this share covers, relative to the tensor's first byte.
    pub fn byte_range(&self) -> Range<u64> {
        let rows = self.tensor.shape.first().copied().unwrap_or(1).max(1) as u64;
        let row_bytes = self.tensor.nbytes / rows;
        self.rows.start as u64 * row_bytes..self.rows.end as u64 * row_bytes
    }
    /// Whether this rank reads the whole tensor.
    pub fn is_whole(&self) -> bool {
        self.rows.start == 0 && self.rows.end == self.tensor.shape.first().copied().unwrap_or(1)
    }
}

fn whole(t: &TensorRef) -> TensorShare<'_> {
    TensorShare {
        tensor: t,
        rows: 0..t.shape.first().copied().unwrap_or(1),
    }
}

/// Rows dealt by [`row_share`] (what [`crate::Dist::matmul`] computes on this rank).
fn dealt(t: &TensorRef, rank: usize, size: usize) -> TensorShare<'_> {
    let rows = t.shape.first().copied().unwrap_or(1);
    let (r0, r1) = row_share(rows, rank, size);
    TensorShare {
        tensor: t,
        rows: r0..r1,
    }
}

/// Every tensor of decoder layer `lt` with the rows `rank` of `size` reads, in binding order.
/// With `size == 1` every share is whole.
pub fn layer_shares(lt: &LayerTensors, rank: usize, size: usize) -> Vec<TensorShare<'_>> {
    let mut out = vec![
        whole(&lt.input_layernorm),
        whole(&lt.post_attention_layernorm),
        whole(&lt.self_attention_res_norm),
        whole(&lt.self_attention_res_proj),
        whole(&lt.mlp_res_norm),
        whole(&lt.mlp_res_proj),
    ];
    match &lt.attn {
        AttnTensors::Kda(a) => out.extend([
            dealt(&a.q_proj, rank, size),
            dealt(&a.k_proj, rank, size),
            dealt(&a.v_proj, rank, size),
            dealt(&a.g_proj, rank, size),
            dealt(&a.o_proj, rank, size),
            whole(&a.q_conv1d),
            whole(&a.k_conv1d),
            whole(&a.v_conv1d),
            dealt(&a.f_a_proj, rank, size),
            dealt(&a.f_b_proj, rank, size),
            dealt(&a.b_proj, rank, size),
            whole(&a.a_log),
            whole(&a.dt_bias),
            whole(&a.o_norm),
        ]),
        AttnTensors::Mla(a) => {
            out.extend([
                dealt(&a.q_a_proj, rank, size),
                whole(&a.q_a_layernorm),
                dealt(&a.q_b_proj, rank, size),
                dealt(&a.kv_a_proj_with_mqa, rank, size),
                whole(&a.kv_a_layernorm),
                // absorbed into attention per head (crate::mla), read whole
                whole(&a.kv_b_proj),
                dealt(&a.o_proj, rank, size),
            ]);
            out.extend(a.g_proj.as_ref().map(|g| dealt(g, rank, size)));
        }
    }
    match &lt.ffn {
        FfnTensors::Dense(f) => out.extend([
            dealt(&f.gate_proj, rank, size),
            dealt(&f.up_proj, rank, size),
            dealt(&f.down_proj, rank, size),
        ]),
        FfnTensors::Moe(f) => out.extend([
            // routing is replicated: every rank scores every expert (crate::router)
            whole(&f.gate),
            whole(&f.e_score_correction_bias),
            dealt(&f.routed_expert_down_proj, rank, size),
            whole(&f.routed_expert_norm),
            dealt(&f.routed_expert_up_proj, rank, size),
            dealt(&f.shared_gate_proj, rank, size),
            dealt(&f.shared_up_proj, rank, size),
            dealt(&f.shared_down_proj, rank, size),
        ]),
    }
    out
}

/// The model-level tensors with this rank's rows: the embedding is read by row id (whole),
/// the norms whole, `lm_head` dealt.
pub fn global_shares(g: &GlobalTensors, rank: usize, size: usize) -> Vec<TensorShare<'_>> {
    vec![
        whole(&g.embed_tokens),
        whole(&g.norm),
        whole(&g.output_attn_res_norm),
        whole(&g.output_attn_res_proj),
        dealt(&g.lm_head, rank, size),
    ]
}

/// Whether routed expert `expert` (of any layer) is read by `rank` of `size`
/// (the owner rule of [`crate::Dist::owns_expert`]).
pub fn owns_expert(expert: u32, rank: usize, size: usize) -> bool {
    expert as usize % size.max(1) == rank
}
