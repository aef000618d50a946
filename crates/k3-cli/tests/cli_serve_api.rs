//! OpenAI API completeness of `k3 serve`: every request field is implemented or refused with a
//! 400 naming it; `stream_options`, `/v1/models/{id}`, the per-request log line and SSE
//! keep-alives. Servers bind 127.0.0.1 only; every loop is bounded.

mod serve_common;

use serde_json::{json, Value};
use serve_common::{chat_body, concat_stream, error_of, long_job, sse_events, Server};
use std::io::Read;

fn user() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

/// A greedy completion of exactly `n` tokens (end ids ignored) with extra fields.
fn completion(s: &Server, n: u32, extra: Value) -> (u16, Value) {
    let mut body = json!({"prompt": "Once upon a time", "max_tokens": n, "ignore_eos": true});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    s.post_json("/v1/completions", &body)
}

fn text_of(v: &Value) -> String {
    v["choices"][0]["text"].as_str().expect("text").to_string()
}

#[test]
fn presence_and_frequency_penalties_are_validated_and_change_greedy_output() {
    let s = Server::start(&[]);
    for field in ["presence_penalty", "frequency_penalty"] {
        for bad in [json!(3.0), json!(-2.5)] {
            let (st, v) = s.post_json(
                "/v1/chat/completions",
                &chat_body(user(), json!({field: bad})),
            );
            assert_eq!((st, error_of(&v).1), (400, Some(field)), "{v}");
            let message = v["error"]["message"].as_str().unwrap();
            assert!(message.contains(field), "{message}");
        }
    }
    let (st, plain) = completion(&s, 32, json!({}));
    assert_eq!(st, 200, "{plain}");
    let (st, penalised) = completion(
        &s,
        32,
        json!({"presence_penalty": 2.0, "frequency_penalty": 2.0}),
    );
    assert_eq!(st, 200, "{penalised}");
    assert_ne!(text_of(&plain), text_of(&penalised), "the penalties apply");
    let (_, again) = completion(
        &s,
        32,
        json!({"presence_penalty": 2.0, "frequency_penalty": 2.0}),
    );
    assert_eq!(text_of(&again), text_of(&penalised), "deterministic");
}

#[test]
fn seed_stop_and_max_tokens_are_honoured() {
    let s = Server::start(&[]);
    let tokens = |v: &Value| v["usage"]["completion_tokens"].as_u64();
    let (_, v) = completion(&s, 7, json!({}));
    assert_eq!(
        (tokens(&v), v["choices"][0]["finish_reason"].as_str()),
        (Some(7), Some("length"))
    );
    let (_, v) = completion(&s, 7, json!({"max_completion_tokens": 5}));
    assert_eq!(
        tokens(&v),
        Some(5),
        "max_completion_tokens wins over max_tokens"
    );
    let sampled = |seed: i64| {
        let (st, v) = completion(&s, 16, json!({"temperature": 1.0, "seed": seed}));
        assert_eq!(st, 200, "{v}");
        text_of(&v)
    };
    assert_eq!(sampled(1), sampled(1), "same seed ⇒ same text");
    assert_ne!(sampled(1), sampled(2), "another seed ⇒ another text");

    let (_, v) = completion(&s, 24, json!({}));
    let full = text_of(&v);
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 6, "{full:?}");
    let stop: String = chars[3..5].iter().collect();
    let expected = &full[..full.find(&stop).unwrap()];
    let (_, v) = completion(&s, 24, json!({"stop": stop}));
    assert_eq!(text_of(&v), expected, "cut before the stop string {stop:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[test]
fn stream_options_include_usage() {
    let s = Server::start(&[]);
    let last = |extra: Value| {
        let body = chat_body(user(), json!({"stream": true, "max_tokens": 4}));
        let mut body = body.as_object().cloned().unwrap();
        body.extend(extra.as_object().cloned().unwrap());
        let text = s
            .post("/v1/chat/completions", &Value::Object(body))
            .text()
            .unwrap();
        concat_stream(&sse_events(&text), "delta/content").1
    };
    let off = last(json!({"stream_options": {"include_usage": false}}));
    assert!(off["choices"][0]["finish_reason"].is_string(), "{off}");
    assert!(
        off.get("usage").is_none() && off.get("timings").is_none(),
        "{off}"
    );
    for on in [
        json!({"stream_options": {"include_usage": true}}),
        json!({}),
    ] {
        let c = last(on);
        assert!(c["usage"]["completion_tokens"].is_number(), "{c}");
    }
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(user(), json!({"stream_options": {"include_usage": true}})),
    );
    assert_eq!((st, error_of(&v).1), (400, Some("stream_options")), "{v}");
}

