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
use k3_format::verify::{verify_dir, Check, Status};
use k3_hub::manifest::{compare, files_to_hash, hash_files, load_manifest, write_manifest, Sum};
use std::path::{Path, PathBuf};

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
    args.model_dir = k3_hub::store::resolve_model(&args.model_dir)?;
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
        let sums = hash_with_bar(dir, &v.shard_files, manifest.as_ref())?;
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
        let c = k3_format::verify_deep::check_trunk_pack(dir, t);
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

/// Hashes the shards (and the manifest's other files) under one progress bar over all bytes.
fn hash_with_bar(
    dir: &Path,
    shards: &[PathBuf],
    manifest: Option<&k3_hub::manifest::Manifest>,
) -> Result<Vec<Sum>, CliError> {
    let rels = files_to_hash(dir, shards, manifest);
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
    let sums = hash_files(dir, &rels, manifest, &|n| bar.inc(n));
    bar.finish_and_clear();
    Ok(sums)
}

/// The NaN scale-byte check (`k3_format::verify_deep`) under a progress bar.
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
    let check = k3_format::verify_deep::scale_check(ck, &|n| bar.inc(n));
    bar.finish_and_clear();
    check
}
