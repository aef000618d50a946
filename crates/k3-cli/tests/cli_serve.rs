//! `k3 serve` against fixtures/tiny-k3 on 127.0.0.1 with an ephemeral port (`--port 0`; the
//! bound address is read from the server's `listening on http://ADDR` line). Every request
//! has a timeout, loops are bounded, and each server is killed when its handle drops.

mod serve_common;

use reqwest::blocking::Response;
use serde_json::{json, Value};
use serve_common::{chat_body, concat_stream, error_of, long_job, sse_events, Server};
use std::io::Read;

#[test]
fn chat_non_stream_shape_and_stream_agree() {
    let s = Server::start(&[]);
    for effort in ["off", "low"] {
        let body = chat_body(
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]),
            json!({"reasoning_effort": effort}),
        );
        let (status, v) = s.post_json("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], "tiny-k3");
        assert!(v["id"].as_str().is_some() && v["created"].as_u64().is_some());
        let choice = &v["choices"][0];
        assert_eq!(choice["index"], 0);
        assert_eq!(choice["message"]["role"], "assistant");
        let content = choice["message"]["content"].as_str().expect("content");
        let finish = choice["finish_reason"].as_str().expect("finish_reason");
        assert!(finish == "stop" || finish == "length", "{finish}");
        let u = &v["usage"];
        let (p, c) = (
            u["prompt_tokens"].as_u64().unwrap(),
            u["completion_tokens"].as_u64().unwrap(),
        );
        assert!(p > 0 && (1..=24).contains(&c), "{u}");
        assert_eq!(u["total_tokens"].as_u64(), Some(p + c));
        for k in [
            "prompt_n",
            "prompt_per_second",
            "predicted_n",
            "predicted_per_second",
            "bytes_read",
            "expert_hit_rate",
        ] {
            assert!(v["timings"][k].is_number(), "timings.{k}: {v}");
        }
        assert_eq!(v["timings"]["predicted_n"].as_u64(), Some(c));
        let reasoning = choice["message"]["reasoning_content"]
            .as_str()
            .unwrap_or("");
        if effort == "off" {
            assert_eq!(reasoning, "");
        }

        let mut body = body.clone();
        body["stream"] = json!(true);
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status().as_u16(), 200);
        let ct = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        let events = sse_events(&r.text().unwrap());
        let (streamed, last) = concat_stream(&events, "delta/content");
        let (streamed_reasoning, _) = concat_stream(&events, "delta/reasoning_content");
        assert_eq!(
            streamed, content,
            "stream deltas == non-stream content ({effort})"
        );
        assert_eq!(streamed_reasoning, reasoning, "reasoning deltas ({effort})");
        assert_eq!(last["object"], "chat.completion.chunk");
        assert_eq!(last["choices"][0]["finish_reason"], finish);
        assert_eq!(last["usage"]["completion_tokens"].as_u64(), Some(c));
        assert!(last["timings"]["predicted_per_second"].is_number());
    }
}

#[test]
fn completions_models_health_metrics() {
    let s = Server::start(&[]);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.7, "seed": 3, "stop": ["zzzz"]});
    let (status, v) = s.post_json("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().expect("text").to_string();
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 12);
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let events = sse_events(&s.post("/v1/completions", &sbody).text().unwrap());
    let (streamed, last) = concat_stream(&events, "text");
    assert_eq!(streamed, text, "same seed ⇒ same text, streamed or not");
    assert!(last["usage"]["total_tokens"].is_number());

    let (st, models) = s.get("/v1/models");
    assert_eq!(st, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "tiny-k3");
    assert_eq!(models["data"].as_array().map(Vec::len), Some(1));
    let (st, health) = s.get("/health");
    assert_eq!((st, health.contains("ok")), (200, true));
    let (st, metrics) = s.get("/metrics");
    assert_eq!(st, 200);
    for name in [
        "k3_tokens_generated_total",
        "k3_prompt_tokens_total",
        "k3_seconds_per_token",
        "k3_bytes_read_total",
        "k3_expert_hit_rate",
        "k3_queue_depth",
        "k3_resident_memory_bytes",
    ] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"));
        let value: f64 = line[name.len() + 1..].parse().expect("a number");
        if name == "k3_tokens_generated_total" || name == "k3_resident_memory_bytes" {
            assert!(value > 0.0, "{line}");
        }
    }
}

#[test]
fn bad_requests_are_openai_errors() {
    let s = Server::start(&["--ctx", "64"]);
    let user = json!([{"role": "user", "content": "hi"}]);
    let r = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .body("{not json")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    assert_eq!(error_of(&v).0, "invalid_request_error");

    for (field, value) in [
        ("temperature", json!(-1)),
        ("top_p", json!(2.0)),
        ("top_k", json!(-3)),
        ("min_p", json!(1.5)),
        ("repeat_penalty", json!(0)),
        ("max_tokens", json!(0)),
    ] {
        let (st, v) = s.post_json(
            "/v1/chat/completions",
            &chat_body(user.clone(), json!({field: value})),
        );
        assert_eq!(st, 400, "{field}: {v}");
        assert_eq!(error_of(&v).1, Some(field), "{v}");
    }
    let long = "word ".repeat(200);
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(json!([{"role": "user", "content": long}]), json!({})),
    );
    assert_eq!(
        (st, error_of(&v).2),
        (400, Some("context_length_exceeded")),
        "{v}"
    );
    let (st, v) = s.post_json("/v1/completions", &json!({"prompt": long}));
    assert_eq!(
        (st, error_of(&v).2),
        (400, Some("context_length_exceeded")),
        "{v}"
    );
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(json!([{"role": "tool", "content": "x"}]), json!({})),
    );
    assert_eq!(
        (st, error_of(&v).1),
        (400, Some("messages[0].tool_call_id")),
        "{v}"
    );
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(json!([{"role": "robot", "content": "x"}]), json!({})),
    );
    assert_eq!((st, error_of(&v).1), (400, Some("messages[0].role")), "{v}");
    let big = json!({"prompt": "x".repeat(2 << 20)});
    let (st, v) = s.post_json("/v1/completions", &big);
    assert_eq!(st, 413, "{v}");
    let (st, _) = s.get("/v1/nothing");
    assert_eq!(st, 404);
    // The server still answers after all that.
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(user, json!({"max_tokens": 4})),
    );
    assert_eq!(st, 200, "{v}");
}

