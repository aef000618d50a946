//! A DSpark draft held in memory (docs/DSPARK.md): the checked checkpoint, its weights bound
//! for [`k3_model::dspark`], and the log of the target's hidden-state taps a session keeps
//! for it.

use crate::EngineError;
use k3_format::{DsparkCheckpoint, K3Config, TensorView};
use k3_kernels::Matrix;
use k3_model::dspark::{Dspark, DsparkLayer, DsparkWeights};
use k3_model::Taps;
use std::collections::HashMap;
use std::path::Path;

/// An opened DSpark draft: the mapped checkpoint (matrices used in place, BF16 as
/// published) and its norm gains and confidence head widened to f32 once.
pub struct DsparkDraft {
    ck: DsparkCheckpoint,
    graph: Dspark,
    vectors: HashMap<String, Vec<f32>>,
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
        Ok(DsparkDraft { ck, graph, vectors })
    }

    /// The graph.
    pub fn graph(&self) -> &Dspark {
        &self.graph
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        self.ck.dir()
    }

    /// Bytes of the draft's weights (mapped; the widened vectors are a few KB more).
    pub fn weight_bytes(&self) -> u64 {
        self.ck.weight_bytes()
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
        Ok(DsparkWeights {
            context_proj: self.matrix("context_proj.weight")?,
            context_norm: self.vector("context_norm.weight")?,
            layers,
            final_norm: self.vector("final_norm.weight")?,
            markov_w1: self.matrix("markov_head.markov_w1.weight")?,
            markov_w2: self.matrix("markov_head.markov_w2.weight")?,
            confidence,
        })
    }
}

/// The target's taps of one session by position, from `base` on (`[n][taps·E]`), with the
/// token id each row was computed for. A pass writing at position `p` replaces everything
/// from `p` on (a rolled-back pass's rows are overwritten when the positions are fed again).
pub(crate) struct TapLog {
    pub(crate) taps: Taps,
    width: usize,
    base: usize,
    ids: Vec<u32>,
    rows: Vec<f32>,
}

impl TapLog {
    pub(crate) fn new(taps: Taps, hidden: usize) -> TapLog {
        let width = taps.layers.len() * hidden;
        TapLog {
            taps,
            width,
            base: 0,
            ids: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// Records the rows `self.taps` holds for `ids` fed at positions `pos..`.
    pub(crate) fn record(&mut self, pos: usize, ids: &[u32]) {
        if pos < self.base {
            // fed again below what was kept (a reset session): start over there
            self.base = pos;
            self.ids.clear();
            self.rows.clear();
        }
        let keep = (pos - self.base).min(self.ids.len());
        if keep < pos - self.base {
            // a gap (positions fed without taps): nothing before `pos` is usable
            self.base = pos;
            self.ids.clear();
            self.rows.clear();
        } else {
            self.ids.truncate(keep);
            self.rows.truncate(keep * self.width);
        }
        self.ids.extend_from_slice(ids);
        self.rows
            .extend_from_slice(&self.taps.rows[..ids.len() * self.width]);
    }

    /// Forgets everything: positions were fed without taps.
    pub(crate) fn clear_from(&mut self, pos: usize) {
        if pos <= self.base {
            self.base = pos;
            self.ids.clear();
            self.rows.clear();
        } else {
            let keep = (pos - self.base).min(self.ids.len());
            self.ids.truncate(keep);
            self.rows.truncate(keep * self.width);
        }
    }

    /// Rows of positions `from..to` when every one is logged for the ids `context[from..to]`.
    pub(crate) fn rows(&self, context: &[u32], from: usize, to: usize) -> Option<&[f32]> {
        if from < self.base || to > self.base + self.ids.len() || to > context.len() {
            return None;
        }
        let (a, b) = (from - self.base, to - self.base);
        (self.ids[a..b] == context[from..to]).then(|| &self.rows[a * self.width..b * self.width])
    }

    /// Drops rows before `pos` (consumed by the draft's context).
    pub(crate) fn drop_before(&mut self, pos: usize) {
        let n = pos.saturating_sub(self.base).min(self.ids.len());
        self.ids.drain(..n);
        self.rows.drain(..n * self.width);
        self.base += n;
    }
}

#[cfg(test)]
mod tests {
    use super::TapLog;
    use k3_model::{TapStream, Taps};

    fn log() -> TapLog {
        TapLog::new(Taps::new(vec![0], TapStream::Prefix), 1)
    }
    fn record(l: &mut TapLog, pos: usize, ids: &[u32]) {
        l.taps.rows = ids.iter().map(|&i| i as f32 * 10.0).collect();
        l.record(pos, ids);
    }

    #[test]
    fn the_tap_log_follows_rollbacks_and_refeeds() {
        let mut l = log();
        record(&mut l, 0, &[1, 2, 3]);
        record(&mut l, 3, &[4, 5, 6, 7]); // a verifying pass: 5, 6, 7 drafts
        let ctx = [1, 2, 3, 4, 5, 9];
        assert_eq!(
            l.rows(&ctx, 0, 5),
            Some(&[10.0, 20.0, 30.0, 40.0, 50.0][..])
        );
        assert_eq!(l.rows(&ctx, 0, 6), None, "position 5 was fed as 6, not 9");
        l.drop_before(5);
        assert_eq!(l.rows(&ctx, 4, 5), None, "dropped");
        record(&mut l, 3, &[4, 5, 9, 8]); // the owed tokens fed again, below the kept rows
        assert_eq!(
            l.rows(&[1, 2, 3, 4, 5, 9, 8], 3, 7),
            Some(&[40.0, 50.0, 90.0, 80.0][..])
        );
        l.clear_from(5); // a batched pass from position 5 recorded nothing
        assert_eq!(l.rows(&[1, 2, 3, 4, 5, 9], 3, 6), None);
        record(&mut l, 7, &[1]); // a gap: nothing before 7 is usable
        assert_eq!(l.rows(&[0; 8], 3, 5), None);
    }
}
