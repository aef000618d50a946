//! Opening a packed trunk: `trunk.json` parsed and checked against itself and `trunk.bin`.

use super::json::{LayerDoc, PackDoc, UpstreamDoc};
use super::{
    quantized_bytes, DraftQuant, PackDtype, PackError, PackSource, PackedLayer, PackedTensor,
    TrunkPack,
};
use super::{CHECKSUM_ALGO, FORMAT_NAME, FORMAT_VERSION, TRUNK_BIN, TRUNK_JSON};
use super::{CODEC_NAME, COMPRESSED_VERSION};
use std::path::Path;

impl TrunkPack {
    /// Opens the pack in `dir` and validates it: format and version, alignment (a power of two;
    /// anything but 4096 means buffered reads, see [`TrunkPack::buffered_fallback_note`]), one
    /// entry per layer in order, every `file_off` aligned, every tensor inside its run with a
    /// size matching dtype × shape and no two overlapping, every run inside `trunk.bin` and no
    /// two runs overlapping. Does not read `trunk.bin`'s data (see
    /// [`TrunkPack::verify_checksums`]).
    pub fn open(dir: impl AsRef<Path>) -> Result<TrunkPack, PackError> {
        open_pack(dir.as_ref())
    }
}

/// [`TrunkPack::open`].
fn open_pack(dir: &Path) -> Result<TrunkPack, PackError> {
    let json = dir.join(TRUNK_JSON);
    if !json.is_file() {
        let interrupted = ["trunk.bin.tmp", "trunk.json.tmp"]
            .iter()
            .any(|t| dir.join(t).exists());
        return Err(PackError::NoPack {
            dir: dir.into(),
            interrupted,
        });
    }
    let text = std::fs::read_to_string(&json).map_err(PackError::io(&json, "read"))?;
    let doc: PackDoc = serde_json::from_str(&text).map_err(|e| not_k3_index(&json, &text, e))?;
    let invalid = |detail: String| PackError::Invalid {
        path: json.clone(),
        detail,
    };
    check_header(&doc).map_err(invalid)?;
    let unchecked = doc.layers.iter().filter(|l| l.checksum.is_none()).count();
    if unchecked > 0 {
        return Err(PackError::NoChecksums {
            path: json,
            layers: unchecked,
            of: doc.layers.len(),
        });
    }
    let compressed = doc.codec.is_some();
    let layers = doc
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| parse_layer(i, l, doc.align, compressed))
        .collect::<Result<Vec<_>, _>>()
        .map_err(invalid)?;
    let bin = dir.join(TRUNK_BIN);
    let bin_len = std::fs::metadata(&bin)
        .map_err(PackError::io(&bin, "stat"))?
        .len();
    check_runs(&bin, bin_len, &layers)?;
    let draft =
        match doc.draft.as_deref() {
            None => None,
            Some(q) => Some(DraftQuant::parse(q).ok_or_else(|| {
                invalid(format!("\"draft\" is {q:?}: expected \"q8\" or \"mxfp4\""))
            })?),
        };
    Ok(TrunkPack {
        compressed,
        draft,
        dir: dir.into(),
        bin_len,
        align: doc.align,
        source: PackSource {
            config: doc.source.config.clone(),
            shards: doc.source.shards.clone(),
        },
        layers,
    })
}

/// The error for an index that does not parse as k3's: upstream's packer's index (no
/// `"format"`, no checksums) is pointed at `--adopt`; anything else is not an index.
fn not_k3_index(json: &Path, text: &str, e: serde_json::Error) -> PackError {
    let value: Option<serde_json::Value> = serde_json::from_str(text).ok();
    let has_format = value.as_ref().is_some_and(|v| v.get("format").is_some());
    match serde_json::from_str::<UpstreamDoc>(text) {
        Ok(up) if !has_format => PackError::NoChecksums {
            path: json.into(),
            layers: up.layers.len(),
            of: up.layers.len(),
        },
        _ => PackError::Json {
            path: json.into(),
            detail: e.to_string(),
        },
    }
}

