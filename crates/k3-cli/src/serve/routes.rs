//! HTTP handlers: parse and validate, render the prompt, queue a job for the worker, and turn
//! its events into a JSON body or an SSE stream.

use super::types::{
    parse_body, validate_chat, validate_completion, ApiError, ChatRequest, CompletionRequest,
    GenSettings,
};
use super::worker::{Event, Job, JobKind, Metrics, Summary};
use super::Shared;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// Default most new tokens when the request gives no `max_tokens`.
const DEFAULT_MAX_TOKENS: usize = 512;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Constant-time check of the `Authorization: Bearer KEY` header (when a key is set).
pub fn authorize(shared: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = &shared.api_key_digest else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if super::digest_eq(&super::key_digest(given), expected) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            "invalid or missing API key (Authorization: Bearer KEY)",
        ))
    }
}

fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
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

/// Checks the prompt against the context and queues the job; returns its event receiver.
fn submit(
    shared: &Shared,
    id: &str,
    kind: JobKind,
    prompt: Vec<u32>,
    settings: GenSettings,
) -> Result<mpsc::UnboundedReceiver<Event>, ApiError> {
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
    let room = ctx - prompt.len();
    let max_new = settings.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).min(room);
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        id: id.to_string(),
        queued: Instant::now(),
        kind,
        prompt,
        settings,
        max_new,
        events: tx,
    };
    shared.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
    shared.metrics.requests.fetch_add(1, Ordering::Relaxed);
    match shared.jobs.try_send(job) {
        Ok(()) => Ok(rx),
        Err(e) => {
            shared.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            Err(match e {
                mpsc::error::TrySendError::Full(_) => ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    Some("queue_full"),
                    "the generation queue is full: retry later",
                ),
                mpsc::error::TrySendError::Closed(_) => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    None,
                    "the engine worker has stopped",
                ),
            })
        }
    }
}

fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_reused": s.prompt_tokens_reused,
    })
}

fn timings(s: &Summary) -> Value {
    let rate = |n: usize, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let fed = s.prompt_tokens - s.prompt_tokens_reused;
    json!({
        "prompt_n": fed,
        "prompt_ms": s.prompt_seconds * 1e3,
        "prompt_per_second": rate(fed, s.prompt_seconds),
        "predicted_n": s.completion_tokens,
        "predicted_ms": s.predicted_seconds * 1e3,
        "predicted_per_second": rate(s.completion_tokens, s.predicted_seconds),
        "bytes_read": s.bytes_read,
        "expert_hit_rate": s.expert_hit_rate,
    })
}

fn worker_failed(message: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        None,
        message,
    )
}

