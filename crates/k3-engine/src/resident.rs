//! The resident store: every trunk tensor viewed in place in the memory-mapped shards (copied
//! only when unaligned; vectors widened once), routed experts sliced from the maps. The
//! simplest store, and the reference the streaming stores must match bit for bit.

use crate::layer_view::{
    expert_view, matrix, prepare_layer, prepare_mat, view_layer, widen, Mat, PreparedLayer,
};
use crate::EngineError;
use k3_format::bind::LayerTensors;
use k3_format::{bind_model, Checkpoint, ExpertLocation, K3Config, ModelBinding, TensorRef};
use k3_model::weights::{
    ExpertFetchError, ExpertProvider, ExpertWeights, HeadWeights, LayerHold, LayerWeights,
    SourceError, WeightProvider, Whole, WholeLayer,
};
use std::path::Path;

/// Every weight of the model, resident (memory-mapped) — implements both model seams.
pub struct ResidentStore {
    ckpt: Checkpoint,
    binding: ModelBinding,
    layers: Vec<PreparedLayer>,
    head: HeadParts,
}

/// The model-level tensors, prepared once (shared with the streaming store).
pub(crate) struct HeadParts {
    pub(crate) vecs: Vec<Vec<f32>>,
    pub(crate) lm_head: Mat,
    pub(crate) embed: Mat,
}

/// The bytes of `t` inside the checkpoint's shard maps.
pub(crate) fn mapped<'c>(ck: &'c Checkpoint, t: &TensorRef) -> Result<&'c [u8], EngineError> {
    let shard = ck
        .shards()
        .get(t.shard)
        .ok_or_else(|| EngineError::Invalid(format!("{}: no shard {}", t.name, t.shard)))?;
    let (s, e) = (t.offset as usize, t.end() as usize);
    shard.bytes().get(s..e).ok_or_else(|| {
        EngineError::Invalid(format!(
            "{}: bytes {s}..{e} beyond shard {}",
            t.name,
            shard.path().display()
        ))
    })
}

impl HeadParts {
    pub(crate) fn prepare(ck: &Checkpoint, b: &ModelBinding) -> Result<HeadParts, EngineError> {
        let g = &b.globals;
        let vecs = [&g.norm, &g.output_attn_res_norm, &g.output_attn_res_proj]
            .into_iter()
            .map(|t| widen(t, mapped(ck, t)?))
            .collect::<Result<_, _>>()?;
        Ok(HeadParts {
            vecs,
            lm_head: prepare_mat(&g.lm_head, mapped(ck, &g.lm_head)?)?,
            embed: prepare_mat(&g.embed_tokens, mapped(ck, &g.embed_tokens)?)?,
        })
    }

    pub(crate) fn weights<'a>(&'a self, lm_head_bytes: &'a [u8]) -> HeadWeights<'a> {
        HeadWeights {
            norm: &self.vecs[0],
            out_res_norm: &self.vecs[1],
            out_res_proj: &self.vecs[2],
            lm_head: matrix(&self.lm_head, lm_head_bytes),
        }
    }
}

/// Writes embedding row `id` of `embed` (over `bytes`) into `out`, widened to f32.
pub(crate) fn embed_row(
    embed: &Mat,
    bytes: &[u8],
    id: u32,
    out: &mut [f32],
) -> Result<(), SourceError> {
    let e = matrix(embed, bytes);
    let (id, c) = (id as usize, e.cols);
    if id >= e.rows || out.len() != c {
        return Err(format!(
            "embedding row {id} of {} (width {c}, asked {})",
            e.rows,
            out.len()
        )
        .into());
    }
    match e.data {
        k3_kernels::MatrixData::Bf16(d) => {
            for (o, w) in out.iter_mut().zip(&d[id * c..(id + 1) * c]) {
                *o = k3_kernels::bf16_to_f32(*w);
            }
        }
        k3_kernels::MatrixData::F32(d) => out.copy_from_slice(&d[id * c..(id + 1) * c]),
        k3_kernels::MatrixData::Mxfp4 { .. } | k3_kernels::MatrixData::Q8 { .. } => {
            return Err("a quantized embedding is not supported".into())
        }
    }
    Ok(())
}

