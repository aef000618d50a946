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
use k3_engine::planning::{budget_extremes, model_sizes};
use k3_engine::{Budget, Preset};
use k3_plan::forecast::{hit_rate, holds_everything};
use k3_plan::plan::{fmt_bytes, plan as make_plan, GB};
use k3_plan::{MemoryPlan, ModelSizes, PlanRequest};
use k3_store::probe::{
    free_disk, fs_type, read_rates, Bandwidth, MachineFacts, ReadTest, TestRead,
};
use k3_store::{available_memory, ShardFile};
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

/// Byte cap per queue depth of the read test (a level always finishes its first round).
const LEVEL_BYTES: u64 = 192 << 20;

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
    println!("  cgroup memory     {}", cgroup_limit());
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

/// The memory limit of this process's cgroup (v2 `memory.max`, else v1 `limit_in_bytes`).
fn cgroup_limit() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let cgroups = read("/proc/self/cgroup").unwrap_or_default();
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let path = path.trim_end_matches('/');
        if ctrl.is_empty() {
            let max = read(&format!("/sys/fs/cgroup{path}/memory.max"))
                .or_else(|| read("/sys/fs/cgroup/memory.max"));
            return match max.as_deref() {
                Some("max") => "unlimited (cgroup v2)".into(),
                Some(v) => v.parse::<u64>().map_or(format!("{v} (cgroup v2)"), |b| {
                    format!("{} (cgroup v2 memory.max)", fmt_bytes(b))
                }),
                None => "none found (cgroup v2, no memory controller)".into(),
            };
        }
        if ctrl.split(',').any(|c| c == "memory") {
            let lim = read(&format!(
                "/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"
            ))
            .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
            return match lim.and_then(|v| v.parse::<u64>().ok()) {
                Some(b) if b >= 1 << 60 => "unlimited (cgroup v1)".into(),
                Some(b) => format!("{} (cgroup v1 memory.limit_in_bytes)", fmt_bytes(b)),
                None => "unknown (cgroup v1)".into(),
            };
        }
    }
    "none (no cgroup memory controller)".into()
}

