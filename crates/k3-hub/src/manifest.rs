//! Sums of a model directory's files (`k3 verify --deep`): XXH3-64 or SHA-256 per file,
//! compared with a manifest.
//!
//! Manifest formats, paths relative to the model directory:
//! - JSON: `{ "model-00001-of-00096.safetensors": "HEX", … }`;
//! - `sha256sum` / `xxhsum` lines: `HEX  FILE` (or `HEX *FILE`), `#` comments allowed.
//!
//! The algorithm is told by the digest length: 64 hex digits are SHA-256, 16 are XXH3-64.

use crate::HubError;
use k3_format::verify::{Check, Status};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// A hash algorithm, told by the digest length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    Xxh3,
    Sha256,
}

impl Algo {
    pub fn of(hex: &str) -> Option<Algo> {
        let hexish = hex.bytes().all(|b| b.is_ascii_hexdigit());
        match hex.len() {
            16 if hexish => Some(Algo::Xxh3),
            64 if hexish => Some(Algo::Sha256),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Algo::Xxh3 => "xxh3",
            Algo::Sha256 => "sha256",
        }
    }
}

/// File (relative to the model dir, `/`-separated, no `./`) → lowercase hex digest.
pub type Manifest = BTreeMap<String, String>;

/// Reads a JSON or sha256sum-style manifest; usage error (exit 2) naming file and line.
pub fn load_manifest(path: &Path) -> Result<Manifest, HubError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| HubError::Refused(format!("{}: {e}", path.display())))?;
    let bad = |what: String| HubError::Refused(format!("{}: {what}", path.display()));
    let raw: Vec<(String, String, usize)> = if text.trim_start().starts_with('{') {
        let m: BTreeMap<String, String> = serde_json::from_str(&text).map_err(|e| {
            bad(format!(
                "not a JSON object of file → hex digest strings: {e}"
            ))
        })?;
        m.into_iter().map(|(f, h)| (f, h, 0)).collect()
    } else {
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((hex, file)) = line.split_once(char::is_whitespace) else {
                return Err(bad(format!(
                    "line {}: expected `HEX  FILE`, got {line:?}",
                    i + 1
                )));
            };
            let file = file.trim_start();
            let file = file.strip_prefix('*').unwrap_or(file);
            out.push((file.to_string(), hex.to_string(), i + 1));
        }
        out
    };
    let mut m = Manifest::new();
    for (file, hex, line) in raw {
        let at = if line > 0 {
            format!("line {line}: ")
        } else {
            String::new()
        };
        if Algo::of(&hex).is_none() {
            return Err(bad(format!(
                "{at}digest for {file:?} is {:?}: expected 64 hex digits (SHA-256) or 16 (XXH3-64)",
                hex
            )));
        }
        let file = file.strip_prefix("./").unwrap_or(&file).to_string();
        if file.is_empty() || Path::new(&file).is_absolute() || file.split('/').any(|c| c == "..") {
            return Err(bad(format!(
                "{at}file {file:?} must be a path inside the model directory"
            )));
        }
        m.insert(file, hex.to_ascii_lowercase());
    }
    if m.is_empty() {
        return Err(bad("no checksums in the manifest".into()));
    }
    Ok(m)
}

/// One hashed file.
pub struct Sum {
    /// The file, relative to the model directory, `/`-separated.
    pub rel: String,
    pub algo: Algo,
    /// The lowercase hex digest, or why the file could not be read.
    pub hex: Result<String, String>,
}

/// The files to hash: every shard, and every other manifest file that exists.
pub fn files_to_hash(dir: &Path, shards: &[PathBuf], manifest: Option<&Manifest>) -> Vec<String> {
    let mut rels: Vec<String> = shards.iter().map(|p| rel_name(dir, p)).collect();
    if let Some(m) = manifest {
        for f in m.keys() {
            if !rels.contains(f) && dir.join(f).is_file() {
                rels.push(f.clone());
            }
        }
    }
    rels
}

