//! Reading upstream's `trunk.json` and matching each of its layers with the checkpoint's run
//! (docs/FORMATS.md#adopting-an-upstream-pack). Only the fields upstream's packer always writes
//! are read; which shard, where the run starts and the model's shapes come from the checkpoint.

use super::json::{UpstreamDoc, UpstreamLayer};
use super::{align_up, PackError, ALIGN, TRUNK_JSON};
use crate::bind::{LayerTensors, ModelBinding, TrunkRun};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// One upstream layer entry matched with the checkpoint's layer of the same number.
pub(super) struct Matched<'b> {
    /// The checkpoint's layer.
    pub lt: &'b LayerTensors,
    /// Its run in the shard.
    pub run: TrunkRun,
    /// Where upstream put the run in `trunk.bin`.
    pub file_off: u64,
    /// Upstream's `nbytes`: the run's length, or that rounded up to 4096 (zero padding).
    pub nbytes: u64,
}

impl Matched<'_> {
    /// Bytes of the entry (run and padding) inside a `bin_len`-byte `trunk.bin`, whose end may
    /// cut the padding short (placement checked first: the run itself is inside).
    pub fn in_file(&self, bin_len: u64) -> u64 {
        self.nbytes.min(bin_len.saturating_sub(self.file_off))
    }
}

/// Reads `dir/trunk.json` as upstream's index; returns it with its original text.
pub(super) fn read_upstream(dir: &Path) -> Result<(UpstreamDoc, String), PackError> {
    let json = dir.join(TRUNK_JSON);
    if !json.is_file() {
        return Err(PackError::NoPack {
            dir: dir.into(),
            interrupted: false,
        });
    }
    let text = std::fs::read_to_string(&json).map_err(PackError::io(&json, "read"))?;
    let doc = serde_json::from_str(&text).map_err(|e| PackError::UpstreamJson {
        path: json,
        detail: e.to_string(),
    })?;
    Ok((doc, text))
}

/// Matches entry `i` of `doc.layers` with the checkpoint's layer `i`: the entry count, each
/// entry's tensor names, within-run offsets, sizes and dtypes, its alignment and its length.
/// The error names the first layer (and tensor) that differs.
pub(super) fn match_layers<'b>(
    json: &Path,
    doc: &UpstreamDoc,
    binding: &'b ModelBinding,
) -> Result<Vec<Matched<'b>>, PackError> {
    let refuse = |detail: String| PackError::NotAdopted {
        path: json.into(),
        detail,
    };
    if !doc.align.is_power_of_two() {
        return Err(refuse(format!(
            "\"align\" is {}, not a power of two",
            doc.align
        )));
    }
    let owner = tensor_owners(binding);
    check_layer_list(doc, binding, &owner).map_err(refuse)?;
    doc.layers
        .iter()
        .zip(&binding.layers)
        .map(|(entry, lt)| match_layer(entry, lt, doc.align).map_err(refuse))
        .collect()
}

/// Full tensor name → the checkpoint layer whose trunk holds it.
fn tensor_owners(binding: &ModelBinding) -> HashMap<&str, usize> {
    binding
        .layers
        .iter()
        .flat_map(|lt| {
            lt.tensors()
                .into_iter()
                .map(|t| (t.name.as_str(), lt.layer))
        })
        .collect()
}

/// Which checkpoint layer entry `entry`'s tensors belong to (the first one known), if any.
fn entry_owner(entry: &UpstreamLayer, owner: &HashMap<&str, usize>) -> Option<usize> {
    entry
        .tensors
        .keys()
        .find_map(|name| owner.get(name.as_str()).copied())
}

/// One entry per checkpoint layer, in order: a missing layer is named by number, an entry
/// holding another layer's tensors by position.
fn check_layer_list(
    doc: &UpstreamDoc,
    binding: &ModelBinding,
    owner: &HashMap<&str, usize>,
) -> Result<(), String> {
    let (n, want) = (doc.layers.len(), binding.layers.len());
    if n != want {
        let claimed: BTreeSet<usize> = doc
            .layers
            .iter()
            .filter_map(|e| entry_owner(e, owner))
            .collect();
        let missing: Vec<String> = (0..want)
            .filter(|l| !claimed.contains(l))
            .map(|l| l.to_string())
            .collect();
        let why = match (n < want, missing.is_empty()) {
            (true, false) => format!(": layer {} missing", missing.join(", ")),
            (false, _) => format!(": {} entries too many", n - want),
            (true, true) => String::new(),
        };
        return Err(format!(
            "upstream's index lists {n} layers, the checkpoint has {want}{why}"
        ));
    }
    for (i, entry) in doc.layers.iter().enumerate() {
        if let Some(j) = entry_owner(entry, owner).filter(|&j| j != i) {
            return Err(format!(
                "entry {i} of \"layers\" holds layer {j}'s tensors: layers must be listed 0..{} in order",
                want - 1
            ));
        }
    }
    Ok(())
}