/// Measures reads of one expert each at 1, 4 and 16 outstanding reads, over real expert
/// locations spread across the model (a fixed pseudo-random walk), with O_DIRECT when the
/// filesystem allows it.
fn bandwidth(
    ck: &k3_format::Checkpoint,
    b: &k3_format::ModelBinding,
    cfg: &k3_format::K3Config,
    files: u64,
    secs: f64,
) -> Bandwidth {
    let shards: Vec<ShardFile> = match ck
        .shards()
        .iter()
        .map(|s| ShardFile::open(s.path(), true))
        .collect()
    {
        Ok(s) => s,
        Err(e) => {
            println!("  read test         skipped: {e}");
            return Bandwidth::default();
        }
    };
    let direct = shards.iter().all(ShardFile::is_direct);
    let first = cfg.first_k_dense_replace;
    let layers = cfg.num_hidden_layers.saturating_sub(first);
    if layers == 0 || cfg.num_experts == 0 || b.experts.is_empty() {
        println!("  read test         skipped: the model has no routed experts");
        return Bandwidth::default();
    }
    let nth = |i: u64| {
        // Weyl sequence over the expert table: deterministic, spread over every shard.
        let k = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as usize % (layers * cfg.num_experts);
        b.experts
            .locate(first + k / cfg.num_experts, k % cfg.num_experts)
            .ok()
    };
    let bytes = b.experts.expert_bytes();
    println!(
        "  read test         {} reads of {} (one expert), {:.1} s per depth",
        if direct { "O_DIRECT" } else { "buffered" },
        fmt_bytes(bytes),
        secs
    );
    let test = ReadTest {
        depths: &[1, 4, 16],
        secs,
        cap: LEVEL_BYTES,
        max_read: bytes,
    };
    let next = |i: u64| {
        nth(i).map(|loc| TestRead {
            file: loc.shard,
            pieces: loc.reads.clone(),
        })
    };
    let levels = match read_rates(&shards, test, &next) {
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

/// A candidate budget and its plan.
struct Candidate {
    label: String,
    flag: String,
    plan: MemoryPlan,
    fits: bool,
    hit: f64,
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
    let cands = candidates(sizes, everything, ctx, &avail)?;
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

/// Every preset, the smallest split holding the whole model, and 90 % of the available memory.
fn candidates(
    sizes: &ModelSizes,
    everything: Budget,
    ctx: usize,
    avail: &k3_plan::Available,
) -> Result<Vec<Candidate>, CliError> {
    let fits = |p: &MemoryPlan| p.check(sizes, avail).is_ok();
    let whole_or_none = |p: &MemoryPlan| f64::from(u8::from(holds_everything(p, sizes)));
    let mut cands = Vec::new();
    let mut add = |label: String, flag: String, plan: MemoryPlan, hit: f64| {
        let fits = fits(&plan);
        cands.push(Candidate {
            label,
            flag,
            fits,
            plan,
            hit,
        });
    };
    for p in Preset::ALL {
        let plan = plan_for(sizes, Budget::Preset(p), ctx)?;
        let hit = hit_rate(p, &plan, sizes);
        add(format!("preset {p}"), format!("--preset {p}"), plan, hit);
    }
    if let Budget::Split { trunk, cache } = everything {
        // The smallest split that holds the whole model, rounded up to whole MB.
        let (t, c) = (gb_up(trunk), gb_up(cache));
        let budget = Budget::Split {
            trunk: (t * GB as f64) as u64,
            cache: (c * GB as f64) as u64,
        };
        if let Ok(plan) = make_plan(sizes, &PlanRequest::new(budget, ctx as u64)) {
            let hit = whole_or_none(&plan);
            add(
                "whole model".into(),
                format!("--trunk-gb {t} --cache-gb {c}"),
                plan,
                hit,
            );
        }
    }
    // 90 % of what is available, rounded down to 0.1 GB: room for the page cache and the OS.
    let gb = avail.bytes().map_or(0.0, |a| {
        ((a as f64 * 0.9 / GB as f64) * 10.0).floor() / 10.0
    });
    if gb > 0.0 {
        let budget = Budget::Total((gb * GB as f64) as u64);
        if let Ok(plan) = make_plan(sizes, &PlanRequest::new(budget, ctx as u64)) {
            let hit = whole_or_none(&plan);
            add(
                format!("--mem-gb {gb}"),
                format!("--mem-gb {gb}"),
                plan,
                hit,
            );
        }
    }
    Ok(cands)
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

/// The smallest fitting budget that already holds everything, else the largest fitting
/// preset, else any that fits.
fn pick<'a>(cands: &'a [Candidate], sizes: &ModelSizes) -> Option<&'a Candidate> {
    cands
        .iter()
        .filter(|c| c.fits && holds_everything(&c.plan, sizes))
        .min_by_key(|c| c.plan.total_bytes())
        .or_else(|| {
            cands
                .iter()
                .filter(|c| c.fits && c.label.starts_with("preset"))
                .max_by_key(|c| c.plan.total_bytes())
        })
        .or_else(|| cands.iter().find(|c| c.fits))
}

/// Bytes → GB rounded up to a whole MB (so the flag value plans at least as much).
fn gb_up(bytes: u64) -> f64 {
    (bytes as f64 / 1e6).ceil() / 1e3
}

/// Bytes read per token and the I/O-floor seconds (trunk at 1 outstanding read, experts at 16).
fn floor(c: &Candidate, sizes: &ModelSizes, moe_layers: f64, bw: &Bandwidth) -> (f64, Option<f64>) {
    let trunk = c.plan.trunk.streamed_per_token as f64;
    let experts = moe_layers * f64::from(sizes.top_k) * (1.0 - c.hit) * sizes.expert_bytes as f64;
    (trunk + experts, bw.floor_secs(trunk, experts))
}
