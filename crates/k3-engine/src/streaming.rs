//! The streaming store: the memory plan made real. Pinned trunk layers live in exact-size
//! buffers, the rest stream through a ring of slots (background read-ahead with ≥ 2 slots);
//! routed experts come through the expert cache; embedding rows are read on demand; the head
//! (final norms + lm_head) is read once into memory. Every byte is read with positional reads
//! (O_DIRECT where the filesystem allows), never through the shard maps, so the process's
//! resident memory follows the plan.
//!
//! Bytes become weights through the same `layer_view` code as the resident store, with the
//! same alignment (slots keep each run's offset mod 4096), so logits are bit-identical.

use crate::gather::RunMap;
use crate::layer_view::{
    expert_view, prepare_layer, prepare_mat, view_layer, widen, Mat, PreparedLayer,
};
use crate::pieces::{LayerPieces, PieceHold};
use crate::resident::embed_row;
use crate::EngineError;
use k3_format::bind::{FfnTensors, LayerTensors};
use k3_format::{Checkpoint, ModelBinding, TensorRef};
use k3_kernels::Matrix;
use k3_model::weights::{
    ExpertFetchError, ExpertProvider, ExpertWeights, HeadWeights, LayerHold, LayerWeights,
    SourceError, WeightProvider, Whole, WholeLayer,
};
use k3_plan::MemoryPlan;
use k3_store::expert_store::ExpertStore;
use k3_store::io::{AlignedBuf, ReadAt, ShardFile};
use k3_store::trunk_store::{LayerBytes, RunLoc, TrunkStore};

/// Experts per MoE layer, from the bound router gate's rows (0 for an all-dense model).
fn cfg_experts(b: &ModelBinding) -> u32 {
    b.layers
        .iter()
        .find_map(|lt| match &lt.ffn {
            k3_format::bind::FfnTensors::Moe(m) => m.gate.shape.first().copied(),
            _ => None,
        })
        .unwrap_or(0) as u32
}
use std::sync::Arc;

mod open;
use open::{open_experts, open_trunk, read_head, trunk_runs};

/// Wraps the shard files; tests swap in fault-injecting readers.
pub type Files = Vec<Arc<dyn ReadAt>>;

/// Opens every shard of `ck` for positional reads (O_DIRECT when `direct` and supported).
pub fn open_files(ck: &Checkpoint, direct: bool) -> Result<Files, EngineError> {
    ck.shards()
        .iter()
        .map(|s| open_file(s.path(), direct))
        .collect()
}

/// Opens one file for positional reads.
pub fn open_file(path: &std::path::Path, direct: bool) -> Result<Arc<dyn ReadAt>, EngineError> {
    ShardFile::open(path, direct)
        .map(|f| Arc::new(f) as Arc<dyn ReadAt>)
        .map_err(|e| EngineError::Io {
            path: path.to_path_buf(),
            source: e,
        })
}

/// The model-level tensors, read once into aligned memory.
struct Head {
    vecs: Vec<Vec<f32>>,
    lm_head: Mat,
    lm_head_bytes: AlignedBuf,
    lm_head_skew: usize,
    lm_head_len: usize,
    embed: Mat,
}

/// Reads `t`'s bytes into a 4096-aligned buffer, preserving the file offset mod 4096 so the
/// in-memory alignment equals the mapped alignment. Returns (buffer, skew).
fn read_aligned(files: &Files, t: &TensorRef) -> Result<(AlignedBuf, usize), EngineError> {
    let skew = (t.offset % 4096) as usize;
    let mut buf = AlignedBuf::new(k3_store::io::aligned_span(t.offset, t.nbytes) as usize);
    let file = &files[t.shard];
    file.read_into_aligned(&mut buf, t.offset, t.nbytes as usize)
        .map_err(|e| EngineError::Io {
            path: file.path().to_path_buf(),
            source: e,
        })?;
    Ok((buf, skew))
}

/// Every weight of the model under a memory plan — implements both model seams.
pub struct StreamingStore {
    binding: ModelBinding,
    files: Files,
    /// Where each layer's tensors sit inside its run buffer.
    run_maps: Vec<RunMap>,
    trunk: TrunkStore,
    /// Each layer's two pieces when the trunk streams in pieces (docs/STREAMING.md#trunk-pieces).
    pieces: Option<Vec<LayerPieces>>,
    experts: ExpertStore,
    head: Head,
    /// Nanoseconds fetches spent waiting for experts (fetch time minus per-expert compute).
    expert_wait_ns: std::sync::atomic::AtomicU64,
    /// With `--trunk`: the pack, and which layers' checksums were verified (each layer once,
    /// the first time it is read; pinned layers at open).
    pack_check: Option<(k3_format::TrunkPack, Vec<std::sync::atomic::AtomicBool>)>,
}

