//! `cargo xtask bench-dspark MODEL_DIR --draft-model DIR [--tokens N]`: plain decoding vs
//! DSpark block drafts with controlled acceptance (each proposal replaced by the plain run's
//! token with probability p, chosen for acceptance lengths near 1.5 / 2.5 / 3.5; the DSpark
//! pass runs and is paid for every time), in a trunk-streaming budget, in one run
//! (docs/STREAMING.md#dspark-block-drafts). Every row's ids are checked equal to the plain
//! run's.
//!
//! The same run measures the cost model's rates (`k3_engine::block::Rates`): the disk's
//! trunk-run and expert-read rates on the model's shards (O_DIRECT; the better of a probe
//! before and one after the rows, as bench-decode), the wall time of a one-position pass
//! (the median of three) and the compute of a pass of 1 and of `block + 1` positions (wall
//! minus the store's waits, in the streaming engine), and one DSpark block pass. The block
//! rows draft with that timed model, and each row reports bytes and seconds per decoded
//! token (the first generated token comes from the prompt's pass) measured, predicted by the
//! model for the row's measured τ and verified drafts per pass, and their ratio. The default
//! budget is the smallest legal one; its ring reads the next piece of a layer while the
//! current one computes, so the model takes a pass's shared seconds from the measured
//! one-position pass, not from the disk rate added to compute.
//!
//! `--verify N` fixes the drafts every pass verifies and solves each row's replacement
//! probability from its `--tau` target, `τ = (1 − p^(N+1)) / (1 − p)`.

use crate::bench_util::{self, median, phrase_prompt};
use clap::Args;
use k3_engine::block::{PassCost, Rates};
use k3_engine::{Budget, DecodeMode, Engine, EngineOptions, Sampler, StopConditions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `bench-dspark`.
#[derive(Args, Debug)]
pub struct BenchDsparkArgs {
    /// Checkpoint directory.
    pub model_dir: PathBuf,
    /// DSpark draft model directory (docs/DSPARK.md; `cargo xtask gen-dspark` makes one).
    #[arg(long)]
    pub draft_model: PathBuf,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 48)]
    pub tokens: usize,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Trunk budget, GB (default: the smallest legal). For tiny-k3 pass 0.001: it streams
    /// most of the trunk and leaves a prefill chunk long enough for a verifying pass of 8
    /// positions.
    #[arg(long)]
    pub trunk_gb: Option<f64>,
    /// Expert-cache budget, GB (default: the smallest legal; tiny-k3: 0.01).
    #[arg(long)]
    pub cache_gb: Option<f64>,
    /// Seconds of each disk-rate measurement.
    #[arg(long, default_value_t = 2.0)]
    pub io_seconds: f64,
    /// Replacement probabilities (independent per position; with 7 verified drafts
    /// τ = 1 + Σ_{i≤7} p^i: 0.33 → 1.5, 0.6 → 2.4, 0.74 → 3.5). Ignored with `--verify`.
    #[arg(long, value_delimiter = ',', default_values_t = [0.33, 0.6, 0.74])]
    pub p: Vec<f64>,
    /// Drafts every pass verifies, fixed (the cost model does not choose); each row's p is
    /// then solved from its `--tau` target: τ = (1 − p^(n+1)) / (1 − p).
    #[arg(long)]
    pub verify: Option<usize>,
    /// Acceptance-length targets of the `--verify` rows.
    #[arg(long, value_delimiter = ',', default_values_t = [1.5, 2.5, 3.5])]
    pub tau: Vec<f64>,
}

/// τ of `n` verified drafts each accepted independently with probability `p`.
fn tau_of(p: f64, n: usize) -> f64 {
    (0..=n).map(|i| p.powi(i as i32)).sum()
}

/// The `p` at which `n` verified drafts give acceptance length `tau` (bisection: τ rises
/// with p from 1 to n+1); `None` when `tau` is outside that range.
pub(crate) fn p_for_tau(tau: f64, n: usize) -> Option<f64> {
    if !(1.0..n as f64 + 1.0).contains(&tau) {
        return None;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if tau_of(mid, n) < tau {
            lo = mid
        } else {
            hi = mid
        }
    }
    Some(0.5 * (lo + hi))
}

