//! `k3 run`: prefill a prompt and generate (greedy by default, sampled with `--temp`),
//! printing the text (the ids, for a model without a tokenizer) on stdout and nothing else,
//! with an optional JSON report and a raw logits dump. Generation stops at the model's end ids
//! (unless `--ignore-eos`), at a `--stop` text, or after `-n` tokens; prompt plus `-n` must fit
//! the context (checked before anything is fed).

use crate::run_args::{json_to_stdout, RunArgs};
use crate::run_input::{self, check_room, Prompt};
use crate::run_output::{LiveLines, TextOut};
use crate::run_structured;
use crate::status::Status;
use crate::CliError;
use k3_engine::config_file::{self, FileConfig};
use k3_engine::run_report::RunFacts;
use k3_engine::{
    DecodeMode, Engine, Generation, Sampler, SamplingParams, Session, StopConditions, StopScanner,
};
use std::path::Path;
use std::time::Instant;

/// Feeds the prompt: one pass per planner chunk (`k3 plan` shows it) whether or not a status
/// line is shown; on a terminal (unless -q) the status line follows the engine after every
/// decoder layer of every chunk, with an ETA (README "Progress").
fn prefill(
    session: &mut k3_engine::Session<'_>,
    prompt: &[u32],
    status: &mut Status,
) -> Result<(), CliError> {
    if !status.shown() {
        return session.feed(prompt).map_err(CliError::from);
    }
    status.start(&format!("prefill: {} tokens", prompt.len()));
    let st = &*status;
    session
        .feed_with_progress(prompt, &mut |p: k3_engine::FeedProgress| st.prefill(&p))
        .map_err(CliError::from)
}

/// The sampling parameters of the flags over the config file, validated (errors name the flag).
fn sampling_params(args: &RunArgs, file: &FileConfig) -> Result<SamplingParams, CliError> {
    let params = args.sampling.params(file)?;
    if args.stop.iter().any(String::is_empty) {
        return Err(CliError::usage("--stop needs a non-empty TEXT"));
    }
    Ok(params)
}

/// The context to allocate: `-c`, else room for prompt and `-n` (4096 with a loaded session,
/// whose length is not known before it is read).
fn session_ctx(args: &RunArgs, prompt: usize, trained: Option<usize>) -> usize {
    match (args.ctx, &args.load_session) {
        (Some(c), _) => c,
        (None, Some(_)) => crate::context::default_ctx(trained),
        (None, None) => prompt + args.gen.max(1),
    }
}

/// Refusals that need no weights: a zero context, a trace without a budget, and an `--ids`
/// prompt that cannot fit `-c` with `-n`.
fn early_checks(args: &RunArgs, prompt: &Prompt, budget: bool) -> Result<(), CliError> {
    if args.ctx == Some(0) {
        return Err(CliError::usage("-c/--ctx must be at least 1"));
    }
    if args.dump_cache_trace.is_some() && !budget {
        return Err(CliError::usage(
            "--dump-cache-trace needs a budget flag (--preset, --mem-gb or --trunk-gb/--cache-gb)",
        ));
    }
    match (prompt, args.ctx, &args.load_session) {
        (Prompt::Ids(ids), Some(ctx), None) => check_room(0, ids.len(), args.gen, ctx),
        _ => Ok(()),
    }
}

/// A fresh session, or the one `--load-session` names; with the prompt tokens it reuses.
fn open_session<'e>(
    args: &RunArgs,
    engine: &'e Engine,
    ctx: usize,
) -> Result<(Session<'e>, usize), CliError> {
    let Some(path) = &args.load_session else {
        return Ok((engine.new_session(ctx)?, 0));
    };
    let (session, info) = engine.load_session_with_info(path, ctx)?;
    if !args.quiet {
        eprintln!(
            "resumed {} tokens from {} ({} prefill tokens saved)",
            info.tokens,
            path.display(),
            info.prefill_tokens_saved
        );
    }
    Ok((session, info.prefill_tokens_saved))
}

