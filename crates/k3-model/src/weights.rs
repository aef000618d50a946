//! The seam between the model and weight storage (design: the two traits of
//! README.md, "How the code is laid out"). The model reads every weight through these traits and never opens a
//! file; stores (resident mmap, streaming ring, expert cache) implement them.

use k3_kernels::Matrix;

/// Error raised by a store; the model wraps it with the layer/expert it was asked for.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Model-level weights used after the last layer.
pub struct HeadWeights<'a> {
    /// Final RMSNorm gain `[hidden]`.
    pub norm: &'a [f32],
    /// Output attention-residual aggregator: norm gain `[hidden]` and projection row `[hidden]`.
    pub out_res_norm: &'a [f32],
    /// Output aggregator projection row `[hidden]` (the `[1, hidden]` tensor).
    pub out_res_proj: &'a [f32],
    /// `[vocab][hidden]`, not tied to the embedding.
    pub lm_head: Matrix<'a>,
}

/// Kimi Delta Attention weights (docs/MODEL.md#kda-layer-tensors, docs/MODEL.md#kimi-delta-attention). P = heads·head_dim, D = head_dim.
pub struct KdaWeights<'a> {
    /// [P][E]
    pub q_proj: Matrix<'a>,
    /// [P][E]
    pub k_proj: Matrix<'a>,
    /// [P][E]
    pub v_proj: Matrix<'a>,
    /// [P][E] full-rank output gate
    pub g_proj: Matrix<'a>,
    /// [E][P]
    pub o_proj: Matrix<'a>,
    /// [P][K] taps oldest→newest
    pub q_conv: &'a [f32],
    /// [P][K]
    pub k_conv: &'a [f32],
    /// [P][K]
    pub v_conv: &'a [f32],
    /// [D][E]
    pub f_a_proj: Matrix<'a>,
    /// [P][D]
    pub f_b_proj: Matrix<'a>,
    /// [H][E]
    pub b_proj: Matrix<'a>,
    /// [≥H]: only the first H values (one per HEAD) are used
    pub a_log: &'a [f32],
    /// [P]
    pub dt_bias: &'a [f32],
    /// [D] shared by all heads
    pub o_norm: &'a [f32],
}

/// Gated MLA weights, NoPE (docs/MODEL.md#mla-layer-tensors, docs/MODEL.md#gated-mla).
pub struct MlaWeights<'a> {
    /// [q_lora][E]
    pub q_a_proj: Matrix<'a>,
    /// [q_lora]
    pub q_a_norm: &'a [f32],
    /// [H·(nope+rope)][q_lora]
    pub q_b_proj: Matrix<'a>,
    /// [kv_lora+rope][E]
    pub kv_a_proj: Matrix<'a>,
    /// [kv_lora]
    pub kv_a_norm: &'a [f32],
    /// [H·(nope+v)][kv_lora]
    pub kv_b_proj: Matrix<'a>,
    /// [E][H·v]
    pub o_proj: Matrix<'a>,
    /// [H·v][E] when mla_use_output_gate
    pub g_proj: Option<Matrix<'a>>,
}

/// Token mixer of one layer.
pub enum AttnWeights<'a> {
    /// Kimi Delta Attention.
    Kda(KdaWeights<'a>),
    /// Gated MLA.
    Mla(MlaWeights<'a>),
}

/// Dense SiTU-GLU MLP (layer 0).
pub struct DenseWeights<'a> {
    /// [DI][E]
    pub gate_proj: Matrix<'a>,
    /// [DI][E]
    pub up_proj: Matrix<'a>,
    /// [E][DI]
    pub down_proj: Matrix<'a>,
}

/// The trunk part of a Stable LatentMoE layer (routed experts come from [`ExpertProvider`]).
pub struct MoeWeights<'a> {
    /// [NE][E]
    pub router: Matrix<'a>,
    /// [NE] selection-only bias
    pub router_bias: &'a [f32],
    /// [L][E] routed_expert_down_proj
    pub down_proj: Matrix<'a>,
    /// [L] routed_expert_norm
    pub latent_norm: &'a [f32],
    /// [E][L] routed_expert_up_proj
    pub up_proj: Matrix<'a>,
    /// [SI][E]
    pub shared_gate: Matrix<'a>,
    /// [SI][E]
    pub shared_up: Matrix<'a>,
    /// [E][SI]
    pub shared_down: Matrix<'a>,
}