/// One entry against the checkpoint's layer: every tensor (in layout order, so the first that
/// differs is named, not one merely shifted), no extra tensor, an aligned `file_off`, and a
/// length that is the run's, exact or rounded up to 4096.
fn match_layer<'b>(
    entry: &UpstreamLayer,
    lt: &'b LayerTensors,
    align: u64,
) -> Result<Matched<'b>, String> {
    let l = lt.layer;
    let run = lt
        .trunk_run()
        .map_err(|e| format!("the checkpoint's layer {l} is not one run ({e})"))?;
    let mut ts = lt.tensors();
    ts.sort_by_key(|t| t.offset);
    for t in &ts {
        let Some(u) = entry.tensors.get(&t.name) else {
            return Err(format!(
                "layer {l}: tensor {:?} is not in upstream's entry for layer {l}",
                t.name
            ));
        };
        let off = t.offset - run.start;
        if (u.off, u.nbytes, u.dtype.as_str()) != (off, t.nbytes, t.dtype.name()) {
            return Err(format!(
                "layer {l}: tensor {:?} is {} bytes of {} at run offset {} in upstream's index, {} bytes of {} at run offset {off} in the checkpoint",
                t.name, u.nbytes, u.dtype, u.off, t.nbytes, t.dtype
            ));
        }
    }
    if let Some(extra) = entry
        .tensors
        .keys()
        .find(|n| !ts.iter().any(|t| &t.name == *n))
    {
        return Err(format!(
            "layer {l}: upstream's index lists tensor {extra:?}, which is not a trunk tensor of the checkpoint's layer {l}"
        ));
    }
    if !entry.file_off.is_multiple_of(align) {
        return Err(format!(
            "layer {l}: file_off {} is not a multiple of align {align}",
            entry.file_off
        ));
    }
    let (exact, padded) = (run.len(), align_up(run.len(), ALIGN));
    if entry.nbytes != exact && entry.nbytes != padded {
        return Err(format!(
            "layer {l}: nbytes is {} but the checkpoint's run is {exact} bytes ({padded} rounded up to {ALIGN})",
            entry.nbytes
        ));
    }
    Ok(Matched {
        lt,
        run,
        file_off: entry.file_off,
        nbytes: entry.nbytes,
    })
}

/// Every run inside `trunk.bin` (its padding may be cut off by the end of the file: a packer
/// that pads before each run leaves none after the last) and no two entries overlapping.
pub(super) fn check_placement(
    bin: &Path,
    bin_len: u64,
    layers: &[Matched<'_>],
) -> Result<(), PackError> {
    for m in layers {
        let end = m.file_off.saturating_add(m.run.len());
        if end > bin_len {
            return Err(PackError::NotAdopted {
                path: bin.into(),
                detail: format!(
                    "layer {}: its {}-byte run needs bytes [{}, {end}) but the file is {bin_len} bytes ({} bytes missing): truncated copy",
                    m.lt.layer,
                    m.run.len(),
                    m.file_off,
                    end - bin_len
                ),
            });
        }
    }
    let mut by_off: Vec<&Matched<'_>> = layers.iter().filter(|m| m.nbytes > 0).collect();
    by_off.sort_by_key(|m| m.file_off);
    match by_off
        .windows(2)
        .find(|w| w[1].file_off < w[0].file_off + w[0].nbytes)
    {
        None => Ok(()),
        Some(w) => Err(PackError::NotAdopted {
            path: bin.with_file_name(TRUNK_JSON),
            detail: format!(
                "layers {} [{}, +{}) and {} [{}, +{}) overlap in trunk.bin",
                w[0].lt.layer,
                w[0].file_off,
                w[0].nbytes,
                w[1].lt.layer,
                w[1].file_off,
                w[1].nbytes
            ),
        }),
    }
}
