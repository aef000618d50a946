//! The server core's HTTP side, shared by the protocol adapters (`http_openai.rs`,
//! `http_anthropic.rs`): authorization, admission and queueing of jobs, collecting or
//! streaming their neutral events, and the protocol-free endpoints (models, health,
//! metrics).

use super::worker::{ChatJob, Event, Job, JobConstraint, JobKind, Metrics, Summary};
use super::Shared;
use crate::error_body::OpenAiError;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use k3_api::neutral::Request;
use k3_api::{ApiError, GenSettings};
use k3_engine::chat_template::{render_with_tools, Thinking};
use k3_engine::{Constraint, ConstraintSpec, ReplyStart, TokenLogprob};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// Default most new tokens when the request gives no `max_tokens`.
const DEFAULT_MAX_TOKENS: usize = 512;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh response id: `prefix` and a number unique in this process.
pub fn next_id(prefix: &str) -> String {
    format!("{prefix}{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Constant-time check of the API key (when one is set), given as `Authorization: Bearer
/// KEY` (OpenAI) or `x-api-key: KEY` (Anthropic); either header may carry it.
pub fn authorize(shared: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &shared.api_key_digest else {
        return Ok(());
    };
    let header_value = |name| {
        headers
            .get(name)
            .and_then(|v: &header::HeaderValue| v.to_str().ok())
    };
    let bearer = header_value(header::AUTHORIZATION.as_str())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let x_api_key = header_value("x-api-key").unwrap_or("");
    let bearer_ok = super::digest_eq(&super::key_digest(bearer), expected);
    let x_api_key_ok = super::digest_eq(&super::key_digest(x_api_key), expected);
    if bearer_ok | x_api_key_ok {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            "invalid or missing API key (Authorization: Bearer KEY or x-api-key: KEY)",
        ))
    }
}

pub fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let status = e.status();
        let err = ApiError::new(status, "invalid_request_error", None, e.body_text());
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            err.with_code("request_too_large")
        } else {
            err
        }
    })
}

/// Renders a neutral chat request's prompt (its tools declared, its tool calls and results
/// in place) and describes its job: whether its reply is parsed for calls, with which id
/// prefix (`call_`, `toolu_`), and the constraint its sampler enforces (docs/SERVER.md
/// "Tools"); a schema the grammar cannot enforce is a 400 naming the field.
pub fn render_chat(
    shared: &Shared,
    request: &Request,
    endpoint: &'static str,
) -> Result<(Vec<u32>, JobKind, Option<JobConstraint>), ApiError> {
    let messages = request.to_template()?;
    let tok = shared
        .engine
        .tokenizer()
        .ok_or_else(|| worker_failed("the model has no tokenizer".into()))?;
    let tools = request.declared_tools();
    let prompt = render_with_tools(tok, &messages, &tools, request.thinking, true)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let start = if request.thinking == Thinking::Off {
        ReplyStart::Response
    } else {
        ReplyStart::Think
    };
    let constraint = match request.constraint_spec() {
        Some(spec) => {
            let param = match spec {
                ConstraintSpec::ToolCalls { .. } => "tools",
                _ => "response_format",
            };
            let compiled = Constraint::new(tok, &spec, start)
                .map_err(|e| ApiError::invalid(param, format!("{param}: {e}")))?;
            Some(JobConstraint {
                compiled,
                spec,
                start,
            })
        }
        None => None,
    };
    let call_id_prefix = match (request.parses_calls(), endpoint) {
        (false, _) => None,
        (true, "/v1/messages") => Some("toolu_"),
        (true, _) => Some("call_"),
    };
    let job = ChatJob {
        thinking: request.thinking,
        ignore_eos: request.ignore_eos,
        think_budget: request.thinking_budget,
        endpoint,
        call_id_prefix,
    };
    Ok((prompt, JobKind::Chat(job), constraint))
}

/// The 429 of a full queue.
fn queue_full() -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        Some("queue_full"),
        "the generation queue is full: retry later",
    )
}

