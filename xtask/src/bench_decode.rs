//! `cargo xtask bench-decode MODEL_DIR [--tokens N] [--threads T]`: seconds per token of
//! greedy decode at four memory budgets, against the I/O floor and the compute floor measured
//! in the same run (docs/PERFORMANCE.md "Decode vs floors").
//!
//! Budgets (all through the streaming store, O_DIRECT reads, the engine default):
//! - `resident`: everything pinned and every expert cached — after warm-up nothing is read, so
//!   its s/token is the compute floor;
//! - `trunk pinned`: the whole trunk pinned, a modest expert cache (a quarter of the experts,
//!   at least top-k + 1 slots);
//! - `half trunk`: the smallest trunk budget whose plan pins at least half the trunk bytes,
//!   same cache;
//! - `smallest`: the smallest legal budget (nothing pinned, one ring slot, top-k + 1 slots).
//!
//! Each run opens a fresh engine, prefills a short prompt (warm-up; the resident run first
//! feeds a separate `--warm`-token session so every expert is cached), then times `--tokens`
//! greedy steps one by one: median s/token, bytes read per token from the engine's counters
//! (trunk and experts), and the compute thread's waits (trunk layer, experts). The I/O floor
//! is trunk bytes / whole-run read rate + expert bytes / expert read rate at the engine's
//! I/O-thread count, both measured with O_DIRECT on the model's own files before and after the
//! budgets (the better of the two is used: a floor). Every budget must produce the same ids
//! (checked).