/// A pack to read the trunk from, with the pool that decodes a compressed one.
pub type PackSource<'p> = (&'p k3_format::TrunkPack, Arc<rayon::ThreadPool>);

/// Each layer's run: where it lies (in a shard, the pack, or the gathered virtual file) and
/// where its tensors sit in it.
pub(crate) struct TrunkRuns {
    pub(crate) runs: Vec<RunLoc>,
    pub(crate) run_maps: Vec<RunMap>,
}

impl StreamingStore {
    /// Builds the stores for `plan` over `files` (one per shard of the binding's checkpoint,
    /// then `trunk.bin` when `pack` is given: trunk runs are read from the pack, verbatim copies
    /// of the shard runs, so the bytes — and the logits — are the same).
    pub fn new(
        binding: ModelBinding,
        files: Files,
        plan: &MemoryPlan,
        io_threads: usize,
        pack: Option<PackSource<'_>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, EngineError> {
        let mut files = files;
        let trunk_runs = trunk_runs(&binding, &mut files, pack.as_ref().map(|p| p.0));
        let (trunk, pieces) =
            open_trunk(&binding, &files, &trunk_runs, plan, pack.as_ref(), progress)?;
        let pack = pack.map(|p| p.0);
        let pack_check = match pack {
            Some(p) => {
                let verified: Vec<std::sync::atomic::AtomicBool> = (0..binding.layers.len())
                    .map(|_| std::sync::atomic::AtomicBool::new(false))
                    .collect();
                for &l in &plan.trunk.pinned {
                    let parts: Vec<LayerBytes<'_>> = (0..trunk.pieces())
                        .filter_map(|i| trunk.pinned_piece(l, i))
                        .collect();
                    let order = pieces.as_ref().map_or([0, 1], |ps| ps[l].byte_order());
                    let ordered: Vec<&[u8]> = order
                        .iter()
                        .filter_map(|&i| parts.get(i).map(|b| &b[..]))
                        .collect();
                    p.check_layer_parts(binding.layers[l].layer, &ordered)?;
                    verified[l].store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Some((p.clone(), verified))
            }
            None => None,
        };
        let experts = open_experts(&binding, &files, plan, io_threads)?;
        let head = read_head(&binding, &files)?;
        Ok(StreamingStore {
            binding,
            files,
            run_maps: trunk_runs.run_maps,
            trunk,
            pieces,
            experts,
            head,
            expert_wait_ns: Default::default(),
            pack_check,
        })
    }

    /// The tensor binding (for the session-file model fingerprint).
    pub(crate) fn binding(&self) -> &ModelBinding {
        &self.binding
    }

    /// Trunk and expert I/O counters.
    pub fn stats(&self) -> crate::stats::StoreStats {
        let wait = self
            .expert_wait_ns
            .load(std::sync::atomic::Ordering::Relaxed) as f64
            / 1e9;
        crate::stats::StoreStats::from_parts(self.trunk.stats(), self.experts.stats(), wait)
    }

    /// Start or stop recording expert requests; take what was recorded.
    pub fn expert_store(&self) -> &ExpertStore {
        &self.experts
    }
}

/// The access mode of the embedding: `View` unless a row would be misaligned for its dtype.
fn embed_mode(t: &TensorRef) -> Result<Mat, EngineError> {
    // A zero-filled stand-in with the tensor's alignment decides view vs copy identically.
    let skew = (t.offset % 8) as usize;
    let probe = AlignedBuf::new(skew + 8);
    let mut fake = t.clone();
    fake.shape = vec![1, (8 / t.dtype.size()).max(1)];
    fake.nbytes = 8;
    let mode = prepare_mat(&fake, &probe[skew..skew + 8])?;
    let (rows, cols) = match t.shape.as_slice() {
        [r, c] => (*r, *c),
        _ => {
            return Err(EngineError::Invalid(format!(
                "{}: embedding must be 2-D, found {:?}",
                t.name, t.shape
            )))
        }
    };
    Ok(match mode {
        Mat::View { f32, .. } => Mat::View { f32, rows, cols },
        _ => Mat::OwnedF32 {
            data: Vec::new(),
            rows,
            cols,
        },
    })
}

impl StreamingStore {
    /// Tensor `t` of layer `l` within the layer's run `bytes`.
    fn tensor_bytes<'b>(&self, l: usize, t: &TensorRef, bytes: &'b [u8]) -> Option<&'b [u8]> {
        let start = self.run_maps.get(l)?.offset_of(t)?;
        bytes.get(start..start + t.nbytes as usize)
    }

    /// Checks layer `l`'s run against the pack's checksum the first time it is read.
    fn check_pack(&self, l: usize, lt: &LayerTensors, bytes: &[u8]) -> Result<(), SourceError> {
        if let Some((pack, verified)) = &self.pack_check {
            if !verified[l].load(std::sync::atomic::Ordering::Relaxed) {
                pack.check_layer(lt.layer, bytes)?;
                verified[l].store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// [`Self::check_pack`] for a layer streamed in pieces, with its first piece `first`
    /// bound: the first time, its second piece is bound beside it (its slot is of the other
    /// class; the read-ahead has usually read it already) and the run is hashed in byte order.
    fn check_pack_pieces(
        &self,
        l: usize,
        lt: &LayerTensors,
        pieces: &LayerPieces,
        first: &[u8],
    ) -> Result<(), SourceError> {
        let Some((pack, verified)) = &self.pack_check else {
            return Ok(());
        };
        if verified[l].load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let second = self.trunk.piece(l, 1)?;
        let parts = match pieces.byte_order() {
            [0, _] => [first, &second[..]],
            _ => [&second[..], first],
        };
        pack.check_layer_parts(lt.layer, &parts)?;
        verified[l].store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Reads each of `tensors` on its own from the checkpoint (a piece's outlying layer
    /// norms, docs/STREAMING.md#trunk-pieces): `(buffer, offset of the bytes in it)`.
    pub(crate) fn read_outside(
        &self,
        tensors: &[TensorRef],
    ) -> Result<Vec<(AlignedBuf, usize)>, SourceError> {
        tensors
            .iter()
            .map(|t| {
                read_aligned(&self.files, t).map_err(|e| -> SourceError { e.to_string().into() })
            })
            .collect()
    }

    /// Where layer `l`'s tensors sit in its run.
    pub(crate) fn run_map(&self, l: usize) -> Option<&RunMap> {
        self.run_maps.get(l)
    }

    /// Piece `p` of layer `l` from the trunk store.
    pub(crate) fn trunk_piece(&self, l: usize, p: usize) -> Result<LayerBytes<'_>, SourceError> {
        Ok(self.trunk.piece(l, p)?)
    }
}

/// A streamed layer: its run's bytes (a pinned buffer or a ring slot, released on drop) and
/// the vectors widened from them.
struct StreamedLayer<'s> {
    store: &'s StreamingStore,
    l: usize,
    lt: &'s LayerTensors,
    bytes: LayerBytes<'s>,
    prepared: PreparedLayer,
}

impl WholeLayer for StreamedLayer<'_> {
    fn view(&self) -> LayerWeights<'_> {
        // Every tensor of the layer was placed in its run when the store was built.
        let slice = |t: &TensorRef| -> &[u8] {
            self.store
                .tensor_bytes(self.l, t, &self.bytes)
                .unwrap_or(&[])
        };
        view_layer(self.lt, &self.prepared, slice)
    }
}

