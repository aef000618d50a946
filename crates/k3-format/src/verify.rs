//! Checkpoint verification for `k3 verify`: every structural check of a model directory, run
//! to the end so that one pass reports every problem (unlike [`Checkpoint::open`] and
//! [`bind_model`], which stop at the first).
//!
//! [`verify_dir`] checks, in order: the shard set (the index's shards all present, none named
//! twice, no stray shard), each shard's size against its header's data end (truncated or extra
//! bytes, plus every header integrity rule of [`ShardHeader::parse`]), the index against the
//! shard headers, `config.json`, every tensor the config requires (dtype and shape, all problems
//! collected by [`bind_problems`]), the routed-expert layout (one read or scattered) and each
//! layer's trunk run. [`scale_nan_counts`] is the deep check of MXFP4 scale bytes.

use crate::bind::{bind_model, bind_problems, model_tensors, ModelBinding};
use crate::config::K3Config;
use crate::dtype::Dtype;
use crate::index::{Checkpoint, INDEX_FILE};
use crate::safetensors::ShardHeader;
use crate::shard_list;
use memmap2::Mmap;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

/// Outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The check passed.
    Pass,
    /// The checkpoint is damaged or will be refused.
    Fail,
    /// Works, but slower or suspicious.
    Warn,
    /// A fact, not a verdict.
    Info,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Warn => "WARN",
            Status::Info => "INFO",
        })
    }
}

/// One named check with its verdict, one-line summary and every problem found.
#[derive(Clone, Debug)]
pub struct Check {
    /// Short name (`shard set`, `shard sizes`, `tensors`, …).
    pub name: &'static str,
    /// Verdict.
    pub status: Status,
    /// One line.
    pub summary: String,
    /// Every problem (or fact), one per line, each naming its file or tensor.
    pub details: Vec<String>,
}

impl Check {
    fn new(name: &'static str, status: Status, summary: impl Into<String>) -> Check {
        Check {
            name,
            status,
            summary: summary.into(),
            details: Vec::new(),
        }
    }

    /// `Pass` when `details` is empty, else `bad` with `bad_summary`.
    fn verdict(
        name: &'static str,
        details: Vec<String>,
        ok: String,
        bad: Status,
        bad_summary: String,
    ) -> Check {
        let (status, summary) = if details.is_empty() {
            (Status::Pass, ok)
        } else {
            (bad, bad_summary)
        };
        Check {
            name,
            status,
            summary,
            details,
        }
    }
}

/// Everything [`verify_dir`] found.
#[derive(Debug)]
pub struct Verification {
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
    /// Shard files that exist on disk, in index (sorted) order.
    pub shard_files: Vec<PathBuf>,
    /// The index of the shards that parsed (absent when none did or tensor names clash).
    pub checkpoint: Option<Checkpoint>,
    /// The binding, when every required tensor bound.
    pub binding: Option<ModelBinding>,
}

impl Verification {
    /// Whether no check failed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }
}

/// Runs every structural check on the model directory `dir` (reads headers, not weights).
pub fn verify_dir(dir: &Path) -> Verification {
    let mut checks = Vec::new();
    let (set_check, shard_files, index) = shard_set(dir);
    checks.push(set_check);
    let (size_check, good) = shard_sizes(&shard_files);
    checks.push(size_check);
    let checkpoint = match Checkpoint::open_files(&good) {
        Ok(ck) if !good.is_empty() => Some(ck),
        Ok(_) => None,
        Err(e) => {
            let mut c = Check::new("tensor index", Status::Fail, "shards clash");
            c.details.push(e.to_string());
            checks.push(c);
            None
        }
    };
    if let (Some(ck), Some(entries)) = (&checkpoint, &index) {
        checks.push(index_agrees(ck, entries, dir));
    }
    let config = match K3Config::load(dir.join("config.json")) {
        Ok(cfg) => {
            checks.push(Check::new(
                "config",
                Status::Pass,
                format!(
                    "config.json: {} layers, {} experts per MoE layer, top-{}",
                    cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_token
                ),
            ));
            Some(cfg)
        }
        Err(e) => {
            let mut c = Check::new("config", Status::Fail, "config.json is not usable");
            c.details.push(e.to_string());
            checks.push(c);
            None
        }
    };
    let mut binding = None;
    if let (Some(ck), Some(cfg)) = (&checkpoint, &config) {
        checks.push(tensors(ck, cfg));
        if checks.last().is_some_and(|c| c.status == Status::Pass) {
            match bind_model(ck, cfg) {
                Ok(b) => {
                    checks.push(expert_layout(&b));
                    checks.push(trunk_runs(&b));
                    binding = Some(b);
                }
                Err(e) => {
                    let mut c = Check::new("binding", Status::Fail, "the binder refuses");
                    c.details.push(e.to_string());
                    checks.push(c);
                }
            }
        }
        checks.push(unused_tensors(ck, cfg));
    }
    Verification {
        checks,
        shard_files,
        checkpoint,
        binding,
    }
}

