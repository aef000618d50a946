//! `cargo xtask bench-trunk-pack MODEL_DIR --plain DIR --compressed DIR [--tokens N]
//! [--threads T] [--rounds R]` (or `--overlap [--plain DIR]`: the piece ring's read-ahead
//! against max(read, compute), `crate::bench_trunk_overlap`): a plain and a compressed packed trunk of the same checkpoint
//! (docs/FORMATS.md#compressed-trunk) at the smallest budget (nothing pinned: every layer is
//! streamed every token, O_DIRECT), same run, alternating plain / compressed R times: s/token
//! (median), trunk bytes read and decoded per token, decode seconds per token, the compute
//! thread's trunk wait. The ids must be identical (checked). Beside each pack's measurement
//! it prints what `k3_plan::CodecRates` predicts for its trunk (reads and decode, no compute)
//! from the drive rate measured here on the plain pack, the compressed pack's stored ratio,
//! and the decode rate per core both as documented and as measured in the run. Results:
//! docs/PERFORMANCE.md#trunk-compression.

use crate::bench_util::{self, gb, median};
use clap::Args;
use k3_engine::trunk_choice::{probe_read_rate, TrunkCodecPlan, TrunkPacks};
use k3_engine::{Engine, EngineOptions};
use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `bench-trunk-pack`.
#[derive(Args, Debug)]
pub struct BenchTrunkPackArgs {
    /// Checkpoint directory (e.g. `cargo xtask gen-bench --trained-weights`).
    pub model_dir: PathBuf,
    /// Plain pack of it (`cargo xtask pack-trunk`); with `--overlap`, optional (the shards
    /// are read without it).
    #[arg(long, required_unless_present = "overlap")]
    pub plain: Option<PathBuf>,
    /// Compressed pack of it (`cargo xtask pack-trunk --compress`).
    #[arg(long, required_unless_present = "overlap")]
    pub compressed: Option<PathBuf>,
    /// Measure the piece ring's overlap instead: s/token against max(read, compute), the
    /// model resident and the drive's O_DIRECT rate measured in the same run.
    #[arg(long)]
    pub overlap: bool,
    /// Timed greedy tokens per run.
    #[arg(long, default_value_t = 6)]
    pub tokens: usize,
    /// Compute threads (default: the engine's default).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Plain / compressed alternations.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
}

