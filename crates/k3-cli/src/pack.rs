//! `k3 pack`: copy each layer's trunk run into `trunk.bin` + `trunk.json` (4096-aligned runs,
//! per-layer xxh3 checksums, atomic output) for users who want the trunk on a faster disk.
//! `--adopt DIR` takes over a trunk packed by upstream's packer instead
//! (docs/FORMATS.md#adopting-an-upstream-pack).

use crate::CliError;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use k3_format::pack::adopt_trunk_pack;
use k3_format::pack::{DraftQuant, PackOptions};
use k3_format::TrunkPack;
use k3_format::{bind_model, write_trunk_pack, Checkpoint, K3Config, ModelBinding, PackError};
use std::path::Path;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  k3 pack /models/kimi-k3 /nvme/k3-trunk --verify\n  k3 pack /models/kimi-k3 --adopt /nvme/upstream-trunk\n  k3 run /models/kimi-k3 --prompt 'Hi' --preset laptop --trunk /nvme/k3-trunk"
)]
pub struct PackArgs {
    /// Model directory (config.json + *.safetensors).
    pub model_dir: PathBuf,
    /// Output directory for trunk.bin + trunk.json.
    #[arg(required_unless_present = "adopt")]
    pub out_dir: Option<PathBuf>,
    /// Adopt a trunk packed by upstream's packer in DIR (its trunk.json: align, and per layer
    /// file_off, nbytes and tensors): match and compare every layer with MODEL_DIR's shards,
    /// then write k3's trunk.json there (no data copied; a damaged layer is refused, exit 2).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["out_dir", "overwrite", "verify"])]
    pub adopt: Option<PathBuf>,
    /// Replace an existing pack in OUT_DIR.
    #[arg(long)]
    pub overwrite: bool,
    /// Re-read the written pack and check every layer's checksum.
    #[arg(long)]
    pub verify: bool,
    /// Store the trunk compressed (bf16 exponents entropy-coded, every bit kept; about 0.67 of
    /// the bytes to read per pass: docs/FORMATS.md#compressed-trunk).
    #[arg(long, conflicts_with_all = ["adopt", "draft_quant"])]
    pub compress: bool,
    /// Write a DRAFT trunk for hybrid drafting (`--draft-trunk`) instead: every trunk matrix
    /// but the router gate quantized, `q8` (per-row int8, half the bytes; recommended, see
    /// docs/PERFORMANCE.md#hybrid-drafting) or `mxfp4` (about a quarter).
    #[arg(long, value_name = "q8|mxfp4", value_parser = parse_quant, conflicts_with = "adopt")]
    pub draft_quant: Option<DraftQuant>,
}

fn parse_quant(s: &str) -> Result<DraftQuant, String> {
    DraftQuant::parse(s).ok_or_else(|| format!("'{s}' is not q8 or mxfp4"))
}

fn bar(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// Exit code of a pack error: I/O is a runtime failure, everything else a refusal.
fn pack_error(e: PackError) -> CliError {
    match e {
        PackError::Io { .. } => CliError::runtime(e.to_string()),
        _ => CliError::usage(e.to_string()),
    }
}

pub fn pack(mut args: PackArgs) -> Result<(), CliError> {
    // A stored NAME (`k3 pull`) stands for its directory (docs/MODELS.md).
    args.model_dir = k3_hub::store::resolve_model(&args.model_dir)?;
    let cfg = K3Config::load(args.model_dir.join("config.json"))
        .map_err(|e| CliError::usage(e.to_string()))?;
    let ck = Checkpoint::open(&args.model_dir).map_err(|e| CliError::usage(e.to_string()))?;
    let binding = bind_model(&ck, &cfg).map_err(|e| CliError::usage(e.to_string()))?;
    if let Some(dir) = &args.adopt {
        return adopt(&ck, &binding, &cfg, dir);
    }
    let Some(out_dir) = args.out_dir else {
        return Err(CliError::usage("k3 pack needs OUT_DIR (or --adopt DIR)"));
    };
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| CliError::runtime(format!("{}: {e}", out_dir.display())))?;
    let t0 = Instant::now();
    let pb = bar(
        0,
        if args.draft_quant.is_some() {
            "quantizing"
        } else {
            "packing"
        },
    );
    let opts = PackOptions {
        overwrite: args.overwrite,
        ..PackOptions::default()
    };
    let mut progress = |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    };
    let packed: TrunkPack = match args.draft_quant {
        None if args.compress => k3_format::pack::write_compressed_pack(
            &ck,
            &binding,
            &cfg,
            &out_dir,
            &opts,
            &mut progress,
        )
        .map_err(pack_error)?,
        None => write_trunk_pack(&ck, &binding, &cfg, &out_dir, &opts, &mut progress)
            .map_err(pack_error)?,
        Some(q) => k3_engine::draft::write_draft_trunk(
            &args.model_dir,
            &out_dir,
            q,
            args.overwrite,
            &mut progress,
        )
        .map_err(|e| match e {
            k3_engine::EngineError::Pack(p) => pack_error(p),
            other => CliError::usage(other.to_string()),
        })?,
    };
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let kind = match args.draft_quant {
        Some(q) => format!("a {} draft trunk", q.name()),
        None if packed.is_compressed() => format!(
            "the trunk compressed ({:.3} GB stored)",
            packed.stored_total_bytes() as f64 / 1e9
        ),
        None => "the trunk".into(),
    };
    eprintln!(
        "packed {kind}: {} layers, {:.3} GB, into {} in {:.2} s ({:.1} MB/s)",
        packed.num_layers(),
        packed.total_bytes() as f64 / 1e9,
        packed.path().display(),
        secs,
        packed.total_bytes() as f64 / 1e6 / secs.max(1e-9)
    );
    if args.verify {
        let pb = bar(packed.total_bytes(), "verifying");
        let checked = packed.verify_checksums(&mut |done, _| pb.set_position(done));
        pb.finish_and_clear();
        checked.map_err(|e| CliError::runtime(e.to_string()))?;
        eprintln!("verified {} layer checksums", packed.num_layers());
    }
    Ok(())
}

/// `--adopt DIR`: compare every layer of upstream's pack with the checkpoint, then write k3's
/// `trunk.json` beside its `trunk.bin`.
fn adopt(
    ck: &Checkpoint,
    binding: &ModelBinding,
    cfg: &K3Config,
    dir: &Path,
) -> Result<(), CliError> {
    let t0 = Instant::now();
    let pb = bar(0, "checking");
    let adopted = adopt_trunk_pack(ck, binding, cfg, dir, &mut |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    });
    pb.finish_and_clear();
    let pack = adopted.map_err(pack_error)?;
    let kept = dir.join(k3_format::pack::UPSTREAM_JSON);
    eprintln!(
        "adopted {}: {} layers, {:.3} GB, each equal to the checkpoint ({:.2} s); wrote {} with checksums{}",
        pack.path().display(),
        pack.num_layers(),
        pack.total_bytes() as f64 / 1e9,
        t0.elapsed().as_secs_f64(),
        pack.json_path().display(),
        if kept.exists() { format!(" (the index without them is kept as {})", kept.display()) } else { String::new() }
    );
    Ok(())
}
