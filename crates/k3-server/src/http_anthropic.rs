//! The Anthropic adapter (docs/SERVER.md "Anthropic Messages API"): `/v1/messages` and
//! `/v1/messages/count_tokens` bodies in, the core's neutral events out as a Message object
//! or Anthropic's SSE event sequence, and errors in Anthropic's shape.

use super::routes::{
    authorize, body_bytes, collect, next_id, render_chat, sse, submit, Choice, SseFraming,
};
use super::worker::{Event, Summary};
use super::Shared;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use k3_api::anthropic::{validate_messages, MessagesRequest};
use k3_api::{parse_body, ApiError};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// An error in Anthropic's shape: `{"type":"error","error":{"type","message"}}`; the
/// message starts with the field's path when there is one.
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's error type for an HTTP status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let e = self.0;
        let retry_after = e.retry_after();
        let message = match &e.param {
            Some(p) if !e.message.starts_with(&format!("{p}:")) => format!("{p}: {}", e.message),
            _ => e.message,
        };
        let body =
            json!({"type": "error", "error": {"type": error_type(e.status), "message": message}});
        let mut resp = (
            e.status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

/// What k3 puts in a thinking block's `signature`: it signs nothing, so it sends the SHA-256
/// of the thinking text (clients that require a signature get one; k3 ignores those it gets).
fn signature_of(thinking: &str) -> String {
    Sha256::digest(thinking.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The kind of the content block being streamed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Open {
    Thinking,
    Text,
    ToolUse,
}

/// The content-block state of one streamed reply: turns neutral events into Anthropic's
/// `content_block_*`, `message_delta` and `message_stop` events (each a JSON object whose
/// `type` is its SSE event name).
#[derive(Default)]
pub struct Blocks {
    open: Option<Open>,
    /// The index of the open block, or of the next one.
    index: usize,
    thinking: String,
}

impl Blocks {
    fn close(&mut self, out: &mut Vec<Value>) {
        let Some(kind) = self.open.take() else { return };
        if kind == Open::Thinking {
            let signature = signature_of(&std::mem::take(&mut self.thinking));
            out.push(json!({"type": "content_block_delta", "index": self.index,
                            "delta": {"type": "signature_delta", "signature": signature}}));
        }
        out.push(json!({"type": "content_block_stop", "index": self.index}));
        self.index += 1;
    }

    fn ensure(&mut self, kind: Open, block: Value, out: &mut Vec<Value>) {
        if self.open != Some(kind) || kind == Open::ToolUse {
            self.close(out);
            out.push(
                json!({"type": "content_block_start", "index": self.index, "content_block": block}),
            );
            self.open = Some(kind);
        }
    }

    fn delta(&self, delta: Value) -> Value {
        json!({"type": "content_block_delta", "index": self.index, "delta": delta})
    }

    /// The events for one neutral event.
    pub fn on(&mut self, event: &Event) -> Vec<Value> {
        let mut out = Vec::new();
        match event {
            Event::Delta {
                content, reasoning, ..
            } => {
                if !reasoning.is_empty() {
                    self.ensure(
                        Open::Thinking,
                        json!({"type": "thinking", "thinking": ""}),
                        &mut out,
                    );
                    self.thinking.push_str(reasoning);
                    out.push(self.delta(json!({"type": "thinking_delta", "thinking": reasoning})));
                }
                if !content.is_empty() {
                    self.ensure(Open::Text, json!({"type": "text", "text": ""}), &mut out);
                    out.push(self.delta(json!({"type": "text_delta", "text": content})));
                }
            }
            Event::ToolCallStart { id, name, .. } => {
                let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                self.ensure(Open::ToolUse, block, &mut out);
            }
            Event::ToolCallArguments { fragment, .. } => {
                out.push(self.delta(json!({"type": "input_json_delta", "partial_json": fragment})));
            }
            Event::ToolCallEnd { .. } => self.close(&mut out),
            Event::Done(s) => {
                self.close(&mut out);
                out.push(json!({"type": "message_delta", "delta": stop_fields(s),
                                "usage": {"output_tokens": s.completion_tokens}}));
                out.push(json!({"type": "message_stop"}));
            }
            Event::Failed(m) => {
                out.push(json!({"type": "error", "error": {"type": "api_error", "message": m}}));
            }
        }
        out
    }
}

/// `stop_reason` and `stop_sequence` of a finished reply.
fn stop_fields(s: &Summary) -> Value {
    let sequence = match &s.finish {
        super::worker::Finish::StopSequence(seq) => json!(seq),
        _ => Value::Null,
    };
    json!({"stop_reason": s.finish.anthropic(), "stop_sequence": sequence})
}

/// One SSE event: `event: TYPE` and its `data:`.
fn sse_event(v: &Value) -> String {
    let name = v["type"].as_str().unwrap_or("error");
    format!("event: {name}\ndata: {v}\n\n")
}

/// The non-streaming Message object: thinking, text and tool_use blocks in that order, the
/// blocks the stream of the same reply opens.
fn message_object(id: &str, model: &str, c: &Choice) -> Value {
    let r = &c.reply;
    let mut content = Vec::new();
    if !r.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": r.reasoning, "signature": signature_of(&r.reasoning)}));
    }
    // As streamed: a text block when there is text.
    if !r.content.is_empty() {
        content.push(json!({"type": "text", "text": r.content}));
    }
    for t in &r.tool_calls {
        let input: Value = serde_json::from_str(&t.arguments).unwrap_or_else(|_| json!({}));
        content.push(json!({"type": "tool_use", "id": t.id, "name": t.name, "input": input}));
    }
    let mut v = json!({"id": id, "type": "message", "role": "assistant", "model": model,
        "content": content,
        "usage": {"input_tokens": c.summary.prompt_tokens, "output_tokens": c.summary.completion_tokens}});
    if let (Some(o), Value::Object(stop)) = (v.as_object_mut(), stop_fields(&c.summary)) {
        o.extend(stop);
    }
    v
}

/// `POST /v1/messages`.
pub async fn messages(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    authorize(&shared, &headers)?;
    let req: MessagesRequest = parse_body(&body_bytes(body)?)?;
    let request = validate_messages(&req, false)?;
    let (prompt, kind, constraint) = render_chat(&shared, &request, "/v1/messages")?;
    let input_tokens = prompt.len();
    let stream = request.settings.stream;
    let id = next_id("msg_k3_");
    let rx = submit(&shared, &id, kind, prompt, request.settings, constraint)?;
    let model = shared.model_id.clone();
    if stream {
        let start = json!({"type": "message_start", "message": {"id": id, "type": "message",
            "role": "assistant", "model": model, "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": input_tokens, "output_tokens": 0}}});
        let framing = SseFraming {
            prologue: sse_event(&start) + &sse_event(&json!({"type": "ping"})),
            keep_alive: "event: ping\ndata: {\"type\": \"ping\"}\n\n",
            finale: "",
        };
        let mut blocks = Blocks::default();
        return Ok(sse(rx, 1, shared.keep_alive, framing, move |_, event| {
            blocks.on(event).iter().map(sse_event).collect()
        }));
    }
    let all = collect(rx, 1).await?;
    let choice = all
        .first()
        .ok_or_else(|| super::routes::worker_failed("no reply".into()))?;
    Ok(super::routes::json_response(message_object(
        &id, &model, choice,
    )))
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would render it.
pub async fn count_tokens(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    authorize(&shared, &headers)?;
    let req: MessagesRequest = parse_body(&body_bytes(body)?)?;
    let request = validate_messages(&req, true)?;
    let (prompt, _, _) = render_chat(&shared, &request, "/v1/messages/count_tokens")?;
    Ok(super::routes::json_response(
        json!({"input_tokens": prompt.len()}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Summary {
        Summary {
            finish: super::super::worker::Finish::StopSequence("END".into()),
            prompt_tokens: 5,
            prompt_tokens_reused: 0,
            completion_tokens: 7,
            prompt_seconds: 0.0,
            predicted_seconds: 0.0,
            queue_seconds: 0.0,
            first_token_seconds: 0.0,
            max_token_gap_seconds: 0.0,
            mean_batch: 1.0,
            ids: Vec::new(),
            bytes_read: 0,
            expert_hit_rate: 0.0,
            decode: Default::default(),
        }
    }

    fn delta(content: &str, reasoning: &str) -> Event {
        Event::Delta {
            content: content.into(),
            reasoning: reasoning.into(),
            logprobs: Vec::new(),
        }
    }

    #[test]
    fn blocks_follow_the_channels_and_close_in_order() {
        let mut b = Blocks::default();
        let events = [
            delta("", "hm"),
            delta("", " ok"),
            delta("Hi", ""),
            Event::ToolCallStart {
                call: 0,
                id: "t1".into(),
                name: "f".into(),
            },
            Event::ToolCallArguments {
                call: 0,
                fragment: "{\"a\":".into(),
            },
            Event::ToolCallArguments {
                call: 0,
                fragment: "1}".into(),
            },
            Event::ToolCallEnd { call: 0 },
            Event::Done(summary()),
        ];
        let out: Vec<Value> = events.iter().flat_map(|e| b.on(e)).collect();
        let kinds: Vec<String> = out
            .iter()
            .map(|v| {
                let t = v["type"].as_str().unwrap();
                match v["delta"]["type"]
                    .as_str()
                    .or(v["content_block"]["type"].as_str())
                {
                    Some(d) => format!("{t}:{d}:{}", v["index"]),
                    None => format!("{t}:{}", v["index"]),
                }
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "content_block_start:thinking:0",
                "content_block_delta:thinking_delta:0",
                "content_block_delta:thinking_delta:0",
                "content_block_delta:signature_delta:0",
                "content_block_stop:0",
                "content_block_start:text:1",
                "content_block_delta:text_delta:1",
                "content_block_stop:1",
                "content_block_start:tool_use:2",
                "content_block_delta:input_json_delta:2",
                "content_block_delta:input_json_delta:2",
                "content_block_stop:2",
                "message_delta:null",
                "message_stop:null",
            ]
        );
        assert_eq!(out[3]["delta"]["signature"], json!(signature_of("hm ok")));
        assert_eq!(out[12]["delta"]["stop_sequence"], json!("END"));
        assert_eq!(out[12]["usage"]["output_tokens"], json!(7));
    }

    #[test]
    fn errors_take_anthropics_shape_with_the_path_in_the_message() {
        let resp =
            AnthropicError(ApiError::invalid("max_tokens", "Field required")).into_response();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        assert_eq!(error_type(StatusCode::UNAUTHORIZED), "authentication_error");
        assert_eq!(
            error_type(StatusCode::TOO_MANY_REQUESTS),
            "rate_limit_error"
        );
    }
}
