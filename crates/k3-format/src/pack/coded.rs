//! The compressed packed trunk (docs/FORMATS.md#compressed-trunk): each BF16 tensor of a
//! layer's run stored as independently decodable chunks (exponent plane Huffman-coded, sign +
//! mantissa raw, `k3_codec`), every other tensor raw; the index carries each chunk's place,
//! its stored bytes' XXH3-64 and each tensor's code, and each layer's checksum is the DECODED
//! run's (equal to the plain pack's).

use super::json::{LayerDoc, StoredDoc};
use super::write::{layer_doc, prepare_dir, publish_doc, TmpFiles};
use super::{align_up, checksum_string, PackDtype, PackError, PackOptions, TrunkPack, ALIGN};
use crate::bind::ModelBinding;
use crate::config::K3Config;
use crate::dtype::Dtype;
use crate::index::Checkpoint;
use k3_codec::{CodeLengths, DecodeTable};
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// The `"codec"` value of a compressed pack's `trunk.json`.
pub const CODEC_NAME: &str = "bf16-exponent-huffman4";
/// The `"version"` of a compressed pack (a plain pack stays version 1).
pub const COMPRESSED_VERSION: u32 = 2;
/// Values per chunk the writer uses: 1 MiB of bf16, ~1,100 chunks per released layer, enough
/// to keep any number of decoding threads busy, and each chunk's table-free header is 16 bytes.
pub const CHUNK_VALUES: u64 = 1 << 19;
/// BF16 tensors smaller than this are stored raw (a code's table costs 256 bytes of index).
pub const MIN_CODED_BYTES: u64 = 64 << 10;

/// How [`write_compressed_pack_with`] cuts and chooses tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompressOptions {
    /// Values per chunk.
    pub chunk_values: u64,
    /// BF16 tensors of fewer bytes are stored raw.
    pub min_coded_bytes: u64,
}

impl Default for CompressOptions {
    fn default() -> CompressOptions {
        CompressOptions {
            chunk_values: CHUNK_VALUES,
            min_coded_bytes: MIN_CODED_BYTES,
        }
    }
}

/// How a tensor of a compressed pack is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TensorStore {
    /// Verbatim, at this offset of the stored run.
    Raw {
        /// Offset within the stored run.
        off: u64,
    },
    /// BF16 chunks coded with one Huffman code.
    Coded(Box<CodedTensor>),
}

/// A coded BF16 tensor: its exponent code and its chunks.
#[derive(Clone)]
pub struct CodedTensor {
    /// Exponent code lengths.
    pub lengths: CodeLengths,
    /// Values per chunk (the last holds the rest).
    pub chunk_values: u64,
    /// Chunks in value order.
    pub chunks: Vec<StoredChunk>,
    table: Arc<DecodeTable>,
}

impl fmt::Debug for CodedTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodedTensor")
            .field("lengths", &self.lengths.to_hex())
            .field("chunk_values", &self.chunk_values)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl PartialEq for CodedTensor {
    fn eq(&self, o: &CodedTensor) -> bool {
        (&self.lengths, self.chunk_values, &self.chunks) == (&o.lengths, o.chunk_values, &o.chunks)
    }
}
impl Eq for CodedTensor {}

/// One chunk's place in the stored run and the XXH3-64 of its stored bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredChunk {
    /// Offset within the stored run.
    pub off: u64,
    /// Stored length.
    pub len: u64,
    /// XXH3-64 of the stored bytes.
    pub hash: u64,
}

/// One independently decodable piece of a layer: `src` of the stored run becomes `dst` of
/// the decoded run. A layer's jobs tile its decoded run in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeJob {
    /// Index into the layer's tensors (sorted by offset).
    pub tensor: usize,
    /// Chunk index within the tensor (0 for a raw tensor).
    pub chunk: usize,
    /// Bytes of the stored run.
    pub src: Range<usize>,
    /// Bytes of the decoded run.
    pub dst: Range<usize>,
}

