//! `cargo xtask bench-draft MODEL_DIR --draft-trunk DIR [--draft-trunk DIR2] [--tokens N]`:
//! plain decoding vs prompt-lookup (n-gram) drafts vs hybrid drafting with each draft trunk,
//! and what `--draft auto` picks, in a trunk-streaming budget and resident, in one run
//! (docs/PERFORMANCE.md#hybrid-drafting). Every row's ids are checked equal to the plain
//! run's. Reports s/token, acceptance, tokens per exact pass, trunk and expert bytes read per
//! generated token, the draft model's time and its expert-cache coverage, and the released-
//! scale break-even.

use crate::bench_util::{oracle_right, phrase_prompt};
use clap::Args;
use k3_engine::planning::budget_extremes;
use k3_engine::{
    Budget, DecodeMode, DraftPolicy, Engine, EngineOptions, Sampler, Speculation, StopConditions,
};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `bench-draft`.
#[derive(Args, Debug)]
pub struct BenchDraftArgs {
    /// Checkpoint directory.
    pub model_dir: PathBuf,
    /// Draft trunk directories (`k3 pack --draft-quant …`), one hybrid row each.
    #[arg(long, required = true)]
    pub draft_trunk: Vec<PathBuf>,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 16)]
    pub tokens: usize,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Trunk budget of the streaming regime, GB (default: the smallest legal).
    #[arg(long)]
    pub trunk_gb: Option<f64>,
    /// Expert-cache budget of the streaming regime, GB (default: the smallest legal).
    #[arg(long)]
    pub cache_gb: Option<f64>,
    /// Timed runs per row, interleaved across the rows (the median s/token is reported).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Oracle acceptances to model (drafts from the first draft trunk's model are run and
    /// paid for, then replaced by the plain run's token with this probability).
    #[arg(long, value_delimiter = ',', default_values_t = [0.5, 0.8, 1.0])]
    pub oracle: Vec<f64>,
}

/// One measured row.
struct Row {
    label: String,
    ids: Vec<u32>,
    seconds_per_token: f64,
    passes: u64,
    drafted: u64,
    accepted: u64,
    trunk_gb_per_token: f64,
    expert_gb_per_token: f64,
    draft_seconds_per_token: f64,
    draft_coverage: Option<f64>,
}

/// What a row runs.
#[derive(Clone)]
enum How {
    Plain,
    Ngram,
    Hybrid(PathBuf),
    Auto(PathBuf),
    /// The draft model runs (its cost is paid) but its proposals are replaced by the plain
    /// run's ids, each right with this probability.
    Oracle(PathBuf, f64),
}

impl How {
    fn label(&self) -> String {
        let name = |d: &PathBuf| {
            d.file_name()
                .map_or(String::new(), |n| n.to_string_lossy().into_owned())
        };
        match self {
            How::Plain => "plain (one token per pass)".into(),
            How::Ngram => "n-gram 2..3, ≤4 drafts".into(),
            How::Hybrid(d) => format!("hybrid, draft trunk {}", name(d)),
            How::Auto(d) => format!("--draft auto with {}", name(d)),
            How::Oracle(d, p) => format!("oracle p={p:.1} paying {}'s draft model", name(d)),
        }
    }
}

fn open(args: &BenchDraftArgs, budget: Budget, how: &How) -> Result<Engine, String> {
    let (draft_trunk, draft_policy) = match how {
        How::Hybrid(d) | How::Oracle(d, _) => (Some(d.clone()), DraftPolicy::On),
        How::Auto(d) => (Some(d.clone()), DraftPolicy::Auto),
        _ => (None, DraftPolicy::Off),
    };
    let options = EngineOptions {
        threads: args.threads,
        budget: Some(budget),
        ctx: 256,
        draft_trunk,
        draft_policy,
        ..EngineOptions::default()
    };
    Engine::open(&args.model_dir, options).map_err(|e| e.to_string())
}

fn run_row(args: &BenchDraftArgs, budget: Budget, how: &How, truth: &[u32]) -> Result<Row, String> {
    let engine = open(args, budget, how)?;
    let p = phrase_prompt(engine.config().vocab_size as u32);
    let n = args.tokens;
    let mode = match how {
        How::Plain => DecodeMode::Incremental,
        How::Ngram => DecodeMode::Speculative(Speculation::default()),
        How::Hybrid(_) | How::Oracle(..) => DecodeMode::Hybrid(Speculation::default()),
        How::Auto(_) => engine.auto_decode_mode(),
    };
    if let (How::Auto(_), Some(c)) = (how, engine.draft_choice()) {
        println!(
            "  (--draft auto: hybrid {}: {})",
            if c.on { "on" } else { "off" },
            c.why
        );
    }
    let mut s = engine
        .new_session(p.len() + n + 1)
        .map_err(|e| e.to_string())?;
    s.feed(&p).map_err(|e| e.to_string())?;
    let mut sampler = Sampler::greedy();
    let none = StopConditions::none();
    let before = engine.stats();
    let t0 = Instant::now();
    let mut oracle_draft = None;
    let g = match how {
        How::Oracle(_, accept) => {
            let mut draft = engine
                .draft_model(p.len() + n + 1)
                .map_err(|e| e.to_string())?;
            let vocab = engine.config().vocab_size as u32;
            let g = s.generate_with_drafter(
                n,
                &mut sampler,
                &none,
                |ctx: &[u32], limit: usize| {
                    let paid = draft.propose(ctx, limit.min(4));
                    (ctx.len()..(ctx.len() + paid.len()).min(truth.len()))
                        .map(|q| {
                            if oracle_right(q, *accept) {
                                truth[q]
                            } else {
                                (truth[q] + 1) % vocab
                            }
                        })
                        .collect()
                },
                |_| true,
            );
            oracle_draft = Some(draft.stats());
            g
        }
        _ => s.generate_with(n, mode, &mut sampler, &none, |_| true),
    }
    .map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    let io = engine.stats().since(&before);
    let spec = s.spec_stats();
    let draft = oracle_draft.or(s.draft_stats()).unwrap_or_default();
    let per = |b: u64| b as f64 / 1e9 / n as f64;
    Ok(Row {
        label: how.label(),
        ids: g.ids,
        seconds_per_token: secs / n as f64,
        passes: if spec.passes == 0 {
            n as u64 - 1
        } else {
            spec.passes
        },
        drafted: spec.drafted,
        accepted: spec.accepted,
        trunk_gb_per_token: per(io.trunk_bytes_read),
        expert_gb_per_token: per(io.expert_bytes_read),
        draft_seconds_per_token: draft.seconds / n as f64,
        draft_coverage: (io.draft_expert_requests > 0)
            .then(|| io.draft_expert_hits as f64 / io.draft_expert_requests as f64),
    })
}

