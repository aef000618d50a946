//! The draft model of hybrid drafting (docs/STREAMING.md#hybrid-drafting): the same graph
//! over a quantized copy of the trunk (docs/FORMATS.md#draft-trunk), held in memory whole,
//! sharing the exact model's embedding and head (never loaded twice), with routed experts
//! served cache-only — an expert that is not in memory is dropped from the draft's top-k
//! (docs/MODEL.md#draft-model), so drafting never reads the disk or waits for it.

use crate::layer_view::{layer_tensors, view_layer, widen, Mat, PreparedLayer};
use crate::resident::ResidentStore;
use crate::streaming::StreamingStore;
use crate::EngineError;
use half::bf16;
use k3_format::bind::LayerTensors;
use k3_format::pack::{DraftQuant, DraftQuantizer, PackDtype, PackOptions, PackedTensor};
use k3_format::{bind_model, Checkpoint, Dtype, K3Config, ModelBinding, TensorRef, TrunkPack};
use k3_model::weights::{
    ExpertFetchError, ExpertProvider, ExpertWeights, HeadWeights, LayerHold, LayerWeights,
    SourceError, WeightProvider, Whole, WholeLayer,
};
use rayon::prelude::*;
use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A loaded draft trunk: every layer prepared in memory.
pub(crate) struct DraftTrunk {
    dir: PathBuf,
    quant: DraftQuant,
    layers: Vec<PreparedLayer>,
    bytes: u64,
}

impl DraftTrunk {
    /// Loads the opened draft trunk `pack`, refusing one made from another model or
    /// checkpoint (`ck`: the shard list it must have been made from): reads every layer
    /// once, checks its checksum and prepares it.
    pub(crate) fn load(
        pack: TrunkPack,
        binding: &ModelBinding,
        cfg: &K3Config,
        ck: &Checkpoint,
    ) -> Result<DraftTrunk, EngineError> {
        let dir = pack.dir().to_path_buf();
        let quant = pack.check_draft_against(binding, cfg)?;
        pack.check_source(ck)?;
        let bin = pack.path();
        let file = std::fs::File::open(&bin).map_err(|e| {
            EngineError::Invalid(format!(
                "{}: cannot open the draft trunk: {e}",
                bin.display()
            ))
        })?;
        let mut layers = Vec::with_capacity(binding.layers.len());
        let mut bytes = 0;
        for (l, lt) in binding.layers.iter().enumerate() {
            let (off, n) = pack.layer(l);
            let mut run = vec![0u8; n as usize];
            file.read_exact_at(&mut run, off).map_err(|e| {
                EngineError::Invalid(format!(
                    "{}: layer {l}: reading {n} bytes at {off}: {e}: the draft trunk is truncated; re-run `k3 pack --draft-quant {} MODEL_DIR {} --overwrite`",
                    bin.display(),
                    quant.name(),
                    dir.display()
                ))
            })?;
            pack.check_layer(l, &run)?;
            let entry = pack.layer_entry(l).ok_or_else(|| {
                EngineError::Invalid(format!("{}: no layer {l}", pack.json_path().display()))
            })?;
            let layer = prepare_draft_layer(lt, &|name| entry.tensor(name), &run)?;
            bytes += n;
            layers.push(layer);
        }
        Ok(DraftTrunk {
            dir,
            quant,
            layers,
            bytes,
        })
    }