/// Parses and checks a tensor's `"stored"` entry: raw bytes or chunks inside the stored run,
/// the code a valid prefix code, one chunk per `chunk_values` values, each long enough for
/// its header and raw plane.
pub(super) fn parse_stored(
    layer: usize,
    name: &str,
    dtype: PackDtype,
    nbytes: u64,
    doc: Option<&StoredDoc>,
    stored_bytes: u64,
) -> Result<TensorStore, String> {
    let at = |what: String| format!("layer {layer}: tensor {name:?}: {what}");
    let doc = doc.ok_or_else(|| at("no \"stored\" entry in a compressed pack".into()))?;
    let inside = |off: u64, len: u64| off.checked_add(len).is_some_and(|e| e <= stored_bytes);
    let Some(hex) = &doc.lengths else {
        let off = doc
            .off
            .ok_or_else(|| at("\"stored\" has neither \"off\" nor \"lengths\"".into()))?;
        if !inside(off, nbytes) {
            return Err(at(format!(
                "raw bytes [{off}, +{nbytes}) lie outside the {stored_bytes}-byte stored run"
            )));
        }
        return Ok(TensorStore::Raw { off });
    };
    if dtype != PackDtype::St(Dtype::BF16) {
        return Err(at(format!("{dtype} cannot be coded (only BF16)")));
    }
    let lengths = CodeLengths::from_hex(hex).map_err(|e| at(e.to_string()))?;
    let table = DecodeTable::new(&lengths).map_err(|e| at(e.to_string()))?;
    let chunk_values = doc
        .chunk_values
        .filter(|&v| v > 0)
        .ok_or_else(|| at("\"chunk_values\" missing or 0".into()))?;
    let values = nbytes / 2;
    let raw = doc.chunks.as_deref().unwrap_or(&[]);
    let want = values.div_ceil(chunk_values) as usize;
    if raw.len() != want {
        return Err(at(format!(
            "{} chunks listed, {values} values in chunks of {chunk_values} need {want}",
            raw.len()
        )));
    }
    let mut chunks = Vec::with_capacity(raw.len());
    for (c, (off, len, hash)) in raw.iter().enumerate() {
        let n = chunk_values.min(values - c as u64 * chunk_values);
        if !inside(*off, *len) {
            return Err(at(format!(
                "chunk {c} at [{off}, +{len}) lies outside the {stored_bytes}-byte stored run"
            )));
        }
        if *len < k3_codec::HEADER as u64 + n {
            return Err(at(format!(
                "chunk {c} is {len} bytes, too short for {n} values"
            )));
        }
        let hash = super::parse_checksum(hash).ok_or_else(|| {
            at(format!(
                "chunk {c}: checksum {hash:?} is not \"xxh3-64:<16 hex digits>\""
            ))
        })?;
        chunks.push(StoredChunk {
            off: *off,
            len: *len,
            hash,
        });
    }
    Ok(TensorStore::Coded(Box::new(CodedTensor {
        lengths,
        chunk_values,
        chunks,
        table: Arc::new(table),
    })))
}

impl TrunkPack {
    /// Layer `l`'s decode jobs (one per chunk, one per raw tensor), in decoded order. Empty
    /// for a plain pack or a layer out of range.
    pub fn decode_jobs(&self, l: usize) -> Vec<DecodeJob> {
        let Some(e) = self.layers.get(l) else {
            return Vec::new();
        };
        let mut jobs = Vec::new();
        for (i, t) in e.tensors.iter().enumerate() {
            let dst0 = t.off as usize;
            match &t.stored {
                None => {}
                Some(TensorStore::Raw { off }) => jobs.push(DecodeJob {
                    tensor: i,
                    chunk: 0,
                    src: *off as usize..(*off + t.nbytes) as usize,
                    dst: dst0..dst0 + t.nbytes as usize,
                }),
                Some(TensorStore::Coded(c)) => {
                    let step = 2 * c.chunk_values as usize;
                    for (k, ch) in c.chunks.iter().enumerate() {
                        let start = dst0 + k * step;
                        let end = (start + step).min(dst0 + t.nbytes as usize);
                        jobs.push(DecodeJob {
                            tensor: i,
                            chunk: k,
                            src: ch.off as usize..(ch.off + ch.len) as usize,
                            dst: start..end,
                        });
                    }
                }
            }
        }
        jobs
    }

