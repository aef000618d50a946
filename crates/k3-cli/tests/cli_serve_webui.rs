//! The chat page and `GET /v1/status` of `k3 serve` (docs/SERVER.md "Chat page", "Status"):
//! the page and its assets are open and carry the CSP, the API is not; `--no-webui` leaves `/`
//! as an unknown path; the status names a queued request's id (from `x-request-id`) in order
//! and the running one's phase. The browser side is tools/webui/test_webui.py. Servers bind
//! 127.0.0.1 only; every loop is bounded.

mod serve_common;

use serde_json::{json, Value};
use serve_common::{long_job, Server};
use std::time::{Duration, Instant};

const KEY: &str = "webui-test-key";

fn get_with_key(s: &Server, path: &str, key: Option<&str>) -> reqwest::blocking::Response {
    let mut req = s.client.get(format!("{}{path}", s.base));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    req.send().expect("request completes")
}

fn json_of(r: reqwest::blocking::Response) -> Value {
    let text = r.text().expect("body");
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

fn status(s: &Server) -> Value {
    let (code, body) = s.get("/v1/status");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status is JSON")
}

/// Polls `/v1/status` (bounded, 60 s) until `wanted` holds; returns that status.
fn wait_status(s: &Server, what: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let v = status(s);
        if wanted(&v) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no status with {what} within 60 s: {}", status(s));
}

#[test]
fn the_page_is_open_with_its_policy_while_the_api_and_status_need_the_key() {
    let s = Server::start(&["--api-key", KEY]);
    for (path, kind) in [
        ("/", "text/html"),
        ("/webui/app.js", "text/javascript"),
        ("/webui/markdown-it.min.js", "text/javascript"),
        ("/webui/app.css", "text/css"),
        ("/favicon.ico", "image/svg+xml"),
    ] {
        let r = get_with_key(&s, path, None);
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("default-src 'self'") && csp.contains("script-src 'self'"),
            "{csp}"
        );
        assert!(!csp.contains("unsafe"), "{csp}");
    }
    let config: Value = json_of(get_with_key(&s, "/webui/config.json", None));
    assert_eq!(config["api_key_required"], json!(true), "{config}");
    assert_eq!(get_with_key(&s, "/v1/status", None).status(), 401);
    let v: Value = json_of(get_with_key(&s, "/v1/status", Some(KEY)));
    assert_eq!(v["object"], "k3.status");
    assert_eq!(v["model"], "tiny-k3");
    assert_eq!(v["state"], "idle");
    assert_eq!(v["plan"], json!({"resident": true}), "{v}");
    assert_eq!(
        (v["jobs"].clone(), v["queued"].clone()),
        (json!([]), json!([]))
    );
}

#[test]
fn no_webui_leaves_the_root_an_unknown_path_and_keeps_the_api() {
    let s = Server::start(&["--no-webui"]);
    for path in ["/", "/webui/app.js", "/webui/config.json"] {
        let (code, body) = s.get(path);
        assert_eq!(code, 404, "{path}: {body}");
        assert!(body.contains("no such endpoint"), "{body}");
    }
    assert_eq!(status(&s)["state"], "idle");
    let config: Value = serde_json::from_str(&Server::start(&[]).get("/webui/config.json").1)
        .expect("config is JSON");
    assert_eq!(config["api_key_required"], json!(false), "{config}");
}

#[test]
fn the_status_names_the_queued_request_and_the_running_ones_phase() {
    let s = Server::start(&["--parallel", "1"]);
    let base = s.base.clone();
    // Holds the only slot for 4000 tokens (end ids ignored); cancelled when dropped.
    let running = s
        .client
        .post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .body(long_job(4000, true).to_string())
        .send()
        .expect("the long job starts");
    assert!(
        running.headers().get("x-request-id").is_none(),
        "only chat names its id"
    );
    let v = wait_status(&s, "a generating job", |v| {
        v["jobs"].as_array().is_some_and(|j| j.len() == 1) && v["jobs"][0]["phase"] == "generating"
    });
    assert_eq!(v["state"], "busy");
    let job = &v["jobs"][0];
    assert!(job["id"].as_str().unwrap().starts_with("cmpl-"), "{job}");
    assert_eq!(job["prompt_fed"], job["prompt_tokens"], "{job}");
    assert!(job["prefill_eta_s"].is_null(), "{job}");
    let waiting = s
        .client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(
            json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 4})
                .to_string(),
        )
        .send()
        .expect("the chat request is queued");
    assert_eq!(waiting.status(), 200);
    let id = waiting.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(id.starts_with("chatcmpl-"), "{id}");
    let v = wait_status(&s, "the queued id", |v| v["queued"] == json!([id]));
    assert_eq!(v["jobs"].as_array().unwrap().len(), 1, "{v}");
    drop(running);
    // The long job is cancelled; the queued one runs and finishes.
    let body = waiting.text().expect("the queued reply");
    assert!(body.contains(&format!("\"id\":\"{id}\"")), "{body}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    let v = wait_status(&s, "idle", |v| v["state"] == "idle");
    assert!(v["tokens_generated_total"].as_u64().unwrap() >= 1, "{v}");
}

#[test]
fn the_status_gives_the_plan_of_a_streaming_budget() {
    let s = Server::start(&["--trunk-gb", "0.0006", "--cache-gb", "0.0006"]);
    let plan = status(&s)["plan"].clone();
    assert_eq!(plan["resident"], json!(false), "{plan}");
    assert_eq!(
        plan["budget"],
        json!({"kind": "split", "trunk_bytes": 600_000, "cache_bytes": 600_000}),
        "{plan}"
    );
    let pinned = plan["trunk_pinned_layers"].as_u64().unwrap();
    assert!(pinned < plan["layers"].as_u64().unwrap(), "{plan}");
    assert!(
        plan["trunk_streamed_bytes_per_token"].as_u64().unwrap() > 0,
        "{plan}"
    );
    assert!(plan["expert_cache_slots"].as_u64().unwrap() > 0, "{plan}");
}
