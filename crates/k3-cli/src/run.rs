//! `k3 run`: prefill a prompt and generate (greedy by default, sampled with `--temp`), printing
//! ids (and text when a tokenizer is present), with an optional JSON report and a raw logits
//! dump. Generation stops at the model's end ids (unless `--ignore-eos`), at a `--stop` text,
//! or after `-n` tokens.

use crate::config_file::{self, FileConfig};
use crate::engine_args::EngineArgs;
use crate::ids::parse_ids;
use crate::sampling_args::SamplingArgs;
use crate::CliError;
use clap::Args;
use k3_engine::{
    DecodeMode, Engine, Sampler, SamplingParams, StopConditions, StopScanner, StoreStats,
};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("prompt_source").required(true).args(["ids", "prompt", "prompt_file"])))]
#[command(
    after_help = "Examples:\n  k3 run fixtures/tiny-k3 --prompt 'The train left at' -n 16\n  k3 run fixtures/tiny-k3 --ids 637,229,263 -n 16 --mem-gb 0.005 --json out.json\n  k3 run fixtures/tiny-k3 --prompt 'Hello' --temp 0.8 --top-p 0.95 --seed 7 --stop '.'\n  k3 run fixtures/tiny-k3 --ids 1,2,3 -n 4 --save-session s.k3ss && k3 run fixtures/tiny-k3 --load-session s.k3ss --ids 4 -n 4"
)]
pub struct RunArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Model directory (config.json + *.safetensors [+ tiktoken.model]); default: `model`
    /// from the config file (`k3 config path`).
    pub model_dir: Option<PathBuf>,
    /// Prompt as raw token ids, comma-separated (the reproducible channel).
    #[arg(long)]
    pub ids: Option<String>,
    /// Prompt text (needs a tokenizer in the model directory or --tok).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Prompt read verbatim from a file (needs a tokenizer).
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Let control-token text in the prompt (e.g. `<|im_end|>`) become control tokens.
    #[arg(long)]
    pub allow_special: bool,
    /// Tokens to generate at most.
    #[arg(
        short = 'n',
        long = "gen",
        visible_alias = "max-tokens",
        default_value_t = 16,
        allow_negative_numbers = true
    )]
    pub gen: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop when the generated text contains TEXT (repeatable; not printed). Needs a tokenizer.
    #[arg(long = "stop", value_name = "TEXT", allow_hyphen_values = true)]
    pub stop: Vec<String>,
    /// Keep generating past the model's end ids (EOS, <|end_of_msg|>).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Re-run the whole sequence every step instead of carrying state (for testing).
    #[arg(long)]
    pub recompute: bool,
    /// Context positions to allocate (default: prompt + generated tokens).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Write a JSON report (prompt_ids, generated_ids, seconds_per_token, peak_rss_bytes…).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the logits at the last prompt position as raw little-endian f32.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
    /// Print only the generated text and ids (no plan, per-token lines or statistics).
    #[arg(short, long)]
    pub quiet: bool,
    /// Resume a conversation saved with --save-session: its tokens are not prefilled again;
    /// the prompt continues it.
    #[arg(long)]
    pub load_session: Option<PathBuf>,
    /// Save the conversation (tokens, KDA state, latent KV) after generating, for
    /// --load-session (versioned, fingerprinted, checksummed, atomic).
    #[arg(long)]
    pub save_session: Option<PathBuf>,
    /// Record routed-expert requests to DIR/expert_trace.bin (u32 LE layer, u32 LE expert per
    /// request; the layout of upstream's trace). Needs a budget flag.
    #[arg(long)]
    pub dump_cache_trace: Option<PathBuf>,
}

/// Reads the prompt ids from whichever prompt flag was given; text needs the tokenizer.
fn prompt_ids(args: &RunArgs, engine: &Engine) -> Result<Vec<u32>, CliError> {
    if let Some(text) = &args.ids {
        return parse_ids(text).map_err(CliError::usage);
    }
    let tok = engine.tokenizer().ok_or_else(|| {
        CliError::usage(format!(
            "{}: no tokenizer (tiktoken.model or tokenizer.json) for --prompt/--prompt-file: pass --tok DIR or use --ids",
            args.dir().display()
        ))
    })?;
    if let Some(text) = &args.prompt {
        return Ok(tok.encode(text, args.allow_special));
    }
    let path = args
        .prompt_file
        .as_ref()
        .ok_or_else(|| CliError::usage("give --ids, --prompt or --prompt-file"))?;
    // Bytes are read verbatim; invalid UTF-8 is encoded losslessly from its raw bytes.
    let bytes = std::fs::read(path).map_err(|e| {
        CliError::usage(format!("{}: cannot read prompt file: {e}", path.display()))
    })?;
    Ok(tok.encode_bytes(&bytes, args.allow_special))
}