    /// Runs one job of layer `l`: checks the stored bytes' XXH3-64, then copies or decodes
    /// them into `dst` (the job's `dst` range of the decoded run). A damaged chunk is refused
    /// naming the layer, tensor and chunk; `dst` then holds nothing to use.
    pub fn decode_job(
        &self,
        l: usize,
        job: &DecodeJob,
        stored: &[u8],
        dst: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> Result<(), PackError> {
        self.decode_job_in(l, job, stored, 0, dst, scratch, true)
    }

    /// [`TrunkPack::decode_job`] where `stored` holds the stored run's bytes from `base` on
    /// (a reader that read only part of the run, e.g. one piece of the layer), checking the
    /// stored bytes' XXH3-64 only when `hash`: a streaming reader checks each unit's chunks
    /// the first time it reads them, as it checks a plain pack's runs (hashing every read
    /// cost a fifth of the decode). The decoder's own checks (stream lengths, codes, bit
    /// counts) run either way.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_job_in(
        &self,
        l: usize,
        job: &DecodeJob,
        stored: &[u8],
        base: usize,
        dst: &mut [u8],
        scratch: &mut Vec<u8>,
        hash: bool,
    ) -> Result<(), PackError> {
        let e = &self.layers[l];
        let t = &e.tensors[job.tensor];
        let fail = |detail: String| PackError::Chunk {
            path: self.path(),
            layer: l,
            tensor: t.name.clone(),
            chunk: job.chunk,
            file_off: e.file_off + job.src.start as u64,
            len: job.src.len() as u64,
            detail,
        };
        let local = job
            .src
            .start
            .checked_sub(base)
            .map(|a| a..a + job.src.len());
        let src = local.and_then(|r| stored.get(r)).ok_or_else(|| {
            fail(format!(
                "the stored run read is {} bytes, short of the chunk's end",
                stored.len()
            ))
        })?;
        match &t.stored {
            Some(TensorStore::Coded(c)) => {
                let want = c.chunks[job.chunk].hash;
                let found = match hash {
                    true => xxhash_rust::xxh3::xxh3_64(src),
                    false => want,
                };
                if found != want {
                    return Err(fail(format!(
                        "stored bytes hash to {} but trunk.json records {}",
                        checksum_string(found),
                        checksum_string(want)
                    )));
                }
                k3_codec::decode_chunk(src, dst.len() / 2, &c.table, dst, scratch)
                    .map_err(|e| fail(e.to_string()))
            }
            _ => {
                dst.copy_from_slice(src);
                Ok(())
            }
        }
    }

    /// Decodes layer `l`'s stored run (`stored`, as read from [`TrunkPack::layer`]) into
    /// `out` (its decoded length) on this thread and checks the decoded run's checksum.
    pub fn decode_layer(&self, l: usize, stored: &[u8], out: &mut [u8]) -> Result<(), PackError> {
        let mut scratch = Vec::new();
        for (job, dst) in self.split_jobs(l, out) {
            self.decode_job(l, &job, stored, dst, &mut scratch)?;
        }
        self.check_layer(l, out)
    }

    /// Layer `l`'s jobs, each with its slice of `out` (the decoded run): disjoint, so callers
    /// may run them in parallel.
    pub fn split_jobs<'o>(&self, l: usize, out: &'o mut [u8]) -> Vec<(DecodeJob, &'o mut [u8])> {
        let mut rest = out;
        let mut at = 0usize;
        let mut v = Vec::new();
        for job in self.decode_jobs(l) {
            let skip = job.dst.start.saturating_sub(at);
            let taken = std::mem::take(&mut rest);
            if taken.len() < skip + job.dst.len() {
                break;
            }
            let (_, tail) = taken.split_at_mut(skip);
            let (mine, tail) = tail.split_at_mut(job.dst.len());
            at = job.dst.end;
            rest = tail;
            v.push((job, mine));
        }
        v
    }
}

