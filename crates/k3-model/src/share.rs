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

use k3_format::bind::{AttnTensors, FfnTensors, GlobalTensors, LayerTensors, TensorRef};
use std::ops::Range;

/// Rows `[r0, r1)` of a `rows`-row matrix computed by `rank` of `size`: contiguous, in rank
/// order, sizes differing by at most one.
pub fn row_share(rows: usize, rank: usize, size: usize) -> (usize, usize) {
    (rows * rank / size, rows * (rank + 1) / size)
}

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

/// How the rows (dimension 0) of one tensor role are dealt over ranks: the ONE description
/// that both [`layer_shares`] (what a store reads) and the model's products and shape checks
/// (what a rank computes, crate::dist) use, so the two cannot disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Every rank reads every row.
    Whole,
    /// Rows dealt by [`row_share`] (what [`crate::Dist::matmul`] computes and all-gathers).
    Rows,
    /// The rows form `n` equal heads; a rank reads the rows of its heads,
    /// `row_share(n, rank, size)` (docs/DISTRIBUTED.md#the-seam).
    Heads(usize),
}

impl Split {
    /// Rows of a `total`-row tensor that `rank` of `size` reads.
    pub fn rows(self, total: usize, rank: usize, size: usize) -> Range<usize> {
        let size = size.max(1);
        match self {
            Split::Whole => 0..total,
            Split::Rows => {
                let (a, b) = row_share(total, rank, size);
                a..b
            }
            Split::Heads(n) => {
                let per = total / n.max(1);
                let (a, b) = row_share(n, rank, size);
                a * per..b * per
            }
        }
    }
}

/// How each tensor of a KDA layer with `heads` heads is dealt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdaSplit {
    /// `q_proj`, `k_proj`, `v_proj`, `g_proj` (`[P][E]`).
    pub qkvg: Split,
    /// `b_proj` (`[H][E]`).
    pub b: Split,
    /// `f_a_proj` (`[D][E]`, low rank, shared by heads).
    pub f_a: Split,
    /// `f_b_proj` (`[P][D]`).
    pub f_b: Split,
    /// `o_proj` (`[E][P]`).
    pub o: Split,
    /// The short-conv taps, `dt_bias` (`[P]…`), `A_log` and `o_norm`.
    pub small: Split,
}

/// The deal of a KDA layer with `heads` heads.
pub fn kda_split(heads: usize) -> KdaSplit {
    let per_head = Split::Heads(heads);
    KdaSplit {
        qkvg: per_head,
        b: per_head,
        f_a: Split::Rows,
        f_b: per_head,
        o: Split::Rows,
        small: per_head,
    }
}

/// How each tensor of an MLA layer with `heads` heads is dealt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaSplit {
    /// `q_a_proj` (`[q_lora][E]`).
    pub q_a: Split,
    /// `q_b_proj` (`[H·(nope+rope)][q_lora]`).
    pub q_b: Split,
    /// `kv_a_proj_with_mqa` (`[kv_lora+rope][E]`).
    pub kv_a: Split,
    /// `kv_b_proj` (`[H·(nope+v)][kv_lora]`), absorbed into attention per head.
    pub kv_b: Split,
    /// `g_proj` (`[H·v][E]`).
    pub g: Split,
    /// `o_proj` (`[E][H·v]`).
    pub o: Split,
}

/// The deal of an MLA layer with `heads` heads.
pub fn mla_split(heads: usize) -> MlaSplit {
    let per_head = Split::Heads(heads);
    MlaSplit {
        q_a: Split::Rows,
        q_b: per_head,
        kv_a: Split::Rows,
        kv_b: per_head,
        g: per_head,
        o: Split::Rows,
    }
}

/// Every trunk product of the FFNs (dense MLP, MoE latent projections, shared expert) and
/// `lm_head` are row-dealt; the MoE router is read whole (routing is replicated).
pub const FFN_SPLIT: Split = Split::Rows;

fn whole(t: &TensorRef) -> TensorShare<'_> {
    share(t, Split::Whole, 0, 1)
}

/// The rows of `t` that `rank` of `size` reads under `split`.
fn share(t: &TensorRef, split: Split, rank: usize, size: usize) -> TensorShare<'_> {
    let rows = t.shape.first().copied().unwrap_or(1);
    TensorShare {
        tensor: t,
        rows: split.rows(rows, rank, size),
    }
}

/// Heads of a layer's token mixer, for [`layer_shares_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// KDA heads (`kda_num_heads`).
    pub kda: usize,
    /// MLA heads (`num_attention_heads`).
    pub mla: usize,
}

