//! The packed trunk (docs/FORMATS.md#packed-trunk): every layer's non-expert tensors copied verbatim, one run per
//! layer, into `trunk.bin`, described by `trunk.json`, so loading a layer is one aligned read.
//!
//! - [`write_trunk_pack`] copies each layer's contiguous shard run (refusing a layer whose trunk
//!   is not one run) with large sequential reads, hashing as it goes, and publishes the two
//!   files atomically (temporary names, renamed at the end, `trunk.json` last).
//! - [`TrunkPack::open`] validates `trunk.json` against itself and `trunk.bin`'s length;
//!   [`TrunkPack::check_against`] refuses a pack of another model or a stale pack;
//!   [`TrunkPack::verify_checksums`] re-reads and re-hashes every layer.
//!
//! - [`adopt_trunk_pack`] takes over a trunk packed by upstream's packer (its own, smaller
//!   `trunk.json`), after matching and comparing every layer with the checkpoint.
//!
//! The format is documented in `docs/FORMATS.md` ("Packed trunk").

mod adopt;
mod check;
mod coded;
mod draft;
mod error;
mod json;
mod read;
mod upstream;
mod write;

pub use adopt::{adopt_trunk_pack, UPSTREAM_JSON};
pub use coded::{
    write_compressed_pack, write_compressed_pack_with, CodedTensor, CompressOptions, DecodeJob,
    StoredChunk, TensorStore, CHUNK_VALUES, CODEC_NAME, COMPRESSED_VERSION, MIN_CODED_BYTES,
};
pub use draft::{quantized_bytes, write_draft_pack, DraftQuant, DraftQuantizer, DraftRecipe};
pub use error::PackError;
pub use json::{ConfigFingerprint, SourceShard};
pub use write::{write_trunk_pack, PackOptions};

use crate::dtype::Dtype;
use std::fmt;
use std::path::{Path, PathBuf};

/// The data file.
pub const TRUNK_BIN: &str = "trunk.bin";
/// The index file.
pub const TRUNK_JSON: &str = "trunk.json";
/// The `"format"` value of `trunk.json`.
pub const FORMAT_NAME: &str = "k3-trunk-pack";
/// The `"version"` this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Run alignment in `trunk.bin` (O_DIRECT reads need 4096).
pub const ALIGN: u64 = 4096;
/// Checksum algorithm tag in `"checksum": "<algo>:<16 hex digits>"`.
pub const CHECKSUM_ALGO: &str = "xxh3-64";
/// Default copy / verify buffer: 64 MiB.
pub const DEFAULT_CHUNK: usize = 64 << 20;

/// Element type of a packed tensor: a safetensors dtype, or a quantized matrix of a draft
/// trunk (docs/FORMATS.md#draft-trunk): the per-row int8 `I8R` (`[f32 scale][i8 × cols]` per
/// row, upstream's layout) or `MXFP4` (`[rows][cols/2]` codes, then `[rows][cols/32]` E8M0
/// scales). Shapes stay the logical `[rows, cols]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackDtype {
    /// A safetensors dtype, copied verbatim.
    St(Dtype),
    /// Per-row int8 with an f32 scale per row.
    I8R,
    /// MXFP4 groups of 32 (codes, then scales).
    Mxfp4,
}

impl PackDtype {
    /// Parses the `trunk.json` spelling.
    pub fn parse(s: &str) -> Option<PackDtype> {
        match s {
            "I8R" => Some(PackDtype::I8R),
            "MXFP4" => Some(PackDtype::Mxfp4),
            _ => Dtype::parse(s).map(PackDtype::St),
        }
    }
    /// The `trunk.json` spelling.
    pub fn name(self) -> &'static str {
        match self {
            PackDtype::St(d) => d.name(),
            PackDtype::I8R => "I8R",
            PackDtype::Mxfp4 => "MXFP4",
        }
    }
}

impl fmt::Display for PackDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor inside a layer's run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedTensor {
    /// Full released name.
    pub name: String,
    /// Byte offset within the run (= absolute shard offset − run start).
    pub off: u64,
    /// Byte length.
    pub nbytes: u64,
    /// Element type.
    pub dtype: PackDtype,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// How the tensor is stored in a compressed pack (`None` in a plain pack: verbatim at
    /// `off` of the run).
    pub stored: Option<TensorStore>,
}

/// One layer's run in `trunk.bin`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedLayer {
    /// Layer index (zero-based).
    pub layer: usize,
    /// Offset of the run in `trunk.bin` (a multiple of the pack's alignment).
    pub file_off: u64,
    /// Run length in bytes (decoded, in a compressed pack).
    pub nbytes: u64,
    /// Bytes the run takes in `trunk.bin` (`nbytes` in a plain pack).
    pub stored_bytes: u64,
    /// XXH3-64 of the run's bytes (decoded, in a compressed pack: equal to the plain pack's).
    pub checksum: u64,
    /// Shard file name the run was copied from.
    pub source_shard: String,
    /// Absolute offset of the run in that shard.
    pub source_offset: u64,
    /// The run's tensors, sorted by `off`.
    pub tensors: Vec<PackedTensor>,
}