/// Collects a whole generation (non-streaming). Dropping this future (client gone) drops the
/// receiver, which cancels the generation at the next token.
async fn collect(
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> Result<(String, String, Summary), ApiError> {
    let (mut content, mut reasoning) = (String::new(), String::new());
    while let Some(event) = rx.recv().await {
        match event {
            Event::Delta {
                content: c,
                reasoning: r,
            } => {
                content.push_str(&c);
                reasoning.push_str(&r);
            }
            Event::Done(s) => return Ok((content, reasoning, s)),
            Event::Failed(m) => return Err(worker_failed(m)),
        }
    }
    Err(worker_failed("the engine worker stopped".into()))
}

/// An SSE body: one `data:` line per worker event, `make` building each chunk, and a
/// `: keep-alive` comment whenever no event came for `keep_alive` (e.g. while queued).
fn sse(
    rx: mpsc::UnboundedReceiver<Event>,
    keep_alive: Duration,
    make: impl Fn(&Event) -> Value + Send + Sync + 'static,
) -> Response {
    let make = Arc::new(make);
    let stream = futures_util::stream::unfold(Some(rx), move |rx| {
        let make = make.clone();
        let out = async move {
            let mut rx = rx?;
            let event = match tokio::time::timeout(keep_alive, rx.recv()).await {
                Err(_) => {
                    let comment = Bytes::from_static(b": keep-alive\n\n");
                    return Some((Ok::<Bytes, Infallible>(comment), Some(rx)));
                }
                Ok(event) => event?,
            };
            let mut text = format!("data: {}\n\n", make(&event));
            let next = match event {
                Event::Delta { .. } => Some(rx),
                Event::Done(_) | Event::Failed(_) => {
                    text.push_str("data: [DONE]\n\n");
                    None
                }
            };
            Some((Ok::<Bytes, Infallible>(Bytes::from(text)), next))
        };
        out
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A 200 response with a JSON body.
pub fn json_response(v: Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn error_value(message: &str) -> Value {
    json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}})
}

pub async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    authorize(&shared, &headers)?;
    let req: ChatRequest = parse_body(&body_bytes(body)?)?;
    let (settings, thinking, messages) = validate_chat(&req)?;
    let tok = shared
        .engine
        .tokenizer()
        .ok_or_else(|| worker_failed("the model has no tokenizer".into()))?;
    let prompt = k3_engine::chat_template::render(tok, &messages, thinking, true)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let (stream, with_usage) = (settings.stream, settings.include_usage);
    let id = format!("chatcmpl-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let rx = submit(&shared, &id, JobKind::Chat(thinking), prompt, settings)?;
    let (created, model) = (now(), shared.model_id.clone());
    if stream {
        let started = std::sync::atomic::AtomicBool::new(false);
        return Ok(sse(rx, shared.keep_alive, move |event| {
            let chunk = |delta: Value, finish: Value| {
                json!({"id": id, "object": "chat.completion.chunk", "created": created,
                       "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            };
            match event {
                Event::Delta { content, reasoning } => {
                    let mut delta = serde_json::Map::new();
                    if !started.swap(true, Ordering::Relaxed) {
                        delta.insert("role".into(), json!("assistant"));
                    }
                    if !content.is_empty() {
                        delta.insert("content".into(), json!(content));
                    }
                    if !reasoning.is_empty() {
                        delta.insert("reasoning_content".into(), json!(reasoning));
                    }
                    chunk(Value::Object(delta), Value::Null)
                }
                Event::Done(s) => {
                    let mut c = chunk(json!({}), json!(s.finish_reason));
                    if with_usage {
                        c["usage"] = usage(s);
                        c["timings"] = timings(s);
                    }
                    c
                }
                Event::Failed(m) => error_value(m),
            }
        }));
    }
    let (content, reasoning, s) = collect(rx).await?;
    let mut message = json!({"role": "assistant", "content": content});
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    Ok(json_response(json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": s.finish_reason}],
        "usage": usage(&s), "timings": timings(&s),
    }))
    .into_response())
}

pub async fn completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    authorize(&shared, &headers)?;
    let req: CompletionRequest = parse_body(&body_bytes(body)?)?;
    let (settings, text) = validate_completion(&req)?;
    let tok = shared
        .engine
        .tokenizer()
        .ok_or_else(|| worker_failed("the model has no tokenizer".into()))?;
    let prompt = tok.encode(&text, false);
    let (stream, with_usage) = (settings.stream, settings.include_usage);
    let kind = JobKind::Completion {
        ignore_eos: req.common.ignore_eos,
    };
    let id = format!("cmpl-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let rx = submit(&shared, &id, kind, prompt, settings)?;
    let (created, model) = (now(), shared.model_id.clone());
    let choice = |text: &str, finish: Value| json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]);
    if stream {
        return Ok(sse(rx, shared.keep_alive, move |event| {
            let base = |choices: Value| {
                json!({"id": id, "object": "text_completion", "created": created,
                       "model": model, "choices": choices})
            };
            match event {
                Event::Delta { content, .. } => base(choice(content, Value::Null)),
                Event::Done(s) => {
                    let mut c = base(choice("", json!(s.finish_reason)));
                    if with_usage {
                        c["usage"] = usage(s);
                        c["timings"] = timings(s);
                    }
                    c
                }
                Event::Failed(m) => error_value(m),
            }
        }));
    }
    let (content, _, s) = collect(rx).await?;
    Ok(json_response(json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": choice(&content, json!(s.finish_reason)),
        "usage": usage(&s), "timings": timings(&s),
    }))
    .into_response())
}

pub async fn models(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
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
) -> Result<Response, ApiError> {
    authorize(&shared, &headers)?;
    if id != shared.model_id {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model `{id}` does not exist: this server serves `{}`",
                shared.model_id
            ),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        });
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
    let lines: [(&str, &str, &str, String); 8] = [
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
) -> Result<Response, ApiError> {
    authorize(&shared, &headers)?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics_text(&shared),
    )
        .into_response())
}

pub async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("not_found"),
        "no such endpoint: see /v1/chat/completions, /v1/completions, /v1/models, /v1/models/{id}, /health, /metrics",
    )
}
