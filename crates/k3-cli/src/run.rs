//! `k3 run`: prefill a prompt and generate greedily, printing ids (and text when a tokenizer
//! is present), with an optional JSON report and a raw logits dump.

use crate::ids::parse_ids;
use crate::CliError;
use clap::Args;
use k3_engine::{DecodeMode, Engine, EngineOptions};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("prompt_source").required(true).args(["ids", "prompt", "prompt_file"])))]
pub struct RunArgs {
    /// Model directory (config.json + *.safetensors [+ tiktoken.model]).
    pub model_dir: PathBuf,
    /// Prompt as raw token ids, comma-separated (the reproducible channel).
    #[arg(long)]
    pub ids: Option<String>,
    /// Prompt text (needs a tokenizer in the model directory or --tok).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Prompt read verbatim from a file (needs a tokenizer).
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Tokens to generate.
    #[arg(short = 'n', long = "gen", default_value_t = 16)]
    pub gen: usize,
    /// Re-run the whole sequence every step instead of carrying state (for testing).
    #[arg(long)]
    pub recompute: bool,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Context positions to allocate (default: prompt + generated tokens).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Write a JSON report (prompt_ids, generated_ids, seconds_per_token, peak_rss_bytes…).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the logits at the last prompt position as raw little-endian f32.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
}

/// Reads the prompt ids from whichever prompt flag was given.
fn prompt_ids(args: &RunArgs) -> Result<Vec<u32>, CliError> {
    if let Some(text) = &args.ids {
        return parse_ids(text).map_err(CliError::usage);
    }
    Err(CliError::usage(
        "--prompt/--prompt-file need the tokenizer, which is not built into this k3 yet: use --ids",
    ))
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

pub fn run(args: RunArgs) -> Result<(), CliError> {
    let prompt = prompt_ids(&args)?;
    if prompt.is_empty() {
        return Err(CliError::usage("the prompt is empty: give at least one token"));
    }
    let engine = Engine::open(&args.model_dir, EngineOptions { threads: args.threads })?;
    let ctx = args.ctx.unwrap_or(prompt.len() + args.gen.max(1));
    let mut session = engine.new_session(ctx)?;
    let mode = if args.recompute { DecodeMode::Recompute } else { DecodeMode::Incremental };

    let t0 = Instant::now();
    session.feed(&prompt)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    if let Some(path) = &args.dump_logits {
        let bytes: Vec<u8> = session.logits().iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes)
            .map_err(|e| CliError::runtime(format!("{}: cannot write logits: {e}", path.display())))?;
    }
    let t1 = Instant::now();
    let mut stdout = std::io::stdout();
    let generated = session.generate(args.gen, mode, |id| {
        let _ = write!(stdout, "{id} ");
        let _ = stdout.flush();
        true
    })?;
    let decode_s = t1.elapsed().as_secs_f64();
    println!();
    let ids_text: Vec<String> = generated.iter().map(u32::to_string).collect();
    println!("generated ids: {}", ids_text.join(","));
    let per_token = if generated.is_empty() { 0.0 } else { decode_s / generated.len() as f64 };
    eprintln!(
        "prefill {} tokens in {:.3} s; {} tokens at {:.4} s/token; peak RSS {:.1} MB",
        prompt.len(),
        prefill_s,
        generated.len(),
        per_token,
        peak_rss_bytes() as f64 / 1e6
    );
    if let Some(path) = &args.json {
        let report = serde_json::json!({
            "model_dir": args.model_dir,
            "prompt_ids": prompt,
            "generated_ids": generated,
            "prefill_seconds": prefill_s,
            "seconds_per_token": per_token,
            "threads": engine.threads(),
            "mode": if args.recompute { "recompute" } else { "incremental" },
            "peak_rss_bytes": peak_rss_bytes(),
        });
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        std::fs::write(path, text + "\n")
            .map_err(|e| CliError::runtime(format!("{}: cannot write JSON report: {e}", path.display())))?;
    }
    Ok(())
}