/// Writes a compressed pack of `ck`'s trunk into `out_dir` (docs/FORMATS.md#compressed-trunk),
/// with the guarantees of [`super::write_trunk_pack`] (refusals before writing, temporary
/// files, atomic publish). Layers are read from the mapped shards one at a time.
pub fn write_compressed_pack(
    ck: &Checkpoint,
    binding: &ModelBinding,
    cfg: &K3Config,
    out_dir: &Path,
    opts: &PackOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TrunkPack, PackError> {
    let c = CompressOptions::default();
    write_compressed_pack_with(ck, binding, cfg, out_dir, opts, &c, progress)
}

/// [`write_compressed_pack`] with other chunking (tests use small chunks and code every
/// BF16 tensor of the tiny models).
pub fn write_compressed_pack_with(
    ck: &Checkpoint,
    binding: &ModelBinding,
    cfg: &K3Config,
    out_dir: &Path,
    opts: &PackOptions,
    copts: &CompressOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TrunkPack, PackError> {
    let copts = CompressOptions {
        chunk_values: copts.chunk_values.max(1),
        ..*copts
    };
    let runs = super::write::plan_runs(ck, binding, cfg, out_dir)?;
    prepare_dir(out_dir, opts.overwrite)?;
    let tmp = TmpFiles::new(out_dir);
    let mut out = File::create(&tmp.bin).map_err(PackError::io(&tmp.bin, "create"))?;
    let total: u64 = runs.iter().map(|(r, _)| r.len()).sum();
    let (mut pos, mut done) = (0u64, 0u64);
    let mut layers: Vec<LayerDoc> = Vec::with_capacity(runs.len());
    for &(run, lt) in &runs {
        let shard = &ck.shards()[run.shard];
        let bytes = shard
            .bytes()
            .get(run.start as usize..run.end as usize)
            .ok_or_else(|| PackError::Invalid {
                path: shard.path().into(),
                detail: format!(
                    "layer {}: run [{}, {}) passes the shard's end",
                    lt.layer, run.start, run.end
                ),
            })?;
        let hash = xxhash_rust::xxh3::xxh3_64(bytes);
        let mut doc = layer_doc(lt, run, pos, hash, shard.path());
        let stored = encode_layer(bytes, &mut doc, &copts).map_err(|e| PackError::Invalid {
            path: shard.path().into(),
            detail: format!("layer {}: {e}", lt.layer),
        })?;
        out.write_all(&stored)
            .map_err(PackError::io(&tmp.bin, "write"))?;
        let end = pos + stored.len() as u64;
        let to = align_up(end, ALIGN);
        out.write_all(&vec![0u8; (to - end) as usize])
            .map_err(PackError::io(&tmp.bin, "write"))?;
        pos = to;
        layers.push(doc);
        done += run.len();
        progress(done, total);
    }
    out.sync_all().map_err(PackError::io(&tmp.bin, "sync"))?;
    publish_doc(ck, cfg, out_dir, tmp, layers, Some(CODEC_NAME))
}

/// Encodes one layer's run (`run`, tensors at `doc`'s offsets) into its stored bytes, filling
/// each tensor's `"stored"` entry and the layer's `stored_bytes`.
fn encode_layer(
    run: &[u8],
    doc: &mut LayerDoc,
    copts: &CompressOptions,
) -> Result<Vec<u8>, k3_codec::CodecError> {
    let mut stored = Vec::with_capacity(run.len());
    let mut order: Vec<&String> = doc.tensors.keys().collect();
    order.sort_by_key(|n| doc.tensors[*n].off);
    let order: Vec<String> = order.into_iter().cloned().collect();
    for name in order {
        let Some(t) = doc.tensors.get_mut(&name) else {
            continue;
        };
        let bytes = &run[t.off as usize..(t.off + t.nbytes) as usize];
        let coded = t.dtype == Dtype::BF16.name() && t.nbytes >= copts.min_coded_bytes.max(2);
        t.stored = Some(if coded {
            encode_tensor(bytes, &mut stored, copts.chunk_values)?
        } else {
            let off = stored.len() as u64;
            stored.extend_from_slice(bytes);
            StoredDoc {
                off: Some(off),
                lengths: None,
                chunk_values: None,
                chunks: None,
            }
        });
    }
    doc.stored_bytes = Some(stored.len() as u64);
    Ok(stored)
}

/// One BF16 tensor: its exponent code, then its chunks appended to `stored`.
fn encode_tensor(
    bytes: &[u8],
    stored: &mut Vec<u8>,
    chunk_values: u64,
) -> Result<StoredDoc, k3_codec::CodecError> {
    let mut hist = [0u64; 256];
    k3_codec::add_exponents(bytes, &mut hist);
    let lengths = CodeLengths::for_histogram(&hist);
    let mut chunks = Vec::new();
    for c in bytes.chunks(2 * chunk_values as usize) {
        let off = stored.len();
        k3_codec::encode_chunk(c, &lengths, stored)?;
        let hash = xxhash_rust::xxh3::xxh3_64(&stored[off..]);
        chunks.push((
            off as u64,
            (stored.len() - off) as u64,
            checksum_string(hash),
        ));
    }
    Ok(StoredDoc {
        off: None,
        lengths: Some(lengths.to_hex()),
        chunk_values: Some(chunk_values),
        chunks: Some(chunks),
    })
}