/// Runs the subcommand.
pub fn run(args: &BenchTrunkPackArgs) -> ExitCode {
    let result = match args.overlap {
        true => crate::bench_trunk_overlap::overlap(
            &args.model_dir,
            args.plain.as_ref(),
            args.tokens,
            args.threads,
            args.rounds,
        ),
        false => bench(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-trunk-pack: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One timed run.
struct Run {
    s_tok: f64,
    read_tok: f64,
    decoded_tok: f64,
    decode_s_tok: f64,
    wait_s_tok: f64,
    ids: Vec<u32>,
    /// Compute threads (the decoding cores).
    threads: usize,
}

fn bench(args: &BenchTrunkPackArgs) -> Result<(), String> {
    let dir = &args.model_dir;
    let (Some(plain), Some(compressed)) = (&args.plain, &args.compressed) else {
        return Err("--plain and --compressed are both needed".into());
    };
    println!("machine: {}", bench_util::machine_facts());
    let (smallest, _) = k3_engine::planning::budget_extremes(dir).map_err(|e| e.to_string())?;
    println!("budget: {smallest:?} (smallest legal: every trunk layer streams)");
    let disk = disk_rate(plain)?;
    println!(
        "O_DIRECT read rate of the plain pack: {:.2} GB/s (median of 3 probes of 0.3 s)",
        gb(disk)
    );
    let mut rows: Vec<(&str, Run)> = Vec::new();
    for _ in 0..args.rounds.max(1) {
        for (name, pack) in [("plain", plain), ("compressed", compressed)] {
            let opts = EngineOptions {
                threads: args.threads,
                budget: Some(smallest),
                ctx: args.tokens + 16,
                direct_io: true,
                trunk_dir: Some(pack.clone()),
                ..EngineOptions::default()
            };
            let engine = Engine::open(dir, opts).map_err(|e| format!("{name}: {e}"))?;
            let r = one_run(&engine, args.tokens)?;
            println!(
                "  {name:<10} {:.3} s/token, trunk {:.3} GB read + {:.3} GB decoded per token, decode {:.3} s/token, trunk wait {:.3} s/token",
                r.s_tok,
                gb(r.read_tok),
                gb(r.decoded_tok),
                r.decode_s_tok,
                r.wait_s_tok
            );
            rows.push((name, r));
        }
    }
    let ids = &rows[0].1.ids;
    if let Some((name, r)) = rows.iter().find(|(_, r)| &r.ids != ids) {
        return Err(format!("{name} produced ids {:?}, plain {ids:?}", r.ids));
    }
    println!("greedy ids (identical from both packs): {ids:?}");
    println!();
    println!("| pack | s/token (median of runs) | trunk GB read/token | GB decoded/token | decode s/token | trunk wait s/token | predicted trunk s/token (documented decode rate) | predicted (measured decode rate) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let packs = TrunkPacks::given(compressed).map_err(|e| e.to_string())?;
    for name in ["plain", "compressed"] {
        let runs: Vec<&Run> = rows
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, r)| r)
            .collect();
        let med = |f: fn(&Run) -> f64| median(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
        // Overlapped: the store reads the next stored run while the current one decodes.
        let threads = runs[0].threads;
        let mut codec = TrunkCodecPlan::new(packs.clone(), Some(disk), threads, true);
        let decoded = match name {
            "plain" => med(|r| r.read_tok),
            _ => med(|r| r.decoded_tok),
        };
        let predict = |c: &TrunkCodecPlan| {
            let f = c.forecast(decoded as u64);
            if name == "plain" {
                f.plain_s
            } else {
                f.compressed_s
            }
        };
        let documented = predict(&codec);
        let decode_s = med(|r| r.decode_s_tok);
        if decode_s > 0.0 {
            codec.rates.decode_bytes_per_s_per_core = decoded / decode_s / threads as f64;
        }
        println!(
            "| {name} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {documented:.3} | {:.3} |",
            med(|r| r.s_tok),
            gb(med(|r| r.read_tok)),
            gb(med(|r| r.decoded_tok)),
            decode_s,
            med(|r| r.wait_s_tok),
            predict(&codec)
        );
        if name == "compressed" {
            println!();
            println!(
                "forecast ({} GB/s per core measured): {}",
                format_args!("{:.2}", gb(codec.rates.decode_bytes_per_s_per_core)),
                codec.rates.decision()
            );
        }
    }
    Ok(())
}

/// The drive's O_DIRECT rate reading the plain pack's `trunk.bin` (median of 3 probes).
fn disk_rate(plain: &std::path::Path) -> Result<f64, String> {
    let bin = plain.join("trunk.bin");
    let rates = (0..3)
        .map(|_| probe_read_rate(&bin))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(median(&rates))
}

/// Prefills 4 ids, then times `tokens` greedy steps (per-token medians; counters per token).
fn one_run(engine: &Engine, tokens: usize) -> Result<Run, String> {
    let vocab = engine.config().vocab_size;
    let prompt = bench_util::prompt_ids(4, vocab, 7);
    let mut s = engine.new_session(tokens + 16).map_err(|e| e.to_string())?;
    s.feed(&prompt).map_err(|e| e.to_string())?;
    let mut ids = Vec::new();
    let (times, d) = bench_util::timed_greedy_steps(engine, &mut s, tokens, &mut ids)?;
    let n = times.len() as f64;
    Ok(Run {
        s_tok: median(&times),
        read_tok: d.trunk_bytes_read as f64 / n,
        decoded_tok: d.trunk_bytes_decoded as f64 / n,
        decode_s_tok: d.trunk_decode_seconds / n,
        wait_s_tok: d.trunk_wait_seconds / n,
        ids,
        threads: engine.threads(),
    })
}