impl WeightProvider for StreamingStore {
    fn embed_row(&self, id: u32, out: &mut [f32]) -> Result<(), SourceError> {
        let t = &self.binding.globals.embed_tokens;
        let (rows, cols) = (t.shape[0], t.shape[1]);
        if id as usize >= rows || out.len() != cols {
            return Err(format!(
                "embedding row {id} of {rows} (width {cols}, asked {})",
                out.len()
            )
            .into());
        }
        let esz = t.dtype.size() as u64;
        let row = TensorRef {
            name: t.name.clone(),
            shard: t.shard,
            offset: t.offset + id as u64 * cols as u64 * esz,
            nbytes: cols as u64 * esz,
            dtype: t.dtype,
            shape: vec![1, cols],
        };
        let (buf, skew) =
            read_aligned(&self.files, &row).map_err(|e| -> SourceError { e.to_string().into() })?;
        let bytes = &buf[skew..skew + row.nbytes as usize];
        match &self.head.embed {
            Mat::View { .. } => embed_row(&prepare_mat(&row, bytes)?, bytes, 0, out),
            _ => {
                out.copy_from_slice(&widen(&row, bytes)?);
                Ok(())
            }
        }
    }

    fn layer(&self, l: usize) -> Result<Box<dyn LayerHold + '_>, SourceError> {
        let lt = self
            .binding
            .layers
            .get(l)
            .ok_or_else(|| format!("layer {l} does not exist"))?;
        if let Some(pieces) = self.pieces.as_ref().and_then(|p| p.get(l)) {
            let first = self.trunk.piece(l, 0)?;
            self.check_pack_pieces(l, lt, pieces, &first)?;
            return Ok(Box::new(PieceHold::bind(self, l, lt, pieces, first)?));
        }
        let bytes = self.trunk.layer(l)?;
        self.check_pack(l, lt, &bytes)?;
        let prepared = prepare_layer(lt, |t| Ok(self.tensor_bytes(l, t, &bytes).unwrap_or(&[])))?;
        Ok(Box::new(Whole(StreamedLayer {
            store: self,
            l,
            lt,
            bytes,
            prepared,
        })))
    }

    fn with_router(&self, l: usize, f: &mut dyn FnMut(&Matrix<'_>, &[f32])) -> bool {
        let Some(lt) = self.binding.layers.get(l) else {
            return false;
        };
        let FfnTensors::Moe(moe) = &lt.ffn else {
            return false;
        };
        // Only the router and its bias: the rest of the layer is not prepared here. Streamed
        // in pieces, a layer's router lies in its channel mixer's piece.
        let (gate, bias) = (&moe.gate, &moe.e_score_correction_bias);
        let piece = self.pieces.as_ref().and_then(|p| p.get(l));
        let Some(guard) = self.trunk.pinned_piece(l, usize::from(piece.is_some())) else {
            return false;
        };
        let find = |t: &TensorRef| match piece {
            Some(p) => crate::pieces::in_piece(self.run_maps.get(l)?, &p.ranges[1], t, &guard),
            None => self.tensor_bytes(l, t, &guard),
        };
        let (Some(gate_bytes), Some(bias_bytes)) = (find(gate), find(bias)) else {
            return false;
        };
        let (Ok(mat), Ok(bias)) = (prepare_mat(gate, gate_bytes), widen(bias, bias_bytes)) else {
            return false;
        };
        f(&crate::layer_view::matrix(&mat, gate_bytes), &bias);
        true
    }

    fn head(&self) -> Result<HeadWeights<'_>, SourceError> {
        let h = &self.head;
        let bytes = &h.lm_head_bytes[h.lm_head_skew..h.lm_head_skew + h.lm_head_len];
        Ok(HeadWeights {
            norm: &h.vecs[0],
            out_res_norm: &h.vecs[1],
            out_res_proj: &h.vecs[2],
            lm_head: crate::layer_view::matrix(&h.lm_head, bytes),
        })
    }
}