/// Format, version, alignment and layer count.
fn check_header(doc: &PackDoc) -> Result<(), String> {
    if doc.format != FORMAT_NAME {
        return Err(format!(
            "\"format\" is {:?}, expected {FORMAT_NAME:?}",
            doc.format
        ));
    }
    match (doc.version, doc.codec.as_deref()) {
        (FORMAT_VERSION, None) | (COMPRESSED_VERSION, Some(CODEC_NAME)) => {}
        (COMPRESSED_VERSION, None) => {
            return Err(format!(
                "\"version\" is {COMPRESSED_VERSION} (compressed) but there is no \"codec\""
            ));
        }
        (_, Some(c)) if c != CODEC_NAME => {
            return Err(format!(
                "\"codec\" is {c:?}: this build reads {CODEC_NAME:?}"
            ));
        }
        (v, _) => {
            return Err(format!(
                "\"version\" is {v}, this build reads version {FORMAT_VERSION} (plain) and {COMPRESSED_VERSION} (compressed, \"codec\": {CODEC_NAME:?})"
            ));
        }
    }
    if !doc.align.is_power_of_two() {
        return Err(format!("\"align\" is {}, not a power of two", doc.align));
    }
    let want = doc.source.config.num_hidden_layers;
    if doc.layers.len() != want {
        let n = doc.layers.len();
        let why = if n < want {
            format!("layers {n}..{want} are missing")
        } else {
            format!("{} entries too many", n - want)
        };
        return Err(format!(
            "lists {n} layers but the source config has {want}: {why}"
        ));
    }
    Ok(())
}

/// One layer entry: position, alignment, checksum syntax, tensors.
fn parse_layer(
    i: usize,
    l: &LayerDoc,
    align: u64,
    compressed: bool,
) -> Result<PackedLayer, String> {
    if l.layer != i {
        return Err(format!(
            "entry {i} of \"layers\" is layer {}: layers must be listed 0..N-1 in order",
            l.layer
        ));
    }
    if !l.file_off.is_multiple_of(align) {
        return Err(format!(
            "layer {i}: file_off {} is not a multiple of align {align} ({} bytes past)",
            l.file_off,
            l.file_off % align
        ));
    }
    let checksum = match &l.checksum {
        Some(sum) => super::parse_checksum(sum).ok_or_else(|| {
            format!("layer {i}: checksum {sum:?} is not \"{CHECKSUM_ALGO}:<16 hex digits>\"")
        })?,
        // Unreachable: `open_pack` refuses layers without a checksum first.
        None => 0,
    };
    let stored_bytes = match (compressed, l.stored_bytes) {
        (false, None) => l.nbytes,
        (true, Some(b)) => b,
        (true, None) => {
            return Err(format!(
                "layer {i}: no \"stored_bytes\" in a compressed pack"
            ))
        }
        (false, Some(_)) => {
            return Err(format!(
                "layer {i}: \"stored_bytes\" in a pack without \"codec\""
            ))
        }
    };
    let mut tensors = Vec::with_capacity(l.tensors.len());
    for (name, t) in &l.tensors {
        let dtype = PackDtype::parse(&t.dtype)
            .ok_or_else(|| format!("layer {i}: tensor {name:?} has unknown dtype {:?}", t.dtype))?;
        let stored = if compressed {
            Some(super::coded::parse_stored(
                i,
                name,
                dtype,
                t.nbytes,
                t.stored.as_ref(),
                stored_bytes,
            )?)
        } else {
            None
        };
        let t = PackedTensor {
            name: name.clone(),
            off: t.off,
            nbytes: t.nbytes,
            dtype,
            shape: t.shape.clone(),
            stored,
        };
        check_tensor(i, &t, l.nbytes)?;
        tensors.push(t);
    }
    tensors.sort_by(|a, b| (a.off, &a.name).cmp(&(b.off, &b.name)));
    for w in tensors.windows(2) {
        if w[1].off < w[0].off + w[0].nbytes {
            return Err(format!(
                "layer {i}: tensors {:?} [{}, {}) and {:?} [{}, {}) overlap",
                w[0].name,
                w[0].off,
                w[0].off + w[0].nbytes,
                w[1].name,
                w[1].off,
                w[1].off + w[1].nbytes
            ));
        }
    }
    if compressed {
        check_tiling(i, &tensors, l.nbytes)?;
    }
    Ok(PackedLayer {
        layer: i,
        file_off: l.file_off,
        nbytes: l.nbytes,
        stored_bytes,
        checksum,
        source_shard: l.source_shard.clone(),
        source_offset: l.source_offset,
        tensors,
    })
}