/// Channel mixer of one layer.
pub enum FfnWeights<'a> {
    /// Dense SiTU-GLU MLP.
    Dense(DenseWeights<'a>),
    /// Stable LatentMoE trunk part.
    Moe(MoeWeights<'a>),
}

/// Every non-expert weight of one decoder layer (its "trunk").
pub struct LayerWeights<'a> {
    /// [E]
    pub input_norm: &'a [f32],
    /// [E]
    pub post_attn_norm: &'a [f32],
    /// [E]
    pub attn_res_norm: &'a [f32],
    /// [E]
    pub attn_res_proj: &'a [f32],
    /// [E]
    pub mlp_res_norm: &'a [f32],
    /// [E]
    pub mlp_res_proj: &'a [f32],
    /// Token mixer.
    pub attn: AttnWeights<'a>,
    /// Channel mixer.
    pub ffn: FfnWeights<'a>,
}

/// One routed expert (MXFP4 in the release; any [`Matrix`] storage is accepted).
pub struct ExpertWeights<'a> {
    /// gate [I][L]
    pub w1: Matrix<'a>,
    /// down [L][I]
    pub w2: Matrix<'a>,
    /// up   [I][L]
    pub w3: Matrix<'a>,
}

/// One layer's weights, kept in memory for as long as the hold lives (a pinned layer, a ring
/// slot, a mapped region); dropping it releases the slot to the store.
pub trait LayerHold {
    /// Typed views of every tensor of the layer, borrowing from the hold.
    fn view(&self) -> LayerWeights<'_>;
}

/// Trunk weights: embedding rows, per-layer weights and the head.
pub trait WeightProvider: Sync {
    /// Writes embedding row `id` (widened to f32) into `out` (`[hidden]`).
    fn embed_row(&self, id: u32, out: &mut [f32]) -> Result<(), SourceError>;
    /// Layer `l`'s weights, held until the returned value is dropped. May block on a read
    /// and start reading the next layers ahead.
    fn layer(&self, l: usize) -> Result<Box<dyn LayerHold + '_>, SourceError>;
    /// The model-level head weights.
    fn head(&self) -> Result<HeadWeights<'_>, SourceError>;
    /// Calls `f(router [NE][E], bias [NE])` of MoE layer `l` when they are in memory right now
    /// (never reads, never waits); returns whether it did. For router lookahead; the default
    /// store has none.
    fn with_router(&self, _l: usize, _f: &mut dyn FnMut(&Matrix<'_>, &[f32])) -> bool {
        false
    }
}

/// A routed expert that could not be made available; the model reports it as
/// [`crate::ModelError::Expert`] with the layer (the CLI exits 4).
#[derive(Debug)]
pub struct ExpertFetchError {
    /// Expert id within the layer.
    pub expert: u32,
    /// The store's error.
    pub source: SourceError,
}

/// Routed experts, fetched on demand.
pub trait ExpertProvider: Sync {
    /// Makes experts `experts` of `layer` available and calls `on_ready(i, w)` once for each
    /// `experts[i]` as it becomes available, in ANY order (resident ones first). The model
    /// adds outputs in top-k order itself, so arrival order never changes a result.
    fn fetch(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &ExpertWeights<'_>),
    ) -> Result<(), ExpertFetchError>;
    /// Lookahead hint: these experts of `layer` are likely to be fetched soon.
    fn hint(&self, _layer: usize, _experts: &[u32]) {}
    /// `true` for a cache-only store (a draft model's, docs/MODEL.md#draft-model): `fetch`
    /// delivers only what is in memory, and the model drops an undelivered expert from the
    /// token's top-k, renormalising the others, instead of failing.
    fn drops_missing(&self) -> bool {
        false
    }
}