impl ResidentStore {
    /// Indexes the shards in `dir` and binds every tensor `cfg` requires.
    pub fn open(dir: &Path, cfg: &K3Config) -> Result<ResidentStore, EngineError> {
        let ckpt = Checkpoint::open(dir)?;
        let binding = bind_model(&ckpt, cfg)?;
        let layers = binding
            .layers
            .iter()
            .map(|lt| prepare_layer(lt, |t| mapped(&ckpt, t)))
            .collect::<Result<_, _>>()?;
        let head = HeadParts::prepare(&ckpt, &binding)?;
        Ok(ResidentStore {
            ckpt,
            binding,
            layers,
            head,
        })
    }

    /// The tensor binding (for the session-file model fingerprint).
    pub(crate) fn checkpoint(&self) -> &Checkpoint {
        &self.ckpt
    }

    pub(crate) fn binding(&self) -> &ModelBinding {
        &self.binding
    }

    /// Slices one expert's six tensors out of the shard map.
    fn expert_weights(&self, loc: &ExpertLocation) -> Result<ExpertWeights<'_>, SourceError> {
        let map = self.ckpt.shards()[loc.shard].bytes();
        expert_view(&loc.shapes, |i| {
            let (buf_off, len) = loc.parts[i];
            let file_off = buffer_to_file_offset(&loc.reads, buf_off).ok_or_else(|| {
                format!("expert part {i} at buffer offset {buf_off} is outside its reads")
            })?;
            let (s, e) = (file_off as usize, (file_off + len) as usize);
            map.get(s..e)
                .ok_or_else(|| format!("expert bytes {s}..{e} beyond the shard").into())
        })
    }
}

/// Maps an offset in the concatenation of `reads` back to an absolute file offset.
fn buffer_to_file_offset(reads: &[(u64, u64)], buf_off: u64) -> Option<u64> {
    let mut base = 0u64;
    for &(file_off, len) in reads {
        if buf_off < base + len {
            return Some(file_off + (buf_off - base));
        }
        base += len;
    }
    None
}

/// A resident layer: views into the shard maps plus the vectors widened at open.
struct MappedLayer<'s> {
    ckpt: &'s Checkpoint,
    lt: &'s LayerTensors,
    prepared: &'s PreparedLayer,
}

impl WholeLayer for MappedLayer<'_> {
    fn view(&self) -> LayerWeights<'_> {
        // Every tensor was sliced successfully when the layer was prepared.
        let bytes_of = |t: &TensorRef| mapped(self.ckpt, t).unwrap_or(&[]);
        view_layer(self.lt, self.prepared, bytes_of)
    }
}

impl WeightProvider for ResidentStore {
    fn embed_row(&self, id: u32, out: &mut [f32]) -> Result<(), SourceError> {
        let bytes = mapped(&self.ckpt, &self.binding.globals.embed_tokens)?;
        embed_row(&self.head.embed, bytes, id, out)
    }

    fn layer(&self, l: usize) -> Result<Box<dyn LayerHold + '_>, SourceError> {
        match (self.binding.layers.get(l), self.layers.get(l)) {
            (Some(lt), Some(prepared)) => Ok(Box::new(Whole(MappedLayer {
                ckpt: &self.ckpt,
                lt,
                prepared,
            }))),
            _ => Err(format!("layer {l} does not exist ({} layers)", self.layers.len()).into()),
        }
    }

    fn head(&self) -> Result<HeadWeights<'_>, SourceError> {
        let bytes = mapped(&self.ckpt, &self.binding.globals.lm_head)?;
        Ok(self.head.weights(bytes))
    }
}

impl ExpertProvider for ResidentStore {
    fn fetch(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &ExpertWeights<'_>),
    ) -> Result<(), ExpertFetchError> {
        for (i, &e) in experts.iter().enumerate() {
            let fail = |source: SourceError| ExpertFetchError { expert: e, source };
            let loc = self
                .binding
                .expert(layer, e as usize)
                .map_err(|err| fail(err.into()))?;
            on_ready(i, &self.expert_weights(&loc).map_err(fail)?);
        }
        Ok(())
    }
}