struct Row {
    label: String,
    ids: Vec<u32>,
    seconds_per_token: f64,
    tau: f64,
    verified_per_pass: f64,
    /// Positions a verifying pass carries: its token and its drafts (and any id an earlier
    /// pass could not keep from its journal, fed again).
    positions_per_pass: f64,
    trunk_per_token: f64,
    experts_per_token: f64,
}

fn budget(args: &BenchDsparkArgs) -> Result<Budget, String> {
    let (smallest, _) =
        k3_engine::planning::budget_extremes(&args.model_dir).map_err(|e| e.to_string())?;
    let Budget::Split { trunk, cache } = smallest else {
        return Ok(smallest);
    };
    Ok(Budget::Split {
        trunk: args.trunk_gb.map_or(trunk, |g| (g * 1e9) as u64),
        cache: args.cache_gb.map_or(cache, |g| (g * 1e9) as u64),
    })
}

fn open(args: &BenchDsparkArgs, ctx: usize) -> Result<Engine, String> {
    let options = EngineOptions {
        threads: args.threads,
        budget: Some(budget(args)?),
        ctx,
        direct_io: true,
        draft_model: Some(args.draft_model.clone()),
        ..EngineOptions::default()
    };
    Engine::open(&args.model_dir, options).map_err(|e| e.to_string())
}

/// `(wall, compute)` seconds of one pass of `ids` on `s`; compute is the wall minus the
/// store's waits.
fn timed_pass(
    engine: &Engine,
    s: &mut k3_engine::Session<'_>,
    ids: &[u32],
) -> Result<(f64, f64), String> {
    let (before, t) = (engine.stats(), Instant::now());
    s.feed(ids).map_err(|e| e.to_string())?;
    let wall = t.elapsed().as_secs_f64();
    let d = engine.stats().since(&before);
    Ok((
        wall,
        (wall - d.trunk_wait_seconds - d.expert_wait_seconds).max(0.0),
    ))
}

/// The disk's rates on the model's shards (O_DIRECT).
fn measure_disk(args: &BenchDsparkArgs) -> Result<bench_util::DiskRates, String> {
    let m = bench_util::model_info(&args.model_dir)?;
    let io = EngineOptions::default().io_threads;
    let disk = bench_util::measure_disk(&m, &[1, io], args.io_seconds)?;
    eprintln!("bench-dspark: disk {}", disk.summary());
    Ok(disk)
}

/// `rates` with the disk terms of `disk` (expert reads at the store's depth).
fn with_disk(rates: Rates, disk: &bench_util::DiskRates) -> Rates {
    Rates {
        trunk_disk: disk.trunk,
        expert_disk: disk.expert_at(EngineOptions::default().io_threads),
        ..rates
    }
}

/// The compute and draft terms, measured on this machine now (module docs); the disk
/// terms are filled in by [`with_disk`].
fn measure_rates(args: &BenchDsparkArgs) -> Result<Rates, String> {
    let engine = open(args, 64)?;
    let vocab = engine.config().vocab_size as u32;
    let block = engine
        .dspark()
        .ok_or("no DSpark draft model")?
        .graph()
        .config()
        .block_size;
    let prompt = phrase_prompt(vocab);
    let mut s = engine.new_session(64).map_err(|e| e.to_string())?;
    s.feed(&prompt).map_err(|e| e.to_string())?;
    // the draft: twice, the second timed (the first maps its weights in)
    s.dspark_block(prompt[0]).map_err(|e| e.to_string())?;
    let t = Instant::now();
    s.dspark_block(prompt[1]).map_err(|e| e.to_string())?;
    let draft = t.elapsed().as_secs_f64();
    // one-position passes, three of them: the median wall (the plain pass as the engine
    // runs it, reads overlapped or cached) and the median compute
    let mut ones = Vec::new();
    for &id in &prompt[..3] {
        ones.push(timed_pass(&engine, &mut s, &[id])?);
    }
    let pass_wall = median(&ones.iter().map(|o| o.0).collect::<Vec<_>>());
    let one = median(&ones.iter().map(|o| o.1).collect::<Vec<_>>());
    // a verifying pass computes the target's logits row at every position: time the
    // `block + 1`-position pass with all its rows (the one-position pass has its one row)
    let many_ids = &prompt[..(block + 1).min(prompt.len())];
    let (before, t) = (engine.stats(), Instant::now());
    s.feed_all_logits(many_ids).map_err(|e| e.to_string())?;
    let d = engine.stats().since(&before);
    let many = (t.elapsed().as_secs_f64() - d.trunk_wait_seconds - d.expert_wait_seconds).max(0.0);
    let extra = (many - one).max(0.0) / (many_ids.len() - 1).max(1) as f64;
    Ok(Rates {
        trunk_disk: 0.0,
        expert_disk: 0.0,
        compute_shared: (one - extra).max(0.0),
        compute_per_position: extra,
        draft,
        pass_wall,
    })
}