/// Checks the prompt against the context and queues the job; returns its event receiver.
/// Queues one job per choice (`settings.n`; choice i > 0 samples from seed + i) and returns
/// their events merged on one channel, tagged with the choice index. Admission: at most
/// `--parallel` + `--queue` jobs are generating or waiting at once (one permit each, held
/// until the job is dropped); all or nothing: when not every choice gets a permit, none is
/// queued and the request gets 429.
pub fn submit(
    shared: &Shared,
    id: &str,
    kind: JobKind,
    prompt: Vec<u32>,
    settings: GenSettings,
    constraint: Option<JobConstraint>,
) -> Result<mpsc::UnboundedReceiver<(usize, Event)>, ApiError> {
    let ctx = shared.ctx;
    let param = match kind {
        JobKind::Chat(_) => "messages",
        JobKind::Completion { .. } => "prompt",
    };
    if prompt.len() >= ctx {
        return Err(ApiError::invalid(
            param,
            format!(
                "the prompt is {} tokens but the context is {ctx} (leaving no room to generate): shorten it or restart with a larger --ctx",
                prompt.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    if prompt.is_empty() {
        return Err(ApiError::invalid(param, "the prompt is empty"));
    }
    let max_new = super::room::max_new(prompt.len(), ctx, settings.max_tokens, DEFAULT_MAX_TOKENS)?;
    let mut permits = Vec::with_capacity(settings.n);
    for _ in 0..settings.n {
        permits.push(
            shared
                .admission
                .clone()
                .try_acquire_owned()
                .map_err(|_| queue_full())?,
        );
    }
    shared.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let mut receivers = Vec::with_capacity(settings.n);
    for (index, permit) in permits.into_iter().enumerate() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut settings = settings.clone();
        settings.params.seed = settings.params.seed.wrapping_add(index as u64);
        let job = Job {
            id: id.to_string(),
            queued: Instant::now(),
            kind,
            prompt: prompt.clone(),
            settings,
            constraint: constraint.clone(),
            max_new,
            index,
            events: tx,
            _admission: permit,
        };
        shared.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
        let events = job.events.downgrade();
        shared
            .metrics
            .live
            .enqueue(id, move || events.upgrade().is_some());
        if let Err(e) = shared.jobs.try_send(job) {
            shared.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            shared.metrics.live.dequeue(id);
            return Err(match e {
                // The channel holds every permit's job; kept as a backstop.
                mpsc::error::TrySendError::Full(_) => queue_full(),
                mpsc::error::TrySendError::Closed(_) => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    None,
                    "the engine worker has stopped",
                ),
            });
        }
        receivers.push(rx);
    }
    Ok(merge(receivers))
}

/// Every choice's events on one channel, tagged with the choice index. A forwarder ends as
/// soon as the merged receiver is dropped (the client left), dropping its job's receiver so
/// the scheduler cancels the job — queued or running.
fn merge(
    receivers: Vec<mpsc::UnboundedReceiver<Event>>,
) -> mpsc::UnboundedReceiver<(usize, Event)> {
    let (tx, merged) = mpsc::unbounded_channel();
    for (index, mut rx) in receivers.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tx.closed() => break,
                    event = rx.recv() => match event {
                        Some(e) => {
                            if tx.send((index, e)).is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
        });
    }
    merged
}

pub fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_reused": s.prompt_tokens_reused,
    })
}

/// Usage of a whole request: the prompt once, every choice's completion tokens.
pub fn usage_all(all: &[Choice]) -> Value {
    let mut u = usage(&all[0].summary);
    let completion: usize = all.iter().map(|c| c.summary.completion_tokens).sum();
    u["completion_tokens"] = json!(completion);
    u["total_tokens"] = json!(all[0].summary.prompt_tokens + completion);
    u
}

