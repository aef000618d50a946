//! `k3 serve` with continuous batching (docs/SERVER.md "Batching"): concurrent clients get
//! exactly their solo output, disconnects free their sessions, and the process stays inside
//! `--mem-gb` with `--parallel 4`.

mod serve_common;

use serde_json::{json, Value};
use serve_common::{concat_stream, sse_events, Server};
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Eight different prompts.
fn prompts() -> Vec<String> {
    (0..8)
        .map(|i| format!("client {i} says {}", "la ".repeat(i + 1)))
        .collect()
}

fn body(prompt: &str, stream: bool) -> Value {
    json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stream": stream})
}

/// Polls `/metrics` until `name` reads `want` (or fails after 30 s).
fn wait_metric(s: &Server, name: &str, want: f64) {
    let start = Instant::now();
    while s.metric(name) != want {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{name} stayed at {} (want {want})",
            s.metric(name)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn eight_streaming_clients_with_disconnects_get_their_solo_output_and_free_every_session() {
    let s = Arc::new(Server::start(&["--parallel", "4", "--queue", "8"]));
    let solo: Vec<String> = prompts()
        .iter()
        .map(|p| {
            let (st, v) = s.post_json("/v1/completions", &body(p, false));
            assert_eq!(st, 200, "{v}");
            v["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    let handles: Vec<_> = prompts()
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut r = s.post("/v1/completions", &body(&p, true));
                assert_eq!(r.status().as_u16(), 200);
                if i % 3 == 1 {
                    // disconnect after the first bytes
                    let mut buf = [0u8; 64];
                    let _ = r.read(&mut buf);
                    return None;
                }
                let text = r.text().unwrap();
                Some(concat_stream(&sse_events(&text), "text").0)
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        if let Some(text) = h.join().unwrap() {
            assert_eq!(
                text, solo[i],
                "client {i}: batched output differs from its solo run"
            );
        }
    }
    wait_metric(&s, "k3_sessions_active", 0.0);
    wait_metric(&s, "k3_queue_depth", 0.0);
    let shared_steps = |l: &str| {
        l.split(", batch ")
            .nth(1)
            .and_then(|v| v.split(',').next()?.parse::<f64>().ok())
            .is_some_and(|b| b > 1.0)
    };
    // panics naming every line if no request shared its steps
    s.wait_stderr(shared_steps);
    // the server still answers, and alone gives the solo output again
    let (_, v) = s.post_json("/v1/completions", &body(&prompts()[0], false));
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), solo[0]);
}

#[test]
fn peak_rss_stays_under_mem_gb_with_parallel_4() {
    let budget = 0.1;
    let s = Arc::new(Server::start(&[
        "--mem-gb",
        &budget.to_string(),
        "--parallel",
        "4",
        "--ctx",
        "2048",
    ]));
    let handles: Vec<_> = prompts()[..4]
        .iter()
        .cloned()
        .map(|p| {
            let s = s.clone();
            std::thread::spawn(move || s.post_json("/v1/completions", &body(&p, false)).0)
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 200);
    }
    let peak = s.peak_rss();
    eprintln!("peak RSS {peak} B under --mem-gb {budget}");
    assert!(
        peak as f64 <= budget * 1e9,
        "peak RSS {peak} B exceeds --mem-gb {budget}"
    );
}

#[test]
fn parallel_ubatch_and_plan_sessions_must_be_positive() {
    let tiny = serve_common::tiny();
    for args in [
        vec!["serve", &tiny, "--parallel", "0"],
        vec!["serve", &tiny, "--ubatch", "0"],
        vec!["plan", &tiny, "--sessions", "0"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_k3"))
            .args(&args)
            .env_remove("K3_CONFIG")
            .env("XDG_CONFIG_HOME", "/nonexistent/k3-serve-batch-xdg")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let flag = args[2];
        assert!(
            err.contains(flag) && err.contains("at least 1"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn token_id_prompts_and_return_tokens() {
    let s = Server::start(&[]);
    let text = json!({"prompt": "hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true, "return_tokens": true});
    let (_, a) = s.post_json("/v1/completions", &text);
    let ids = a["choices"][0]["tokens"].as_array().unwrap().clone();
    assert_eq!(ids.len(), 4, "{a}");
    // the same prompt as ids gives the same tokens
    let tok = k3_engine::Tokenizer::from_dir(std::path::Path::new(&serve_common::tiny())).unwrap();
    let mut by_ids = text.clone();
    by_ids["prompt"] = json!(tok.encode("hello", false));
    let (_, b) = s.post_json("/v1/completions", &by_ids);
    assert_eq!(b["choices"][0]["tokens"].as_array().unwrap(), &ids, "{b}");
    let (st, v) = s.post_json(
        "/v1/completions",
        &json!({"prompt": [1, 99999999], "max_tokens": 1}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("out of range"),
        "{v}"
    );
    let (st, v) = s.post_json(
        "/v1/completions",
        &json!({"prompt": [5, 6, 7], "max_tokens": 2, "return_tokens": true}),
    );
    assert_eq!(st, 200, "{v}");
    assert!(
        v["choices"][0]["tokens"].as_array().unwrap().len() <= 2,
        "{v}"
    );
}
