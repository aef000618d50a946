//! The draft trunk (docs/FORMATS.md#draft-trunk): a packed trunk whose large matrices are
//! quantized (per-row int8 `I8R` or `MXFP4` groups of 32), for the draft model of hybrid
//! drafting. Same `trunk.bin` + `trunk.json` layout as the exact pack, plus `"draft"` naming
//! the quantization; the exact model refuses it, the draft loader refuses an exact pack.
//!
//! This crate never does the arithmetic: [`DraftQuantizer`] (implemented by the engine over
//! `k3_kernels::quant`) turns a tensor's bytes into the draft's bytes or keeps them verbatim.

use super::json::{LayerDoc, TensorDoc};
use super::write::{prepare_dir, publish, TmpFiles};
use super::{align_up, checksum_string, PackDtype, PackError, PackOptions, PackedLayer};
use super::{TrunkPack, ALIGN, TRUNK_JSON};
use crate::bind::{LayerTensors, ModelBinding, TensorRef};
use crate::config::K3Config;
use crate::index::Checkpoint;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use xxhash_rust::xxh3::Xxh3;

/// How a draft trunk stores its large matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DraftQuant {
    /// Per-row int8 with one f32 scale per row (`I8R`): half the bf16 bytes.
    Q8,
    /// MXFP4, groups of 32 with one E8M0 scale (`MXFP4`): about a quarter of the bf16 bytes.
    Mxfp4,
}

impl DraftQuant {
    /// The `--draft-quant` / `"draft"` spelling.
    pub fn name(self) -> &'static str {
        match self {
            DraftQuant::Q8 => "q8",
            DraftQuant::Mxfp4 => "mxfp4",
        }
    }
    /// Parses [`DraftQuant::name`].
    pub fn parse(s: &str) -> Option<DraftQuant> {
        match s {
            "q8" => Some(DraftQuant::Q8),
            "mxfp4" => Some(DraftQuant::Mxfp4),
            _ => None,
        }
    }
    /// The pack dtype of a quantized matrix.
    pub fn dtype(self) -> PackDtype {
        match self {
            DraftQuant::Q8 => PackDtype::I8R,
            DraftQuant::Mxfp4 => PackDtype::Mxfp4,
        }
    }
}

/// Turns one trunk tensor into draft bytes.
pub trait DraftQuantizer {
    /// `Some(bytes)` in `quant`'s layout for a tensor the draft quantizes, `None` to copy it
    /// verbatim (vectors, the router gate). `bytes` are the tensor's bytes as stored.
    fn quantize(
        &self,
        t: &TensorRef,
        bytes: &[u8],
        quant: DraftQuant,
    ) -> Result<Option<Vec<u8>>, String>;
}

/// Bytes of a `[rows, cols]` matrix stored as `dtype`, `None` for a safetensors dtype or a
/// shape that is not 2-D (or, for MXFP4, whose columns are not whole groups of 32).
pub fn quantized_bytes(dtype: PackDtype, shape: &[usize]) -> Option<u64> {
    let &[rows, cols] = shape else { return None };
    let (rows, cols) = (rows as u64, cols as u64);
    match dtype {
        PackDtype::I8R => rows.checked_mul(cols.checked_add(4)?),
        PackDtype::Mxfp4 if cols % 32 == 0 => rows.checked_mul(cols / 2 + cols / 32),
        _ => None,
    }
}

/// What a draft trunk is made of: the quantization and who computes it.
#[derive(Clone, Copy)]
pub struct DraftRecipe<'q> {
    /// How the matrices are stored.
    pub quant: DraftQuant,
    /// Turns tensors into draft bytes.
    pub quantizer: &'q dyn DraftQuantizer,
}

/// Tensor offsets inside a draft run are multiples of this (bf16/f32 views stay aligned).
const TENSOR_ALIGN: u64 = 64;