/// The stop conditions of the flags; `--stop` needs a tokenizer.
fn stop_conditions(
    args: &RunArgs,
    engine: &Engine,
    dir: &Path,
) -> Result<StopConditions, CliError> {
    let stop = if args.ignore_eos {
        StopConditions::none()
    } else {
        StopConditions::for_engine(engine)
    };
    let stop = stop.with_stop_strings(args.stop.iter().cloned());
    if !stop.stop_strings.is_empty() && engine.tokenizer().is_none() {
        return Err(CliError::usage(format!(
            "--stop needs a tokenizer: {} has no tiktoken.model or tokenizer.json (pass --tok DIR)",
            dir.display()
        )));
    }
    Ok(stop)
}

/// Writes the logits at the last prompt position (`--dump-logits`).
fn dump_logits(path: &Path, session: &Session<'_>) -> Result<(), CliError> {
    let bytes: Vec<u8> = session
        .logits()
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(path, bytes)
        .map_err(|e| CliError::runtime(format!("{}: cannot write logits: {e}", path.display())))
}

/// Generates, streaming the text (or ids) to stdout as it decodes; ends stdout with a newline.
fn generate(
    args: &RunArgs,
    engine: &Engine,
    session: &mut Session<'_>,
    mode: DecodeMode,
    sampler: &mut Sampler,
    stop: &StopConditions,
    status: &mut Status,
) -> Result<Generation, k3_engine::EngineError> {
    use std::io::IsTerminal;
    // `--json-schema` / `--json-object`: only the response channel goes to stdout.
    let structured = args.json_schema.is_some() || args.json_object;
    let mut out = TextOut::new(json_to_stdout(args));
    // The text is not on the terminal (a file, a pipe, `--json -`): the status line can stay.
    let text_off_terminal = !std::io::stdout().is_terminal() || json_to_stdout(args);
    let decode_status = !args.verbose && text_off_terminal;
    if decode_status {
        status.start("generating: first token");
    }
    let mut count = 0usize;
    // Structured output prints the response channel only: the text before the first marker
    // (`response_bytes` of the engine's text).
    let mut in_response = true;
    let mut response_bytes = 0usize;
    let mut live = LiveLines::new(args.verbose, engine);
    let mut text = engine.tokenizer().map(|t| t.stream_decoder());
    // Holds back text that may be the start of a stop string, so none of it is printed.
    let mut scanner = StopScanner::new(&stop.stop_strings);
    let mut printed = 0usize;
    let generated = session.generate_with(args.gen, mode, sampler, stop, |id| {
        // An end id ends the generation and is not printed (an ids-only model prints it).
        if structured && engine.tokenizer().is_some_and(|t| t.is_special(id)) {
            in_response = false;
        }
        match text.as_mut() {
            Some(_) if stop.end_ids.contains(&id) || !in_response => {}
            Some(d) => {
                let decoded = d.push(id).unwrap_or_default();
                response_bytes += decoded.len();
                let piece = scanner.push(&decoded).emit;
                printed += piece.len();
                out.text(&piece);
            }
            None => out.id(id),
        }
        live.token(id, engine);
        count += 1;
        if decode_status {
            status.tokens("generating", count);
        }
        !crate::interrupt::requested()
    });
    status.clear();
    // The engine's text is what was printed plus whatever was still held back.
    if let Ok(g) = &generated {
        let end = g.text.as_deref().map_or(0, |t| match structured {
            true => response_bytes.min(t.len()),
            false => t.len(),
        });
        if let Some(rest) = g.text.as_deref().and_then(|t| t.get(printed..end)) {
            out.text(rest);
        }
    }
    out.finish();
    live.flush();
    generated
}

/// `-n` and `-c` over the config file's `n` and `ctx`.
fn resolve_lengths(args: &mut RunArgs, file: &FileConfig) {
    args.gen = args.gen_flag.or(file.n).unwrap_or(16);
    args.ctx = args.ctx.or(file.ctx);
}

