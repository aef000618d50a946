//! A DSpark draft held in memory (docs/DSPARK.md): the checked checkpoint, its weights bound
//! for [`k3_model::dspark`], and the log of the target's hidden-state taps a session keeps
//! for it.

use crate::dspark_hold::{DraftHold, HeldMatrix};
use crate::EngineError;
use k3_format::{DsparkCheckpoint, K3Config, TensorView};
use k3_kernels::Matrix;
use k3_model::dspark::{DraftContext, Dspark, DsparkLayer, DsparkWeights};
use k3_model::Taps;
use std::collections::HashMap;
use std::path::Path;

/// An opened DSpark draft: the mapped checkpoint (matrices used in place, BF16 as
/// published, or quantized copies, [`DraftHold`]) and its norm gains and confidence head
/// widened to f32 once.
pub struct DsparkDraft {
    ck: DsparkCheckpoint,
    graph: Dspark,
    vectors: HashMap<String, Vec<f32>>,
    hold: DraftHold,
    held: HashMap<String, HeldMatrix>,
}

/// Whether `name` (of `shape`) is one of the draft's matrices (the confidence head, `[1, n]`,
/// is a vector to the forward).
fn is_matrix(name: &str, shape: &[usize]) -> bool {
    shape.len() == 2 && !name.starts_with("confidence_head.")
}

impl DsparkDraft {
    /// Opens and checks the draft in `dir` against the target `config` (refusals name the
    /// file and key or tensor, before anything runs).
    pub fn open(dir: &Path, config: &K3Config) -> Result<DsparkDraft, EngineError> {
        let ck = DsparkCheckpoint::open(dir, config)?;
        let graph = Dspark::new(ck.config().clone());
        let mut vectors = HashMap::new();
        for (name, shape) in k3_format::dspark::expected_tensors(ck.config()) {
            if shape.len() == 1 || name.starts_with("confidence_head.") {
                vectors.insert(name.clone(), ck.tensor(&name)?.to_f32_vec()?);
            }
        }
        Ok(DsparkDraft {
            ck,
            graph,
            vectors,
            hold: DraftHold::Bf16,
            held: HashMap::new(),
        })
    }

    /// Bytes of the draft's weights held in `hold` (vectors as published).
    pub fn held_weight_bytes(&self, hold: DraftHold) -> u64 {
        k3_format::dspark::expected_tensors(self.graph.config())
            .iter()
            .map(|(name, shape)| match is_matrix(name, shape) {
                true => hold.matrix_bytes(shape[0], shape[1]),
                false => self.ck.tensor(name).map_or(0, |v| v.nbytes()),
            })
            .sum()
    }

    /// Bytes of the context KV the draft keeps for `sessions` sessions of `ctx` positions:
    /// every layer's latent row per position, f32 (docs/DSPARK.md#memory).
    pub fn context_kv_bytes(&self, ctx: usize, sessions: usize) -> u64 {
        let c = self.graph.config();
        (c.num_hidden_layers * c.kv_width() * 4) as u64 * ctx as u64 * sessions.max(1) as u64
    }

    /// Holds the matrices in `hold` (quantizing them once; BF16 drops any copies).
    pub fn hold_as(&mut self, hold: DraftHold) -> Result<(), EngineError> {
        self.held.clear();
        self.hold = hold;
        let DraftHold::Quant(quant) = hold else {
            return Ok(());
        };
        for (name, shape) in k3_format::dspark::expected_tensors(self.graph.config()) {
            if !is_matrix(&name, &shape) {
                continue;
            }
            let floats = self.ck.tensor(&name)?.to_f32_vec()?;
            if let Some(m) = HeldMatrix::quantize(&name, &floats, shape[0], shape[1], quant)? {
                self.held.insert(name, m);
            }
        }
        Ok(())
    }

    /// The form the matrices are held in.
    pub fn hold(&self) -> DraftHold {
        self.hold
    }

    /// The graph.
    pub fn graph(&self) -> &Dspark {
        &self.graph
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        self.ck.dir()
    }

    /// Bytes of the draft's weights as held (mapped BF16 or quantized copies; the widened
    /// vectors are a few KB more).
    pub fn weight_bytes(&self) -> u64 {
        self.held_weight_bytes(self.hold)
    }

    /// A fresh tap set for the target's forward.
    pub fn taps(&self) -> Taps {
        let c = self.graph.config();
        Taps::new(c.target_layer_ids.clone(), c.stream)
    }

    fn vector(&self, name: &str) -> Result<&[f32], EngineError> {
        self.vectors
            .get(name)
            .map(Vec::as_slice)
            .ok_or_else(|| EngineError::Invalid(format!("dspark: {name} was not loaded")))
    }