fn run_row(
    args: &BenchDsparkArgs,
    p: Option<f64>,
    truth: &[u32],
    cost: PassCost,
) -> Result<Row, String> {
    let n = args.tokens;
    let engine = open(args, 512.max(n + 64))?;
    let prompt = phrase_prompt(engine.config().vocab_size as u32);
    let mut s = engine
        .new_session(prompt.len() + n + 8)
        .map_err(|e| e.to_string())?;
    if let Some(p) = p {
        s.set_block_truth(truth.to_vec(), p, 9)
            .map_err(|e| e.to_string())?;
        s.set_pass_cost(cost).map_err(|e| e.to_string())?;
        if let Some(n) = args.verify {
            s.set_block_verify(n).map_err(|e| e.to_string())?;
        }
    }
    s.feed(&prompt).map_err(|e| e.to_string())?;
    let mode = match p {
        Some(_) => DecodeMode::Block(7),
        None => DecodeMode::Incremental,
    };
    let (before, t0) = (engine.stats(), Instant::now());
    let g = s
        .generate_with(
            n,
            mode,
            &mut Sampler::greedy(),
            &StopConditions::none(),
            |_| true,
        )
        .map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    let io = engine.stats().since(&before);
    // per decoded token: the first generated token comes from the prompt's pass
    let decoded = n.saturating_sub(1).max(1) as f64;
    let spec = s.spec_stats();
    let passes = spec.passes.max(1) as f64;
    let row = Row {
        label: p.map_or("plain".into(), |p| format!("block p={p:.3}")),
        ids: [prompt, g.ids].concat(),
        seconds_per_token: secs / decoded,
        tau: match p {
            Some(_) => (spec.passes + spec.accepted) as f64 / passes,
            None => 1.0,
        },
        verified_per_pass: spec.drafted as f64 / passes,
        // every id the passes fed: their own and their drafts (and any fed again)
        positions_per_pass: match p {
            Some(_) => spec.positions as f64 / passes,
            None => 1.0,
        },
        trunk_per_token: io.trunk_bytes_read as f64 / decoded,
        experts_per_token: io.expert_bytes_read as f64 / decoded,
    };
    let drafting = s.block_drafting().map_or(0.0, |(secs, _)| secs);
    // plain decoding runs one pass per decoded token
    let passes = if p.is_some() { passes } else { decoded };
    eprintln!(
        "bench-dspark: {}: {:.3} s/token, τ {:.2}, {:.2} verified/pass, {:.2} positions/pass, trunk {:.1} + experts {:.1} MB/token; per pass: {:.3} s, trunk wait {:.3} s, expert wait {:.3} s, draft {:.3} s, {:.2} rollbacks",
        row.label,
        row.seconds_per_token,
        row.tau,
        row.verified_per_pass,
        row.positions_per_pass,
        row.trunk_per_token / 1e6,
        row.experts_per_token / 1e6,
        secs / passes,
        io.trunk_wait_seconds / passes,
        io.expert_wait_seconds / passes,
        drafting / passes,
        spec.rollbacks as f64 / passes
    );
    Ok(row)
}