pub fn run(mut args: RunArgs, group: &crate::mpi_comm::Group) -> Result<(), CliError> {
    let file = config_file::load()?;
    resolve_lengths(&mut args, &file);
    if group.is_follower() {
        // Rank 0 owns the product; a follower writes no report or file (it still
        // joins `--save-session`: saving gathers every rank's KDA heads, rank 0 writes)
        (args.quiet, args.print_ids) = (true, false);
        (args.json, args.dump_logits) = (None, None);
        args.dump_cache_trace = None;
    }
    if run_input::wants_chat(&args) {
        if group.comm().is_some() {
            return Err(CliError::usage(
                "give a prompt: chat does not run over MPI ranks yet (docs/DISTRIBUTED.md)",
            ));
        }
        return crate::chat_repl::chat(crate::chat_repl::ChatArgs::from_run(args), group);
    }
    let inputs = run_input::resolve(&args, &file)?;
    let params = sampling_params(&args, &file)?;
    let dir = inputs.model_dir.as_path();
    let trained = crate::context::trained_context(dir);
    let plan_ctx = args.ctx.unwrap_or(crate::context::default_ctx(trained));
    let mut options = args.engine.options(&file, plan_ctx, group.comm())?;
    options.draft_policy = args.sampling.draft_policy(options.draft_trunk.as_deref())?;
    options.max_drafts = args.sampling.planned_drafts();
    early_checks(&args, &inputs.prompt, options.budget.is_some())?;
    let resident = args.engine.resident;
    args.engine.set_numerics()?;
    let engine = crate::engine_args::open_engine(dir, options, resident, !args.quiet)?;
    let structured = run_structured::spec(&args)?;
    let mut prompt = match &structured {
        Some(_) => {
            let tok = run_structured::tokenizer(&engine, dir)?;
            run_structured::chat_prompt(tok, &inputs.prompt)?
        }
        None => inputs.prompt.ids(&engine, dir, args.allow_special)?,
    };
    group.share_ids(&mut prompt)?; // rank 0's prompt ids
    if prompt.is_empty() {
        return Err(CliError::usage(
            "the prompt is empty: give at least one token",
        ));
    }
    let ctx = session_ctx(&args, prompt.len(), trained);
    if !args.quiet {
        crate::engine_args::print_plan(&engine);
    }
    let stop = stop_conditions(&args, &engine, dir)?;
    engine.record_expert_trace(args.dump_cache_trace.is_some());
    let (mut session, reused) = open_session(&args, &engine, ctx)?;
    let held = session.tokens().len();
    check_room(held, prompt.len(), args.gen, ctx)?;
    let what = format!(
        "the prompt ({} tokens) and -n {}",
        held + prompt.len(),
        args.gen
    );
    let need = held + prompt.len() + args.gen;
    crate::context::check_trained(dir, trained, need, args.ctx, &what)?;
    let mode = match args.recompute {
        true => DecodeMode::Recompute,
        false => args.sampling.decode_mode(&engine),
    };
    crate::interrupt::install()?;
    let mut status = Status::new(!args.quiet);
    let stats_open = engine.stats();
    let t0 = Instant::now();
    prefill(&mut session, &prompt, &mut status)?;
    status.clear();
    let prefill_s = t0.elapsed().as_secs_f64();
    let stats_prefill = engine.stats();
    if let Some(path) = &args.dump_logits {
        dump_logits(path, &session)?;
    }
    let mut sampler = Sampler::new(params.clone())?;
    if let Some(spec) = &structured {
        let tok = run_structured::tokenizer(&engine, dir)?;
        sampler = run_structured::constrain(sampler, tok, spec)?;
    }
    let t1 = Instant::now();
    let generated = generate(
        &args,
        &engine,
        &mut session,
        mode,
        &mut sampler,
        &stop,
        &mut status,
    );
    let generation = generated.inspect_err(|e| expert_failure_report(e, &engine, t0))?;
    let done = RunFacts {
        dir,
        prompt: &prompt,
        generation: &generation,
        params: &params,
        stop: &stop,
        mode,
        reused,
        prefill_s,
        stats_open,
        stats_prefill,
        decode_s: t1.elapsed().as_secs_f64(),
        wall: t0.elapsed().as_secs_f64(),
    };
    finish(&args, &engine, &session, &done)?;
    crate::interrupt::result(generation.ids.len())?;
    run_structured::check_complete(&sampler, args.gen)
}

