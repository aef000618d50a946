//! Starting the core and serving it: [`Core`] (the scheduler thread and the router, for a
//! program that nests k3's routes into its own axum app) and [`serve`] (bind, serve until
//! SIGINT/SIGTERM; over MPI ranks every rank runs the scheduler, rank 0 serves HTTP).

use crate::error_body::OpenAiError;
use crate::events::{Events, Quiet};
use crate::replica::Inbox;
use crate::scheduler::{self, Limits};
use crate::worker::{Job, Metrics};
use crate::{
    http_anthropic, http_openai, keep_alive_interval, key_digest, routes, status_api, Shared,
    BODY_LIMIT,
};
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use k3_api::ApiError;
use k3_engine::{Comm, Engine};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::mpsc;

/// What the server allows; `k3 serve`'s flags (docs/SERVER.md).
#[derive(Debug, Clone)]
pub struct Options {
    /// Name of the model in `/v1/models` and in replies.
    pub model_id: String,
    /// Context positions per request (prompt + reply).
    pub ctx: usize,
    /// Generations batched together at most.
    pub parallel: usize,
    /// Requests that may wait while `parallel` others generate; more ⇒ 429.
    pub queue: usize,
    /// Prompt tokens fed per step while other requests generate.
    pub ubatch: usize,
    /// Keep saved sessions for conversation state reuse.
    pub reuse: bool,
    /// `Authorization: Bearer KEY` (or `x-api-key: KEY`) required on /v1/* and /metrics.
    pub api_key: Option<String>,
    /// Serve the chat page at `/` (docs/SERVER.md "Chat page").
    pub webui: bool,
    /// Print control tokens the model writes as their spellings (llama.cpp's `--special`);
    /// by default they are left out of every reply (docs/SERVER.md "Control tokens").
    pub special: bool,
}

impl Options {
    /// Defaults as `k3 serve` has them, for a model called `model_id`.
    pub fn new(model_id: impl Into<String>, ctx: usize) -> Options {
        Options {
            model_id: model_id.into(),
            ctx,
            parallel: 4,
            queue: 8,
            ubatch: 64,
            reuse: true,
            api_key: None,
            webui: true,
            special: false,
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            ctx: self.ctx,
            parallel: self.parallel,
            ubatch: self.ubatch,
            reuse: self.reuse,
            special: self.special,
        }
    }
}

/// Why the server could not start or went down.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The options or the address cannot be used (exit code 2 in the binary).
    #[error("{0}")]
    Usage(String),
    /// The server failed while running (exit code 1).
    #[error("{0}")]
    Runtime(String),
}

/// The serving core: the scheduler thread that owns the engine's generations, and the state
/// every handler shares. Dropping it (and every router made from it) ends the scheduler
/// once its live requests are answered.
pub struct Core {
    shared: Arc<Shared>,
    webui: bool,
    scheduler: Option<JoinHandle<Result<(), String>>>,
}

impl Core {
    /// Starts the scheduler thread for one process.
    pub fn start(
        engine: Arc<Engine>,
        options: &Options,
        events: Arc<dyn Events>,
    ) -> Result<Core, ServeError> {
        let (tx, rx) = job_channel(options)?;
        let metrics = Arc::new(Metrics::default());
        let scheduler = spawn_scheduler(
            engine.clone(),
            Inbox::Local(rx),
            metrics.clone(),
            options.limits(),
            events,
            None,
        )?;
        Ok(Core {
            shared: shared(engine, options, tx, metrics),
            webui: options.webui,
            scheduler: Some(scheduler),
        })
    }

    /// The OpenAI and Anthropic routes (`/v1/chat/completions`, `/v1/completions`,
    /// `/v1/messages`, `/v1/messages/count_tokens`, `/v1/models`), `/v1/status`, `/health`,
    /// `/metrics` and, unless [`Options::webui`] is off, the chat page at `/`, with a 1 MiB body
    /// limit; unknown paths answer 404 in OpenAI's error shape.
    pub fn router(&self) -> Router {
        router(self.shared.clone(), self.webui)
    }

    /// Waits for the scheduler once every router is dropped.
    pub fn join(mut self) -> Result<(), ServeError> {
        let shared = self.shared;
        drop(shared);
        match self.scheduler.take().map(JoinHandle::join) {
            Some(Ok(r)) => r.map_err(ServeError::Runtime),
            Some(Err(_)) => Err(ServeError::Runtime("the engine thread panicked".into())),
            None => Ok(()),
        }
    }
}

fn job_channel(options: &Options) -> Result<(mpsc::Sender<Job>, mpsc::Receiver<Job>), ServeError> {
    if options.parallel == 0 || options.ubatch == 0 {
        return Err(ServeError::Usage(
            "--parallel and --ubatch must be at least 1".into(),
        ));
    }
    if options.queue == 0 {
        return Err(ServeError::Usage("--queue must be at least 1".into()));
    }
    // Admission is counted by `Shared::admission`; the channel holds every admitted job.
    Ok(mpsc::channel(options.parallel + options.queue))
}

fn shared(
    engine: Arc<Engine>,
    options: &Options,
    jobs: mpsc::Sender<Job>,
    metrics: Arc<Metrics>,
) -> Arc<Shared> {
    Arc::new(Shared {
        engine,
        model_id: options.model_id.clone(),
        ctx: options.ctx,
        started: routes::now(),
        api_key_digest: options.api_key.as_deref().map(key_digest),
        jobs,
        admission: Arc::new(tokio::sync::Semaphore::new(
            options.parallel + options.queue,
        )),
        metrics,
        keep_alive: keep_alive_interval(),
    })
}