fn bench(args: &BenchDsparkArgs) -> Result<(), String> {
    let before = measure_disk(args)?;
    let rates = measure_rates(args)?;
    let engine = open(args, 64)?;
    let streamed = engine.plan().map_or(0, |p| p.trunk.streamed_per_token) as f64;
    // the bytes a pass reads from disk: the streamed trunk, the union of its positions'
    // routed experts (the engine's routing geometry)
    let bytes = PassCost {
        shared: streamed,
        ..engine.pass_cost()
    };
    drop(engine);
    // the drafter chooses with the timed model, its disk terms from the first probe
    let chooser = bytes.with_rates(&with_disk(rates, &before));
    let mut rows = vec![run_row(args, None, &[], chooser)?];
    let ps = match args.verify {
        None => args.p.clone(),
        Some(n) => args
            .tau
            .iter()
            .map(|&t| {
                p_for_tau(t, n).ok_or(format!("τ {t} is outside 1..{} for --verify {n}", n + 1))
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    for &p in &ps {
        let truth = rows[0].ids.clone();
        rows.push(run_row(args, Some(p), &truth, chooser)?);
    }
    // the disk as the runs found it: the better of the probes before and after them (the
    // host may cache the virtual disk; bench-decode does the same)
    let rates = with_disk(rates, &before.best(&measure_disk(args)?));
    let cost = bytes.with_rates(&rates);
    let t = cost.seconds.ok_or("no time terms")?;
    println!(
        "bench-dspark {} — greedy, ids checked equal to plain decoding; {}",
        args.model_dir.display(),
        bench_util::machine_facts()
    );
    println!(
        "rates: trunk {:.0} MB/s, experts {:.0} MB/s, compute {:.3} s/pass + {:.3} s/position, DSpark pass {:.3} s, one-position pass {:.3} s wall",
        rates.trunk_disk / 1e6,
        rates.expert_disk / 1e6,
        rates.compute_shared,
        rates.compute_per_position,
        rates.draft,
        rates.pass_wall
    );
    println!(
        "model: pass of m positions = {:.1} MB streamed + u(m) × {:.1} MB of experts (u: the union of m positions' experts in positions, u(2) = {:.3}, u(8) = {:.3}); {:.3} s + u(m) × {:.3} s + m × {:.3} s + {:.3} s draft",
        streamed / 1e6,
        cost.per_position / 1e6,
        cost.expert_positions(2.0),
        cost.expert_positions(8.0),
        t.shared,
        t.experts,
        t.per_position,
        t.draft
    );
    print_table(&rows, &cost)
}

fn print_table(rows: &[Row], cost: &PassCost) -> Result<(), String> {
    println!("(per decoded token: the first generated token comes from the prompt's pass)");
    println!(
        "\n| row | τ | verified/pass | positions/pass | MB/token measured | predicted | ratio | s/token measured | predicted | ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        if r.ids != rows[0].ids {
            return Err(format!("{}: ids differ from plain decoding", r.label));
        }
        let drafted = r.label != "plain";
        let want = cost.per_token_at(r.tau, r.positions_per_pass, drafted);
        let bytes = r.trunk_per_token + r.experts_per_token;
        let secs = want.seconds.unwrap_or(0.0);
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {:.3} | {:.3} | {:.2} |",
            r.label,
            r.tau,
            r.verified_per_pass,
            r.positions_per_pass,
            bytes / 1e6,
            want.bytes / 1e6,
            bytes / want.bytes.max(1.0),
            r.seconds_per_token,
            secs,
            r.seconds_per_token / secs.max(1e-12)
        );
    }
    Ok(())
}

/// Runs the benchmark; exit 1 on any error or differing ids.
pub fn run(args: &BenchDsparkArgs) -> ExitCode {
    match bench(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-dspark: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{p_for_tau, tau_of};

    #[test]
    fn p_for_tau_inverts_the_acceptance_length() {
        for n in [3, 5, 7] {
            for tau in [1.5, 2.5, 3.5] {
                let p = p_for_tau(tau, n).unwrap();
                assert!((tau_of(p, n) - tau).abs() < 1e-9, "n {n}, τ {tau}: p {p}");
            }
        }
        // three verified drafts accepted with p = 0.5: 1 + 1/2 + 1/4 + 1/8
        assert!((tau_of(0.5, 3) - 1.875).abs() < 1e-15);
        assert_eq!(p_for_tau(4.5, 3), None);
    }
}
