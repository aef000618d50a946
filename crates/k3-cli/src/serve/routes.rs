//! HTTP handlers: parse and validate, render the prompt, queue a job for the worker, and turn
//! its events into a JSON body or an SSE stream.

use super::types::{
    parse_body, validate_chat, validate_completion, ApiError, ChatRequest, CompletionRequest,
    GenSettings, Prompt,
};
use super::worker::{Event, Job, JobKind, Metrics, Summary};
use super::Shared;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use k3_engine::{TokenLogprob, Tokenizer};
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
/// Queues one job per choice (`settings.n`; choice i > 0 samples from seed + i) and returns
/// their events merged on one channel, tagged with the choice index. All or nothing: when
/// the queue cannot take every choice, none runs (the queued ones are cancelled) and the
/// request gets 429.
fn submit(
    shared: &Shared,
    id: &str,
    kind: JobKind,
    prompt: Vec<u32>,
    settings: GenSettings,
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
    let room = ctx - prompt.len();
    let max_new = settings.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).min(room);
    shared.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let mut receivers = Vec::with_capacity(settings.n);
    for index in 0..settings.n {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut settings = settings.clone();
        settings.params.seed = settings.params.seed.wrapping_add(index as u64);
        let job = Job {
            id: id.to_string(),
            queued: Instant::now(),
            kind,
            prompt: prompt.clone(),
            settings,
            max_new,
            index,
            events: tx,
        };
        shared.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = shared.jobs.try_send(job) {
            shared.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            return Err(match e {
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

fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_reused": s.prompt_tokens_reused,
    })
}

/// Usage of a whole request: the prompt once, every choice's completion tokens.
fn usage_all(all: &[Choice]) -> Value {
    let mut u = usage(&all[0].summary);
    let completion: usize = all.iter().map(|c| c.summary.completion_tokens).sum();
    u["completion_tokens"] = json!(completion);
    u["total_tokens"] = json!(all[0].summary.prompt_tokens + completion);
    u
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
        "queue_ms": s.queue_seconds * 1e3,
        "first_token_ms": s.first_token_seconds * 1e3,
        "max_token_gap_ms": s.max_token_gap_seconds * 1e3,
        "mean_batch": s.mean_batch,
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

/// One finished choice of a non-streaming request.
struct Choice {
    content: String,
    reasoning: String,
    logprobs: Vec<TokenLogprob>,
    summary: Summary,
}

/// Waits for all `n` choices; the first failure fails the request.
async fn collect(
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
) -> Result<Vec<Choice>, ApiError> {
    let mut text = vec![(String::new(), String::new(), Vec::new()); n];
    let mut done: Vec<Option<Summary>> = vec![None; n];
    while let Some((i, event)) = rx.recv().await {
        match event {
            Event::Delta {
                content,
                reasoning,
                logprobs,
            } => {
                text[i].0.push_str(&content);
                text[i].1.push_str(&reasoning);
                text[i].2.extend(logprobs);
            }
            Event::Done(s) => done[i] = Some(s),
            Event::Failed(m) => return Err(worker_failed(m)),
        }
        if done.iter().all(Option::is_some) {
            return Ok(text
                .into_iter()
                .zip(done)
                .filter_map(|((content, reasoning, logprobs), s)| {
                    s.map(|summary| Choice {
                        content,
                        reasoning,
                        logprobs,
                        summary,
                    })
                })
                .collect());
        }
    }
    Err(worker_failed("the engine worker stopped".into()))
}

/// A token's text (lossy UTF-8) and bytes.
fn token_text(tok: Option<&Tokenizer>, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.and_then(|t| t.token_bytes(id)).unwrap_or(&[]).to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat's `logprobs` object: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(tok: Option<&Tokenizer>, lps: &[TokenLogprob]) -> Value {
    let entry = |id: u32, logprob: f64| {
        let (token, bytes) = token_text(tok, id);
        json!({"token": token, "logprob": logprob, "bytes": bytes})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut v = entry(lp.id, lp.logprob);
            v["top_logprobs"] = lp.top.iter().map(|&(i, p)| entry(i, p)).collect();
            v
        })
        .collect();
    json!({ "content": content })
}

/// Completions' `logprobs` object: parallel `tokens`, `token_logprobs`, `top_logprobs`
/// (token → logprob) and `text_offset` (characters from the start of the completion, from
/// `offset` on).
fn completion_logprobs(tok: Option<&Tokenizer>, lps: &[TokenLogprob], offset: usize) -> Value {
    let (mut tokens, mut lp, mut top, mut offsets) = (vec![], vec![], vec![], vec![]);
    let mut at = offset;
    for l in lps {
        let (text, _) = token_text(tok, l.id);
        offsets.push(at);
        at += text.chars().count();
        tokens.push(text);
        lp.push(l.logprob);
        let alts: serde_json::Map<String, Value> = l
            .top
            .iter()
            .map(|&(i, p)| (token_text(tok, i).0, json!(p)))
            .collect();
        top.push(Value::Object(alts));
    }
    json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": offsets})
}

/// The SSE body: one `data:` event per choice event, `: keep-alive` comments while nothing
/// comes, `[DONE]` after every one of the `n` choices has finished (or one failed).
fn sse(
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
    keep_alive: Duration,
    make: impl Fn(usize, &Event) -> Value + Send + Sync + 'static,
) -> Response {
    let make = Arc::new(make);
    let stream = futures_util::stream::unfold(Some((rx, n)), move |state| {
        let make = make.clone();
        async move {
            let (mut rx, mut left) = state?;
            let (index, event) = match tokio::time::timeout(keep_alive, rx.recv()).await {
                Err(_) => {
                    let comment = Bytes::from_static(b": keep-alive\n\n");
                    return Some((Ok::<Bytes, Infallible>(comment), Some((rx, left))));
                }
                Ok(event) => event?,
            };
            let mut text = format!("data: {}\n\n", make(index, &event));
            match event {
                Event::Delta { .. } => {}
                Event::Done(_) => left -= 1,
                Event::Failed(_) => left = 0,
            }
            if left == 0 {
                text.push_str("data: [DONE]\n\n");
                return Some((Ok::<Bytes, Infallible>(Bytes::from(text)), None));
            }
            Some((Ok::<Bytes, Infallible>(Bytes::from(text)), Some((rx, left))))
        }
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
    let (stream, with_usage, n) = (settings.stream, settings.include_usage, settings.n);
    let return_tokens = settings.return_tokens;
    let want_logprobs = settings.logprobs.is_some();
    let tok_shared = shared.clone();
    let id = format!("chatcmpl-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let rx = submit(&shared, &id, JobKind::Chat(thinking), prompt, settings)?;
    let (created, model) = (now(), shared.model_id.clone());
    if stream {
        let started = std::sync::Mutex::new(vec![false; n]);
        return Ok(sse(rx, n, shared.keep_alive, move |index, event| {
            let chunk = |delta: Value, finish: Value| {
                json!({"id": id, "object": "chat.completion.chunk", "created": created,
                       "model": model, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]})
            };
            match event {
                Event::Delta {
                    content,
                    reasoning,
                    logprobs,
                } => {
                    let mut delta = serde_json::Map::new();
                    let first = started
                        .lock()
                        .map(|mut s| !std::mem::replace(&mut s[index], true))
                        .unwrap_or(false);
                    if first {
                        delta.insert("role".into(), json!("assistant"));
                    }
                    if !content.is_empty() {
                        delta.insert("content".into(), json!(content));
                    }
                    if !reasoning.is_empty() {
                        delta.insert("reasoning_content".into(), json!(reasoning));
                    }
                    let mut c = chunk(Value::Object(delta), Value::Null);
                    if want_logprobs {
                        let tok = tok_shared.engine.tokenizer();
                        c["choices"][0]["logprobs"] = chat_logprobs(tok, logprobs);
                    }
                    c
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
    let all = collect(rx, n).await?;
    let choices: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let mut message = json!({"role": "assistant", "content": c.content});
            if !c.reasoning.is_empty() {
                message["reasoning_content"] = json!(c.reasoning);
            }
            let mut v = json!({"index": index, "message": message, "finish_reason": c.summary.finish_reason,
                               "logprobs": Value::Null});
            if want_logprobs {
                v["logprobs"] = chat_logprobs(shared.engine.tokenizer(), &c.logprobs);
            }
            if return_tokens {
                v["tokens"] = json!(c.summary.ids);
            }
            v
        })
        .collect();
    Ok(json_response(json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices, "usage": usage_all(&all), "timings": timings(&all[0].summary),
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
    let (settings, prompt) = validate_completion(&req)?;
    let tok = shared
        .engine
        .tokenizer()
        .ok_or_else(|| worker_failed("the model has no tokenizer".into()))?;
    let prompt = match prompt {
        Prompt::Text(text) => tok.encode(&text, false),
        Prompt::Ids(ids) => {
            let vocab = shared.engine.config().vocab_size;
            if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is out of range: the model's vocab_size is {vocab}"),
                ));
            }
            ids
        }
    };
    let return_tokens = settings.return_tokens;
    let want_logprobs = settings.logprobs.is_some();
    let tok_shared = shared.clone();
    let (stream, with_usage, n) = (settings.stream, settings.include_usage, settings.n);
    let kind = JobKind::Completion {
        ignore_eos: req.common.ignore_eos,
    };
    let id = format!("cmpl-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let rx = submit(&shared, &id, kind, prompt, settings)?;
    let (created, model) = (now(), shared.model_id.clone());
    let choice = |index: usize, text: &str, finish: Value| json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish});
    if stream {
        return Ok(sse(rx, n, shared.keep_alive, move |index, event| {
            let base = |choice: Value| {
                json!({"id": id, "object": "text_completion", "created": created,
                       "model": model, "choices": [choice]})
            };
            match event {
                Event::Delta {
                    content, logprobs, ..
                } => {
                    let mut c = base(choice(index, content, Value::Null));
                    if want_logprobs {
                        let tok = tok_shared.engine.tokenizer();
                        // offsets within this chunk's text
                        c["choices"][0]["logprobs"] = completion_logprobs(tok, logprobs, 0);
                    }
                    c
                }
                Event::Done(s) => {
                    let mut c = base(choice(index, "", json!(s.finish_reason)));
                    if return_tokens {
                        c["choices"][0]["tokens"] = json!(s.ids);
                    }
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
    let all = collect(rx, n).await?;
    let choices: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = choice(i, &c.content, json!(c.summary.finish_reason));
            if want_logprobs {
                v["logprobs"] = completion_logprobs(shared.engine.tokenizer(), &c.logprobs, 0);
            }
            if return_tokens {
                v["tokens"] = json!(c.summary.ids);
            }
            v
        })
        .collect();
    Ok(json_response(json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": choices, "usage": usage_all(&all), "timings": timings(&all[0].summary),
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
    let lines: [(&str, &str, &str, String); 11] = [
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
