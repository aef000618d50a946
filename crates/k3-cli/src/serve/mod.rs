//! `k3 serve`: an OpenAI- and Anthropic-compatible HTTP server with the model resident
//! in-process: one core (`routes.rs`, the scheduler) behind thin protocol adapters
//! (`http_openai.rs`, `http_anthropic.rs`).
//!
//! The engine runs on ONE dedicated OS thread (the scheduler, [`scheduler::run`]); handlers
//! on a small tokio runtime parse and validate requests, render the prompt with the shared
//! engine's tokenizer, and queue jobs (at most `--parallel` + `--queue` at once; more ⇒ 429). Up to
//! `--parallel` generations run together, batched into one forward pass per step
//! (continuous batching). See docs/SERVER.md.

mod http_anthropic;
mod http_openai;
mod replica;
#[cfg(test)]
mod replica_tests;
mod room;
mod routes;
mod scheduler;
mod status_line;
mod types;
mod worker;

use crate::engine_args::EngineArgs;
use crate::CliError;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use clap::Args;
use k3_engine::Engine;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Request bodies larger than this are refused with 413.
const BODY_LIMIT: usize = 1 << 20;

/// A streaming response with nothing to send for this long gets a `: keep-alive` comment.
const SSE_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(5);

/// The keep-alive interval: [`SSE_KEEP_ALIVE`], or `K3_SSE_KEEP_ALIVE_MS` (≥ 1) when set (for
/// tests).
fn keep_alive_interval() -> std::time::Duration {
    std::env::var("K3_SSE_KEEP_ALIVE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(SSE_KEEP_ALIVE, std::time::Duration::from_millis)
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  k3 serve fixtures/tiny-k3 --port 8080\n  K3_API_KEY=$KEY k3 serve /models/kimi-k3 --preset server\n  curl -s localhost:8080/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'"
)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub model: crate::engine_args::ModelArgs,
    /// Address to bind (loopback by default; anything else exposes the model to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (default 8080, or `port` from the config file; 0 = any free port; the
    /// bound address is printed on stderr).
    #[arg(long)]
    pub port: Option<u16>,
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics. On a shared machine prefer
    /// $K3_API_KEY or --api-key-file: a key on the command line is visible in `ps`.
    #[arg(long, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from the first line of FILE (instead of --api-key or $K3_API_KEY).
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Requests that may wait while `--parallel` others generate; more ⇒ 429.
    #[arg(long, default_value_t = 8)]
    pub queue: usize,
    /// Generations batched together at most (continuous batching; llama-server's name). The
    /// memory plan reserves each one's state (KDA state + latent KV for `--ctx`).
    #[arg(long, visible_alias = "np", default_value_t = 4)]
    pub parallel: usize,
    /// Prompt tokens fed per step while other requests are generating: bounds the time
    /// between their tokens when a long prompt arrives (alone, a prompt is fed in planner
    /// chunks).
    #[arg(long, visible_alias = "ubatch-size", default_value_t = 64)]
    pub ubatch: usize,
    /// Context positions per request (prompt + reply; default 4096, or `ctx` from the config
    /// file, or the model's trained context when smaller; past it only when given).
    #[arg(short = 'c', long, visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// Do not keep saved sessions for conversation state reuse (every prompt is fed whole).
    #[arg(long)]
    pub no_reuse: bool,
    /// Print control tokens the model writes in its text as their spellings (llama.cpp's
    /// `--special`); by default they are left out of every reply. Template markup never is text.
    #[arg(long)]
    pub special: bool,
}

/// State shared by every handler.
pub struct Shared {
    /// The engine, shared for its tokenizer and stats; only the worker thread generates.
    pub engine: Arc<Engine>,
    pub model_id: String,
    pub ctx: usize,
    pub started: u64,
    /// SHA-256 of the API key, when one is required.
    pub api_key_digest: Option<[u8; 32]>,
    pub jobs: mpsc::Sender<worker::Job>,
    /// `--parallel` + `--queue` permits: one per job generating or waiting.
    pub admission: Arc<tokio::sync::Semaphore>,
    pub metrics: Arc<worker::Metrics>,
    /// SSE keep-alive interval.
    pub keep_alive: std::time::Duration,
}

