//! `cargo xtask bench-spec MODEL_DIR [--tokens N] [--threads T]`: speculative decoding vs
//! plain incremental decoding, in the trunk-streaming regime (smallest legal budget) and the
//! resident regime (every layer pinned), in one run.
//!
//! Drafters: the prompt-lookup n-gram drafter (`--draft`, what users get) and an ORACLE that
//! knows the plain run's tokens and is right with a chosen probability per drafted token —
//! synthetic models rarely repeat themselves, so the oracle is how the win (or loss) at a
//! given acceptance is measured. Every run's ids are checked equal to the plain run's.

use crate::bench_util::{oracle_right, phrase_prompt};
use clap::Args;
use k3_engine::planning::budget_extremes;
use k3_engine::{
    Budget, DecodeMode, Engine, EngineOptions, Sampler, SpecStats, Speculation, StopConditions,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `bench-spec`.
#[derive(Args, Debug)]
pub struct BenchSpecArgs {
    /// Checkpoint directory.
    pub model_dir: PathBuf,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 24)]
    pub tokens: usize,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Most tokens drafted per pass.
    #[arg(long, default_value_t = 4)]
    pub max_draft: usize,
    /// Timed repetitions per row (the median is reported; one untimed warm-up run first).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
}

/// One measured run.
struct Row {
    drafter: String,
    seconds_per_token: f64,
    gb_per_token: f64,
    spec: SpecStats,
}

fn run_one(
    engine: &Engine,
    prompt: &[u32],
    n: usize,
    how: &Drafter,
    truth: &[u32],
) -> Result<(Row, Vec<u32>), String> {
    let mut s = engine
        .new_session(prompt.len() + n + 1)
        .map_err(|e| e.to_string())?;
    s.feed(prompt).map_err(|e| e.to_string())?;
    let mut sampler = Sampler::greedy();
    let none = StopConditions::none();
    let before = engine.stats();
    let t0 = Instant::now();
    let g = match how {
        Drafter::Plain => {
            s.generate_with(n, DecodeMode::Incremental, &mut sampler, &none, |_| true)
        }
        Drafter::Ngram(spec) => s.generate_with(
            n,
            DecodeMode::Speculative(*spec),
            &mut sampler,
            &none,
            |_| true,
        ),
        Drafter::Oracle { accept, max } => {
            let vocab = engine.config().vocab_size as u32;
            let drafter = |ctx: &[u32], limit: usize| -> Vec<u32> {
                (ctx.len()..(ctx.len() + limit.min(*max)).min(truth.len()))
                    .map(|p| {
                        if oracle_right(p, *accept) {
                            truth[p]
                        } else {
                            (truth[p] + 1) % vocab
                        }
                    })
                    .collect()
            };
            s.generate_with_drafter(n, &mut sampler, &none, drafter, |_| true)
        }
    }
    .map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    let io = engine.stats().since(&before);
    let row = Row {
        drafter: how.label(),
        seconds_per_token: secs / n as f64,
        gb_per_token: io.bytes_read() as f64 / 1e9 / n as f64,
        spec: s.spec_stats(),
    };
    Ok((row, g.ids))
}

/// `repeat` runs (at least one), each checked to give the plain run's ids; the one with the
/// median s/token.
fn median_run(
    engine: &Engine,
    prompt: &[u32],
    n: usize,
    how: &Drafter,
    truth: &[u32],
    repeat: usize,
) -> Result<Row, String> {
    let mut rows = Vec::new();
    for _ in 0..repeat.max(1) {
        let (row, got) = run_one(engine, prompt, n, how, truth)?;
        if got != truth[prompt.len()..] {
            return Err(format!("{}: ids differ from the plain run's", row.drafter));
        }
        rows.push(row);
    }
    rows.sort_by(|a, b| a.seconds_per_token.total_cmp(&b.seconds_per_token));
    Ok(rows.swap_remove(rows.len() / 2))
}

enum Drafter {
    Plain,
    Ngram(Speculation),
    Oracle { accept: f64, max: usize },
}

impl Drafter {
    fn label(&self) -> String {
        match self {
            Drafter::Plain => "plain (one token per pass)".into(),
            Drafter::Ngram(s) => format!(
                "n-gram {}..{}, ≤{} drafts",
                s.min_ngram, s.max_ngram, s.max_draft
            ),
            Drafter::Oracle { accept, max } => {
                format!("oracle p={accept:.2}, ≤{max} drafts")
            }
        }
    }
}

fn regime(args: &BenchSpecArgs, name: &str, budget: Budget) -> Result<(), String> {
    let options = EngineOptions {
        threads: args.threads,
        budget: Some(budget),
        ctx: 256,
        ..EngineOptions::default()
    };
    let engine = Engine::open(&args.model_dir, options).map_err(|e| e.to_string())?;
    let vocab = engine.config().vocab_size as u32;
    let p = phrase_prompt(vocab);
    let n = args.tokens;
    let (_, ids) = run_one(&engine, &p, n, &Drafter::Plain, &[])?; // warm-up
    let mut truth = p.clone();
    truth.extend(&ids);
    let plain = median_run(&engine, &p, n, &Drafter::Plain, &truth, args.repeat)?;
    let streamed = engine.plan().map_or(0, |pl| pl.trunk.streamed_per_token);
    println!(
        "\n### {name}: trunk streamed per pass {:.3} GB, {} threads, {n} tokens\n",
        streamed as f64 / 1e9,
        engine.threads()
    );
    println!("| drafter | s/token | vs plain | GB read/token | passes | drafted | accepted | acceptance |");
    println!("|---|---|---|---|---|---|---|---|");
    let spec = Speculation {
        max_draft: args.max_draft,
        ..Speculation::default()
    };
    let drafters = [
        Drafter::Ngram(spec),
        Drafter::Oracle {
            accept: 0.0,
            max: args.max_draft,
        },
        Drafter::Oracle {
            accept: 0.5,
            max: args.max_draft,
        },
        Drafter::Oracle {
            accept: 0.8,
            max: args.max_draft,
        },
        Drafter::Oracle {
            accept: 1.0,
            max: args.max_draft,
        },
    ];
    print_row(&plain, plain.seconds_per_token, n);
    for d in &drafters {
        let row = median_run(&engine, &p, n, d, &truth, args.repeat)?;
        print_row(&row, plain.seconds_per_token, n);
    }
    Ok(())
}

fn print_row(r: &Row, base: f64, n: usize) {
    let passes = if r.spec.passes == 0 {
        n.saturating_sub(1) as u64
    } else {
        r.spec.passes
    };
    println!(
        "| {} | {:.4} | {:.2}× | {:.3} | {} | {} | {} | {:.0}% |",
        r.drafter,
        r.seconds_per_token,
        r.seconds_per_token / base,
        r.gb_per_token,
        passes,
        r.spec.drafted,
        r.spec.accepted,
        100.0 * r.spec.acceptance()
    );
}

pub fn run(args: &BenchSpecArgs) -> ExitCode {
    let result = budget_extremes(&args.model_dir)
        .map_err(|e| e.to_string())
        .and_then(|(smallest, everything)| {
            println!(
                "bench-spec {} — greedy, ids checked equal to the plain run in every row",
                args.model_dir.display()
            );
            regime(args, "trunk streaming (smallest legal budget)", smallest)?;
            regime(args, "resident (every layer pinned)", everything)
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-spec: {e}");
            ExitCode::FAILURE
        }
    }
}