    /// The draft trunk's directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
    /// How its matrices are quantized.
    pub(crate) fn quant(&self) -> DraftQuant {
        self.quant
    }
    /// Bytes held in memory (the sum of the layer runs).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// One draft layer from its run: vectors widened, matrices owned in their stored form.
fn prepare_draft_layer<'p>(
    lt: &LayerTensors,
    find: &dyn Fn(&str) -> Option<&'p PackedTensor>,
    run: &[u8],
) -> Result<PreparedLayer, EngineError> {
    let (vec_refs, mat_refs) = layer_tensors(lt);
    let part = |t: &TensorRef| -> Result<(&'p PackedTensor, &[u8]), EngineError> {
        let p = find(&t.name).ok_or_else(|| {
            EngineError::Invalid(format!("draft trunk: tensor {} is missing", t.name))
        })?;
        let bytes = run
            .get(p.off as usize..(p.off + p.nbytes) as usize)
            .ok_or_else(|| {
                EngineError::Invalid(format!(
                    "draft trunk: tensor {} lies beyond its run",
                    t.name
                ))
            })?;
        Ok((p, bytes))
    };
    let vecs = vec_refs
        .into_iter()
        .map(|t| widen(t, part(t)?.1))
        .collect::<Result<_, _>>()?;
    let mats = mat_refs
        .into_iter()
        .map(|t| {
            let (p, bytes) = part(t)?;
            owned_mat(t, p.dtype, bytes)
        })
        .collect::<Result<_, _>>()?;
    Ok(PreparedLayer::owned(vecs, mats))
}

/// A matrix of the draft, owned: bf16/f32 copied, I8R de-interleaved, MXFP4 split.
fn owned_mat(t: &TensorRef, dtype: PackDtype, bytes: &[u8]) -> Result<Mat, EngineError> {
    let &[rows, cols] = t.shape.as_slice() else {
        return Err(EngineError::Invalid(format!(
            "draft trunk: {} is not a matrix ({:?})",
            t.name, t.shape
        )));
    };
    Ok(match dtype {
        PackDtype::St(Dtype::BF16) => Mat::OwnedBf16 {
            data: bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                .collect(),
            rows,
            cols,
        },
        PackDtype::St(_) => Mat::OwnedF32 {
            data: widen(t, bytes)?,
            rows,
            cols,
        },
        PackDtype::I8R => {
            let (mut values, mut scales) =
                (Vec::with_capacity(rows * cols), Vec::with_capacity(rows));
            for row in bytes.chunks_exact(cols + 4) {
                scales.push(f32::from_le_bytes([row[0], row[1], row[2], row[3]]));
                values.extend(row[4..].iter().map(|&b| b as i8));
            }
            Mat::OwnedQ8 {
                values,
                scales,
                rows,
                cols,
            }
        }
        PackDtype::Mxfp4 => {
            let (packed, scales) = bytes.split_at(rows * cols / 2);
            Mat::OwnedMxfp4 {
                packed: packed.to_vec(),
                scales: scales.to_vec(),
                rows,
                cols,
            }
        }
    })
}

/// The draft's trunk seam: layers from the draft trunk, embedding rows and head from the
/// exact model's store.
pub(crate) struct DraftWeights<'a> {
    pub(crate) trunk: &'a DraftTrunk,
    pub(crate) binding: &'a ModelBinding,
    pub(crate) exact: &'a dyn WeightProvider,
}

struct DraftHold<'a> {
    lt: &'a LayerTensors,
    layer: &'a PreparedLayer,
}

impl WholeLayer for DraftHold<'_> {
    fn view(&self) -> LayerWeights<'_> {
        view_layer(self.lt, self.layer, |_| &[])
    }
}

impl WeightProvider for DraftWeights<'_> {
    fn embed_row(&self, id: u32, out: &mut [f32]) -> Result<(), SourceError> {
        self.exact.embed_row(id, out)
    }
    fn layer(&self, l: usize) -> Result<Box<dyn LayerHold + '_>, SourceError> {
        match (self.binding.layers.get(l), self.trunk.layers.get(l)) {
            (Some(lt), Some(layer)) => Ok(Box::new(Whole(DraftHold { lt, layer }))),
            _ => Err(format!("draft trunk has no layer {l}").into()),
        }
    }
    fn head(&self) -> Result<HeadWeights<'_>, SourceError> {
        self.exact.head()
    }
}

/// The draft's expert seam: only what the exact model's store holds in memory.
pub(crate) enum CacheOnlyExperts<'a> {
    /// Everything is mapped in place: every expert is available.
    Resident(&'a ResidentStore),
    /// The expert cache's resident slots ([`StreamingStore::fetch_cached`]).
    Streaming(&'a StreamingStore),
}

impl ExpertProvider for CacheOnlyExperts<'_> {
    fn fetch(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &ExpertWeights<'_>),
    ) -> Result<(), ExpertFetchError> {
        match self {
            CacheOnlyExperts::Resident(s) => s.fetch(layer, experts, on_ready),
            CacheOnlyExperts::Streaming(s) => {
                s.fetch_cached(layer, experts, on_ready);
                Ok(())
            }
        }
    }
    fn drops_missing(&self) -> bool {
        true
    }
}