/// SHA-256 of an API key: both sides of the comparison get the same length.
pub fn key_digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Constant-time equality of two digests: every byte is compared, no early exit, so the
/// time does not depend on where they differ (and hashing first hides the key's length).
pub fn digest_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The engine is shared between the worker thread and the handlers.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Engine>();
};

/// Environment variable holding the API key (kept out of `ps`).
pub const ENV_API_KEY: &str = "K3_API_KEY";

/// The API key: `--api-key`, else `--api-key-file`'s first line, else `$K3_API_KEY`.
fn api_key(args: &ServeArgs) -> Result<Option<String>, CliError> {
    if let Some(k) = &args.api_key {
        return Ok(Some(k.clone()));
    }
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CliError::usage(format!(
                "{}: cannot read the API key file: {e}",
                path.display()
            ))
        })?;
        let key = text.lines().next().unwrap_or("").trim().to_string();
        if key.is_empty() {
            return Err(CliError::usage(format!(
                "{}: the API key file is empty: put the key on its first line",
                path.display()
            )));
        }
        return Ok(Some(key));
    }
    Ok(std::env::var(ENV_API_KEY).ok().filter(|k| !k.is_empty()))
}

/// `-c` over the config file's `ctx` (explicit), else the default capped at the trained range,
/// checked against the trained range (README "Context").
fn serve_ctx(
    args: &ServeArgs,
    file: &crate::config_file::FileConfig,
    dir: &std::path::Path,
) -> Result<usize, CliError> {
    let trained = crate::context::trained_context(dir);
    let explicit = args.ctx.or(file.ctx);
    let ctx = explicit.unwrap_or(crate::context::default_ctx(trained));
    if ctx < 2 {
        return Err(CliError::usage("-c/--ctx must be at least 2"));
    }
    crate::context::check_trained(dir, trained, ctx, explicit, "requests")?;
    Ok(ctx)
}

