//! The OpenAI adapter (docs/SERVER.md "Endpoints"): `/v1/chat/completions` and
//! `/v1/completions` bodies in, the core's neutral events out as OpenAI's JSON objects and
//! `data:` chunks.

use super::routes::{
    authorize, body_bytes, collect, json_response, next_id, now, render_chat, sse, submit, timings,
    usage, usage_all, worker_failed, Choice, SseFraming,
};
use super::worker::{Event, JobKind};
use super::Shared;
use crate::error_body::OpenAiError;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use k3_api::{
    parse_body, validate_chat, validate_completion, ApiError, ChatRequest, CompletionRequest,
    Prompt,
};
use k3_engine::{TokenLogprob, Tokenizer};
use serde_json::{json, Value};
use std::sync::Arc;

/// OpenAI's SSE framing: `data: [DONE]` at the end, comments as keep-alives.
fn framing() -> SseFraming {
    SseFraming {
        prologue: String::new(),
        keep_alive: ": keep-alive\n\n",
        finale: "data: [DONE]\n\n",
    }
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// A tool-call event as a chat chunk's `delta.tool_calls` (`None` for other events).
fn tool_call_delta(event: &Event) -> Option<Value> {
    match event {
        Event::ToolCallStart { call, id, name } => Some(json!([{"index": call, "id": id,
            "type": "function", "function": {"name": name, "arguments": ""}}])),
        Event::ToolCallArguments { call, fragment } => {
            Some(json!([{"index": call, "function": {"arguments": fragment}}]))
        }
        _ => None,
    }
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

fn error_value(message: &str) -> Value {
    json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}})
}

pub async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OpenAiError> {
    authorize(&shared, &headers)?;
    let req: ChatRequest = parse_body(&body_bytes(body)?)?;
    let request = validate_chat(&req)?;
    let (prompt, kind, constraint) = render_chat(&shared, &request, "/v1/chat/completions")?;
    let settings = request.settings;
    let (stream, with_usage, n) = (settings.stream, settings.include_usage, settings.n);
    let return_tokens = settings.return_tokens;
    let want_logprobs = settings.logprobs.is_some();
    let tok_shared = shared.clone();
    let id = next_id("chatcmpl-");
    let rx = submit(&shared, &id, kind, prompt, settings, constraint)?;
    let (created, model) = (now(), shared.model_id.clone());
    if stream {
        let started = std::sync::Mutex::new(vec![false; n]);
        let request_id = id.clone();
        return Ok(super::status_api::with_request_id(
            &request_id,
            sse(rx, n, shared.keep_alive, framing(), move |index, event| {
                let chunk = |delta: Value, finish: Value| {
                    json!({"id": id, "object": "chat.completion.chunk", "created": created,
                       "model": model, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]})
                };
                let value = match event {
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
                    Event::ToolCallStart { .. } | Event::ToolCallArguments { .. } => {
                        let mut delta = json!({"tool_calls": tool_call_delta(event)});
                        let first = started
                            .lock()
                            .map(|mut s| !std::mem::replace(&mut s[index], true))
                            .unwrap_or(false);
                        if first {
                            // The first chunk of a reply names the role, whatever it carries.
                            delta["role"] = json!("assistant");
                        }
                        chunk(delta, Value::Null)
                    }
                    Event::ToolCallEnd { .. } => return String::new(),
                    Event::Done(s) => {
                        let mut c = chunk(json!({}), json!(s.finish.openai()));
                        if with_usage {
                            c["usage"] = usage(s);
                            c["timings"] = timings(s);
                        }
                        c
                    }
                    Event::Failed(m) => error_value(m),
                };
                data(&value)
            }),
        ));
    }
    let all = collect(rx, n).await?;
    let tok = shared.engine.tokenizer();
    let choices: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(index, c)| chat_choice(tok, index, c, want_logprobs, return_tokens))
        .collect();
    Ok(json_response(json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices, "usage": usage_all(&all), "timings": timings(&all[0].summary),
    }))
    .into_response())
}

/// One choice of a non-streamed chat completion: the assistant message (content, reasoning,
/// tool calls), its finish reason and, when asked, its logprobs and token ids.
fn chat_choice(
    tok: Option<&Tokenizer>,
    index: usize,
    c: &Choice,
    want_logprobs: bool,
    return_tokens: bool,
) -> Value {
    let r = &c.reply;
    let mut message = json!({"role": "assistant", "content": r.content});
    if !r.reasoning.is_empty() {
        message["reasoning_content"] = json!(r.reasoning);
    }
    if !r.tool_calls.is_empty() {
        message["tool_calls"] = r
            .tool_calls
            .iter()
            .map(|t| {
                json!({"id": t.id, "type": "function",
            "function": {"name": t.name, "arguments": t.arguments}})
            })
            .collect();
    }
    let mut v = json!({"index": index, "message": message, "finish_reason": c.summary.finish.openai(),
                       "logprobs": Value::Null});
    if want_logprobs {
        v["logprobs"] = chat_logprobs(tok, &r.logprobs);
    }
    if return_tokens {
        v["tokens"] = json!(c.summary.ids);
    }
    v
}

pub async fn completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OpenAiError> {
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
                return Err(OpenAiError(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is out of range: the model's vocab_size is {vocab}"),
                )));
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
    let id = next_id("cmpl-");
    let rx = submit(&shared, &id, kind, prompt, settings, None)?;
    let (created, model) = (now(), shared.model_id.clone());
    let choice = |index: usize, text: &str, finish: Value| json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish});
    if stream {
        return Ok(sse(
            rx,
            n,
            shared.keep_alive,
            framing(),
            move |index, event| {
                let base = |choice: Value| {
                    json!({"id": id, "object": "text_completion", "created": created,
                       "model": model, "choices": [choice]})
                };
                let value = match event {
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
                        let mut c = base(choice(index, "", json!(s.finish.openai())));
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
                    // A raw completion has no tool calls.
                    _ => return String::new(),
                };
                data(&value)
            },
        ));
    }
    let all = collect(rx, n).await?;
    let choices: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = choice(i, &c.reply.content, json!(c.summary.finish.openai()));
            if want_logprobs {
                v["logprobs"] =
                    completion_logprobs(shared.engine.tokenizer(), &c.reply.logprobs, 0);
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