fn print_row(r: &Row, base: f64, n: usize) {
    let acceptance = if r.drafted == 0 {
        "–".to_string()
    } else {
        format!("{:.0}%", 100.0 * r.accepted as f64 / r.drafted as f64)
    };
    let coverage = r
        .draft_coverage
        .map_or("–".to_string(), |c| format!("{:.0}%", 100.0 * c));
    println!(
        "| {} | {:.3} | {:.2}× | {acceptance} | {:.2} | {:.3} | {:.3} | {:.3} | {coverage} |",
        r.label,
        r.seconds_per_token,
        base / r.seconds_per_token,
        (n as f64 - 1.0) / r.passes.max(1) as f64,
        r.trunk_gb_per_token,
        r.expert_gb_per_token,
        r.draft_seconds_per_token,
    );
}

fn regime(args: &BenchDraftArgs, name: &str, budget: Budget) -> Result<(), String> {
    let n = args.tokens;
    let first = run_row(args, budget, &How::Plain, &[])?; // also the oracle's truth
    let mut truth = phrase_prompt(vocab_of(args)?);
    truth.extend(&first.ids);
    let mut hows: Vec<How> = vec![How::Plain, How::Ngram];
    hows.extend(args.draft_trunk.iter().cloned().map(How::Hybrid));
    if let Some(d) = args.draft_trunk.first() {
        hows.push(How::Auto(d.clone()));
        hows.extend(args.oracle.iter().map(|&p| How::Oracle(d.clone(), p)));
    }
    // Interleaved repeats: round r runs every row once, so slow phases of the machine (the
    // disk's throughput varies by tens of percent here) fall on every row alike.
    let mut runs: Vec<Vec<Row>> = hows.iter().map(|_| Vec::new()).collect();
    for _ in 0..args.repeat.max(1) {
        for (how, rows) in hows.iter().zip(runs.iter_mut()) {
            let r = run_row(args, budget, how, &truth)?;
            if r.ids != first.ids {
                return Err(format!("{}: ids differ from plain decoding's", r.label));
            }
            rows.push(r);
        }
    }
    let medians: Vec<Row> = runs
        .into_iter()
        .map(|mut rows| {
            rows.sort_by(|a, b| a.seconds_per_token.total_cmp(&b.seconds_per_token));
            rows.swap_remove(rows.len() / 2)
        })
        .collect();
    println!(
        "\n### {name} ({budget:?}), {n} tokens, median of {}\n",
        args.repeat.max(1)
    );
    println!("| decoding | s/token | speed-up | acceptance | tokens / exact pass | trunk GB / token | expert GB / token | draft s / token | draft expert coverage |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let base = medians[0].seconds_per_token;
    for r in &medians {
        print_row(r, base, n);
    }
    Ok(())
}

fn vocab_of(args: &BenchDraftArgs) -> Result<u32, String> {
    k3_engine::K3Config::load(args.model_dir.join("config.json"))
        .map(|c| c.vocab_size as u32)
        .map_err(|e| e.to_string())
}

fn gb(x: f64) -> u64 {
    (x * 1e9) as u64
}

pub fn run(args: &BenchDraftArgs) -> ExitCode {
    let result = budget_extremes(&args.model_dir)
        .map_err(|e| e.to_string())
        .and_then(|(smallest, everything)| {
            let streaming = match (smallest, args.trunk_gb, args.cache_gb) {
                (Budget::Split { trunk, cache }, t, c) => Budget::Split {
                    trunk: t.map_or(trunk, gb),
                    cache: c.map_or(cache, gb),
                },
                (b, _, _) => b,
            };
            println!(
                "bench-draft {} — greedy, ids checked equal to plain decoding in every row",
                args.model_dir.display()
            );
            regime(args, "trunk streaming", streaming)?;
            regime(args, "resident (every layer pinned)", everything)
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-draft: {e}");
            ExitCode::FAILURE
        }
    }
}
