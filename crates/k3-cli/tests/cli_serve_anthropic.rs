//! Anthropic's Messages API on `k3 serve` (docs/SERVER.md "Anthropic Messages API"): the
//! Message object and its SSE event sequence, as Anthropic publishes them; the same core as
//! the OpenAI endpoint (same greedy reply for the same conversation); errors in Anthropic's
//! shape; `x-api-key`; `count_tokens`; stop sequences and the thinking budget. Servers bind
//! 127.0.0.1 only; every loop is bounded.

mod serve_common;

use serde_json::{json, Value};
use serve_common::{chat_body, Server};

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn message(s: &Server, body: &Value) -> (u16, Value) {
    s.post_json("/v1/messages", body)
}

/// The `(event, data)` pairs of an Anthropic SSE body.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .expect("event line");
            let data = e
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .expect("data line");
            (
                name.to_string(),
                serde_json::from_str(data).expect("data is JSON"),
            )
        })
        .collect()
}

fn text_blocks(v: &Value, kind: &str, field: &str) -> String {
    v["content"]
        .as_array()
        .expect("content array")
        .iter()
        .filter(|b| b["type"] == kind)
        .filter_map(|b| b[field].as_str())
        .collect()
}

#[test]
fn a_text_reply_is_a_message_and_matches_the_openai_endpoint() {
    let s = Server::start(&[]);
    let body = json!({"model": "claude-whatever", "max_tokens": 24, "temperature": 0,
                      "system": "Be brief.", "messages": user("Hello")});
    let (st, v) = message(&s, &body);
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["type"].as_str(), v["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!(v["model"], "tiny-k3");
    let stop = v["stop_reason"].as_str().unwrap();
    assert!(["end_turn", "max_tokens"].contains(&stop), "{v}");
    assert_eq!(v["stop_sequence"], Value::Null);
    let messages =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]);
    let (st, o) = s.post_json("/v1/chat/completions", &chat_body(messages, json!({})));
    assert_eq!(st, 200, "{o}");
    assert_eq!(
        text_blocks(&v, "text", "text"),
        o["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(v["usage"]["input_tokens"], o["usage"]["prompt_tokens"]);
    assert_eq!(v["usage"]["output_tokens"], o["usage"]["completion_tokens"]);
    let finish = o["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(stop == "max_tokens", finish == "length");
    let (st, c) = s.post_json(
        "/v1/messages/count_tokens",
        &json!({"model": "x", "system": "Be brief.", "messages": user("Hello")}),
    );
    assert_eq!(
        (st, &c["input_tokens"]),
        (200, &v["usage"]["input_tokens"]),
        "{c}"
    );
}

#[test]
fn streamed_events_come_in_anthropics_order_and_carry_the_same_reply() {
    let s = Server::start(&[]);
    for thinking in [
        json!({"type": "disabled"}),
        json!({"type": "enabled", "budget_tokens": 4}),
    ] {
        let body = json!({"model": "x", "max_tokens": 16, "temperature": 0, "thinking": thinking,
                          "messages": user("Hello")});
        let (_, whole) = message(&s, &body);
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let r = s.post("/v1/messages", &streamed);
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let ev = events(&r.text().unwrap());
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
        assert_eq!(
            names[names.len() - 2..],
            ["message_delta", "message_stop"],
            "{names:?}"
        );
        for (name, data) in &ev {
            assert_eq!(data["type"].as_str(), Some(name.as_str()), "{data}");
        }
        let start = &ev[0].1["message"];
        assert_eq!(
            (start["role"].as_str(), start["content"].clone()),
            (Some("assistant"), json!([]))
        );
        assert_eq!(
            start["usage"]["input_tokens"],
            whole["usage"]["input_tokens"]
        );
        // Blocks: start, deltas of the block's kind, stop; indices 0, 1, … in order.
        let (mut open, mut next, mut thinking_text, mut text) =
            (None::<String>, 0, String::new(), String::new());
        for (name, d) in &ev[2..ev.len() - 2] {
            match name.as_str() {
                "content_block_start" => {
                    assert!(open.is_none(), "{d}");
                    assert_eq!(d["index"], next);
                    open = Some(d["content_block"]["type"].as_str().unwrap().to_string());
                }
                "content_block_delta" => {
                    assert_eq!(d["index"], next, "{d}");
                    let kind = d["delta"]["type"].as_str().unwrap();
                    match (open.as_deref(), kind) {
                        (Some("thinking"), "thinking_delta") => {
                            thinking_text.push_str(d["delta"]["thinking"].as_str().unwrap())
                        }
                        (Some("thinking"), "signature_delta") => {
                            assert!(d["delta"]["signature"].is_string())
                        }
                        (Some("text"), "text_delta") => {
                            text.push_str(d["delta"]["text"].as_str().unwrap())
                        }
                        other => panic!("delta {other:?} in the wrong block: {d}"),
                    }
                }
                "content_block_stop" => {
                    assert_eq!(d["index"], next);
                    assert!(open.take().is_some());
                    next += 1;
                }
                "ping" => {}
                other => panic!("unexpected event {other}"),
            }
        }
        assert!(open.is_none());
        assert_eq!(text, text_blocks(&whole, "text", "text"), "{whole}");
        assert_eq!(
            thinking_text,
            text_blocks(&whole, "thinking", "thinking"),
            "{whole}"
        );
        let delta = &ev[ev.len() - 2].1;
        assert_eq!(delta["delta"]["stop_reason"], whole["stop_reason"]);
        assert_eq!(
            delta["usage"]["output_tokens"],
            whole["usage"]["output_tokens"]
        );
    }
}

#[test]
fn errors_take_anthropics_shape_and_name_the_field() {
    let s = Server::start(&["--api-key", "sesame"]);
    let key = |r: reqwest::blocking::RequestBuilder, k: &str| r.header("x-api-key", k);
    let post = |body: &Value, k: &str| {
        let r = key(s.client.post(format!("{}/v1/messages", s.base)), k)
            .body(body.to_string())
            .send()
            .unwrap();
        let status = r.status().as_u16();
        (
            status,
            serde_json::from_str::<Value>(&r.text().unwrap()).unwrap(),
        )
    };
    let shape = |v: &Value| -> (String, String) {
        assert_eq!(v["type"], "error", "{v}");
        (
            v["error"]["type"].as_str().unwrap().into(),
            v["error"]["message"].as_str().unwrap().into(),
        )
    };
    let ok = json!({"model": "x", "max_tokens": 2, "messages": user("Hi")});
    let (st, v) = post(&ok, "wrong");
    assert_eq!((st, shape(&v).0.as_str()), (401, "authentication_error"));
    let (st, v) = post(&ok, "sesame");
    assert_eq!(st, 200, "{v}");
    // Bearer works on /v1/messages too, and x-api-key on the OpenAI endpoints.
    let r = s
        .client
        .post(format!("{}/v1/messages", s.base))
        .bearer_auth("sesame")
        .body(ok.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = key(
        s.client.post(format!("{}/v1/chat/completions", s.base)),
        "sesame",
    )
    .body(chat_body(user("Hi"), json!({"max_tokens": 2})).to_string())
    .send()
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    for (body, path) in [
        (json!({"model": "x", "messages": user("Hi")}), "max_tokens"),
        (
            json!({"model": "x", "max_tokens": "many", "messages": user("Hi")}),
            "max_tokens",
        ),
        (
            json!({"model": "x", "max_tokens": 2, "messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
        ),
        (
            json!({"model": "x", "max_tokens": 2, "messages": user("Hi"), "temperature": "hot"}),
            "temperature",
        ),
        (
            json!({"model": "x", "max_tokens": 2, "messages": user("Hi"), "thinking": {"type": "enabled", "budget_tokens": 9}}),
            "thinking.budget_tokens",
        ),
        (
            json!({"model": "x", "max_tokens": 2, "messages": user("Hi"), "frobnicate": 1}),
            "frobnicate",
        ),
        (
            json!({"model": "x", "max_tokens": 2, "messages": user("Hi"), "tools": [{"name": "bad name", "input_schema": {"type": "object"}}]}),
            "tools[0].name",
        ),
    ] {
        let (st, v) = post(&body, "sesame");
        let (kind, message) = shape(&v);
        assert_eq!((st, kind.as_str()), (400, "invalid_request_error"), "{v}");
        assert!(
            message.starts_with(&format!("{path}:")),
            "{path}: {message}"
        );
    }
    let r = key(
        s.client.post(format!("{}/v1/messages/nothing", s.base)),
        "sesame",
    )
    .body("{}")
    .send()
    .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    assert_eq!(shape(&v).0, "not_found_error");
    let (st, v) = post(
        &json!({"model": "x", "max_tokens": 2, "messages": user(&"word ".repeat(5000))}),
        "sesame",
    );
    assert_eq!(
        (st, shape(&v).0.as_str()),
        (400, "invalid_request_error"),
        "{v}"
    );
}

#[test]
fn stop_sequences_and_the_thinking_budget() {
    let s = Server::start(&[]);
    let base = json!({"model": "x", "max_tokens": 30, "temperature": 0, "messages": user("Hello"),
                      "thinking": {"type": "enabled", "budget_tokens": 20}});
    let (_, full) = message(&s, &base);
    let thought = text_blocks(&full, "thinking", "thinking");
    assert_eq!(full["stop_reason"], "max_tokens", "{full}");
    assert!(
        text_blocks(&full, "text", "text").is_empty(),
        "budget 20 of 30 still thinking: {full}"
    );
    // A budget of 3 ends the reasoning after 3 ids; the reply goes on in its text block.
    let mut budgeted = base.clone();
    budgeted["thinking"]["budget_tokens"] = json!(3);
    let (_, short) = message(&s, &budgeted);
    let short_thought = text_blocks(&short, "thinking", "thinking");
    assert!(
        thought.starts_with(&short_thought) && short_thought.len() < thought.len(),
        "{short}"
    );
    assert!(!text_blocks(&short, "text", "text").is_empty(), "{short}");
    // A stop sequence taken from the greedy reply stops it there.
    let plain = json!({"model": "x", "max_tokens": 30, "temperature": 0, "messages": user("Hello"),
                       "thinking": {"type": "enabled", "budget_tokens": 3}});
    let reply = text_blocks(&short, "text", "text");
    let cut: String = reply.chars().skip(2).take(2).collect();
    let mut stopped = plain.clone();
    stopped["stop_sequences"] = json!([cut]);
    let (_, v) = message(&s, &stopped);
    assert_eq!(
        (v["stop_reason"].as_str(), v["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some(cut.as_str())),
        "{v}"
    );
    let before = &reply[..reply.find(&cut).unwrap()];
    assert_eq!(text_blocks(&v, "text", "text"), before);
}