/// Writes the draft trunk of `ck` (quantized by `recipe`) into `out_dir`.
///
/// Same guarantees as [`super::write_trunk_pack`]: refuses an existing pack unless
/// `opts.overwrite`, writes under `.tmp` names and renames at the end (`trunk.json` last),
/// each layer's run starts at a multiple of 4096 and carries an XXH3-64 of its bytes. Within a
/// run tensors follow the checkpoint's layout order at 64-byte aligned offsets. The shards
/// are read tensor by tensor (no maps). `progress(done, total)` counts source bytes.
pub fn write_draft_pack(
    ck: &Checkpoint,
    binding: &ModelBinding,
    cfg: &K3Config,
    out_dir: &Path,
    recipe: DraftRecipe<'_>,
    opts: &PackOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TrunkPack, PackError> {
    let DraftRecipe { quant, quantizer } = recipe;
    if binding.layers.len() != cfg.num_hidden_layers {
        return Err(PackError::Mismatch {
            path: out_dir.join(TRUNK_JSON),
            detail: format!(
                "the binding has {} layers but the config has {}",
                binding.layers.len(),
                cfg.num_hidden_layers
            ),
        });
    }
    prepare_dir(out_dir, opts.overwrite)?;
    let tmp = TmpFiles::new(out_dir);
    let total: u64 = binding
        .layers
        .iter()
        .flat_map(|lt| lt.tensors())
        .map(|t| t.nbytes)
        .sum();
    let mut out = File::create(&tmp.bin).map_err(PackError::io(&tmp.bin, "create"))?;
    let mut writer = RunWriter {
        out: &mut out,
        path: &tmp.bin,
        pos: 0,
    };
    let mut done = 0u64;
    let mut layers = Vec::with_capacity(binding.layers.len());
    for lt in &binding.layers {
        writer.pad(ALIGN, None)?;
        let doc = write_layer(ck, lt, quant, quantizer, &mut writer, &mut |n| {
            done += n;
            progress(done, total);
        })?;
        layers.push(doc);
    }
    writer.pad(ALIGN, None)?;
    out.sync_all().map_err(PackError::io(&tmp.bin, "sync"))?;
    publish(ck, cfg, out_dir, tmp, layers, Some(quant.name()))
}

/// Appends bytes to `trunk.bin`, hashing the current run.
struct RunWriter<'f> {
    out: &'f mut File,
    path: &'f Path,
    pos: u64,
}

impl RunWriter<'_> {
    fn write(&mut self, bytes: &[u8], hash: &mut Xxh3) -> Result<(), PackError> {
        self.out
            .write_all(bytes)
            .map_err(PackError::io(self.path, "write"))?;
        hash.update(bytes);
        self.pos += bytes.len() as u64;
        Ok(())
    }
    /// Zeros up to the next multiple of `align` (hashed into `hash` when inside a run).
    fn pad(&mut self, align: u64, hash: Option<&mut Xxh3>) -> Result<(), PackError> {
        let zeros = vec![0u8; (align_up(self.pos, align) - self.pos) as usize];
        self.out
            .write_all(&zeros)
            .map_err(PackError::io(self.path, "write"))?;
        if let Some(h) = hash {
            h.update(&zeros);
        }
        self.pos += zeros.len() as u64;
        Ok(())
    }
}