/// `(tensor, shard file name)` pairs of the index's `weight_map`, in file order.
type IndexEntries = Vec<(String, String)>;

/// The shard set: from the index when present (all present, none twice, names inside `dir`,
/// strays noted), else every `*.safetensors` file.
fn shard_set(dir: &Path) -> (Check, Vec<PathBuf>, Option<IndexEntries>) {
    const NAME: &str = "shard set";
    let index_path = dir.join(INDEX_FILE);
    if !index_path.is_file() {
        return match shard_list::list_shards(dir) {
            Ok(paths) => {
                let msg = format!("no {INDEX_FILE}; {} *.safetensors files", paths.len());
                (Check::new(NAME, Status::Pass, msg), paths, None)
            }
            Err(e) => {
                let mut c = Check::new(NAME, Status::Fail, "no shards");
                c.details.push(e.to_string());
                (c, Vec::new(), None)
            }
        };
    }
    let mut problems = Vec::new();
    let bytes = match std::fs::read(&index_path) {
        Ok(b) => b,
        Err(e) => {
            let mut c = Check::new(NAME, Status::Fail, "index unreadable");
            c.details.push(format!("{}: {e}", index_path.display()));
            return (c, Vec::new(), None);
        }
    };
    let parsed = match shard_list::parse_index(&index_path, &bytes) {
        Ok(p) => p,
        Err(e) => {
            let mut c = Check::new(NAME, Status::Fail, "index malformed");
            c.details.push(e.to_string());
            return (c, Vec::new(), None);
        }
    };
    let entries: IndexEntries = parsed
        .entries
        .iter()
        .map(|(t, s)| (t.to_string(), parsed.shard_names[*s as usize].0.to_string()))
        .collect();
    let mut seen = HashSet::with_capacity(entries.len());
    for (t, _) in &entries {
        if !seen.insert(t.as_str()) {
            problems.push(format!(
                "{}: tensor {t:?} is listed twice in weight_map",
                index_path.display()
            ));
        }
    }
    let by_path = index_shard_paths(dir, &index_path, &parsed.shard_names, &mut problems);
    let (files, missing) = present_shards(&by_path, &mut problems);
    let listed: HashSet<&PathBuf> = by_path.keys().collect();
    let strays: Vec<String> = shard_list::list_shards(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| !listed.contains(p))
        .map(|p| p.display().to_string())
        .collect();
    let ok = format!(
        "{} shards named by {INDEX_FILE}, all present",
        by_path.len()
    );
    let bad = format!(
        "{} of {} shards missing, {} other problem(s)",
        missing.len(),
        by_path.len(),
        problems.len() - missing.len()
    );
    let mut c = Check::verdict(NAME, problems, ok, Status::Fail, bad);
    if c.status == Status::Pass && !strays.is_empty() {
        c.status = Status::Warn;
        c.summary = format!(
            "{}; {} stray shard(s) not in the index are ignored",
            c.summary,
            strays.len()
        );
    }
    c.details.extend(
        strays
            .iter()
            .map(|s| format!("{s}: not named in {INDEX_FILE}, ignored")),
    );
    (c, files, Some(entries))
}