fn router(shared: Arc<Shared>, webui: bool) -> Router {
    Router::new()
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
        .route("/v1/status", get(status_api::status))
        .merge(match webui {
            true => crate::webui::router(),
            false => Router::new(),
        })
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(shared)
}

/// 404 for an unknown path; in Anthropic's shape under `/v1/messages`.
async fn not_found(uri: axum::http::Uri) -> Response {
    let e = ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("not_found"),
        "no such endpoint: see /v1/chat/completions, /v1/completions, /v1/messages, /v1/messages/count_tokens, /v1/models, /v1/models/{id}, /v1/status, /health, /metrics",
    );
    if uri.path().starts_with("/v1/messages") {
        http_anthropic::AnthropicError(e).into_response()
    } else {
        OpenAiError(e).into_response()
    }
}

/// The scheduler on its own thread; over ranks a failure ends every rank
/// (docs/DISTRIBUTED.md#faults).
fn spawn_scheduler(
    engine: Arc<Engine>,
    inbox: Inbox,
    metrics: Arc<Metrics>,
    limits: Limits,
    events: Arc<dyn Events>,
    group: Option<Arc<dyn Comm>>,
) -> Result<JoinHandle<Result<(), String>>, ServeError> {
    std::thread::Builder::new()
        .name("k3-engine".into())
        .spawn(move || {
            let result = scheduler::run(engine, inbox, metrics, limits, events);
            if let (Err(e), Some(comm)) = (&result, &group) {
                // The group cannot go on: end every rank (the transport reports `e`).
                comm.abort(e);
            }
            result
        })
        .map_err(|e| ServeError::Runtime(format!("cannot start the engine thread: {e}")))
}

/// Serves `engine` on `host:port` until SIGINT or SIGTERM. With `group` (one rank of an MPI
/// job), rank 0 serves HTTP and broadcasts each scheduler tick; the other ranks run the same
/// scheduler on those ticks and serve nothing (docs/DISTRIBUTED.md#serve-over-ranks).
pub fn serve(
    engine: Arc<Engine>,
    options: &Options,
    addr: &str,
    group: Option<Arc<dyn Comm>>,
    events: Arc<dyn Events>,
) -> Result<(), ServeError> {
    let limits = options.limits();
    if let Some(comm) = group.as_ref().filter(|c| c.rank() > 0) {
        let inbox = Inbox::Follower(comm.clone());
        let metrics = Arc::new(Metrics::default());
        return scheduler::run(engine, inbox, metrics, limits, Arc::new(Quiet))
            .map_err(ServeError::Runtime);
    }
    let (tx, rx) = job_channel(options)?;
    let metrics = Arc::new(Metrics::default());
    let shutdown = Arc::new(AtomicBool::new(false));
    let inbox = match group.clone() {
        Some(comm) => Inbox::Leader {
            jobs: rx,
            comm,
            shutdown: shutdown.clone(),
        },
        None => Inbox::Local(rx),
    };
    let replicated = inbox.replicated();
    let worker = spawn_scheduler(
        engine.clone(),
        inbox,
        metrics.clone(),
        limits,
        events.clone(),
        group,
    )?;
    let app = router(shared(engine, options, tx, metrics), options.webui);
    let served = run_http(app, addr, shutdown, replicated, events);
    if replicated {
        // The followers wait for the scheduler's shutdown tick.
        match worker.join() {
            Ok(r) => r.map_err(ServeError::Runtime)?,
            Err(_) => return Err(ServeError::Runtime("the engine thread panicked".into())),
        }
    }
    served
}

/// Binds `addr` and serves `app` on a small runtime until a signal.
fn run_http(
    app: Router,
    addr: &str,
    shutdown: Arc<AtomicBool>,
    replicated: bool,
    events: Arc<dyn Events>,
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("k3-http")
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| ServeError::Runtime(format!("cannot start the HTTP runtime: {e}")))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ServeError::Usage(format!("cannot listen on {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| ServeError::Runtime(format!("cannot read the bound address: {e}")))?;
        // The signals are caught, and `listening` reported, before the address is announced:
        // whoever reads `listening on` finds the server in `k3 ps` and can stop it cleanly.
        let stop = on_signal(shutdown, replicated, events.clone());
        events.listening(local);
        events.log(&format!("k3: listening on http://{local}"));
        let serving = axum::serve(listener, app);
        let served = match replicated {
            // Over ranks SIGINT/SIGTERM stop every rank cleanly: the scheduler's next tick
            // tells the followers, live requests fail, then the server closes.
            true => serving.with_graceful_shutdown(stop).await,
            // One process: a signal ends serving at once (open connections are closed, live
            // generations dropped), so the exit code is 0.
            false => tokio::select! {
                served = serving => served,
                () = stop => Ok(()),
            },
        };
        served.map_err(|e| ServeError::Runtime(format!("server error: {e}")))
    })
}

/// Catches SIGINT and SIGTERM from this call on (inside the runtime); the future resolves at
/// the first of them, after setting `shutdown` (over ranks the scheduler's next tick carries
/// it to every rank).
fn on_signal(
    shutdown: Arc<AtomicBool>,
    replicated: bool,
    events: Arc<dyn Events>,
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
        events.log(match replicated {
            true => "k3: shutting down (every rank)",
            false => "k3: shutting down",
        });
        shutdown.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