pub fn timings(s: &Summary) -> Value {
    let rate = |n: usize, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let fed = s.prompt_tokens - s.prompt_tokens_reused;
    json!({
        "prompt_n": fed,
        "prompt_ms": s.prompt_seconds * 1e3,
        "prompt_per_second": rate(fed, s.prompt_seconds),
        "predicted_n": s.completion_tokens,
        "predicted_ms": s.predicted_seconds * 1e3,
        "predicted_per_second": rate(s.completion_tokens, s.predicted_seconds),
        "queue_ms": s.queue_seconds * 1e3,
        "first_token_ms": s.first_token_seconds * 1e3,
        "max_token_gap_ms": s.max_token_gap_seconds * 1e3,
        "mean_batch": s.mean_batch,
        "bytes_read": s.bytes_read,
        "expert_hit_rate": s.expert_hit_rate,
        "decode": s.decode.json(),
    })
}

pub fn worker_failed(message: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        None,
        message,
    )
}

/// A tool call of a finished reply: id, name and arguments (JSON text).
#[derive(Clone, Debug, Default)]
pub struct CollectedCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One choice of a non-streaming request, collected from its events.
#[derive(Clone, Debug, Default)]
pub struct Partial {
    pub content: String,
    pub reasoning: String,
    pub logprobs: Vec<TokenLogprob>,
    pub tool_calls: Vec<CollectedCall>,
    pub summary: Option<Summary>,
}

/// A finished choice.
pub struct Choice {
    pub reply: Partial,
    pub summary: Summary,
}

impl Partial {
    /// Adds one event of this choice; `true` when it was the last (done or failed).
    pub fn add(&mut self, event: Event) -> Result<bool, ApiError> {
        match event {
            Event::Delta {
                content,
                reasoning,
                logprobs,
            } => {
                self.content.push_str(&content);
                self.reasoning.push_str(&reasoning);
                self.logprobs.extend(logprobs);
            }
            Event::ToolCallStart { call, id, name } => {
                if self.tool_calls.len() <= call {
                    self.tool_calls.resize(call + 1, CollectedCall::default());
                }
                self.tool_calls[call].id = id;
                self.tool_calls[call].name = name;
            }
            Event::ToolCallArguments { call, fragment } => {
                if let Some(c) = self.tool_calls.get_mut(call) {
                    c.arguments.push_str(&fragment);
                }
            }
            Event::ToolCallEnd { .. } => {}
            Event::Done(s) => {
                self.summary = Some(s);
                return Ok(true);
            }
            Event::Failed(m) => return Err(worker_failed(m)),
        }
        Ok(false)
    }
}

/// Waits for all `n` choices; the first failure fails the request.
pub async fn collect(
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
) -> Result<Vec<Choice>, ApiError> {
    let mut partial = vec![Partial::default(); n];
    let mut left = n;
    while left > 0 {
        let Some((i, event)) = rx.recv().await else {
            return Err(worker_failed("the engine worker stopped".into()));
        };
        if partial[i].add(event)? {
            left -= 1;
        }
    }
    Ok(partial
        .into_iter()
        .filter_map(|mut reply| {
            let summary = reply.summary.take()?;
            Some(Choice { reply, summary })
        })
        .collect())
}

/// How a protocol's SSE body is framed around the events `make` formats.
pub struct SseFraming {
    /// Sent first (Anthropic's `message_start`), or empty.
    pub prologue: String,
    /// Sent while nothing else comes for the keep-alive interval.
    pub keep_alive: &'static str,
    /// Sent after the last choice finished (OpenAI's `data: [DONE]`), or empty.
    pub finale: &'static str,
}