/// The shard files an index names, by path inside `dir`, with every name naming each; a name
/// that is empty, absolute or leaves `dir` is a problem and left out.
fn index_shard_paths(
    dir: &Path,
    index_path: &Path,
    shard_names: &[(std::borrow::Cow<'_, str>, usize)],
    problems: &mut Vec<String>,
) -> BTreeMap<PathBuf, Vec<String>> {
    let mut by_path: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    for (name, _) in shard_names {
        let rel = Path::new(name.as_ref());
        if name.is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            problems.push(format!(
                "{}: shard path {name:?} is empty, absolute or leaves the model directory",
                index_path.display()
            ));
            continue;
        }
        let path: PathBuf = rel.components().collect();
        by_path
            .entry(dir.join(path))
            .or_default()
            .push(name.to_string());
    }
    by_path
}

/// The indexed shards present on disk and the missing ones; a shard named twice and every
/// missing one are problems.
fn present_shards(
    by_path: &BTreeMap<PathBuf, Vec<String>>,
    problems: &mut Vec<String>,
) -> (Vec<PathBuf>, Vec<String>) {
    let mut files = Vec::new();
    let mut missing = Vec::new();
    for (path, names) in by_path {
        if names.len() > 1 {
            problems.push(format!(
                "shard {} is listed twice in the index, as {}",
                path.display(),
                names.join(" and ")
            ));
        }
        if path.is_file() {
            files.push(path.clone());
        } else {
            missing.push(path.display().to_string());
        }
    }
    for m in &missing {
        problems.push(format!("{m}: missing (named in {INDEX_FILE})"));
    }
    (files, missing)
}

/// Each shard's length against its header's data end; returns the shards that parsed.
fn shard_sizes(files: &[PathBuf]) -> (Check, Vec<PathBuf>) {
    let mut problems = Vec::new();
    let mut good = Vec::new();
    let mut total = 0u64;
    for path in files {
        match shard_size(path) {
            Ok(len) => {
                total += len;
                good.push(path.clone());
            }
            Err(msg) => problems.push(msg),
        }
    }
    let ok = format!(
        "{} shards, {} bytes, each exactly as long as its header's data end",
        files.len(),
        total
    );
    let bad = format!("{} of {} shards damaged", problems.len(), files.len());
    (
        Check::verdict("shard sizes", problems, ok, Status::Fail, bad),
        good,
    )
}

/// The file length when it equals `8 + header_len + data end` and the header is sound.
fn shard_size(path: &Path) -> Result<u64, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: read-only private mapping of a file nobody should modify while it is verified
    // (the same contract as `Checkpoint::open`).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| format!("{}: {e}", path.display()))?;
    let h = ShardHeader::parse(path, &map).map_err(|e| e.to_string())?;
    let data_end = h.iter().map(|t| t.end).max().unwrap_or(0);
    let expected = h.data_start() + data_end;
    if h.file_len() > expected {
        return Err(format!(
            "{}: {} extra bytes: the header's data ends at file offset {expected} but the file has {} bytes (appended or mis-copied data; re-download)",
            path.display(),
            h.file_len() - expected,
            h.file_len()
        ));
    }
    Ok(h.file_len())
}

/// Every weight_map entry must be in the shard the index names (shards that parsed only).
fn index_agrees(ck: &Checkpoint, entries: &IndexEntries, dir: &Path) -> Check {
    let shard_of: HashMap<&Path, usize> = ck
        .shards()
        .iter()
        .enumerate()
        .map(|(i, s)| (s.path(), i))
        .collect();
    let mut problems = Vec::new();
    for (tensor, shard) in entries {
        let want = dir.join(Path::new(shard).components().collect::<PathBuf>());
        let Some(&want_i) = shard_of.get(want.as_path()) else {
            continue; // missing or damaged shard: already reported
        };
        let found = ck.get(tensor).map(|v| v.shard);
        if found != Some(want_i) {
            let where_ = match found {
                Some(s) => format!("it is in {}", ck.shards()[s].path().display()),
                None => "no shard has it".to_string(),
            };
            problems.push(format!(
                "tensor {tensor:?}: {INDEX_FILE} says {} but its header does not list it ({where_})",
                want.display()
            ));
        }
    }
    let ok = format!(
        "all {} weight_map entries are where the index says",
        entries.len()
    );
    let bad = format!(
        "{} weight_map entries disagree with the shard headers",
        problems.len()
    );
    let mut c = Check::verdict("index entries", problems, ok, Status::Fail, bad);
    // The other direction: shard tensors the index does not list. k3 finds tensors by name in
    // the shards, so this runs, but index-driven loaders would not see them: index and shards
    // come from different revisions.
    let listed: HashSet<&str> = entries.iter().map(|(t, _)| t.as_str()).collect();
    let unlisted: Vec<String> = ck
        .iter()
        .filter(|v| !listed.contains(v.name))
        .map(|v| {
            format!(
                "tensor {:?} in {} is not listed in {INDEX_FILE}",
                v.name,
                v.shard_path.display()
            )
        })
        .collect();
    if !unlisted.is_empty() {
        if c.status == Status::Pass {
            c.status = Status::Warn;
            c.summary = format!(
                "{} shard tensors are not listed in {INDEX_FILE}: index and shards disagree",
                unlisted.len()
            );
        }
        c.details.extend(unlisted);
    }
    c
}

/// Every tensor the config requires, by the binder's rules; all problems collected.
fn tensors(ck: &Checkpoint, cfg: &K3Config) -> Check {
    let required: usize = model_tensors(cfg).iter().map(Vec::len).sum();
    let problems: Vec<String> = bind_problems(ck, cfg)
        .iter()
        .map(ToString::to_string)
        .collect();
    let ok = format!(
        "all {required} tensors the config requires are present with the right dtype and shape"
    );
    let bad = format!(
        "{} problem(s) among the {required} tensors the config requires",
        problems.len()
    );
    Check::verdict("tensors", problems, ok, Status::Fail, bad)
}