/// A tensor lies inside its run and its size is dtype × shape (quantized: [`quantized_bytes`]).
fn check_tensor(layer: usize, t: &PackedTensor, run: u64) -> Result<(), String> {
    if t.off.checked_add(t.nbytes).is_none_or(|end| end > run) {
        return Err(format!(
            "layer {layer}: tensor {:?} at [{}, +{}) lies outside the {run}-byte run",
            t.name, t.off, t.nbytes
        ));
    }
    let size = match t.dtype {
        PackDtype::St(d) => t
            .shape
            .iter()
            .try_fold(d.size() as u64, |a, &n| a.checked_mul(n as u64)),
        q => quantized_bytes(q, &t.shape),
    };
    if size != Some(t.nbytes) {
        return Err(format!(
            "layer {layer}: tensor {:?} is {} {:?} = {} bytes but nbytes is {}",
            t.name,
            t.dtype,
            t.shape,
            size.map_or("overflow or bad shape".into(), |s| s.to_string()),
            t.nbytes
        ));
    }
    Ok(())
}

/// A compressed layer's tensors (sorted by offset) cover its decoded run with no gap, so its
/// decode jobs write every byte.
fn check_tiling(layer: usize, tensors: &[PackedTensor], nbytes: u64) -> Result<(), String> {
    let mut at = 0u64;
    for t in tensors {
        if t.off != at {
            return Err(format!(
                "layer {layer}: compressed run has a gap before tensor {:?} ([{at}, {}))",
                t.name, t.off
            ));
        }
        at = t.off + t.nbytes;
    }
    if at != nbytes {
        return Err(format!(
            "layer {layer}: tensors end at {at} of the {nbytes}-byte run"
        ));
    }
    Ok(())
}

/// Every run inside the file (else the first that is not, by layer), no two overlapping.
fn check_runs(bin: &Path, file_len: u64, layers: &[PackedLayer]) -> Result<(), PackError> {
    for l in layers {
        let end = l.file_off.saturating_add(l.stored_bytes);
        if end > file_len {
            return Err(PackError::Truncated {
                path: bin.into(),
                layer: l.layer,
                file_off: l.file_off,
                nbytes: l.stored_bytes,
                end,
                file_len,
                missing: end - file_len,
            });
        }
    }
    let mut by_off: Vec<&PackedLayer> = layers.iter().filter(|l| l.stored_bytes > 0).collect();
    by_off.sort_by_key(|l| l.file_off);
    for w in by_off.windows(2) {
        if w[1].file_off < w[0].file_off + w[0].stored_bytes {
            return Err(PackError::Invalid {
                path: bin.with_file_name(TRUNK_JSON),
                detail: format!(
                    "layers {} [{}, {}) and {} [{}, {}) overlap in trunk.bin",
                    w[0].layer,
                    w[0].file_off,
                    w[0].file_off + w[0].stored_bytes,
                    w[1].layer,
                    w[1].file_off,
                    w[1].file_off + w[1].stored_bytes
                ),
            });
        }
    }
    Ok(())
}
