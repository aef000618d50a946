//! `k3 verify MODEL_DIR [--deep] [--manifest FILE]`: is this checkpoint whole and usable?
//!
//! Prints one `PASS`/`FAIL`/`WARN`/`INFO` line per check (problems indented below it, each
//! naming its file or tensor) and a summary; exits 0 when nothing failed, 1 when a check
//! failed, 2 on a usage error (no such directory, unreadable manifest). The structural checks
//! live in [`k3_format::verify`] and read only headers. `--deep` also reads every byte: it
//! hashes every shard (XXH3-64, or SHA-256 where the manifest gives SHA-256 sums) and counts
//! the E8M0 scale bytes equal to 255 (NaN groups: legal, decoded as zero, but suspicious)
//! per layer.
//!
//! Manifest formats (`--manifest`, implies `--deep`), paths relative to MODEL_DIR:
//! - JSON: `{ "model-00001-of-00096.safetensors": "HEX", … }`;
//! - `sha256sum` / `xxhsum` lines: `HEX  FILE` (or `HEX *FILE`), `#` comments allowed.
//!
//! The algorithm is told by the digest length: 64 hex digits are SHA-256, 16 are XXH3-64.
//! `--write-manifest FILE` writes the XXH3-64 sums of every shard as JSON for later checks.

use crate::CliError;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use k3_format::verify::{scale_nan_counts, verify_dir, Check, Status};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// Problems printed per check unless `--all`.
const SHOWN: usize = 20;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  k3 verify fixtures/tiny-k3\n  k3 verify /models/kimi-k3 --deep --manifest SHA256SUMS"
)]
pub struct VerifyArgs {
    /// Model directory.
    pub model_dir: PathBuf,
    /// Also read every byte: hash every shard and count NaN (255) MXFP4 scale bytes.
    #[arg(long)]
    pub deep: bool,
    /// Expected checksums (JSON {"file": "hex"} or sha256sum lines); implies --deep.
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// Write the shards' XXH3-64 sums as a JSON manifest; implies --deep.
    #[arg(long, value_name = "FILE")]
    pub write_manifest: Option<PathBuf>,
    /// Print every problem, not the first 20 of each check.
    #[arg(long)]
    pub all: bool,
    /// Also check the packed trunk in DIR (`k3 pack`): it matches this checkpoint and every
    /// layer's checksum holds (a compressed pack's every chunk is checked and decoded).
    #[arg(long, value_name = "DIR")]
    pub trunk: Option<PathBuf>,
}

/// Runs the checks and prints the report; `Err` with exit code 1 when a check failed.
pub fn verify(mut args: VerifyArgs) -> Result<(), CliError> {
    // A stored NAME (`k3 pull`) stands for its directory (docs/MODELS.md).
    args.model_dir = crate::store::resolve_model(&args.model_dir)?;
    let dir = &args.model_dir;
    if !dir.is_dir() {
        return Err(CliError::usage(format!(
            "{}: not a directory: point at the checkpoint directory",
            dir.display()
        )));
    }
    let manifest = args.manifest.as_deref().map(load_manifest).transpose()?;
    println!("k3 verify {}", dir.display());
    let v = verify_dir(dir);
    let mut checks = v.checks;
    print_checks(&checks, args.all);
    if args.deep || manifest.is_some() || args.write_manifest.is_some() {
        let mut deep = Vec::new();
        let sums = hash_files(dir, &v.shard_files, manifest.as_ref())?;
        deep.extend(compare(dir, &sums, manifest.as_ref()));
        if let Some(out) = &args.write_manifest {
            write_manifest(dir, out, &sums)?;
            deep.push(Check {
                name: "manifest",
                status: Status::Info,
                summary: format!("wrote {} XXH3-64 sums to {}", sums.len(), out.display()),
                details: Vec::new(),
            });
        }
        if let Some(ck) = &v.checkpoint {
            deep.push(scales(ck));
        }
        print_checks(&deep, args.all);
        checks.extend(deep);
    }
    if let Some(t) = &args.trunk {
        let c = crate::verify_trunk::check(dir, t);
        print_checks(std::slice::from_ref(&c), args.all);
        checks.push(c);
    }
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    let (fail, warn, pass) = (
        count(Status::Fail),
        count(Status::Warn),
        count(Status::Pass),
    );
    let verdict = if fail == 0 { "OK" } else { "FAILED" };
    println!("summary: {pass} passed, {fail} failed, {warn} warnings: {verdict}");
    if fail > 0 {
        return Err(CliError::runtime(format!(
            "{}: {fail} check(s) failed",
            dir.display()
        )));
    }
    Ok(())
}