/// Reads, quantizes and appends one layer's tensors; returns its `trunk.json` entry.
fn write_layer(
    ck: &Checkpoint,
    lt: &LayerTensors,
    quant: DraftQuant,
    quantizer: &dyn DraftQuantizer,
    w: &mut RunWriter<'_>,
    step: &mut dyn FnMut(u64),
) -> Result<LayerDoc, PackError> {
    let mut ts = lt.tensors();
    ts.sort_by_key(|t| (t.shard, t.offset));
    let run_start = w.pos;
    let mut hash = Xxh3::new();
    let mut tensors = BTreeMap::new();
    for t in &ts {
        w.pad(TENSOR_ALIGN, Some(&mut hash))?;
        let shard = ck.shards()[t.shard].path();
        let mut src = vec![0u8; t.nbytes as usize];
        File::open(shard)
            .and_then(|f| f.read_exact_at(&mut src, t.offset))
            .map_err(PackError::io(shard, "read"))?;
        let quantized =
            quantizer
                .quantize(t, &src, quant)
                .map_err(|detail| PackError::Invalid {
                    path: shard.to_path_buf(),
                    detail: format!("tensor {:?}: {detail}", t.name),
                })?;
        let (dtype, bytes) = match &quantized {
            Some(q) => (quant.dtype(), q.as_slice()),
            None => (PackDtype::St(t.dtype), src.as_slice()),
        };
        let doc = TensorDoc {
            off: w.pos - run_start,
            nbytes: bytes.len() as u64,
            dtype: dtype.name().into(),
            shape: t.shape.clone(),
            stored: None,
        };
        w.write(bytes, &mut hash)?;
        tensors.insert(t.name.clone(), doc);
        step(t.nbytes);
    }
    let first = ts.first().map_or((0, 0), |t| (t.shard, t.offset));
    Ok(LayerDoc {
        layer: lt.layer,
        file_off: run_start,
        nbytes: w.pos - run_start,
        stored_bytes: None,
        checksum: Some(checksum_string(hash.digest())),
        source_shard: ck.shards()[first.0]
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        source_offset: first.1,
        tensors,
    })
}

impl TrunkPack {
    /// The quantization of a draft trunk; `None` for an exact pack.
    pub fn draft_quant(&self) -> Option<DraftQuant> {
        self.draft
    }

    /// Refuses a draft trunk that does not belong to `binding`'s model (config fingerprint,
    /// layer count, every tensor present with the checkpoint's shape, stored verbatim or in
    /// the draft's quantized dtype), or a pack that is not a draft trunk.
    pub fn check_draft_against(
        &self,
        binding: &ModelBinding,
        cfg: &K3Config,
    ) -> Result<DraftQuant, PackError> {
        let mismatch = |detail: String| PackError::Mismatch {
            path: self.json_path(),
            detail,
        };
        let Some(quant) = self.draft else {
            return Err(mismatch(
                "this is an exact trunk pack, not a draft trunk: make one with `k3 pack --draft-quant q8 MODEL_DIR DRAFT_DIR`".into(),
            ));
        };
        self.check_model(binding, cfg, "draft trunk")?;
        for (pl, lt) in self.layers.iter().zip(&binding.layers) {
            check_draft_layer(pl, lt, quant).map_err(mismatch)?;
        }
        Ok(quant)
    }
}

/// Every checkpoint tensor of the layer is in the draft layer with the same shape, stored
/// verbatim (same dtype and size) or quantized; nothing else is.
fn check_draft_layer(pl: &PackedLayer, lt: &LayerTensors, quant: DraftQuant) -> Result<(), String> {
    let l = pl.layer;
    let ts = lt.tensors();
    for t in &ts {
        let Some(p) = pl.tensor(&t.name) else {
            return Err(format!(
                "tensor {:?} (layer {l}) is not in the draft trunk",
                t.name
            ));
        };
        let verbatim = p.dtype == PackDtype::St(t.dtype) && p.nbytes == t.nbytes;
        let quantized = p.dtype == quant.dtype();
        if p.shape != t.shape || !(verbatim || quantized) {
            return Err(format!(
                "tensor {:?} (layer {l}): draft trunk has {} {:?} ({} bytes), checkpoint has {} {:?}",
                t.name, p.dtype, p.shape, p.nbytes, t.dtype, t.shape
            ));
        }
    }
    if let Some(extra) = pl
        .tensors
        .iter()
        .find(|p| !ts.iter().any(|t| t.name == p.name))
    {
        return Err(format!(
            "tensor {:?} in the draft trunk's layer {l} is not a trunk tensor of the checkpoint",
            extra.name
        ));
    }
    Ok(())
}