    fn matrix(&self, name: &str) -> Result<Matrix<'_>, EngineError> {
        let v: TensorView<'_> = self.ck.tensor(name)?;
        let (rows, cols) = match v.shape {
            [r, c] => (*r, *c),
            _ => {
                return Err(EngineError::Invalid(format!(
                    "dspark: {name} is not a matrix"
                )))
            }
        };
        if let Some(held) = self.held.get(name) {
            return held.view(rows, cols).ok_or_else(|| {
                EngineError::Invalid(format!("dspark: {name}: held copy is not {rows}×{cols}"))
            });
        }
        Matrix::bf16(rows, cols, v.as_bf16()?).ok_or_else(|| {
            EngineError::Invalid(format!("dspark: {name}: data does not fill {rows}×{cols}"))
        })
    }

    /// The weights, bound by their published names (borrowing the mapped file).
    pub fn weights(&self) -> Result<DsparkWeights<'_>, EngineError> {
        let c = self.graph.config();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = |s: &str| format!("layers.{i}.{s}");
            layers.push(DsparkLayer {
                input_norm: self.vector(&p("input_layernorm.weight"))?,
                post_attn_norm: self.vector(&p("post_attention_layernorm.weight"))?,
                q_a_proj: self.matrix(&p("self_attn.q_a_proj.weight"))?,
                q_a_norm: self.vector(&p("self_attn.q_a_layernorm.weight"))?,
                q_b_proj: self.matrix(&p("self_attn.q_b_proj.weight"))?,
                kv_a_proj: self.matrix(&p("self_attn.kv_a_proj_with_mqa.weight"))?,
                kv_a_norm: self.vector(&p("self_attn.kv_a_layernorm.weight"))?,
                kv_b_proj: self.matrix(&p("self_attn.kv_b_proj.weight"))?,
                o_proj: self.matrix(&p("self_attn.o_proj.weight"))?,
                gate_proj: self.matrix(&p("mlp.gate_proj.weight"))?,
                up_proj: self.matrix(&p("mlp.up_proj.weight"))?,
                down_proj: self.matrix(&p("mlp.down_proj.weight"))?,
            });
        }
        let confidence = match c.confidence_head {
            true => {
                let b = self.vector("confidence_head.proj.bias")?;
                let bias = b.first().copied().unwrap_or(0.0);
                Some((self.vector("confidence_head.proj.weight")?, bias))
            }
            false => None,
        };
        let fc_norm = match c.fc_norm {
            true => Some(
                (0..c.target_layer_ids.len())
                    .map(|i| self.vector(&format!("fc_norm.{i}.weight")))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            false => None,
        };
        Ok(DsparkWeights {
            context_proj: self.matrix("context_proj.weight")?,
            context_norm: self.vector("context_norm.weight")?,
            fc_norm,
            layers,
            final_norm: self.vector("final_norm.weight")?,
            markov_w1: self.matrix("markov_head.markov_w1.weight")?,
            markov_w2: self.matrix("markov_head.markov_w2.weight")?,
            confidence,
        })
    }
}

/// The draft context of one session, kept as the target runs: after every forward chunk
/// the tapped rows are projected at once into each draft layer's latent KV rows
/// (`Dspark::extend_context`), by position, with the token each position was fed with, so
/// no tap row outlives its pass. A pass at position `p` replaces everything from `p` on (a
/// rolled-back pass's rows stay usable for the positions it got right — computed for the
/// same tokens — and are overwritten when those positions are fed again).
pub(crate) struct TapLog {
    pub(crate) taps: Taps,
    ctx: DraftContext,
    ids: Vec<u32>,
}

impl TapLog {
    pub(crate) fn new(draft: &DsparkDraft) -> TapLog {
        TapLog {
            taps: draft.taps(),
            ctx: DraftContext::new(draft.graph().config()),
            ids: Vec::new(),
        }
    }

    /// Projects the rows `self.taps` holds for `ids` fed at positions `pos..`. A pass past
    /// the kept positions (some fed without taps, by a batched pass) records nothing.
    pub(crate) fn record(
        &mut self,
        draft: &DsparkDraft,
        pos: usize,
        ids: &[u32],
    ) -> Result<(), EngineError> {
        self.clear_from(pos);
        if pos != self.ids.len() {
            return Ok(());
        }
        let width = self.taps.layers.len() * draft.graph().config().hidden_size;
        let rows = &self.taps.rows[..ids.len() * width];
        draft
            .graph()
            .extend_context(&draft.weights()?, rows, &mut self.ctx)?;
        self.ids.extend_from_slice(ids);
        Ok(())
    }

    /// Forgets positions `pos..`.
    pub(crate) fn clear_from(&mut self, pos: usize) {
        if pos < self.ids.len() {
            self.ids.truncate(pos);
            self.ctx.truncate(pos);
        }
    }

    /// The draft context when positions `0..t` are kept for the ids `context[..t]`.
    pub(crate) fn context(&self, context: &[u32], t: usize) -> Option<&DraftContext> {
        (t <= self.ids.len() && t <= context.len() && self.ids[..t] == context[..t])
            .then_some(&self.ctx)
    }

    /// Bytes of the kept context rows.
    pub(crate) fn bytes(&self) -> u64 {
        self.ctx.bytes()
    }
}