/// The SSE body: `make`'s text for each choice event, `framing.keep_alive` while nothing
/// comes, `framing.finale` after every one of the `n` choices has finished (or one failed).
pub fn sse(
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
    keep_alive: Duration,
    framing: SseFraming,
    make: impl FnMut(usize, &Event) -> String + Send + 'static,
) -> Response {
    let prologue = Bytes::from(framing.prologue);
    let first = (!prologue.is_empty()).then_some(prologue);
    let state = Some((rx, n, make, first));
    let stream = futures_util::stream::unfold(state, move |state| async move {
        let (mut rx, mut left, mut make, first) = state?;
        if let Some(bytes) = first {
            return Some((Ok::<Bytes, Infallible>(bytes), Some((rx, left, make, None))));
        }
        let (index, event) = match tokio::time::timeout(keep_alive, rx.recv()).await {
            Err(_) => {
                let ping = Bytes::from_static(framing.keep_alive.as_bytes());
                return Some((Ok(ping), Some((rx, left, make, None))));
            }
            Ok(event) => event?,
        };
        let mut text = make(index, &event);
        match event {
            Event::Done(_) => left -= 1,
            Event::Failed(_) => left = 0,
            _ => {}
        }
        if left == 0 {
            text.push_str(framing.finale);
            return Some((Ok(Bytes::from(text)), None));
        }
        Some((Ok(Bytes::from(text)), Some((rx, left, make, None))))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

pub fn json_response(v: Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

pub async fn models(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, OpenAiError> {
    authorize(&shared, &headers)?;
    Ok(json_response(json!({"object": "list", "data": [model_object(&shared)]})).into_response())
}

fn model_object(shared: &Shared) -> Value {
    json!({"id": shared.model_id, "object": "model", "created": shared.started, "owned_by": "k3"})
}

/// `GET /v1/models/{id}`: the served model, or 404 `model_not_found`.
pub async fn model(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, OpenAiError> {
    authorize(&shared, &headers)?;
    if id != shared.model_id {
        return Err(OpenAiError(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model `{id}` does not exist: this server serves `{}`",
                shared.model_id
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }));
    }
    Ok(json_response(model_object(&shared)).into_response())
}

pub async fn health() -> Response {
    json_response(json!({"status": "ok"})).into_response()
}

/// Resident set size from `/proc/self/status` (0 where unavailable).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn metrics_text(shared: &Shared) -> String {
    let m: &Metrics = &shared.metrics;
    let stats = shared.engine.stats();
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let lines: Vec<(&str, &str, &str, String)> = vec![
        (
            "k3_tokens_generated_total",
            "counter",
            "Tokens generated.",
            load(&m.tokens_generated).to_string(),
        ),
        (
            "k3_prompt_tokens_total",
            "counter",
            "Prompt tokens of all requests (reused included).",
            load(&m.prompt_tokens).to_string(),
        ),
        (
            "k3_prompt_tokens_reused_total",
            "counter",
            "Prompt tokens restored from saved sessions instead of fed.",
            load(&m.prompt_tokens_reused).to_string(),
        ),
        (
            "k3_seconds_per_token",
            "gauge",
            "Seconds per generated token of the last generation.",
            f64::from_bits(load(&m.seconds_per_token_bits)).to_string(),
        ),
        (
            "k3_bytes_read_total",
            "counter",
            "Weight bytes read from disk.",
            stats.bytes_read().to_string(),
        ),
        (
            "k3_sessions_active",
            "gauge",
            "Sessions generating or prefilling now (the batch).",
            load(&m.active_sessions).to_string(),
        ),
        (
            "k3_max_token_gap_seconds",
            "gauge",
            "Longest wait between two tokens of the last finished request.",
            f64::from_bits(load(&m.max_token_gap_bits)).to_string(),
        ),
        (
            "k3_trunk_bytes_read_total",
            "counter",
            "Trunk bytes read from disk (streamed layers).",
            stats.trunk_bytes_read.to_string(),
        ),
        (
            "k3_expert_hit_rate",
            "gauge",
            "Routed-expert cache hit rate since start.",
            stats.expert_hit_rate().to_string(),
        ),
        (
            "k3_queue_depth",
            "gauge",
            "Requests waiting for the engine worker.",
            load(&m.queue_depth).to_string(),
        ),
        (
            "k3_resident_memory_bytes",
            "gauge",
            "Resident set size (VmRSS).",
            resident_bytes().to_string(),
        ),
    ];
    let lines = lines.into_iter().chain(m.decode.metric_lines());
    let mut out = String::new();
    for (name, kind, help, value) in lines {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        ));
    }
    out
}

pub async fn metrics(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, OpenAiError> {
    authorize(&shared, &headers)?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics_text(&shared),
    )
        .into_response())
}