#[test]
fn unsupported_fields_are_refused_by_name_and_informational_ones_accepted() {
    let s = Server::start(&[]);
    for (field, value) in [
        // Tools and JSON formats are served (cli_serve_tools.rs); malformed ones are refused.
        ("tools", json!(5)),
        ("tool_choice", json!("required")),
        ("functions", json!([{"name": "f"}])),
        ("function_call", json!("auto")),
        ("logit_bias", json!({"42": 5})),
        ("n", json!(0)),
        ("n", json!(17)),
        ("logprobs", json!("yes")),
        ("top_logprobs", json!(21)),
        ("parallel_tool_calls", json!("yes")),
        ("frobnicate", json!(1)),
    ] {
        let (st, v) = s.post_json(
            "/v1/chat/completions",
            &chat_body(user(), json!({field: value})),
        );
        assert_eq!((st, error_of(&v).1), (400, Some(field)), "{field}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{message}");
    }
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(user(), json!({"response_format": {"type": "xml"}})),
    );
    assert_eq!(
        (st, error_of(&v).1),
        (400, Some("response_format.type")),
        "{v}"
    );
    let (_, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(user(), json!({"frobnicate": 1})),
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("unknown field `frobnicate`"));
    let (st, v) = completion(&s, 2, json!({"logprobs": 30}));
    assert_eq!((st, error_of(&v).1), (400, Some("logprobs")), "{v}");
    let (st, v) = completion(&s, 2, json!({"top_logprobs": 2}));
    assert_eq!((st, error_of(&v).1), (400, Some("top_logprobs")), "{v}");
    let accepted = json!({"user": "u1", "metadata": {"k": "v"}, "store": false, "service_tier": "auto",
        "response_format": {"type": "text"}, "logit_bias": {}, "n": 1, "logprobs": false, "top_logprobs": 0,
        "tool_choice": "auto", "parallel_tool_calls": true, "tools": []});
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(
            user(),
            json!({"max_tokens": 2})
                .as_object()
                .map(|m| {
                    let mut m = m.clone();
                    m.extend(accepted.as_object().cloned().unwrap());
                    Value::Object(m)
                })
                .unwrap(),
        ),
    );
    assert_eq!(st, 200, "{v}");
}

#[test]
fn any_model_name_is_served_and_models_by_id() {
    let s = Server::start(&[]);
    for name in ["gpt-4", "", "tiny-k3"] {
        let (st, v) = s.post_json(
            "/v1/chat/completions",
            &chat_body(user(), json!({"model": name, "max_tokens": 2})),
        );
        assert_eq!(
            (st, v["model"].as_str()),
            (200, Some("tiny-k3")),
            "{name}: {v}"
        );
    }
    let (st, body) = s.get("/v1/models/tiny-k3");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (st, v["id"].as_str(), v["object"].as_str()),
        (200, Some("tiny-k3"), Some("model"))
    );
    let (st, body) = s.get("/v1/models/gpt-4");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((st, error_of(&v).2), (404, Some("model_not_found")), "{v}");
}