impl PackedLayer {
    /// The tensor named `name` (full released name), if the layer has it.
    pub fn tensor(&self, name: &str) -> Option<&PackedTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Whether `run` (the layer's `nbytes` bytes, read from `file_off`) hashes to the recorded
    /// checksum: lets a loader verify a layer it has read anyway.
    pub fn verify(&self, run: &[u8]) -> bool {
        run.len() as u64 == self.nbytes && xxhash_rust::xxh3::xxh3_64(run) == self.checksum
    }
}

/// Where the pack came from: the config fingerprint and the shard files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackSource {
    /// Shape-determining config values of the packed model.
    pub config: ConfigFingerprint,
    /// Every shard of the source checkpoint, in checkpoint order.
    pub shards: Vec<SourceShard>,
}

/// An opened, validated packed trunk.
#[derive(Clone, Debug)]
pub struct TrunkPack {
    dir: PathBuf,
    bin_len: u64,
    align: u64,
    source: PackSource,
    layers: Vec<PackedLayer>,
    /// `Some` for a draft trunk (`"draft"` in `trunk.json`).
    draft: Option<DraftQuant>,
    /// Whether runs are stored compressed (`"codec"`, version 2).
    compressed: bool,
}

impl TrunkPack {
    /// The pack directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Path of `trunk.bin`.
    pub fn path(&self) -> PathBuf {
        self.dir.join(TRUNK_BIN)
    }
    /// Path of `trunk.json`.
    pub fn json_path(&self) -> PathBuf {
        self.dir.join(TRUNK_JSON)
    }
    /// Length of `trunk.bin` when opened.
    pub fn bin_len(&self) -> u64 {
        self.bin_len
    }
    /// Alignment of every `file_off` (4096 for packs written by this crate).
    pub fn align(&self) -> u64 {
        self.align
    }
    /// Whether runs are 4096-aligned, so a loader may read them with O_DIRECT; otherwise it
    /// must fall back to buffered reads (docs/FORMATS.md#packed-trunk).
    pub fn direct_io_ok(&self) -> bool {
        self.align == ALIGN
    }
    /// Why a loader must use buffered reads, if it must.
    pub fn buffered_fallback_note(&self) -> Option<String> {
        (!self.direct_io_ok()).then(|| {
            format!(
                "{}: align is {}, not {ALIGN}: reads use buffered I/O",
                self.json_path().display(),
                self.align
            )
        })
    }
    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
    /// `(file_off, bytes)` of layer `l`'s run as stored in `trunk.bin` (compressed in a
    /// compressed pack: decode it with [`TrunkPack::decode_layer`]). Panics if
    /// `l >= num_layers()`.
    pub fn layer(&self, l: usize) -> (u64, u64) {
        let e = &self.layers[l];
        (e.file_off, e.stored_bytes)
    }
    /// Whether runs are stored compressed (docs/FORMATS.md#compressed-trunk).
    pub fn is_compressed(&self) -> bool {
        self.compressed
    }
    /// Layer `l`'s decoded run length (= its stored length in a plain pack).
    pub fn decoded_bytes(&self, l: usize) -> u64 {
        self.layers.get(l).map_or(0, |e| e.nbytes)
    }
    /// Sum of the runs' stored lengths (without padding).
    pub fn stored_total_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.stored_bytes).sum()
    }
    /// Checks layer `l`'s run, already read by the caller, against its recorded checksum
    /// (a loader verifies each layer the first time it reads it).
    pub fn check_layer(&self, l: usize, run: &[u8]) -> Result<(), PackError> {
        self.check_layer_parts(l, &[run])
    }

    /// [`TrunkPack::check_layer`] over a run held in consecutive `parts` (a layer streamed
    /// in pieces: the pieces in byte order).
    pub fn check_layer_parts(&self, l: usize, parts: &[&[u8]]) -> Result<(), PackError> {
        let Some(e) = self.layers.get(l) else {
            return Ok(());
        };
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        parts.iter().for_each(|p| hasher.update(p));
        let found = hasher.digest();
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len as u64 == e.nbytes && found == e.checksum {
            return Ok(());
        }
        Err(PackError::Checksum {
            path: self.path(),
            layer: l,
            file_off: e.file_off,
            nbytes: e.nbytes,
            expected: checksum_string(e.checksum),
            found: checksum_string(found),
        })
    }

    /// Layer `l`'s full entry (tensors, checksum, provenance).
    pub fn layer_entry(&self, l: usize) -> Option<&PackedLayer> {
        self.layers.get(l)
    }
    /// Every layer, in order.
    pub fn layers(&self) -> &[PackedLayer] {
        &self.layers
    }
    /// Where the pack came from.
    pub fn source(&self) -> &PackSource {
        &self.source
    }
    /// Sum of the runs' lengths (decoded; without padding).
    pub fn total_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.nbytes).sum()
    }
    /// The largest stored run (= [`TrunkPack::max_run_bytes`] in a plain pack).
    pub fn max_stored_bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| l.stored_bytes)
            .max()
            .unwrap_or(0)
    }
    /// The largest run.
    pub fn max_run_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.nbytes).max().unwrap_or(0)
    }
}

/// `"xxh3-64:<16 hex>"`.
fn checksum_string(h: u64) -> String {
    format!("{CHECKSUM_ALGO}:{h:016x}")
}

/// `"xxh3-64:<16 hex>"` → the hash.
fn parse_checksum(s: &str) -> Option<u64> {
    let hex = s.strip_prefix(CHECKSUM_ALGO)?.strip_prefix(':')?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
}

/// `n` rounded up to a multiple of `align` (> 0).
fn align_up(n: u64, align: u64) -> u64 {
    n.div_ceil(align) * align
}
