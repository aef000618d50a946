//! Helpers of the `k3 serve` tests: a server on 127.0.0.1 with an ephemeral port (`--port 0`;
//! the bound address is read from its `listening on http://ADDR` line), killed when dropped.
#![allow(dead_code)]

use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

pub fn tiny() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny-k3")
        .to_string_lossy()
        .into_owned()
}

pub struct Server {
    child: Child,
    /// The server's `XDG_RUNTIME_DIR`: its `k3 ps` record goes here, not into the user's
    /// runtime directory, and is removed with it (the server is killed, so it cannot).
    _runtime: tempfile::TempDir,
    pub base: String,
    pub client: Client,
    /// Every stderr line so far.
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_env(extra, &[])
    }

    /// Starts `k3 serve` with extra flags and environment variables.
    pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let runtime = tempfile::Builder::new()
            .prefix("k3-serve-run-")
            .tempdir()
            .expect("a runtime directory for the server");
        let mut child = Command::new(env!("CARGO_BIN_EXE_k3"))
            .args(["serve", &tiny(), "--port", "0", "--threads", "2"])
            .args(extra)
            .env("XDG_RUNTIME_DIR", runtime.path())
            .envs(env.iter().copied())
            .env_remove("K3_CONFIG")
            .env("XDG_CONFIG_HOME", "/nonexistent/k3-serve-test-xdg")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("k3 serve starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = mpsc::channel();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.split("listening on ").nth(1) {
                    let _ = tx.send(addr.trim().to_string());
                }
                sink.lock().unwrap().push(line);
            }
        });
        let base = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(b) => b,
            Err(_) => {
                let _ = child.kill();
                panic!("k3 serve did not print its address within 60 s");
            }
        };
        assert!(base.starts_with("http://127.0.0.1:"), "{base}");
        // No connection reuse: the server may close a connection after an error response
        // (e.g. 413 before reading the body), and a pooled reuse would race that close.
        let client = Client::builder()
            .timeout(Duration::from_secs(120))
            .pool_max_idle_per_host(0)
            .no_proxy()
            .build()
            .expect("client");
        Server {
            child,
            _runtime: runtime,
            base,
            client,
            stderr: lines,
        }
    }

    /// The server's peak resident set (VmHWM), bytes.
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the server's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmHWM")
            * 1024
    }

    /// Waits (bounded, 10 s) until a stderr line satisfies `wanted`, then returns every line so
    /// far. A request's log line is written after its reply ends, so a client that has its
    /// reply may read stderr before that line arrives.
    pub fn wait_stderr(&self, wanted: impl Fn(&str) -> bool) -> Vec<String> {
        for _ in 0..200 {
            let lines = self.stderr.lock().unwrap().clone();
            if lines.iter().any(|l| wanted(l)) {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "no wanted stderr line within 10 s: {:?}",
            self.stderr.lock().unwrap()
        );
    }

    /// Waits (bounded) for a stderr line containing `needle` and returns it.
    pub fn wait_log_line(&self, needle: &str) -> String {
        let lines = self.wait_stderr(|l| l.contains(needle));
        lines.into_iter().find(|l| l.contains(needle)).unwrap()
    }

    /// The value of metric `name` in `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in {text}"))
    }

    pub fn post(&self, path: &str, body: &Value) -> Response {
        self.client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .expect("request completes")
    }

    pub fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self.post(path, body);
        let status = r.status().as_u16();
        let text = r.text().expect("body");
        let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
        (status, v)
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .expect("request completes");
        (r.status().as_u16(), r.text().expect("body"))
    }
}

/// The `data:` payloads of an SSE body, `[DONE]` included.
pub fn sse_events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// Concatenated `field` of every chunk's delta, the last JSON chunk, and whether it ended with [DONE].
pub fn concat_stream(events: &[String], field: &str) -> (String, Value) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk is JSON"))
        .collect();
    let text = chunks
        .iter()
        .filter_map(|c| c.pointer(&format!("/choices/0/{field}")))
        .filter_map(Value::as_str)
        .collect::<String>();
    (text, chunks.last().cloned().expect("at least one chunk"))
}

pub fn chat_body(messages: Value, extra: Value) -> Value {
    let mut body =
        json!({"model": "tiny-k3", "messages": messages, "max_tokens": 24, "temperature": 0});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

pub fn error_of(v: &Value) -> (&str, Option<&str>, Option<&str>) {
    let e = &v["error"];
    assert!(e["message"].as_str().is_some(), "{v}");
    (
        e["type"].as_str().unwrap_or(""),
        e["param"].as_str(),
        e["code"].as_str(),
    )
}

/// A long generation: end ids ignored, so it runs `max_tokens` tokens.
pub fn long_job(max_tokens: u32, stream: bool) -> Value {
    json!({"prompt": "a", "max_tokens": max_tokens, "ignore_eos": true, "stream": stream})
}