#[test]
fn each_request_logs_one_line() {
    let s = Server::start(&[]);
    let (_, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(user(), json!({"max_tokens": 3})),
    );
    let id = v["id"].as_str().unwrap();
    let line = s.wait_log_line(&format!("request {id} "));
    for part in [
        "/v1/chat/completions",
        "prompt ",
        "reused",
        "generated ",
        "queue ",
        "first token ",
        "s/token",
        "finish ",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }
}

#[test]
fn a_queued_stream_gets_keep_alive_comments() {
    let s = Server::start_env(
        &["--ctx", "8192", "--parallel", "1"],
        &[("K3_SSE_KEEP_ALIVE_MS", "50")],
    );
    let mut first = s.post("/v1/completions", &long_job(8000, true));
    let mut buf = [0u8; 256];
    assert!(first.read(&mut buf).expect("the first stream runs") > 0);
    let mut queued = s.post("/v1/completions", &long_job(4, true));
    assert_eq!(queued.status().as_u16(), 200);
    let n = queued.read(&mut buf).expect("bytes while queued");
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with(": keep-alive\n\n"), "{text:?}");
    drop(queued);
    drop(first);
    s.wait_log_line("cancelled while queued");
}

#[test]
fn n_choices_run_as_one_batch() {
    let s = Server::start(&["--parallel", "4"]);
    let body = chat_body(
        user(),
        json!({"max_tokens": 6, "n": 3, "temperature": 1.0, "seed": 9}),
    );
    let (st, v) = s.post_json("/v1/chat/completions", &body);
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], json!(i));
        assert!(c["message"]["content"].is_string(), "{c}");
    }
    let total: u64 = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((3..=18).contains(&total), "{v}");
    // choice 0 is the request alone with the same seed; choice 1 is seed + 1
    let one = |seed: u64| {
        let (_, v) = s.post_json(
            "/v1/chat/completions",
            &chat_body(
                user(),
                json!({"max_tokens": 6, "temperature": 1.0, "seed": seed}),
            ),
        );
        v["choices"][0]["message"]["content"].clone()
    };
    assert_eq!(choices[0]["message"]["content"], one(9));
    assert_eq!(choices[1]["message"]["content"], one(10));
    // streamed: every choice's chunks carry its index, one [DONE] at the end
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text = s.post("/v1/chat/completions", &streamed).text().unwrap();
    let events = sse_events(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    let mut finished = [false; 3];
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        let c = &v["choices"][0];
        if !c["finish_reason"].is_null() {
            finished[c["index"].as_u64().unwrap() as usize] = true;
        }
    }
    assert_eq!(finished, [true; 3], "{text}");
}

#[test]
fn logprobs_report_the_models_distribution() {
    let s = Server::start(&[]);
    let body = chat_body(
        user(),
        json!({"max_tokens": 5, "logprobs": true, "top_logprobs": 3, "ignore_eos": true}),
    );
    let (st, v) = s.post_json("/v1/chat/completions", &body);
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!content.is_empty(), "{v}");
    for e in content {
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{e}");
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        // greedy: the chosen token is the most probable one
        assert_eq!(top[0]["logprob"].as_f64().unwrap(), lp, "{e}");
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        assert!(e["bytes"].is_array() && e["token"].is_string());
    }
    // streamed: the same entries, chunk by chunk
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let text = s.post("/v1/chat/completions", &streamed).text().unwrap();
    let entries: Vec<Value> = sse_events(&text)
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&entries, content);
    // completions: parallel arrays, one entry per generated token
    let (st, v) = completion(&s, 4, json!({"logprobs": 2, "ignore_eos": true}));
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n, "{v}");
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), n);
    assert_eq!(lp["text_offset"].as_array().unwrap().len(), n);
    assert!(lp["top_logprobs"].as_array().unwrap().iter().all(|t| {
        let k = t.as_object().unwrap().len();
        (1..=2).contains(&k)
    }));
}