/// The kernels' quantizers behind `k3 pack --draft-quant`: every matrix the model multiplies
/// except the MoE router gate (routing stays exact; the router refuses quantized gates) is
/// quantized; vectors are copied.
pub struct KernelQuantizer {
    names: HashSet<String>,
}

impl KernelQuantizer {
    /// The quantizer for `binding`'s trunk.
    pub fn for_binding(binding: &ModelBinding) -> Self {
        let mut names = HashSet::new();
        for lt in &binding.layers {
            let router = match &lt.ffn {
                k3_format::bind::FfnTensors::Moe(m) => Some(m.gate.name.as_str()),
                _ => None,
            };
            let (_, mats) = layer_tensors(lt);
            names.extend(
                mats.into_iter()
                    .filter(|t| Some(t.name.as_str()) != router)
                    .map(|t| t.name.clone()),
            );
        }
        KernelQuantizer { names }
    }
}

impl DraftQuantizer for KernelQuantizer {
    fn quantize(
        &self,
        t: &TensorRef,
        bytes: &[u8],
        quant: DraftQuant,
    ) -> Result<Option<Vec<u8>>, String> {
        let &[rows, cols] = t.shape.as_slice() else {
            return Ok(None);
        };
        if !self.names.contains(&t.name) || (quant == DraftQuant::Mxfp4 && cols % 32 != 0) {
            return Ok(None);
        }
        let floats = widen(t, bytes).map_err(|e| e.to_string())?;
        // Rows are independent and each is quantized by the same pure function, so splitting
        // them across threads changes no byte (≈2× on 2 cores).
        let first_error = |results: Vec<Result<(), k3_kernels::quant::QuantError>>| match results
            .into_iter()
            .enumerate()
            .find(|(_, r)| r.is_err())
        {
            Some((r, Err(e))) => Err(format!("row {r}: {e}")),
            _ => Ok(()),
        };
        match quant {
            DraftQuant::Q8 => {
                let mut out = vec![0u8; rows * (cols + 4)];
                let results = out
                    .par_chunks_mut(cols + 4)
                    .zip(floats.par_chunks(cols))
                    .map(|(dst, row)| {
                        let (scale, values) = dst.split_at_mut(4);
                        let values: &mut [i8] = bytemuck::cast_slice_mut(values);
                        let s = k3_kernels::quant::quantize_q8_row(row, values)?;
                        scale.copy_from_slice(&s.to_le_bytes());
                        Ok(())
                    })
                    .collect();
                first_error(results)?;
                Ok(Some(out))
            }
            DraftQuant::Mxfp4 => {
                let (mut packed, scales) = crate::dspark_hold::mxfp4_rows(&floats, cols)
                    .map_err(|(r, e)| format!("row {r}: {e}"))?;
                packed.extend_from_slice(&scales);
                Ok(Some(packed))
            }
        }
    }
}

/// `k3 pack --draft-quant`: writes the draft trunk of the checkpoint in `model_dir` into
/// `out_dir`; `progress(done, total)` counts source bytes.
pub fn write_draft_trunk(
    model_dir: &Path,
    out_dir: &Path,
    quant: DraftQuant,
    overwrite: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TrunkPack, EngineError> {
    let config = K3Config::load(model_dir.join("config.json"))?;
    let ckpt = Checkpoint::open(model_dir)?;
    let binding = bind_model(&ckpt, &config)?;
    let quantizer = KernelQuantizer::for_binding(&binding);
    let opts = PackOptions {
        overwrite,
        ..PackOptions::default()
    };
    let recipe = k3_format::pack::DraftRecipe {
        quant,
        quantizer: &quantizer,
    };
    Ok(k3_format::pack::write_draft_pack(
        &ckpt, &binding, &config, out_dir, recipe, &opts, progress,
    )?)
}
