//! `cargo xtask bench-prefill MODEL_DIR [--prompts 40,512] [--cache-slots N]`: routed-expert
//! bytes read per prompt token when a prompt is prefilled in one pass (each MoE layer reads
//! the union of the chunk's experts once) vs fed token by token, at a small expert cache so
//! misses are real (docs/PERFORMANCE.md "Prefill: chunk-union expert reads").
//!
//! Each way runs on a freshly opened engine (cold cache) with the whole trunk pinned, so only
//! expert reads differ. The last logits of the two ways must be bit-identical (checked: the
//! command fails otherwise). The table also gives what uniform random routing predicts for
//! this geometry and for the released one (896 experts, top-16), ignoring cache hits:
//! distinct experts per layer E·(1 − (1 − k/E)^P) vs P·k requests.

use crate::bench_util::{self, gb, ModelInfo};
use clap::Args;
use k3_engine::{Budget, Engine, EngineOptions, StoreStats};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `bench-prefill`.
#[derive(Args, Debug)]
pub struct BenchPrefillArgs {
    /// Model directory (e.g. from `cargo xtask gen-bench`).
    pub model_dir: PathBuf,
    /// Prompt lengths, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "40,512")]
    pub prompts: Vec<usize>,
    /// Expert-cache slots (default 2 × (top-k + 1)).
    #[arg(long)]
    pub cache_slots: Option<u64>,
    /// Compute threads (default: the engine's default).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Turn the engine's next-layer router lookahead on (`EngineOptions::lookahead`, off by
    /// default).
    #[arg(long)]
    pub lookahead: bool,
}

/// Runs the subcommand.
pub fn run(args: &BenchPrefillArgs) -> ExitCode {
    match bench(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-prefill: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One way of feeding a prompt.
struct Way {
    stats: StoreStats,
    secs: f64,
    logits: Vec<f32>,
}

fn feed(
    args: &BenchPrefillArgs,
    m: &ModelInfo,
    ids: &[u32],
    one_pass: bool,
) -> Result<Way, String> {
    let s = &m.sizes;
    let slots = args
        .cache_slots
        .unwrap_or(2 * s.min_expert_slots())
        .max(s.min_expert_slots());
    let opts = EngineOptions {
        threads: args.threads,
        budget: Some(Budget::Split {
            trunk: s.trunk_full_bytes(),
            cache: slots * s.expert_slot_bytes(),
        }),
        ctx: ids.len() + 1,
        direct_io: true,
        lookahead: args.lookahead,
        ..EngineOptions::default()
    };
    let engine = Engine::open(&args.model_dir, opts).map_err(|e| e.to_string())?;
    let mut session = engine
        .new_session(ids.len() + 1)
        .map_err(|e| e.to_string())?;
    let before = engine.stats();
    let t = Instant::now();
    if one_pass {
        session.feed(ids).map_err(|e| e.to_string())?;
    } else {
        for &id in ids {
            session.feed(&[id]).map_err(|e| e.to_string())?;
        }
    }
    Ok(Way {
        secs: t.elapsed().as_secs_f64(),
        stats: engine.stats().since(&before),
        logits: session.logits().to_vec(),
    })
}

/// Expected distinct experts over requests for `p` tokens routed uniformly, top-`k` of `e`.
fn uniform_ratio(e: usize, k: usize, p: usize) -> f64 {
    let (e, k, p) = (e as f64, k as f64, p as f64);
    (e * (1.0 - (1.0 - k / e).powf(p))) / (p * k)
}

fn bench(args: &BenchPrefillArgs) -> Result<(), String> {
    let m = bench_util::model_info(&args.model_dir)?;
    let (e, k) = (m.cfg.num_experts, m.cfg.num_experts_per_token);
    let moe_layers = m.cfg.num_hidden_layers - m.cfg.first_k_dense_replace;
    println!("machine: {}", bench_util::machine_facts());
    println!(
        "model {}: {moe_layers} MoE layers × {e} experts (top-{k}), expert {:.3} MB, trunk pinned ({:.3} GB)",
        args.model_dir.display(),
        m.sizes.expert_bytes as f64 / 1e6,
        gb(m.sizes.trunk_full_bytes() as f64)
    );
    let mut lines = Vec::new();
    for &p in &args.prompts {
        if p == 0 {
            return Err("prompt lengths must be at least 1".into());
        }
        let ids = bench_util::prompt_ids(p, m.cfg.vocab_size, 2);
        let one = feed(args, &m, &ids, true)?;
        let tok = feed(args, &m, &ids, false)?;
        let same = one.logits.len() == tok.logits.len()
            && one
                .logits
                .iter()
                .zip(&tok.logits)
                .all(|(a, b)| a.to_bits() == b.to_bits());
        if !same {
            return Err(format!(
                "{p}-token prompt: the last logits of one-pass prefill and token-by-token feeding differ"
            ));
        }
        let per = |w: &Way| w.stats.expert_bytes_read as f64 / p as f64;
        lines.push(format!(
            "| {p} | {:.1} MB ({} req, {:.0} % hit) | {:.1} MB ({} req, {:.0} % hit) | {:.3} | {:.2} / {:.2} | {:.3} | {:.3} | yes |",
            per(&one) / 1e6,
            one.stats.expert_requests,
            100.0 * one.stats.expert_hit_rate(),
            per(&tok) / 1e6,
            tok.stats.expert_requests,
            100.0 * tok.stats.expert_hit_rate(),
            per(&one) / per(&tok).max(1e-9),
            one.secs,
            tok.secs,
            uniform_ratio(e, k, p),
            uniform_ratio(896, 16, p),
        ));
        println!(
            "  {p} tokens done (one pass {:.2} s, token by token {:.2} s)",
            one.secs, tok.secs
        );
    }
    println!("\n| prompt tokens | one pass: expert bytes / token | token by token: expert bytes / token | ratio | wall s (one pass / token by token) | uniform-routing ratio, this geometry | uniform-routing ratio, released (896, top-16) | last logits bit-identical |");
    println!("|---:|---|---|---:|---|---:|---:|---|");
    for l in lines {
        println!("{l}");
    }
    Ok(())
}