/// Prompts longer than this get a prefill progress bar (on a terminal, unless --quiet).
const PROGRESS_PREFILL_TOKENS: usize = 256;

/// Feeds the prompt: one pass per planner chunk (`k3 plan` shows it) whether or not a bar
/// is shown; on a terminal, a long prompt gets a bar that the engine moves after every
/// decoder layer of every chunk.
fn prefill(
    session: &mut k3_engine::Session<'_>,
    prompt: &[u32],
    quiet: bool,
) -> Result<(), CliError> {
    use std::io::IsTerminal;
    if quiet || prompt.len() <= PROGRESS_PREFILL_TOKENS || !std::io::stderr().is_terminal() {
        return session.feed(prompt).map_err(CliError::from);
    }
    const STEPS: u64 = 1000;
    let bar = indicatif::ProgressBar::new(STEPS);
    bar.set_style(
        indicatif::ProgressStyle::with_template("prefill [{bar:40}] {msg}, eta {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let fed = session.feed_with_progress(prompt, &mut |p: k3_engine::FeedProgress| {
        bar.set_position((p.fraction() * STEPS as f64) as u64);
        bar.set_message(format!(
            "tokens {}..{} of {}, layer {}/{}",
            p.tokens_done,
            p.tokens_done + p.chunk,
            p.tokens,
            p.layers_done,
            p.layers
        ));
    });
    bar.finish_and_clear();
    fed.map_err(CliError::from)
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// One line per generated token while streaming: time, bytes read, hit rates.
fn live_line(step: usize, id: u32, secs: f64, now: &StoreStats, before: &StoreStats) -> String {
    let d = now.since(before);
    format!(
        "step {step:>4}  token {id:>7}  {secs:>8.3} s  read {:>9.3} GB  expert hits {:>5.1}%  trunk hits {:>5.1}%",
        d.bytes_read() as f64 / 1e9,
        100.0 * d.expert_hit_rate(),
        100.0 * d.trunk_hit_rate(),
    )
}

/// The sampling parameters of the flags over the config file, validated (errors name the flag).
fn sampling_params(args: &RunArgs, file: &FileConfig) -> Result<SamplingParams, CliError> {
    let params = args.sampling.params(file)?;
    if args.stop.iter().any(String::is_empty) {
        return Err(CliError::usage("--stop needs a non-empty TEXT"));
    }
    Ok(params)
}

/// The model directory: the positional argument, else the config file's `model`.
fn resolve_model_dir(args: &mut RunArgs, file: &FileConfig) -> Result<(), CliError> {
    if args.model_dir.is_none() {
        args.model_dir = file.model.clone();
    }
    match args.model_dir {
        Some(_) => Ok(()),
        None => Err(CliError::usage(
            "give MODEL_DIR (or set `model` in the config file: see `k3 config path`)",
        )),
    }
}

impl RunArgs {
    /// The resolved model directory (after [`resolve_model_dir`]).
    fn dir(&self) -> &std::path::Path {
        self.model_dir
            .as_deref()
            .unwrap_or(std::path::Path::new("."))
    }
}

pub fn run(mut args: RunArgs) -> Result<(), CliError> {
    if let Some(text) = &args.ids {
        parse_ids(text).map_err(CliError::usage)?; // usage errors before any loading
    }
    let file = config_file::load()?;
    resolve_model_dir(&mut args, &file)?;
    let params = sampling_params(&args, &file)?;
    let options = args.engine.options(&file, args.ctx.unwrap_or(4096))?;
    let budget = options.budget;
    if args.dump_cache_trace.is_some() && budget.is_none() {
        return Err(CliError::usage(
            "--dump-cache-trace needs a budget flag (--preset, --mem-gb or --trunk-gb/--cache-gb)",
        ));
    }
    let engine = crate::engine_args::open_engine(args.dir(), options, !args.quiet)?;
    let prompt = prompt_ids(&args, &engine)?;
    if prompt.is_empty() {
        return Err(CliError::usage(
            "the prompt is empty: give at least one token",
        ));
    }
    let ctx = match &args.load_session {
        Some(_) => args.ctx.unwrap_or(4096),
        None => args.ctx.unwrap_or(prompt.len() + args.gen.max(1)),
    };
    let quiet = args.quiet;
    if let (Some(plan), false) = (engine.plan(), quiet) {
        eprintln!(
            "{}",
            plan.table(Some(&k3_store::available_memory())).trim_end()
        );
    }
    engine.record_expert_trace(args.dump_cache_trace.is_some());
    let (mut session, reused) = match &args.load_session {
        Some(path) => {
            let (session, info) = engine.load_session_with_info(path, ctx)?;
            if !quiet {
                eprintln!(
                    "resumed {} tokens from {} ({} prefill tokens saved)",
                    info.tokens,
                    path.display(),
                    info.prefill_tokens_saved
                );
            }
            (session, info.prefill_tokens_saved)
        }
        None => (engine.new_session(ctx)?, 0),
    };
    let mode = if args.recompute {
        DecodeMode::Recompute
    } else {
        args.sampling.decode_mode(&engine)
    };
    let streaming = engine.plan().is_some();

    let t0 = Instant::now();
    prefill(&mut session, &prompt, quiet)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    if let Some(path) = &args.dump_logits {
        let bytes: Vec<u8> = session
            .logits()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(path, bytes).map_err(|e| {
            CliError::runtime(format!("{}: cannot write logits: {e}", path.display()))
        })?;
    }
    let mut sampler = Sampler::new(params.clone())?;
    let mut stop = if args.ignore_eos {
        StopConditions::none()
    } else {
        StopConditions::for_engine(&engine)
    };
    stop = stop.with_stop_strings(args.stop.iter().cloned());
    if !stop.stop_strings.is_empty() && engine.tokenizer().is_none() {
        return Err(CliError::usage(format!(
            "--stop needs a tokenizer: {} has no tiktoken.model or tokenizer.json (pass --tok DIR)",
            args.dir().display()
        )));
    }
    let t1 = Instant::now();
    let mut stdout = std::io::stdout();
    let mut text = engine.tokenizer().map(|t| t.stream_decoder());
    // Holds back text that may be the start of a stop string, so none of it is printed.
    let mut scanner = StopScanner::new(&stop.stop_strings);
    let mut printed = 0usize;
    let (mut last_t, mut last_stats, mut step) = (Instant::now(), engine.stats(), 0usize);
    let generated = session.generate_with(args.gen, mode, &mut sampler, &stop, |id| {
        // Stream complete UTF-8 characters as they decode; ids when there is no tokenizer.
        // An end id ends the generation and is not printed.
        let piece = match text.as_mut() {
            Some(_) if stop.end_ids.contains(&id) => String::new(),
            Some(d) => scanner.push(&d.push(id).unwrap_or_default()).emit,
            None => format!("{id} "),
        };
        printed += piece.len();
        let _ = write!(stdout, "{piece}");
        let _ = stdout.flush();
        if streaming && !quiet {
            let now = engine.stats();
            eprintln!(
                "{}",
                live_line(step, id, last_t.elapsed().as_secs_f64(), &now, &last_stats)
            );
            (last_t, last_stats) = (Instant::now(), now);
        }
        step += 1;
        true
    });
    let stats = engine.stats();
    if let Err(e) = &generated {
        if e.exit_code() == k3_engine::EXIT_EXPERT {
            eprintln!("{}", stats.report(t0.elapsed().as_secs_f64()));
        }
    }
    let generation = generated?;
    let generated = &generation.ids;
    let decode_s = t1.elapsed().as_secs_f64();
    // The engine's text is what was printed plus whatever was still held back.
    if let Some(rest) = generation.text.as_deref().and_then(|t| t.get(printed..)) {
        print!("{rest}");
    }
    println!();
    let ids_text: Vec<String> = generated.iter().map(u32::to_string).collect();
    println!("generated ids: {}", ids_text.join(","));
    let per_token = if generated.is_empty() {
        0.0
    } else {
        decode_s / generated.len() as f64
    };
    let wall = t0.elapsed().as_secs_f64();
    if !quiet {
        eprintln!("stopped: {}", generation.stop_reason);
        eprintln!(
            "prefill {} tokens in {:.3} s; {} tokens at {:.4} s/token; peak RSS {:.1} MB",
            prompt.len(),
            prefill_s,
            generated.len(),
            per_token,
            peak_rss_bytes() as f64 / 1e6
        );
        let spec = session.spec_stats();
        if spec.drafted > 0 {
            eprintln!(
                "speculative: {} decode passes for {} tokens (plain decoding: {}); {} of {} drafted tokens accepted ({:.1}%)",
                spec.passes,
                generated.len(),
                generated.len().saturating_sub(1),
                spec.accepted,
                spec.drafted,
                100.0 * spec.acceptance()
            );
        }
        if streaming {
            eprintln!("{}", stats.report(wall));
        }
    }
    if let Some(path) = &args.save_session {
        let info = session.save(path)?;
        if !quiet {
            eprintln!(
                "saved {} tokens ({} bytes) to {}",
                info.tokens,
                info.bytes,
                path.display()
            );
        }
    }
    if let Some(dir) = &args.dump_cache_trace {
        write_trace(dir, &engine.take_expert_trace())?;
    }
    if let Some(path) = &args.json {
        let report = serde_json::json!({
            "model_dir": args.model_dir,
            "prompt_ids": prompt,
            "generated_ids": generated,
            "generated_text": generation.text,
            "stop_reason": generation.stop_reason.name(),
            "stop_value": serde_json::to_value(&generation.stop_reason).ok().and_then(|v| v.get("value").cloned()),
            "sampling": sampling_json(&params, &stop, args.ignore_eos),
            "prefill_seconds": prefill_s,
            "prompt_tokens_reused": reused,
            "seconds_per_token": per_token,
            "threads": engine.threads(),
            "mode": match mode {
                DecodeMode::Recompute => "recompute",
                DecodeMode::Speculative(_) => "speculative",
                _ => "incremental",
            },
            "draft_passes": session.spec_stats().passes,
            "draft_tokens": session.spec_stats().drafted,
            "draft_accepted": session.spec_stats().accepted,
            "peak_rss_bytes": peak_rss_bytes(),
            "streaming": streaming,
            "bytes_read_trunk": stats.trunk_bytes_read,
            "bytes_read_experts": stats.expert_bytes_read,
            "expert_requests": stats.expert_requests,
            "expert_resident_hits": stats.expert_resident_hits,
            "expert_evictions": stats.expert_evictions,
            "trunk_binds": stats.trunk_binds,
            "trunk_pinned_hits": stats.trunk_pinned_hits,
            "io_seconds": stats.io_seconds,
            "lookahead_reads": stats.lookahead_reads,
            "lookahead_useful_reads": stats.lookahead_useful_reads,
            "lookahead_recall": stats.lookahead_recall(),
        });
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        std::fs::write(path, text + "\n").map_err(|e| {
            CliError::runtime(format!("{}: cannot write JSON report: {e}", path.display()))
        })?;
    }
    Ok(())
}

/// The `sampling` object of the JSON report: the parameters, stop strings and end ids in force.
fn sampling_json(
    params: &SamplingParams,
    stop: &StopConditions,
    ignore_eos: bool,
) -> serde_json::Value {
    let mut v = serde_json::to_value(params).unwrap_or_default();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("greedy".into(), params.is_greedy().into());
        obj.insert("stop".into(), serde_json::json!(stop.stop_strings));
        obj.insert("end_ids".into(), serde_json::json!(stop.end_ids));
        obj.insert("ignore_eos".into(), ignore_eos.into());
    }
    v
}

/// Writes `DIR/expert_trace.bin`: per request, u32 LE layer then u32 LE expert.
fn write_trace(dir: &std::path::Path, trace: &[(u32, u32)]) -> Result<(), CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::runtime(format!("{}: {e}", dir.display())))?;
    let path = dir.join("expert_trace.bin");
    let bytes: Vec<u8> = trace
        .iter()
        .flat_map(|(l, e)| l.to_le_bytes().into_iter().chain(e.to_le_bytes()))
        .collect();
    std::fs::write(&path, bytes)
        .map_err(|e| CliError::runtime(format!("{}: {e}", path.display())))?;
    eprintln!(
        "expert trace: {} requests written to {}",
        trace.len(),
        path.display()
    );
    Ok(())
}