/// Hashes `rels` (relative to `dir`) several files at a time, with the manifest's algorithm
/// for each file it lists and XXH3-64 otherwise; `progress` hears every byte hashed.
pub fn hash_files(
    dir: &Path,
    rels: &[String],
    manifest: Option<&Manifest>,
    progress: &(dyn Fn(u64) + Sync),
) -> Vec<Sum> {
    let algo_of = |rel: &str| {
        manifest
            .and_then(|m| m.get(rel))
            .and_then(|h| Algo::of(h))
            .unwrap_or(Algo::Xxh3)
    };
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4);
    let next = std::sync::atomic::AtomicUsize::new(0);
    // A worker that cannot be spawned runs inline (`par::run_scoped`).
    let worker = || {
        let mut out = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(rel) = rels.get(i) else { break };
            let algo = algo_of(rel);
            let hex = hash_file(&dir.join(rel), algo, &|n| progress(n));
            out.push(Sum {
                rel: rel.clone(),
                algo,
                hex,
            });
        }
        out
    };
    let mut sums: Vec<Sum> = k3_format::par::run_scoped((0..workers).map(|_| worker))
        .into_iter()
        .flatten()
        .collect();
    sums.sort_by(|a, b| a.rel.cmp(&b.rel));
    sums
}

/// `path` relative to `dir`, `/`-separated.
pub fn rel_name(dir: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(dir).unwrap_or(path);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// Streams one file through the hash in 8 MiB reads.
fn hash_file(path: &Path, algo: Algo, progress: &dyn Fn(u64)) -> Result<String, String> {
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = File::open(path).map_err(err)?;
    let mut buf = vec![0u8; 8 << 20];
    let mut xxh = Xxh3::new();
    let mut sha = Sha256::new();
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(err(e)),
        };
        match algo {
            Algo::Xxh3 => xxh.update(&buf[..n]),
            Algo::Sha256 => sha.update(&buf[..n]),
        }
        progress(n as u64);
    }
    Ok(match algo {
        Algo::Xxh3 => format!("{:016x}", xxh.digest()),
        Algo::Sha256 => sha.finalize().iter().map(|b| format!("{b:02x}")).collect(),
    })
}

/// The checksum checks: against the manifest when given, else the sums as facts.
pub fn compare(dir: &Path, sums: &[Sum], manifest: Option<&Manifest>) -> Vec<Check> {
    let mut problems = Vec::new();
    let mut facts = Vec::new();
    let mut unlisted = Vec::new();
    for s in sums {
        let path = dir.join(&s.rel);
        let got = match &s.hex {
            Ok(h) => h,
            Err(e) => {
                problems.push(e.clone());
                continue;
            }
        };
        facts.push(format!("{}  {got}  {}", s.algo.name(), s.rel));
        match manifest.map(|m| m.get(&s.rel)) {
            Some(Some(want)) if want != got => problems.push(format!(
                "{}: {} is {got}, the manifest says {want}: damaged or different file, re-download",
                path.display(),
                s.algo.name()
            )),
            Some(None) => unlisted.push(format!("{}: not in the manifest", path.display())),
            _ => {}
        }
    }
    if let Some(m) = manifest {
        for f in m.keys().filter(|f| !sums.iter().any(|s| &s.rel == *f)) {
            problems.push(format!(
                "{}: listed in the manifest but missing",
                dir.join(f).display()
            ));
        }
    }
    let mut out = Vec::new();
    let Some(m) = manifest else {
        let mut c = Check {
            name: "checksums",
            status: Status::Info,
            summary: format!(
                "{} files hashed (no --manifest to compare with)",
                sums.len()
            ),
            details: facts,
        };
        if !problems.is_empty() {
            c.status = Status::Fail;
            c.summary = format!("{} file(s) unreadable", problems.len());
            c.details = problems;
        }
        return vec![c];
    };
    let n = problems.len();
    out.push(Check {
        name: "checksums",
        status: if n == 0 { Status::Pass } else { Status::Fail },
        summary: if n == 0 {
            format!("{} files match the manifest", m.len())
        } else {
            format!("{n} of {} manifest entries do not match", m.len())
        },
        details: problems,
    });
    if !unlisted.is_empty() {
        out.push(Check {
            name: "manifest cover",
            status: Status::Warn,
            summary: format!("{} shard(s) hashed but not in the manifest", unlisted.len()),
            details: unlisted,
        });
    }
    out
}

/// Writes `{ "file": "xxh3 hex" }` for every shard hashed with XXH3.
pub fn write_manifest(dir: &Path, out: &Path, sums: &[Sum]) -> Result<(), HubError> {
    let mut m = BTreeMap::new();
    for s in sums {
        if let (Algo::Xxh3, Ok(h)) = (s.algo, &s.hex) {
            m.insert(s.rel.clone(), h.clone());
        }
    }
    let text = serde_json::to_string_pretty(&m)
        .map_err(|e| HubError::Failed(format!("manifest for {}: {e}", dir.display())))?;
    std::fs::write(out, text + "\n")
        .map_err(|e| HubError::Failed(format!("{}: {e}", out.display())))
}
