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
#[derive(Clone, Copy)]
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
#[derive(Clone, Copy)]
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
#[derive(Clone, Copy)]
pub enum AttnWeights<'a> {
    /// Kimi Delta Attention.
    Kda(KdaWeights<'a>),
    /// Gated MLA.
    Mla(MlaWeights<'a>),
}

/// Dense SiTU-GLU MLP (layer 0).
#[derive(Clone, Copy)]
pub struct DenseWeights<'a> {
    /// [DI][E]
    pub gate_proj: Matrix<'a>,
    /// [DI][E]
    pub up_proj: Matrix<'a>,
    /// [E][DI]
    pub down_proj: Matrix<'a>,
}

/// The trunk part of a Stable LatentMoE layer (routed experts come from [`ExpertProvider`]).
#[derive(Clone, Copy)]
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
#[derive(Clone, Copy)]
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

/// What the token mixer (the first half of a layer, docs/MODEL.md#decoder-layer) reads.
#[derive(Clone, Copy)]
pub struct MixerWeights<'a> {
    /// [E]
    pub input_norm: &'a [f32],
    /// [E]
    pub attn_res_norm: &'a [f32],
    /// [E]
    pub attn_res_proj: &'a [f32],
    /// Token mixer.
    pub attn: AttnWeights<'a>,
}

/// What the channel mixer (the second half of a layer) reads.
#[derive(Clone, Copy)]
pub struct ChannelWeights<'a> {
    /// [E]
    pub post_attn_norm: &'a [f32],
    /// [E]
    pub mlp_res_norm: &'a [f32],
    /// [E]
    pub mlp_res_proj: &'a [f32],
    /// Channel mixer.
    pub ffn: FfnWeights<'a>,
}

impl<'a> LayerWeights<'a> {
    /// The weights of the layer's two halves, in the order a pass uses them.
    pub fn halves(&self) -> (MixerWeights<'a>, ChannelWeights<'a>) {
        let mixer = MixerWeights {
            input_norm: self.input_norm,
            attn_res_norm: self.attn_res_norm,
            attn_res_proj: self.attn_res_proj,
            attn: self.attn,
        };
        let channel = ChannelWeights {
            post_attn_norm: self.post_attn_norm,
            mlp_res_norm: self.mlp_res_norm,
            mlp_res_proj: self.mlp_res_proj,
            ffn: self.ffn,
        };
        (mixer, channel)
    }
}

/// One layer's weights for one pass through it, kept in memory while the hold lives; dropping
/// it releases what is left to the store. The pass asks for the token mixer's weights, is
/// done with them, then asks once for the channel mixer's: a store that streams a layer in
/// pieces (docs/STREAMING.md#trunk-pieces) releases the first piece at that point and binds
/// the second, so the next piece can be read while this one computes.
pub trait LayerHold {
    /// The token mixer's weights (first).
    fn mixer(&self) -> MixerWeights<'_>;
    /// The channel mixer's weights, once the weights [`LayerHold::mixer`] returned are no
    /// longer used; may block until they are read.
    fn channel(&mut self) -> Result<ChannelWeights<'_>, SourceError>;
}

/// A hold of a whole layer at once (mapped, pinned, a whole-layer ring slot): typed views of
/// every tensor, borrowing from the hold. [`Whole`] makes one a [`LayerHold`].
pub trait WholeLayer {
    /// Typed views of every tensor of the layer.
    fn view(&self) -> LayerWeights<'_>;
}

/// A [`WholeLayer`] as a [`LayerHold`]: both halves from the same bytes.
pub struct Whole<H>(pub H);

impl<H: WholeLayer> LayerHold for Whole<H> {
    fn mixer(&self) -> MixerWeights<'_> {
        self.0.view().halves().0
    }
    fn channel(&mut self) -> Result<ChannelWeights<'_>, SourceError> {
        Ok(self.0.view().halves().1)
    }
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
