//! `cargo xtask bench-dspark MODEL_DIR --draft-model DIR [--tokens N]`: plain decoding vs
//! DSpark block drafts with controlled acceptance (each proposal replaced by the plain run's
//! token with probability p, chosen for acceptance lengths near 1.5 / 2.5 / 3.5; the DSpark
//! pass runs and is paid for every time), in a trunk-streaming budget, in one run
//! (docs/STREAMING.md#dspark-block-drafts). Every row's ids are checked equal to the plain
//! run's. Reports s/token, acceptance length τ, trunk and expert bytes read per generated
//! token, and the cost model's bytes per token for the same τ and verified count.

use crate::bench_util::phrase_prompt;
use clap::Args;
use k3_engine::{Budget, DecodeMode, Engine, EngineOptions, Sampler, StopConditions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `bench-dspark`.
#[derive(Args, Debug)]
pub struct BenchDsparkArgs {
    /// Checkpoint directory.
    pub model_dir: PathBuf,
    /// DSpark draft model directory (docs/DSPARK.md).
    #[arg(long)]
    pub draft_model: PathBuf,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 48)]
    pub tokens: usize,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Trunk budget, GB (the default streams most of tiny-k3's trunk and leaves a prefill
    /// chunk long enough for a verifying pass of 8 positions; the smallest legal budget's
    /// chunk is too short to verify any draft).
    #[arg(long, default_value_t = 0.001)]
    pub trunk_gb: f64,
    /// Expert-cache budget, GB.
    #[arg(long, default_value_t = 0.01)]
    pub cache_gb: f64,
    /// Replacement probabilities (independent per position; with 7 verified drafts
    /// τ = 1 + Σ_{i≤7} p^i: 0.33 → 1.5, 0.6 → 2.4, 0.74 → 3.5).
    #[arg(long, value_delimiter = ',', default_values_t = [0.33, 0.6, 0.74])]
    pub p: Vec<f64>,
}

struct Row {
    label: String,
    ids: Vec<u32>,
    seconds_per_token: f64,
    tau: f64,
    verified_per_pass: f64,
    trunk_per_token: f64,
    experts_per_token: f64,
}

fn budget(args: &BenchDsparkArgs) -> Budget {
    Budget::Split {
        trunk: (args.trunk_gb * 1e9) as u64,
        cache: (args.cache_gb * 1e9) as u64,
    }
}

fn run_row(args: &BenchDsparkArgs, p: Option<f64>, truth: &[u32]) -> Result<Row, String> {
    let options = EngineOptions {
        threads: args.threads,
        budget: Some(budget(args)),
        ctx: 512,
        draft_model: Some(args.draft_model.clone()),
        ..EngineOptions::default()
    };
    let engine = Engine::open(&args.model_dir, options).map_err(|e| e.to_string())?;
    let prompt = phrase_prompt(engine.config().vocab_size as u32);
    let n = args.tokens;
    let mut s = engine
        .new_session(prompt.len() + n + 8)
        .map_err(|e| e.to_string())?;
    if let Some(p) = p {
        s.set_block_truth(truth.to_vec(), p, 9)
            .map_err(|e| e.to_string())?;
    }
    s.feed(&prompt).map_err(|e| e.to_string())?;
    let mode = if p.is_some() {
        DecodeMode::Block(7)
    } else {
        DecodeMode::Incremental
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
    let spec = s.spec_stats();
    let passes = spec.passes.max(1) as f64;
    Ok(Row {
        label: p.map_or("plain".into(), |p| format!("block p={p}")),
        ids: [prompt, g.ids].concat(),
        seconds_per_token: secs / n as f64,
        tau: if p.is_some() {
            (spec.passes + spec.accepted) as f64 / passes
        } else {
            1.0
        },
        verified_per_pass: spec.drafted as f64 / passes,
        trunk_per_token: io.trunk_bytes_read as f64 / n as f64,
        experts_per_token: io.expert_bytes_read as f64 / n as f64,
    })
}

fn bench(args: &BenchDsparkArgs) -> Result<(), String> {
    let plain = run_row(args, None, &[])?;
    let engine = Engine::open(
        &args.model_dir,
        EngineOptions {
            budget: Some(budget(args)),
            ..EngineOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let cost = engine.pass_cost();
    let streamed = engine.plan().map_or(0, |p| p.trunk.streamed_per_token) as f64;
    println!(
        "bench-dspark {} — greedy, trunk streams {:.0} KB per pass, ids checked equal to plain decoding",
        args.model_dir.display(),
        streamed / 1e3
    );
    println!(
        "{:<14} {:>9} {:>6} {:>9} {:>12} {:>12} {:>14}",
        "row", "s/token", "τ", "verified", "trunk KB/t", "expert KB/t", "model KB/t"
    );
    let mut rows = vec![plain];
    for &p in &args.p {
        let truth = rows[0].ids.clone();
        rows.push(run_row(args, Some(p), &truth)?);
    }
    for r in &rows {
        if r.ids != rows[0].ids {
            return Err(format!("{}: ids differ from plain decoding", r.label));
        }
        // the cost model's bytes per token: the streamed trunk once per pass, each verified
        // position's experts (upper bound: every expert read), over τ tokens per pass
        let model = (streamed + (r.verified_per_pass + 1.0) * cost.per_position) / r.tau;
        println!(
            "{:<14} {:>9.4} {:>6.2} {:>9.2} {:>12.1} {:>12.1} {:>14.1}",
            r.label,
            r.seconds_per_token,
            r.tau,
            r.verified_per_pass,
            r.trunk_per_token / 1e3,
            r.experts_per_token / 1e3,
            model / 1e3
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