/// How many routed experts are one contiguous read.
fn expert_layout(b: &ModelBinding) -> Check {
    let n = b.experts.len();
    let scattered = b.experts.scattered_count();
    let mut c = Check::new(
        "expert layout",
        Status::Pass,
        format!(
            "{n} routed experts of {} bytes: {} one contiguous read each, {scattered} scattered",
            b.experts.expert_bytes(),
            n - scattered
        ),
    );
    if scattered > 0 {
        c.status = Status::Warn;
        c.details.push(format!(
            "{scattered} experts need six reads instead of one (the six tensors do not tile one span): correct but slower on a cache miss"
        ));
    }
    c
}

/// Each layer's trunk as one byte run (budgeted runs read a non-contiguous layer tensor by
/// tensor, slower; `k3 pack` refuses it).
fn trunk_runs(b: &ModelBinding) -> Check {
    let mut problems = Vec::new();
    let mut bytes = 0u64;
    for lt in &b.layers {
        match lt.trunk_run() {
            Ok(run) => bytes += run.len(),
            Err(why) => problems.push(format!("{why}")),
        }
    }
    let n = b.layers.len();
    let ok = format!("all {n} layers' trunks are one contiguous run ({bytes} bytes in all)");
    let bad = format!(
        "{} of {n} layers' trunks are not one contiguous run: budgeted runs read them tensor by tensor (one read each) and `k3 pack` refuses them",
        problems.len()
    );
    Check::verdict("trunk runs", problems, ok, Status::Warn, bad)
}

/// Tensors the model does not use (a vision tower, say): a fact.
fn unused_tensors(ck: &Checkpoint, cfg: &K3Config) -> Check {
    let required: HashSet<String> = model_tensors(cfg)
        .into_iter()
        .flatten()
        .map(|t| t.name)
        .collect();
    let unused: Vec<String> = ck
        .iter()
        .filter(|v| !required.contains(v.name))
        .map(|v| v.name.to_string())
        .collect();
    let mut c = Check::new(
        "unused tensors",
        Status::Info,
        format!(
            "{} of {} tensors in the shards are not used by the text model",
            unused.len(),
            ck.len()
        ),
    );
    c.details = unused;
    c
}

/// E8M0 scale bytes of one layer's MXFP4 tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScaleCounts {
    /// Scale tensors seen.
    pub tensors: u64,
    /// Scale bytes seen.
    pub bytes: u64,
    /// Bytes equal to 255: E8M0's NaN encoding (k3 decodes the group as zero, as upstream).
    pub nan: u64,
}

/// Reads every `*.weight_scale` U8 tensor and counts bytes equal to 255 per layer (key: the
/// layer number in the name, `None` for a name without one). `progress` receives byte counts
/// as they are scanned (from several threads).
pub fn scale_nan_counts(
    ck: &Checkpoint,
    progress: &(dyn Fn(u64) + Sync),
) -> BTreeMap<Option<usize>, ScaleCounts> {
    let views: Vec<_> = ck
        .iter()
        .filter(|v| v.name.ends_with(".weight_scale") && v.dtype == Dtype::U8)
        .collect();
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 16);
    let chunk = views.len().div_ceil(workers).max(1);
    // A part whose thread cannot be spawned is scanned inline (`par::run_scoped`).
    let parts: Vec<BTreeMap<Option<usize>, ScaleCounts>> =
        crate::par::run_scoped(views.chunks(chunk).map(|part| {
            move || {
                let mut m: BTreeMap<Option<usize>, ScaleCounts> = BTreeMap::new();
                for v in part {
                    let c = m.entry(layer_of(v.name)).or_default();
                    c.tensors += 1;
                    c.bytes += v.bytes.len() as u64;
                    c.nan += v.bytes.iter().filter(|&&b| b == 255).count() as u64;
                    progress(v.bytes.len() as u64);
                }
                m
            }
        }));
    let mut out: BTreeMap<Option<usize>, ScaleCounts> = BTreeMap::new();
    for m in parts {
        for (k, v) in m {
            let c = out.entry(k).or_default();
            c.tensors += v.tensors;
            c.bytes += v.bytes;
            c.nan += v.nan;
        }
    }
    out
}

/// The number after `layers.` in a tensor name.
fn layer_of(name: &str) -> Option<usize> {
    let rest = &name[name.find("layers.")? + "layers.".len()..];
    rest.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_numbers() {
        assert_eq!(
            layer_of("language_model.model.layers.12.block_sparse_moe.experts.3.w1.weight_scale"),
            Some(12)
        );
        assert_eq!(layer_of("language_model.lm_head.weight"), None);
    }

    #[test]
    fn tiny_fixture_passes() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3");
        let v = verify_dir(&dir);
        assert!(v.passed(), "{:#?}", v.checks);
        let ck = v.checkpoint.as_ref().expect("indexed");
        let nan: u64 = scale_nan_counts(ck, &|_| {}).values().map(|c| c.nan).sum();
        assert_eq!(nan, 3);
    }
}