/// The heads of layer `lt` read off its tensors' shapes: KDA from `b_proj` (`[H][E]`); MLA
/// from `rope = rows(kv_a) − len(kv_a_layernorm)`, `H·nope = rows(kv_b) − cols(o_proj)` and
/// `H = (rows(q_b) − H·nope) / rope` (a NoPE-only layer without rope slots: 1, which reads
/// head-split tensors whole; pass the config's counts to [`layer_shares_with`] instead).
pub fn heads_of(lt: &LayerTensors) -> Heads {
    let dim = |t: &TensorRef, i: usize| t.shape.get(i).copied().unwrap_or(1);
    match &lt.attn {
        AttnTensors::Kda(a) => Heads {
            kda: dim(&a.b_proj, 0).max(1),
            mla: 1,
        },
        AttnTensors::Mla(a) => {
            let rope = dim(&a.kv_a_proj_with_mqa, 0).saturating_sub(a.kv_a_layernorm.numel());
            let h_nope = dim(&a.kv_b_proj, 0).saturating_sub(dim(&a.o_proj, 1));
            let h_rope = dim(&a.q_b_proj, 0).saturating_sub(h_nope);
            let mla = match rope {
                0 => 1,
                r if h_rope.is_multiple_of(r) && h_rope > 0 => h_rope / r,
                _ => 1,
            };
            Heads { kda: 1, mla }
        }
    }
}

/// Every tensor of decoder layer `lt` with the rows `rank` of `size` reads, in binding order;
/// the heads are read off the shapes ([`heads_of`]). With `size == 1` every share is whole.
pub fn layer_shares(lt: &LayerTensors, rank: usize, size: usize) -> Vec<TensorShare<'_>> {
    layer_shares_with(lt, heads_of(lt), rank, size)
}

/// [`layer_shares`] with the config's head counts.
pub fn layer_shares_with(
    lt: &LayerTensors,
    heads: Heads,
    rank: usize,
    size: usize,
) -> Vec<TensorShare<'_>> {
    let dealt = |t, split| share(t, split, rank, size);
    let mut out = vec![
        whole(&lt.input_layernorm),
        whole(&lt.post_attention_layernorm),
        whole(&lt.self_attention_res_norm),
        whole(&lt.self_attention_res_proj),
        whole(&lt.mlp_res_norm),
        whole(&lt.mlp_res_proj),
    ];
    match &lt.attn {
        AttnTensors::Kda(a) => {
            let k = kda_split(heads.kda);
            out.extend([
                dealt(&a.q_proj, k.qkvg),
                dealt(&a.k_proj, k.qkvg),
                dealt(&a.v_proj, k.qkvg),
                dealt(&a.g_proj, k.qkvg),
                dealt(&a.o_proj, k.o),
                dealt(&a.q_conv1d, k.small),
                dealt(&a.k_conv1d, k.small),
                dealt(&a.v_conv1d, k.small),
                dealt(&a.f_a_proj, k.f_a),
                dealt(&a.f_b_proj, k.f_b),
                dealt(&a.b_proj, k.b),
                whole(&a.a_log),
                dealt(&a.dt_bias, k.small),
                whole(&a.o_norm),
            ])
        }
        AttnTensors::Mla(a) => {
            let m = mla_split(heads.mla);
            out.extend([
                dealt(&a.q_a_proj, m.q_a),
                whole(&a.q_a_layernorm),
                dealt(&a.q_b_proj, m.q_b),
                dealt(&a.kv_a_proj_with_mqa, m.kv_a),
                whole(&a.kv_a_layernorm),
                dealt(&a.kv_b_proj, m.kv_b),
                dealt(&a.o_proj, m.o),
            ]);
            out.extend(a.g_proj.as_ref().map(|g| dealt(g, m.g)));
        }
    }
    match &lt.ffn {
        FfnTensors::Dense(f) => out.extend([
            dealt(&f.gate_proj, FFN_SPLIT),
            dealt(&f.up_proj, FFN_SPLIT),
            dealt(&f.down_proj, FFN_SPLIT),
        ]),
        FfnTensors::Moe(f) => out.extend([
            // routing is replicated: every rank scores every expert (crate::router)
            whole(&f.gate),
            whole(&f.e_score_correction_bias),
            dealt(&f.routed_expert_down_proj, FFN_SPLIT),
            whole(&f.routed_expert_norm),
            dealt(&f.routed_expert_up_proj, FFN_SPLIT),
            dealt(&f.shared_gate_proj, FFN_SPLIT),
            dealt(&f.shared_up_proj, FFN_SPLIT),
            dealt(&f.shared_down_proj, FFN_SPLIT),
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
        share(&g.lm_head, FFN_SPLIT, rank, size),
    ]
}

/// Whether routed expert `expert` (of any layer) is read by `rank` of `size`
/// (the owner rule of [`crate::Dist::owns_expert`]).
pub fn owns_expert(expert: u32, rank: usize, size: usize) -> bool {
    expert as usize % size.max(1) == rank
}
