//! `k3 doctor [MODEL_DIR]`: can this machine run the model, how should it, and how fast?
//!
//! Without a model: machine facts only (CPU, SIMD level the kernels use, whether `--numerics
//! fast` can run, cores, RAM, MemAvailable, cgroup limit, free disk), exit 0. With a model it
//! also measures O_DIRECT read bandwidth on the model's own files at 1, 4 and 16 outstanding
//! reads of one expert each (capped at about 0.6 s and 192 MB per level), plans every preset
//! with the engine's planner (the same `model_sizes` → `plan` → `check` steps as `k3 plan` /
//! `planning::forecast`), recommends a budget and predicts seconds per token from the I/O floor:
//!
//! ```text
//! bytes/token = unpinned trunk + MoE layers · top-k · (1 − hit rate) · expert bytes
//! s/token    ≥ trunk / bandwidth(1 read) + experts / bandwidth(16 reads)
//! ```
//!
//! The hit rate is 100 % when the cache holds every expert, else the decode-view ARC figure
//! of docs/PERFORMANCE.md for the preset (0 for a `--mem-gb` budget: conservative). Exits 2
//! when even the smallest legal plan does not fit the available memory, saying why.

use crate::CliError;
use clap::Args;
use k3_engine::io_probe::ExpertReads;
use k3_engine::planning::{budget_extremes, model_sizes};
use k3_engine::Budget;
use k3_plan::cgroup::CgroupLimit;
use k3_plan::forecast::holds_everything;
use k3_plan::plan::{fmt_bytes, plan as make_plan};
use k3_plan::recommend::{bytes_per_token, candidates, pick, Candidate};
use k3_plan::{MemoryPlan, ModelSizes, PlanRequest};
use k3_store::available_memory;
use k3_store::probe::{free_disk, fs_type, Bandwidth, MachineFacts};
use std::path::{Path, PathBuf};

#[derive(Args)]
#[command(
    after_help = "Examples:\n  k3 doctor\n  k3 doctor --disk /nvme/models\n  k3 doctor /models/kimi-k3\n  k3 doctor Kimi-K3"
)]
pub struct DoctorArgs {
    /// Model directory or stored NAME (optional: without it, machine facts and the released
    /// model's disk needs and presets on this disk, before downloading it).
    pub model_dir: Option<PathBuf>,
    /// Without a model: the directory the release would go to (default: the model store,
    /// `k3 pull`'s target), whose free space and read rate are checked.
    #[arg(long, value_name = "DIR", conflicts_with = "model_dir")]
    pub disk: Option<PathBuf>,
    /// Context positions to plan latent KV for.
    #[arg(short = 'c', long, visible_alias = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Seconds of read test per queue depth (three depths are tested).
    #[arg(long, default_value_t = 0.6)]
    pub io_seconds: f64,
}

/// Prints the report; `Err` (exit 2) when the model cannot run on this machine at all.
pub fn doctor(args: DoctorArgs) -> Result<(), CliError> {
    if !(args.io_seconds.is_finite() && args.io_seconds > 0.0) {
        return Err(CliError::usage(format!(
            "--io-seconds must be positive, got {}",
            args.io_seconds
        )));
    }
    let dir = args
        .model_dir
        .as_deref()
        .map(k3_hub::store::resolve_model)
        .transpose()?;
    machine_facts(dir.as_deref());
    let Some(dir) = dir else {
        crate::release::doctor_release(args.disk.as_deref(), args.ctx, args.io_seconds)?;
        println!("\n(pass a model directory or stored NAME to measure its files and get a recommended budget)");
        return Ok(());
    };
    let cfg = k3_format::K3Config::load(dir.join("config.json"))
        .map_err(|e| CliError::usage(format!("{e}")))?;
    let ck = k3_format::Checkpoint::open(&dir).map_err(|e| CliError::usage(e.to_string()))?;
    let binding = k3_format::bind_model(&ck, &cfg).map_err(|e| CliError::usage(e.to_string()))?;
    let sizes = model_sizes(&cfg, &binding)?;
    println!("\nmodel {}", dir.display());
    let files: u64 = ck.shards().iter().map(|s| s.file_len()).sum();
    println!(
        "  shards            {} files, {}",
        ck.shards().len(),
        fmt_bytes(files)
    );
    println!(
        "  expert            {} ({} routed)",
        fmt_bytes(sizes.expert_bytes),
        sizes.n_routed_experts
    );
    let bw = bandwidth(&ck, &binding, &cfg, files, args.io_seconds);
    recommend(&dir, &cfg, &sizes, args.ctx, &bw)
}