/// After a routed expert failed to load (exit 4), the I/O report shows what was read.
fn expert_failure_report(e: &k3_engine::EngineError, engine: &Engine, t0: Instant) {
    if e.exit_code() == k3_engine::EXIT_EXPERT && engine.plan().is_some() {
        let wall = t0.elapsed().as_secs_f64();
        eprintln!("{}", engine.stats().report(Some(wall)));
    }
}

/// After the text: `--print-ids`, the summary on stderr, then the files asked for.
fn finish(
    args: &RunArgs,
    engine: &Engine,
    session: &Session<'_>,
    done: &RunFacts<'_>,
) -> Result<(), CliError> {
    let ids = &done.generation.ids;
    // a collective every rank makes, followers too (docs/DISTRIBUTED.md#memory-per-rank)
    let ranks = engine.rank_figures(k3_store::probe::peak_rss_bytes())?;
    if args.print_ids {
        let text: Vec<String> = ids.iter().map(u32::to_string).collect();
        eprintln!("generated ids: {}", text.join(","));
    }
    if !args.quiet {
        summary(engine, session, done);
    }
    if let Some(path) = &args.save_session {
        let info = session.save(path)?;
        if !args.quiet {
            eprintln!(
                "saved {} tokens ({} bytes) to {}",
                info.tokens,
                info.bytes,
                path.display()
            );
        }
    }
    if let Some(dir) = &args.dump_cache_trace {
        crate::run_report::write_trace(dir, &engine.take_expert_trace())?;
    }
    if let Some(path) = &args.json {
        crate::run_report::write_json(path, args, engine, session, done, &ranks)?;
    }
    Ok(())
}

/// The end-of-run lines on stderr: why it stopped, speeds, drafts, the I/O report.
fn summary(engine: &Engine, session: &Session<'_>, done: &RunFacts<'_>) {
    let n = done.generation.ids.len();
    match crate::interrupt::requested() {
        true => eprintln!("stopped: interrupted (Ctrl-C)"),
        false => eprintln!("stopped: {}", done.generation.stop_reason),
    }
    eprintln!(
        "prefill {} tokens in {:.3} s; {} tokens at {:.4} s/token (decode); peak RSS {:.1} MB",
        done.prompt.len(),
        done.prefill_s,
        n,
        done.per_token(),
        k3_store::probe::peak_rss_bytes() as f64 / 1e6
    );
    let spec = session.spec_stats();
    if spec.drafted > 0 {
        eprintln!(
            "speculative: {} decode passes for {n} tokens (plain decoding: {}); {} of {} drafted tokens accepted ({:.1}%)",
            spec.passes,
            n.saturating_sub(1),
            spec.accepted,
            spec.drafted,
            100.0 * spec.acceptance()
        );
    }
    if let Some(d) = session.draft_stats() {
        eprintln!(
            "draft model: {} passes over {} tokens in {:.3} s, {} rollbacks",
            d.passes, d.tokens_fed, d.seconds, d.rollbacks
        );
    }
    if let Some(why) = session.draft_failure() {
        eprintln!("warning: hybrid drafting stopped: {why}");
    }
    if engine.plan().is_some() {
        eprintln!("{}", engine.stats().report(Some(done.wall)));
    }
}