#[test]
fn api_key_is_required_when_set() {
    let s = Server::start(&["--api-key", "sekrit-key"]);
    let url = format!("{}/v1/models", s.base);
    let st = |r: Response| r.status().as_u16();
    assert_eq!(st(s.client.get(&url).send().unwrap()), 401);
    assert_eq!(
        st(s.client.get(&url).bearer_auth("wrong").send().unwrap()),
        401
    );
    assert_eq!(
        st(s.client
            .get(&url)
            .bearer_auth("sekrit-key-")
            .send()
            .unwrap()),
        401
    );
    let r = s.client.get(&url).bearer_auth("sekrit-key").send().unwrap();
    assert_eq!(st(r), 200);
    let r = s
        .client
        .post(format!("{}/v1/chat/completions", s.base))
        .body(chat_body(json!([{"role": "user", "content": "hi"}]), json!({})).to_string())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    assert_eq!(error_of(&v).2, Some("invalid_api_key"));
    assert_eq!(s.get("/health").0, 200, "health needs no key");
}

#[test]
fn queue_full_gives_429() {
    let s = std::sync::Arc::new(Server::start(&["--queue", "1", "--ctx", "4096"]));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let (s, barrier) = (s.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let r = s.post("/v1/completions", &long_job(1500, false));
                let retry = r
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap_or("").to_string());
                let status = r.status().as_u16();
                (status, retry, r.text().unwrap_or_default())
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = results.iter().filter(|r| r.0 == 200).count();
    let full: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert!(ok >= 1, "{results:?}");
    assert!(
        !full.is_empty(),
        "one running + one queued: the rest are refused: {results:?}"
    );
    assert_eq!(ok + full.len(), 6, "{results:?}");
    for (_, retry, body) in full {
        assert_eq!(retry.as_deref(), Some("1"));
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(error_of(&v).2, Some("queue_full"));
    }
}

#[test]
fn disconnect_mid_stream_does_not_wedge() {
    let s = Server::start(&["--ctx", "8192"]);
    let mut r = s.post("/v1/completions", &long_job(8000, true));
    assert_eq!(r.status().as_u16(), 200);
    let mut buf = [0u8; 256];
    let n = r.read(&mut buf).expect("first bytes of the stream");
    assert!(n > 0 && String::from_utf8_lossy(&buf[..n]).contains("data: "));
    drop(r); // disconnect
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(
            json!([{"role": "user", "content": "hi"}]),
            json!({"max_tokens": 4}),
        ),
    );
    assert_eq!(st, 200, "{v}");
    let (_, metrics) = s.get("/metrics");
    let total: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("k3_tokens_generated_total "))
        .and_then(|v| v.parse().ok())
        .expect("counter");
    assert!(
        total < 8000.0,
        "the dropped stream was cancelled early: {total} tokens"
    );
}

fn conversation(s: &Server, extra: Value) -> Vec<(String, u64, u64)> {
    let mut messages = vec![json!({"role": "user", "content": "Tell me a story."})];
    let mut out = Vec::new();
    for next in ["Go on.", "And then?"] {
        let (st, v) = s.post_json(
            "/v1/chat/completions",
            &chat_body(json!(messages), extra.clone()),
        );
        assert_eq!(st, 200, "{v}");
        let content = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        let usage = &v["usage"];
        out.push((
            content.clone(),
            usage["completion_tokens"].as_u64().unwrap(),
            usage["prompt_tokens_reused"].as_u64().unwrap(),
        ));
        messages.push(json!({"role": "assistant", "content": content}));
        messages.push(json!({"role": "user", "content": next}));
    }
    out
}

#[test]
fn reused_state_gives_the_same_output_as_fresh() {
    let reuse = Server::start(&[]);
    let fresh = Server::start(&["--no-reuse"]);
    for extra in [
        json!({}),
        json!({"temperature": 0.9, "seed": 11, "top_k": 40}),
    ] {
        let a = conversation(&reuse, extra.clone());
        let b = conversation(&fresh, extra);
        assert!(
            a[1].2 > 0,
            "the second turn restored the first's state: {a:?}"
        );
        assert!(b.iter().all(|t| t.2 == 0), "{b:?}");
        let strip =
            |v: &[(String, u64, u64)]| v.iter().map(|t| (t.0.clone(), t.1)).collect::<Vec<_>>();
        assert_eq!(strip(&a), strip(&b), "resumed output == fresh output");
    }
}