fn machine_facts(model_dir: Option<&Path>) {
    let m = MachineFacts::read();
    println!("machine");
    println!("  cpu               {} ({})", m.cpu, std::env::consts::ARCH);
    println!(
        "  simd              {} (the kernels' dispatch level)",
        k3_kernels::simd::simd_level()
    );
    println!("  trunk decoder     {}", k3_codec::decoder_build());
    println!("  numerics fast     {}", numerics_fast());
    if m.online_cores > m.usable_cores {
        println!(
            "  logical cores     {} usable by this process ({} online)",
            m.usable_cores, m.online_cores
        );
    } else {
        println!("  logical cores     {}", m.usable_cores);
    }
    let shown = |b: Option<u64>| b.map_or_else(|| "unknown".into(), fmt_bytes);
    println!("  RAM total         {}", shown(m.mem_total));
    println!("  MemAvailable      {}", shown(m.mem_available));
    let cgroup = CgroupLimit::from_reader(|p| std::fs::read_to_string(format!("/{p}")).ok());
    println!("  cgroup memory     {cgroup}");
    let avail = available_memory();
    match avail.bytes() {
        Some(b) => println!("  usable for k3     {} ({})", fmt_bytes(b), avail.source()),
        None => println!("  usable for k3     unknown (no /proc/meminfo, no cgroup limit)"),
    }
    let disk_dir = model_dir.map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    match free_disk(&disk_dir) {
        Some(free) => println!(
            "  free disk         {} at {} ({})",
            fmt_bytes(free),
            disk_dir.display(),
            fs_type(&disk_dir).unwrap_or_else(|| "filesystem unknown".into())
        ),
        None => println!("  free disk         unknown at {}", disk_dir.display()),
    }
}

/// Whether `--numerics fast` (docs/NUMERICS.md#numeric-mode-fast) can run here, and why not.
fn numerics_fast() -> String {
    use k3_kernels::probe::{amx_bf16, Amx};
    match (k3_kernels::fast::amx_usable(), amx_bf16()) {
        (true, _) => "available (AMX-BF16 tiles; opt in with --numerics fast, default v2)".into(),
        (false, Amx::Available) => {
            "unavailable (AMX-BF16: yes, but Linux refused this process the tile state)".into()
        }
        (false, amx) => format!("unavailable (AMX-BF16: {})", amx.label()),
    }
}

/// Measures reads of one expert each at 1, 4 and 16 outstanding reads over the model's own
/// expert locations (`k3_engine::io_probe`) and prints the rates.
fn bandwidth(
    ck: &k3_format::Checkpoint,
    b: &k3_format::ModelBinding,
    cfg: &k3_format::K3Config,
    files: u64,
    secs: f64,
) -> Bandwidth {
    let reads = match ExpertReads::open(ck, b, cfg) {
        Ok(r) => r,
        Err(e) => {
            println!("  read test         skipped: {e}");
            return Bandwidth::default();
        }
    };
    let direct = reads.direct();
    println!(
        "  read test         {} reads of {} (one expert), {:.1} s per depth",
        if direct { "O_DIRECT" } else { "buffered" },
        fmt_bytes(reads.read_bytes()),
        secs
    );
    let levels = match reads.run(secs) {
        Ok(bw) => bw.levels,
        Err(e) => {
            println!("  read test         {e}");
            return Bandwidth::default();
        }
    };
    for (qd, bps) in &levels {
        println!("  {qd:>2} outstanding    {}/s", fmt_bytes(*bps as u64));
    }
    if files < 1 << 30 {
        println!("  note              the model's files total {} (< 1 GiB): these figures are cache-dominated (drive or page cache), not the disk's sustained rate", fmt_bytes(files));
    } else if !direct {
        println!("  note              O_DIRECT unavailable here (buffered I/O): figures include the page cache");
    }
    Bandwidth { levels }
}