use crate::bench_util::{self, gb, mean, median, DiskRates, ModelInfo};
use clap::Args;
use k3_engine::{argmax, Budget, DecodeMode, Engine, EngineOptions, StoreStats};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `bench-decode`.
#[derive(Args, Debug)]
pub struct BenchDecodeArgs {
    /// Model directory (e.g. from `cargo xtask gen-bench`).
    pub model_dir: PathBuf,
    /// Timed greedy tokens per budget (the median is reported).
    #[arg(long, default_value_t = 8)]
    pub tokens: usize,
    /// Compute threads (default: the engine's default).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Prompt tokens prefilled before timing (warm-up).
    #[arg(long, default_value_t = 8)]
    pub prompt: usize,
    /// Expert I/O threads of the engine.
    #[arg(long, default_value_t = 4)]
    pub io_threads: usize,
    /// Seconds of expert-read test per queue depth (run before and after the budgets).
    #[arg(long, default_value_t = 3.0)]
    pub io_seconds: f64,
    /// Resident run only: tokens of a separate warm-up session that loads every expert.
    #[arg(long, default_value_t = 64)]
    pub warm: usize,
    /// Turn the engine's next-layer router lookahead on (`EngineOptions::lookahead`, off by
    /// default).
    #[arg(long)]
    pub lookahead: bool,
    /// Run only these budgets (resident, pinned, half, smallest; comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// Runs the subcommand.
pub fn run(args: &BenchDecodeArgs) -> ExitCode {
    match bench(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-decode: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One budget's measurements.
struct Row {
    name: &'static str,
    budget: String,
    pinned: String,
    s_tok: f64,
    trunk_b: f64,
    expert_b: f64,
    hit: f64,
    trunk_wait: f64,
    expert_wait: f64,
    mean_s: f64,
    ids: Vec<u32>,
    open_s: f64,
}

/// The four budgets of the table (also `bench-compute --model DIR --cold --cold-budget`).
pub(crate) fn budgets(m: &ModelInfo, dir: &Path) -> Result<Vec<(&'static str, Budget)>, String> {
    let s = &m.sizes;
    let slot = s.expert_slot_bytes();
    let (smallest, everything) =
        k3_engine::planning::budget_extremes(dir).map_err(|e| e.to_string())?;
    let modest = (s.n_routed_experts / 4).max(s.min_expert_slots()) * slot;
    let full = s.trunk_full_bytes();
    // The smallest trunk budget (1 % steps) whose plan pins at least half the trunk bytes.
    let half_target = full / 2;
    let mut half = full;
    for pct in 1..=100u64 {
        let trunk = full * pct / 100;
        let b = Budget::Split {
            trunk,
            cache: modest,
        };
        let req = k3_plan::PlanRequest::new(b, 256);
        if let Ok(p) = k3_plan::plan::plan(s, &req) {
            if p.trunk.pinned_bytes >= half_target && p.trunk.streamed_per_token > 0 {
                half = trunk;
                break;
            }
        }
    }
    Ok(vec![
        ("resident", everything),
        (
            "pinned",
            Budget::Split {
                trunk: full,
                cache: modest,
            },
        ),
        (
            "half",
            Budget::Split {
                trunk: half,
                cache: modest,
            },
        ),
        ("smallest", smallest),
    ])
}

fn bench(args: &BenchDecodeArgs) -> Result<(), String> {
    if args.tokens == 0 || args.prompt == 0 {
        return Err("--tokens and --prompt must be at least 1".into());
    }
    let dir = &args.model_dir;
    let m = bench_util::model_info(dir)?;
    println!("machine: {}", bench_util::machine_facts());
    println!(
        "model {}: {} layers, {} routed experts ({} per MoE layer, top-{}), expert {:.1} MB, trunk {:.3} GB",
        dir.display(),
        m.cfg.num_hidden_layers,
        m.sizes.n_routed_experts,
        m.cfg.num_experts,
        m.cfg.num_experts_per_token,
        m.sizes.expert_bytes as f64 / 1e6,
        gb(m.sizes.trunk_full_bytes() as f64)
    );
    let mut depths = vec![1, args.io_threads.max(1), 16];
    depths.dedup();
    let before = bench_util::measure_disk(&m, &depths, args.io_seconds)?;
    println!("disk before: {}", before.summary());
    let mut rows = Vec::new();
    for (name, budget) in budgets(&m, dir)? {
        if !args.only.is_empty() && !args.only.iter().any(|o| o == name) {
            continue;
        }
        let row = run_budget(args, name, budget, &m)?;
        println!(
            "  {name:<9} {:.3} s/token (median of {}), {:.3} GB trunk + {:.3} GB experts per token, opened in {:.1} s",
            row.s_tok,
            args.tokens,
            gb(row.trunk_b),
            gb(row.expert_b),
            row.open_s
        );
        rows.push(row);
    }
    if let Some(first) = rows.first() {
        if let Some(bad) = rows.iter().find(|r| r.ids != first.ids) {
            return Err(format!(
                "budget {} produced ids {:?}, budget {} produced {:?}: tokens must not depend on the budget",
                bad.name, bad.ids, first.name, first.ids
            ));
        }
        println!("greedy ids (identical at every budget): {:?}", first.ids);
    }
    let after = bench_util::measure_disk(&m, &depths, args.io_seconds)?;
    println!("disk after:  {}", after.summary());
    // A floor takes the better of the two measurements.
    let disk = before.best(&after);
    print_table(&rows, &disk, args);
    Ok(())
}

fn run_budget(
    args: &BenchDecodeArgs,
    name: &'static str,
    budget: Budget,
    m: &ModelInfo,
) -> Result<Row, String> {
    let ctx = (args.prompt + args.tokens + 8).max(args.warm);
    let opts = EngineOptions {
        threads: args.threads,
        budget: Some(budget),
        ctx,
        direct_io: true,
        lookahead: args.lookahead,
        io_threads: args.io_threads,
        ..EngineOptions::default()
    };
    let t = Instant::now();
    let engine = Engine::open(&args.model_dir, opts).map_err(|e| format!("{name}: {e}"))?;
    let open_s = t.elapsed().as_secs_f64();
    let plan = engine.plan().ok_or("no plan")?.clone();
    let (budget_s, pinned) = describe(&budget, &plan);
    if name == "resident" {
        // A separate session whose prefill routes through every expert: the cache is the
        // engine's, so the timed session starts with every expert resident.
        let mut warm = engine
            .new_session(args.warm.max(1))
            .map_err(|e| e.to_string())?;
        let ids = bench_util::prompt_ids(args.warm.max(1), m.cfg.vocab_size, 3);
        warm.feed(&ids).map_err(|e| e.to_string())?;
    }
    let mut session = engine.new_session(ctx).map_err(|e| e.to_string())?;
    let prompt = bench_util::prompt_ids(args.prompt, m.cfg.vocab_size, 1);
    session.feed(&prompt).map_err(|e| e.to_string())?;
    let mut next = argmax(session.logits());
    let mut ids = vec![next];
    let (mut secs, mut deltas) = (Vec::new(), Vec::new());
    for _ in 0..args.tokens {
        let before = engine.stats();
        let t = Instant::now();
        session
            .step(next, DecodeMode::Incremental)
            .map_err(|e| e.to_string())?;
        secs.push(t.elapsed().as_secs_f64());
        deltas.push(engine.stats().since(&before));
        next = argmax(session.logits());
        ids.push(next);
    }
    let per = |f: &dyn Fn(&StoreStats) -> f64| mean(&deltas.iter().map(f).collect::<Vec<_>>());
    let requests: f64 = deltas.iter().map(|d| d.expert_requests as f64).sum();
    let hits: f64 = deltas.iter().map(|d| d.expert_resident_hits as f64).sum();
    Ok(Row {
        name,
        budget: budget_s,
        pinned,
        s_tok: median(&secs),
        mean_s: mean(&secs),
        trunk_b: per(&|d| d.trunk_bytes_read as f64),
        expert_b: per(&|d| d.expert_bytes_read as f64),
        hit: if requests > 0.0 { hits / requests } else { 0.0 },
        trunk_wait: per(&|d| d.trunk_wait_seconds),
        expert_wait: per(&|d| d.expert_wait_seconds),
        ids,
        open_s,
    })
}

fn describe(budget: &Budget, plan: &k3_engine::MemoryPlan) -> (String, String) {
    let b = match budget {
        Budget::Split { trunk, cache } => format!(
            "{:.2} / {:.2} GB ({} slots)",
            gb(*trunk as f64),
            gb(*cache as f64),
            plan.expert_slots
        ),
        other => format!("{other:?}"),
    };
    let p = format!(
        "{}/{} layers, {:.2} GB; ring {}×{:.2} GB",
        plan.trunk.pinned.len(),
        plan.n_layers,
        gb(plan.trunk.pinned_bytes as f64),
        plan.trunk.ring_slots,
        gb(plan.trunk.ring_slot_bytes as f64),
    );
    (b, p)
}

fn print_table(rows: &[Row], disk: &DiskRates, args: &BenchDecodeArgs) {
    let compute = rows.iter().find(|r| r.name == "resident").map(|r| r.s_tok);
    let (bw_t, bw_e) = (disk.trunk, disk.expert_at(args.io_threads));
    println!(
        "\nI/O floor = trunk bytes / {:.0} MB/s + expert bytes / {:.0} MB/s ({} outstanding); compute floor = the resident row",
        bw_t / 1e6,
        bw_e / 1e6,
        args.io_threads
    );
    println!("\n| budget | trunk / cache budget | trunk pinned; ring | s/token (median; mean) | trunk GB/token | expert GB/token (hit %) | I/O floor s | compute floor s | ratio | read GB/s achieved | trunk wait s | expert wait s | rest (compute) s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let io = r.trunk_b / bw_t + r.expert_b / bw_e;
        let cf = compute.unwrap_or(f64::NAN);
        let ratio = r.s_tok / io.max(cf);
        println!(
            "| {} | {} | {} | {:.3}; {:.3} | {:.3} | {:.3} ({:.0} %) | {:.3} | {:.3} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} |",
            r.name,
            r.budget,
            r.pinned,
            r.s_tok,
            r.mean_s,
            gb(r.trunk_b),
            gb(r.expert_b),
            100.0 * r.hit,
            io,
            cf,
            ratio,
            gb(r.trunk_b + r.expert_b) / r.s_tok,
            r.trunk_wait,
            r.expert_wait,
            r.mean_s - r.trunk_wait - r.expert_wait
        );
    }
}