pub fn serve(args: ServeArgs) -> Result<(), CliError> {
    if args.queue == 0 {
        return Err(CliError::usage("--queue must be at least 1"));
    }
    let file = crate::config_file::load()?;
    let model_dir = args.model.resolve(&file)?;
    let ctx = serve_ctx(&args, &file, &model_dir)?;
    let port = args.port.or(file.port).unwrap_or(8080);
    let key = api_key(&args)?;
    if args.parallel == 0 || args.ubatch == 0 {
        return Err(CliError::usage(
            "--parallel and --ubatch must be at least 1",
        ));
    }
    let mut options = args.engine.options(&file, ctx)?;
    // every batched session's state, and every saved one, inside the budget
    let saved = if args.no_reuse {
        0
    } else {
        worker::LRU_CAPACITY
    };
    options.sessions = args.parallel + saved;
    let resident = args.engine.resident;
    args.engine.set_numerics()?;
    let engine = Arc::new(crate::engine_args::open_engine(
        &model_dir, options, resident, true,
    )?);
    crate::engine_args::print_plan(&engine);
    crate::engine_args::tokenizer_of(&engine, &model_dir)?;
    let model_id = std::fs::canonicalize(&model_dir)
        .unwrap_or_else(|_| model_dir.clone())
        .file_name()
        .map_or_else(|| "k3".to_string(), |n| n.to_string_lossy().into_owned());
    let limits = scheduler::Limits {
        ctx,
        parallel: args.parallel,
        ubatch: args.ubatch,
        reuse: !args.no_reuse,
        special: args.special,
    };
    let group = crate::mpi_comm::group();
    if let Some(comm) = group.as_ref().filter(|c| c.rank() > 0) {
        // A follower: the same scheduler loop on rank 0's ticks, no HTTP (docs/DISTRIBUTED.md).
        let inbox = replica::Inbox::Follower(comm.clone());
        let metrics = Arc::new(worker::Metrics::default());
        return scheduler::run(engine, inbox, metrics, limits).map_err(CliError::runtime);
    }
    // `k3 ps` record, published once listening (docs/MODELS.md#k3-ps; crate::ps).
    let ps_record = crate::ps::Announcement::new(&model_dir, &engine);
    let metrics = Arc::new(worker::Metrics::default());
    // Admission is counted by `Shared::admission`; the channel holds every admitted job.
    let admitted = args.parallel + args.queue;
    let (tx, rx) = mpsc::channel(admitted);
    let shutdown = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let inbox = match group {
        Some(comm) => replica::Inbox::Leader {
            jobs: rx,
            comm,
            shutdown: shutdown.clone(),
        },
        None => replica::Inbox::Local(rx),
    };
    let replicated = inbox.replicated();
    let (w_engine, w_metrics) = (engine.clone(), metrics.clone());
    let worker = std::thread::Builder::new()
        .name("k3-engine".into())
        .spawn(move || {
            let result = scheduler::run(w_engine, inbox, w_metrics, limits);
            if let Err(e) = &result {
                // The group cannot go on: end every rank (docs/DISTRIBUTED.md#faults).
                eprintln!("k3: error: {}{e}", crate::mpi_comm::rank_prefix());
                crate::mpi_comm::end_group(k3_engine::EXIT_RUNTIME);
            }
            result
        })
        .map_err(|e| CliError::runtime(format!("cannot start the engine thread: {e}")))?;
    let shared = Arc::new(Shared {
        engine,
        model_id,
        ctx,
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        api_key_digest: key.as_deref().map(key_digest),
        jobs: tx,
        admission: Arc::new(tokio::sync::Semaphore::new(admitted)),
        metrics,
        keep_alive: keep_alive_interval(),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(http_openai::chat_completions))
        .route("/v1/completions", post(http_openai::completions))
        .route("/v1/messages", post(http_anthropic::messages))
        .route(
            "/v1/messages/count_tokens",
            post(http_anthropic::count_tokens),
        )
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{id}", get(routes::model))
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .fallback(routes::not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(shared);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("k3-http")
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the HTTP runtime: {e}")))?;
    let served = runtime.block_on(async move {
        let addr = format!("{}:{port}", args.host);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| CliError::usage(format!("cannot listen on {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| CliError::runtime(format!("cannot read the bound address: {e}")))?;
        // The signals are caught, and the record published, before the address is announced:
        // whoever reads `listening on` finds the server in `k3 ps` and can stop it cleanly.
        let stop = on_signal(shutdown, replicated);
        // Removed when serve returns.
        let _ps_record = ps_record.publish(local.port());
        worker::log(format_args!("k3: listening on http://{local}"));
        status_line::start();
        let serving = axum::serve(listener, app);
        let served = match replicated {
            // Over ranks SIGINT/SIGTERM stop every rank cleanly: the scheduler's next tick
            // tells the followers, live requests fail, then the server closes.
            true => serving.with_graceful_shutdown(stop).await,
            // One process: a signal ends serving at once (open connections are closed, live
            // generations dropped), so the `k3 ps` record goes and the exit code is 0.
            false => tokio::select! {
                served = serving => served,
                () = stop => Ok(()),
            },
        };
        served.map_err(|e| CliError::runtime(format!("server error: {e}")))
    });
    drop(runtime);
    if replicated {
        // The followers wait for the scheduler's shutdown tick.
        match worker.join() {
            Ok(r) => r.map_err(CliError::runtime)?,
            Err(_) => return Err(CliError::runtime("the engine thread panicked")),
        }
    }
    served
}

/// Catches SIGINT and SIGTERM from this call on (inside the runtime); the future resolves at
/// the first of them, after setting `shutdown` (over ranks the scheduler's next tick carries
/// it to every rank).
fn on_signal(
    shutdown: Arc<std::sync::atomic::AtomicBool>,
    replicated: bool,
) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let caught = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        let (Ok(mut int), Ok(mut term)) = caught else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = int.recv() => {},
            _ = term.recv() => {},
        }
        worker::log(match replicated {
            true => "k3: shutting down (every rank)",
            false => "k3: shutting down",
        });
        shutdown.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
