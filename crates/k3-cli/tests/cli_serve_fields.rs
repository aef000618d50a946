//! The OpenAI endpoints of `k3 serve`: every refusal names its field (type errors
//! included, nested paths too); tools, tool_choice and response_format are parsed and
//! validated, then refused as not yet supported; `ignore_eos` works for chat; admission
//! takes exactly `--parallel` + `--queue` requests; log lines carry RFC 3339 UTC timestamps.
//! Servers bind 127.0.0.1 only; every loop is bounded.

mod serve_common;

use serde_json::{json, Value};
use serve_common::{chat_body, error_of, long_job, Server};
use std::sync::{Arc, Barrier};
use std::time::Duration;

fn user() -> Value {
    json!([{"role": "user", "content": "Hello"}])
}

#[test]
fn a_wrongly_typed_field_is_refused_by_its_path_on_every_endpoint() {
    let s = Server::start(&[]);
    for (path, body, param) in [
        (
            "/v1/chat/completions",
            chat_body(user(), json!({"max_tokens": "many"})),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            chat_body(user(), json!({"stream": "yes"})),
            "stream",
        ),
        (
            "/v1/chat/completions",
            chat_body(user(), json!({"seed": 1.5})),
            "seed",
        ),
        (
            "/v1/chat/completions",
            chat_body(
                json!([{"role": "user", "content": "a"}, {"role": "user", "content": 5}]),
                json!({}),
            ),
            "messages[1].content",
        ),
        (
            "/v1/chat/completions",
            chat_body(json!([{"role": 1}]), json!({})),
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            chat_body(json!("hi"), json!({})),
            "messages",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": "many"}),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "ignore_eos": 1}),
            "ignore_eos",
        ),
        ("/v1/completions", json!({"prompt": "a", "stop": 3}), "stop"),
    ] {
        let (st, v) = s.post_json(path, &body);
        assert_eq!(
            (st, error_of(&v).1),
            (400, Some(param)),
            "{path} {body}: {v}"
        );
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(param), "{message}");
    }
}

#[test]
fn tools_are_validated_naming_the_field_then_served() {
    let s = Server::start(&[]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let history = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]);
    for (messages, extra, param) in [
        (
            user(),
            json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (
            user(),
            json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            "tools[0].function.name",
        ),
        (
            user(),
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": []}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!([{"role": "tool", "tool_call_id": "zzz", "content": "x"}]),
            json!({}),
            "messages[0].tool_call_id",
        ),
    ] {
        let (st, v) = s.post_json("/v1/chat/completions", &chat_body(messages, extra.clone()));
        assert_eq!((st, error_of(&v).1), (400, Some(param)), "{extra}: {v}");
    }
    // Served (docs/SERVER.md "Tools"): tools, a call and its result in the history.
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(history, json!({"tools": tools, "max_tokens": 2})),
    );
    assert_eq!(st, 200, "{v}");
    // Accepted: no tools, tool_choice auto/none, text format, parallel_tool_calls.
    let fine = json!({"tool_choice": "none", "parallel_tool_calls": false, "response_format": {"type": "text"}, "max_tokens": 2});
    let (st, v) = s.post_json("/v1/chat/completions", &chat_body(user(), fine));
    assert_eq!(st, 200, "{v}");
}

#[test]
fn ignore_eos_is_honoured_by_chat() {
    let s = Server::start(&[]);
    let (_, natural) = s.post_json(
        "/v1/chat/completions",
        &chat_body(user(), json!({"max_tokens": 40})),
    );
    let n = natural["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(
        natural["choices"][0]["finish_reason"], "stop",
        "this prompt ends early: {natural}"
    );
    assert!(n < 40, "{natural}");
    let (_, forced) = s.post_json(
        "/v1/chat/completions",
        &chat_body(user(), json!({"max_tokens": 40, "ignore_eos": true})),
    );
    assert_eq!(forced["usage"]["completion_tokens"], 40, "{forced}");
    assert_eq!(forced["choices"][0]["finish_reason"], "length");
}

/// Starts `count` streaming requests at once; returns their statuses while every stream is
/// still open (then drops them).
fn simultaneous(s: &Arc<Server>, count: usize) -> Vec<u16> {
    let start = Arc::new(Barrier::new(count));
    let answered = Arc::new(Barrier::new(count + 1));
    let (tx, rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = (0..count)
        .map(|_| {
            let (s, start, answered, tx) = (s.clone(), start.clone(), answered.clone(), tx.clone());
            std::thread::spawn(move || {
                start.wait();
                let r = s.post("/v1/completions", &long_job(4000, true));
                tx.send(r.status().as_u16()).unwrap();
                answered.wait(); // keep the stream open until every status is in
                drop(r);
            })
        })
        .collect();
    let statuses: Vec<u16> = (0..count)
        .map(|_| rx.recv_timeout(Duration::from_secs(60)).unwrap())
        .collect();
    answered.wait();
    for h in handles {
        h.join().unwrap();
    }
    statuses
}

#[test]
fn exactly_parallel_plus_queue_requests_are_admitted() {
    let s = Arc::new(Server::start(&["--parallel", "4", "--queue", "8"]));
    for (count, admitted) in [(12, 12), (13, 12)] {
        let statuses = simultaneous(&s, count);
        let ok = statuses.iter().filter(|&&st| st == 200).count();
        let full = statuses.iter().filter(|&&st| st == 429).count();
        assert_eq!((ok, full), (admitted, count - admitted), "{statuses:?}");
        // Every stream was dropped: wait (bounded) until all permits are back.
        for _ in 0..600 {
            if s.metric("k3_queue_depth") == 0.0 && s.metric("k3_sessions_active") == 0.0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn log_lines_start_with_an_rfc3339_utc_timestamp() {
    let s = Server::start(&[]);
    let (st, _) = s.post_json(
        "/v1/chat/completions",
        &chat_body(user(), json!({"max_tokens": 2})),
    );
    assert_eq!(st, 200);
    for needle in ["listening on", "request chatcmpl-"] {
        let line = s.wait_log_line(needle);
        let stamp = line.split(' ').next().unwrap();
        // 2026-12-03T08:32:42.277Z
        let b = stamp.as_bytes();
        assert_eq!(b.len(), 24, "{line}");
        assert!(
            b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':' && b[16] == b':',
            "{line}"
        );
        assert!(b[19] == b'.' && b[23] == b'Z', "{line}");
        assert!(
            stamp.chars().filter(char::is_ascii_digit).count() == 17,
            "{line}"
        );
    }
}
