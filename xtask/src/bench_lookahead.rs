//! `cargo xtask bench-lookahead MODEL_DIR [--tokens N] [--cache-slots S]`: next-layer router
//! lookahead on vs off, trunk fully pinned (so every next-layer router is in memory) and a
//! small expert cache (so predictions cause real reads), in one run: s/token, expert bytes
//! per token, recall@top-k of the predictions, and how many early reads were used. Every
//! run's ids are checked equal.

use clap::Args;
use k3_engine::planning::budget_extremes;
use k3_engine::{Budget, DecodeMode, Engine, EngineOptions, StoreStats};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `bench-lookahead`.
#[derive(Args, Debug)]
pub struct BenchLookaheadArgs {
    /// Checkpoint directory.
    pub model_dir: PathBuf,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 16)]
    pub tokens: usize,
    /// Expert cache size in multiples of the smallest legal cache (top-k + 1 slots).
    #[arg(long, default_value_t = 2)]
    pub cache_multiple: u64,
    /// Timed repetitions per setting (median reported; one warm-up run first).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

struct Measured {
    seconds_per_token: f64,
    io: StoreStats,
    ids: Vec<u32>,
}

fn measure(args: &BenchLookaheadArgs, budget: Budget, lookahead: bool) -> Result<Measured, String> {
    let options = EngineOptions {
        threads: args.threads,
        budget: Some(budget),
        ctx: 64,
        lookahead,
        ..EngineOptions::default()
    };
    let engine = Engine::open(&args.model_dir, options).map_err(|e| e.to_string())?;
    // The prompt the docs/PERFORMANCE.md table was measured with.
    let vocab = engine.config().vocab_size as u32;
    let prompt: Vec<u32> = (0..8).map(|i| (11 + 97 * i) % vocab).collect();
    let mut runs = Vec::new();
    for r in 0..=args.repeat.max(1) {
        let mut s = engine.new_session(64).map_err(|e| e.to_string())?;
        s.feed(&prompt).map_err(|e| e.to_string())?;
        let before = engine.stats();
        let t0 = Instant::now();
        let ids = s
            .generate(args.tokens, DecodeMode::Incremental, |_| true)
            .map_err(|e| e.to_string())?;
        let m = Measured {
            seconds_per_token: t0.elapsed().as_secs_f64() / args.tokens as f64,
            io: engine.stats().since(&before),
            ids,
        };
        if r > 0 {
            runs.push(m); // run 0 warms the cache and the page tables
        }
    }
    runs.sort_by(|a, b| a.seconds_per_token.total_cmp(&b.seconds_per_token));
    Ok(runs.swap_remove(runs.len() / 2))
}

pub fn run(args: &BenchLookaheadArgs) -> ExitCode {
    let result = budget_extremes(&args.model_dir)
        .map_err(|e| e.to_string())
        .and_then(|(smallest, everything)| {
            let (Budget::Split { cache, .. }, Budget::Split { trunk, .. }) = (smallest, everything)
            else {
                return Err("budget_extremes gives splits".into());
            };
            let budget = Budget::Split {
                trunk,
                cache: cache * args.cache_multiple.max(1),
            };
            let off = measure(args, budget, false)?;
            let on = measure(args, budget, true)?;
            if on.ids != off.ids {
                return Err("ids differ with lookahead on".into());
            }
            let n = args.tokens as f64;
            println!(
                "bench-lookahead {}: trunk pinned, expert cache {} × the minimum, {} tokens, median of {}\n",
                args.model_dir.display(),
                args.cache_multiple,
                args.tokens,
                args.repeat
            );
            println!("| lookahead | s/token | expert GB/token | expert hit rate | recall@top-k | early reads | used | cancelled |");
            println!("|---|---|---|---|---|---|---|---|");
            for (name, m) in [("off", &off), ("on", &on)] {
                println!(
                    "| {name} | {:.4} | {:.3} | {:.1}% | {} | {} | {} | {} |",
                    m.seconds_per_token,
                    m.io.expert_bytes_read as f64 / 1e9 / n,
                    100.0 * m.io.expert_hit_rate(),
                    if m.io.lookahead_requested > 0 {
                        format!("{:.1}%", 100.0 * m.io.lookahead_recall())
                    } else {
                        "–".into()
                    },
                    m.io.lookahead_reads,
                    m.io.lookahead_useful_reads,
                    m.io.lookahead_cancelled
                );
            }
            println!(
                "\non/off s/token: {:.3}×",
                on.seconds_per_token / off.seconds_per_token
            );
            Ok(())
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-lookahead: {e}");
            ExitCode::FAILURE
        }
    }
}