fn plan_for(sizes: &ModelSizes, budget: Budget, ctx: usize) -> Result<MemoryPlan, CliError> {
    make_plan(sizes, &PlanRequest::new(budget, ctx as u64))
        .map_err(|e| CliError::usage(e.to_string()))
}

fn recommend(
    dir: &Path,
    cfg: &k3_format::K3Config,
    sizes: &ModelSizes,
    ctx: usize,
    bw: &Bandwidth,
) -> Result<(), CliError> {
    let avail = available_memory();
    let (smallest, everything) = budget_extremes(dir)?;
    let min_plan = plan_for(sizes, smallest, ctx)?;
    if let Err(e) = min_plan.check(sizes, &avail) {
        println!("\nverdict: this machine cannot run the model");
        println!("{}", min_plan.table(Some(&avail)).trim_end());
        return Err(CliError::usage(format!(
            "even the smallest legal plan ({} for ctx {ctx}: nothing pinned, one ring slot, top-k + 1 expert slots) does not fit: {e}",
            fmt_bytes(min_plan.total_bytes())
        )));
    }
    let cands =
        candidates(sizes, everything, ctx, &avail).map_err(|e| CliError::usage(e.to_string()))?;
    let moe_layers = cfg
        .num_hidden_layers
        .saturating_sub(cfg.first_k_dense_replace) as f64;
    print_candidates(&cands, sizes, ctx, moe_layers, bw);
    match pick(&cands, sizes) {
        Some(c) => {
            let why = if holds_everything(&c.plan, sizes) {
                "holds the whole model: nothing is read per token after warm-up"
            } else {
                "the largest preset that fits the available memory"
            };
            // A whole command line, runnable as printed (tests run it verbatim).
            println!(
                "\nrecommended: k3 run {} {} -p Hello\n  ({why})",
                dir.display(),
                c.flag
            );
        }
        None => println!(
            "\nrecommended: no preset fits; size it yourself with --mem-gb (at least {})",
            fmt_bytes(min_plan.total_bytes())
        ),
    }
    println!("s/token is a floor from I/O alone (compute not included); hit rates: docs/PERFORMANCE.md decode view (ARC), 0 for --mem-gb");
    Ok(())
}

/// The budgets table: total, fits, hit rate, bytes read and the I/O floor per token.
fn print_candidates(
    cands: &[Candidate],
    sizes: &ModelSizes,
    ctx: usize,
    moe_layers: f64,
    bw: &Bandwidth,
) {
    println!("\nbudgets (ctx {ctx}; I/O floor = trunk streamed + expected expert misses, over the measured bandwidth)");
    println!(
        "  {:<20} {:>10} {:>5} {:>8} {:>12} {:>12}",
        "budget", "total", "fits", "hit", "read/token", "s/token"
    );
    for c in cands {
        let (read, secs) = floor(c, sizes, moe_layers, bw);
        println!(
            "  {:<20} {:>10} {:>5} {:>7.1}% {:>12} {:>12}",
            c.label,
            fmt_bytes(c.plan.total_bytes()),
            if c.fits { "yes" } else { "no" },
            c.hit * 100.0,
            fmt_bytes(read as u64),
            secs.map_or("?".to_string(), |s| format!("≥ {s:.3}"))
        );
    }
}

/// Bytes read per token and the I/O-floor seconds (trunk at 1 outstanding read, experts at 16).
fn floor(c: &Candidate, sizes: &ModelSizes, moe_layers: f64, bw: &Bandwidth) -> (f64, Option<f64>) {
    let (trunk, experts) = bytes_per_token(&c.plan, c.hit, sizes, moe_layers);
    (trunk + experts, bw.floor_secs(trunk, experts))
}
