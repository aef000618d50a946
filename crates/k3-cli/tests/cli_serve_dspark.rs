//! `k3 serve --draft-model DIR` (docs/DSPARK.md, docs/SERVER.md "Drafting"): a request
//! decoding alone drafts DSpark blocks through the scheduler and verifies them in one pass;
//! every reply — OpenAI completions and chat, Anthropic messages, streamed and not, greedy
//! and seeded sampling — carries the ids of the plain server and of `k3 run`, and the stats
//! report acceptance length, tokens per trunk pass and bytes read per generated token.

mod common;
mod serve_common;

use serde_json::{json, Value};
use serve_common::{concat_stream, sse_events, Server};

/// A budget where the trunk streams: the cost model then verifies drafts.
const BUDGET: [&str; 4] = ["--trunk-gb", "0.001", "--cache-gb", "0.01"];

fn dspark() -> String {
    common::tiny()
        .parent()
        .unwrap()
        .join("tiny-k3-dspark")
        .to_string_lossy()
        .into_owned()
}

/// The ids `k3 run` starts every drafting test from.
const PROMPT: [u32; 7] = [637, 229, 263, 638, 730, 42, 197];

/// The generated ids a streamed OpenAI reply carries (on its final chunk).
fn streamed_tokens(s: &Server, path: &str, body: &Value) -> Value {
    let events = sse_events(&s.post(path, body).text().unwrap());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find_map(|c| c["choices"][0].get("tokens").cloned())
        .unwrap_or(Value::Null)
}

/// Generated ids (and the decode stats when the reply has them) of every request kind.
fn replies(s: &Server) -> Vec<(Value, Value)> {
    let mut out = Vec::new();
    let completions = [
        json!({"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": true}),
        json!({"prompt": "once upon a time", "max_tokens": 14, "temperature": 0.8, "seed": 5, "ignore_eos": true}),
    ];
    for body in &completions {
        let mut body = body.clone();
        body["return_tokens"] = json!(true);
        let (st, v) = s.post_json("/v1/completions", &body);
        assert_eq!(st, 200, "{v}");
        out.push((
            v["choices"][0]["tokens"].clone(),
            v["timings"]["decode"].clone(),
        ));
        body["stream"] = json!(true);
        out.push((streamed_tokens(s, "/v1/completions", &body), Value::Null));
    }
    let chat = json!({"messages": [{"role": "user", "content": "tell me a story"}],
        "max_tokens": 12, "temperature": 0.7, "seed": 3, "return_tokens": true});
    let (st, v) = s.post_json("/v1/chat/completions", &chat);
    assert_eq!(st, 200, "{v}");
    out.push((
        v["choices"][0]["tokens"].clone(),
        v["timings"]["decode"].clone(),
    ));
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    // a streamed chat reply carries its text (and, with usage, its timings), not its ids
    let events = sse_events(&s.post("/v1/chat/completions", &streamed).text().unwrap());
    let (text, last) = concat_stream(&events, "delta/content");
    out.push((json!(text), last["timings"]["decode"].clone()));
    // Anthropic: the text of the reply (its ids are not in the Message object)
    let msg = json!({"model": "tiny-k3", "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "user", "content": "hello there"}]});
    let (st, v) = s.post_json("/v1/messages", &msg);
    assert_eq!(st, 200, "{v}");
    out.push((v["content"].clone(), Value::Null));
    let mut streamed = msg.clone();
    streamed["stream"] = json!(true);
    let body = s.post("/v1/messages", &streamed).text().unwrap();
    let text: String = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|e| e["delta"]["text"].as_str().map(str::to_string))
        .collect();
    out.push((json!(text), Value::Null));
    out
}

#[test]
fn serve_with_a_draft_model_drafts_blocks_and_changes_no_reply() {
    let plain = Server::start(&BUDGET);
    let want = replies(&plain);
    drop(plain);
    let mut flags = BUDGET.to_vec();
    let d = dspark();
    flags.extend(["--draft-model", &d]);
    let served = Server::start(&flags);
    let got = replies(&served);
    for (i, ((ids, _), (want_ids, _))) in got.iter().zip(&want).enumerate() {
        assert!(
            !ids.is_null() && ids != &json!(""),
            "reply {i}: no ids/text"
        );
        assert_eq!(ids, want_ids, "reply {i}");
    }
    // the greedy completion is `k3 run`'s
    let dir = common::scratch_dir("serve-dspark", "run");
    let (_, run) = common::run_tiny_json(16, &["--draft", "off"], &dir.join("run.json"));
    assert_eq!(got[0].0, run["generated_ids"]);
    // block drafts were verified, and the stats say what they bought
    let decode = &got[0].1;
    assert_eq!(decode["drafter"], "dspark", "{decode}");
    let verifying: u64 = got
        .iter()
        .filter_map(|(_, d)| d["verifying_passes"].as_u64())
        .sum();
    assert!(verifying > 0, "no block was verified: {got:?}");
    for (_, d) in got.iter().filter(|(_, d)| !d.is_null()) {
        let tau = d["acceptance_length"].as_f64().unwrap();
        let per_pass = d["tokens_per_trunk_pass"].as_f64().unwrap();
        assert!(
            d["verifying_passes"].as_u64() == Some(0) || tau >= 1.0,
            "{d}"
        );
        assert!(per_pass >= 1.0, "{d}");
        assert!(
            d["bytes_read_per_generated_token"].as_f64().unwrap() > 0.0,
            "{d}"
        );
        assert!(
            d["accepted"].as_u64().unwrap() <= d["drafted"].as_u64().unwrap(),
            "{d}"
        );
    }
    assert!(served.metric("k3_draft_verifying_passes_total") >= verifying as f64);
    assert!(served.metric("k3_tokens_per_trunk_pass") >= 1.0);
    assert!(served.metric("k3_bytes_read_per_generated_token") > 0.0);
    assert!(served.metric("k3_draft_acceptance_length") >= 1.0);
    let (_, status) = served.get("/v1/status");
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["decode"]["drafter"], "dspark", "{status}");
    assert!(status["decode"]["acceptance_length"].as_f64().unwrap() >= 1.0);
    let line = served.wait_log_line("DSpark block drafting accepted");
    assert!(line.contains("tokens per trunk pass"), "{line}");
}

#[test]
fn batched_requests_with_a_draft_model_give_the_plain_replies() {
    // two requests at once share plain batched steps (drafting is for a request alone)
    let bodies: Vec<Value> = (0..2)
        .map(|i| {
            json!({"prompt": PROMPT, "max_tokens": 10 + i, "temperature": 0,
            "ignore_eos": true, "return_tokens": true})
        })
        .collect();
    let both = |s: &Server| -> Vec<Value> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = bodies
                .iter()
                .map(|b| scope.spawn(move || s.post_json("/v1/completions", b).1))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap()["choices"][0]["tokens"].clone())
                .collect()
        })
    };
    let plain = Server::start(&BUDGET);
    let want = both(&plain);
    drop(plain);
    let mut flags = BUDGET.to_vec();
    let d = dspark();
    flags.extend(["--draft-model", &d]);
    let served = Server::start(&flags);
    assert_eq!(both(&served), want);
}