fn print_checks(checks: &[Check], all: bool) {
    for c in checks {
        println!("{}  {:<15} {}", c.status, c.name, c.summary);
        if c.status == Status::Info && !all {
            continue;
        }
        let shown = if all { c.details.len() } else { SHOWN };
        for d in c.details.iter().take(shown) {
            println!("      {d}");
        }
        if c.details.len() > shown {
            println!(
                "      … and {} more (--all lists them)",
                c.details.len() - shown
            );
        }
    }
}

/// A hash algorithm, told by the digest length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algo {
    Xxh3,
    Sha256,
}

impl Algo {
    fn of(hex: &str) -> Option<Algo> {
        let hexish = hex.bytes().all(|b| b.is_ascii_hexdigit());
        match hex.len() {
            16 if hexish => Some(Algo::Xxh3),
            64 if hexish => Some(Algo::Sha256),
            _ => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Algo::Xxh3 => "xxh3",
            Algo::Sha256 => "sha256",
        }
    }
}

/// File (relative to the model dir, `/`-separated, no `./`) → lowercase hex digest.
type Manifest = BTreeMap<String, String>;

/// Reads a JSON or sha256sum-style manifest; usage error (exit 2) naming file and line.
fn load_manifest(path: &Path) -> Result<Manifest, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
    let bad = |what: String| CliError::usage(format!("{}: {what}", path.display()));
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
struct Sum {
    rel: String,
    algo: Algo,
    hex: Result<String, String>,
}

/// Hashes every shard and every other manifest file that exists, several files at a time,
/// with one progress bar over all bytes.
fn hash_files(
    dir: &Path,
    shards: &[PathBuf],
    manifest: Option<&Manifest>,
) -> Result<Vec<Sum>, CliError> {
    let mut rels: Vec<String> = shards.iter().map(|p| rel_name(dir, p)).collect();
    if let Some(m) = manifest {
        for f in m.keys() {
            if !rels.contains(f) && dir.join(f).is_file() {
                rels.push(f.clone());
            }
        }
    }
    let algo_of = |rel: &str| {
        manifest
            .and_then(|m| m.get(rel))
            .and_then(|h| Algo::of(h))
            .unwrap_or(Algo::Xxh3)
    };
    let total: u64 = rels
        .iter()
        .filter_map(|r| std::fs::metadata(dir.join(r)).ok())
        .map(|m| m.len())
        .sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "hashing {bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .map_err(|e| CliError::runtime(format!("progress bar: {e}")))?,
    );
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
            let hex = hash_file(&dir.join(rel), algo, &|n| bar.inc(n));
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
    bar.finish_and_clear();
    sums.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(sums)
}

/// `path` relative to `dir`, `/`-separated.
fn rel_name(dir: &Path, path: &Path) -> String {
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
fn compare(dir: &Path, sums: &[Sum], manifest: Option<&Manifest>) -> Vec<Check> {
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
fn write_manifest(dir: &Path, out: &Path, sums: &[Sum]) -> Result<(), CliError> {
    let mut m = BTreeMap::new();
    for s in sums {
        if let (Algo::Xxh3, Ok(h)) = (s.algo, &s.hex) {
            m.insert(s.rel.clone(), h.clone());
        }
    }
    let text = serde_json::to_string_pretty(&m)
        .map_err(|e| CliError::runtime(format!("manifest for {}: {e}", dir.display())))?;
    std::fs::write(out, text + "\n")
        .map_err(|e| CliError::runtime(format!("{}: {e}", out.display())))
}

/// Counts E8M0 bytes equal to 255 per layer: a warning, never a failure.
fn scales(ck: &k3_format::Checkpoint) -> Check {
    let total: u64 = ck
        .iter()
        .filter(|v| v.name.ends_with(".weight_scale"))
        .map(|v| v.nbytes())
        .sum();
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("scales  {bar:40} {bytes}/{total_bytes} eta {eta}")
    {
        bar.set_style(style);
    }
    let counts = scale_nan_counts(ck, &|n| bar.inc(n));
    bar.finish_and_clear();
    let (tensors, bytes, nan) = counts.values().fold((0, 0, 0), |a, c| {
        (a.0 + c.tensors, a.1 + c.bytes, a.2 + c.nan)
    });
    let with_nan = counts.values().filter(|c| c.nan > 0).count();
    let details = counts
        .iter()
        .filter(|(_, c)| c.nan > 0)
        .map(|(l, c)| {
            let layer = l.map_or("no layer".to_string(), |l| format!("layer {l}"));
            format!(
                "{layer}: {} of {} scale bytes are 255 (NaN groups, decoded as 0)",
                c.nan, c.bytes
            )
        })
        .collect();
    Check {
        name: "mxfp4 scales",
        status: if nan == 0 { Status::Pass } else { Status::Warn },
        summary: format!(
            "{nan} of {bytes} E8M0 scale bytes in {tensors} tensors are 255 (NaN), in {with_nan} layer(s)"
        ),
        details,
    }
}