impl ExpertProvider for StreamingStore {
    fn fetch(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &ExpertWeights<'_>),
    ) -> Result<(), ExpertFetchError> {
        let mut bad: Option<ExpertFetchError> = None;
        let start = std::time::Instant::now();
        let mut computing = std::time::Duration::ZERO;
        let result = self.experts.fetch(layer, experts, &mut |i, bytes| {
            let t = std::time::Instant::now();
            if bad.is_some() {
                return;
            }
            let e = experts[i];
            match self.expert_weights(layer, e, bytes) {
                Ok(w) => on_ready(i, &w),
                Err(source) => bad = Some(ExpertFetchError { expert: e, source }),
            }
            computing += t.elapsed();
        });
        let waited = start.elapsed().saturating_sub(computing);
        self.expert_wait_ns.fetch_add(
            waited.as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        if let Err(failure) = result {
            return Err(ExpertFetchError {
                expert: failure.expert,
                source: Box::new(failure),
            });
        }
        bad.map_or(Ok(()), Err)
    }

    fn hint(&self, layer: usize, experts: &[u32]) {
        self.experts.hint(layer, experts);
    }
}

impl StreamingStore {
    /// Delivers those of `experts` that the expert cache holds right now, reading nothing
    /// (a draft model's experts: [`crate::draft::CacheOnlyExperts`]). An expert whose
    /// bytes cannot be viewed is treated as absent (the draft only loses a proposal).
    pub(crate) fn fetch_cached(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &ExpertWeights<'_>),
    ) {
        self.experts.fetch_cached(layer, experts, &mut |i, bytes| {
            if let Ok(w) = self.expert_weights(layer, experts[i], bytes) {
                on_ready(i, &w);
            }
        });
    }

    /// Expert `e` of `layer` viewed in its canonical buffer `bytes` (from the expert store).
    fn expert_weights<'b>(
        &self,
        layer: usize,
        e: u32,
        bytes: &'b [u8],
    ) -> Result<ExpertWeights<'b>, SourceError> {
        let loc = self
            .binding
            .experts
            .locate(layer, e as usize)
            .map_err(|err| -> SourceError { err.into() })?;
        expert_view(&loc.shapes, |p| {
            let (off, len) = loc.parts[p];
            bytes
                .get(off as usize..(off + len) as usize)
                .ok_or_else(|| "expert part beyond its buffer".into())
        })
    }
}
