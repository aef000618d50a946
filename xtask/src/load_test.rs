//! `cargo xtask load-test [--model fixtures/tiny-k3] [--clients 8] [--requests 64]
//! [--max-tokens 16] [--queue 8] [--timeout-s 120]`: drive `k3 serve` with concurrent
//! blocking clients and report latency percentiles, throughput and 429s (docs/SERVER.md
//! "Load test").
//!
//! The k3 binary is built first with `cargo build -p k3-cli --bin k3` (a no-op when fresh),
//! in the profile xtask itself was built in (debug unless xtask runs with `--release`), and
//! is found at `$CARGO_TARGET_DIR/<profile>/k3` (a relative `CARGO_TARGET_DIR` is taken from
//! the workspace root) or `<workspace>/target/<profile>/k3`. The server binds 127.0.0.1 only,
//! on an ephemeral port read from its `listening on http://ADDR` stderr line, and is killed
//! when the run ends, on success or error. Every request has a timeout and the whole run is
//! bounded by `--timeout-s`. A 429 (queue full) is retried after its `Retry-After` and counted
//! apart; any other failure is an error and makes the command exit non-zero.

use clap::Args;
use reqwest::blocking::Client;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Longest a single HTTP request may take (also capped by the run's deadline).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for the server's `listening on` line (also capped by the deadline).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Retry-After used when a 429 carries none (or an unparsable one).
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Flags of `load-test`.
#[derive(Args, Debug)]
pub struct LoadTestArgs {
    /// Model directory served (relative: to the current directory, else the workspace root).
    #[arg(long, default_value = "fixtures/tiny-k3")]
    pub model: PathBuf,
    /// Concurrent client threads.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Requests in all, split evenly across the clients.
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// `max_tokens` of every request.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    /// The server's `--queue`.
    #[arg(long, default_value_t = 8)]
    pub queue: usize,
    /// Bound on the whole run (build excluded), in seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
}

pub fn run(args: &LoadTestArgs) -> ExitCode {
    match load_test(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("load-test: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The running server; killed and reaped when dropped.
pub(crate) struct ServerGuard {
    child: Child,
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one client thread saw.
#[derive(Default)]
struct ClientStats {
    latencies: Vec<Duration>,
    completion_tokens: u64,
    too_many: u64,
    errors: Vec<String>,
}

pub(crate) fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Builds (if needed) and locates the k3 binary.
pub(crate) fn build_k3(root: &Path) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "-p", "k3-cli", "--bin", "k3"]);
    if profile() == "release" {
        cmd.arg("--release");
    }
    eprintln!("load-test: cargo build -p k3-cli --bin k3 ({})", profile());
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build -p k3-cli failed ({status})"));
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    };
    let bin = target
        .join(profile())
        .join(format!("k3{}", std::env::consts::EXE_SUFFIX));
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("built k3 not found at {}", bin.display()))
    }
}

pub(crate) fn resolve_model(model: &Path, root: &Path) -> Result<PathBuf, String> {
    if model.is_dir() {
        return Ok(model.to_path_buf());
    }
    let from_root = root.join(model);
    if model.is_relative() && from_root.is_dir() {
        return Ok(from_root);
    }
    Err(format!("model directory not found: {}", model.display()))
}

/// Starts `k3 serve` on 127.0.0.1:0 and waits for its address.
pub(crate) fn start_server(
    bin: &Path,
    model: &Path,
    queue: usize,
    deadline: Instant,
) -> Result<(ServerGuard, String), String> {
    start_server_with(bin, model, queue, &[], STARTUP_TIMEOUT, deadline)
}

/// [`start_server`] with further `k3 serve` flags.
pub(crate) fn start_server_with(
    bin: &Path,
    model: &Path,
    queue: usize,
    extra: &[String],
    startup: Duration,
    deadline: Instant,
) -> Result<(ServerGuard, String), String> {
    let mut child = Command::new(bin)
        .arg("serve")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", "0", "--queue"])
        .arg(queue.to_string())
        .args(extra)
        .env_remove("K3_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent/k3-load-test-xdg")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let stderr = child.stderr.take();
    let guard = ServerGuard { child };
    let Some(stderr) = stderr else {
        return Err("the server's stderr is not piped".into());
    };
    let (tx, rx) = mpsc::channel();
    // Keeps draining stderr after the address so the server never blocks on a full pipe; an
    // error line before the address is passed on as `Err`.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(addr) = line.split("listening on ").nth(1) {
                let _ = tx.send(Ok(addr.trim().to_string()));
            } else if line.contains("error") {
                let _ = tx.send(Err(line));
            }
        }
    });
    let wait = startup.min(deadline.saturating_duration_since(Instant::now()));
    let base = match rx.recv_timeout(wait) {
        Ok(Ok(base)) => base,
        Ok(Err(line)) => return Err(format!("k3 serve failed to start: {line}")),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            return Err("k3 serve exited before printing its address".into())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return Err(format!(
                "k3 serve printed no address within {} s",
                wait.as_secs()
            ))
        }
    };
    if !base.starts_with("http://127.0.0.1:") {
        return Err(format!("the server is not on loopback: {base}"));
    }
    Ok((guard, base))
}

fn retry_after(resp: &reqwest::blocking::Response) -> Duration {
    resp.headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_RETRY_AFTER)
}

/// One request until it succeeds, fails, or the deadline passes; 429s are retried.
fn one_request(
    client: &Client,
    url: &str,
    body: &str,
    deadline: Instant,
    stats: &mut ClientStats,
) -> Result<(), String> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("run deadline reached".into());
        }
        let started = Instant::now();
        let resp = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .timeout(REQUEST_TIMEOUT.min(left))
            .send()
            .map_err(|e| format!("request failed: {e}"))?;
        let status = resp.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            stats.too_many += 1;
            let wait = retry_after(&resp).min(deadline.saturating_duration_since(Instant::now()));
            std::thread::sleep(wait);
            continue;
        }
        let text = resp
            .text()
            .map_err(|e| format!("reading the body failed: {e}"))?;
        let latency = started.elapsed();
        if !status.is_success() {
            return Err(format!("HTTP {status}: {text}"));
        }
        let v: Value =
            serde_json::from_str(&text).map_err(|e| format!("response is not JSON: {e}"))?;
        let tokens = v
            .pointer("/usage/completion_tokens")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("response has no usage.completion_tokens: {text}"))?;
        if v.pointer("/choices/0/message").is_none() {
            return Err(format!("response has no choices[0].message: {text}"));
        }
        stats.latencies.push(latency);
        stats.completion_tokens += tokens;
        return Ok(());
    }
}

fn client_thread(
    client: Client,
    url: String,
    id: usize,
    count: usize,
    max_tokens: usize,
    deadline: Instant,
) -> ClientStats {
    let mut stats = ClientStats::default();
    for n in 0..count {
        let body = json!({
            "messages": [{
                "role": "user",
                "content": format!("Load test: client {id}, request {n}. Count to ten."),
            }],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": false,
        })
        .to_string();
        if let Err(e) = one_request(&client, &url, &body, deadline, &mut stats) {
            stats.errors.push(format!("client {id} request {n}: {e}"));
            if Instant::now() >= deadline {
                break;
            }
        }
    }
    stats
}

/// `k3_queue_depth` from /metrics.
fn queue_depth(client: &Client, base: &str, deadline: Instant) -> Result<String, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    let text = client
        .get(format!("{base}/metrics"))
        .timeout(REQUEST_TIMEOUT.min(left.max(Duration::from_secs(1))))
        .send()
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.text())
        .map_err(|e| format!("GET /metrics failed: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("k3_queue_depth "))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| "no k3_queue_depth in /metrics".into())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // Nearest rank.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn load_test(args: &LoadTestArgs) -> Result<bool, String> {
    if args.clients == 0 || args.requests == 0 || args.max_tokens == 0 || args.queue == 0 {
        return Err("--clients, --requests, --max-tokens and --queue must be at least 1".into());
    }
    let root = workspace_root();
    let model = resolve_model(&args.model, &root)?;
    let bin = build_k3(&root)?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    let (server, base) = start_server(&bin, &model, args.queue, deadline)?;
    eprintln!("load-test: server at {base}");
    let client = Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let url = format!("{base}/v1/chat/completions");

    let started = Instant::now();
    let handles: Vec<_> = (0..args.clients)
        .map(|id| {
            let count =
                args.requests / args.clients + usize::from(id < args.requests % args.clients);
            let (client, url, max_tokens) = (client.clone(), url.clone(), args.max_tokens);
            std::thread::spawn(move || client_thread(client, url, id, count, max_tokens, deadline))
        })
        .collect();
    let mut all = ClientStats::default();
    for h in handles {
        match h.join() {
            Ok(s) => {
                all.latencies.extend(s.latencies);
                all.completion_tokens += s.completion_tokens;
                all.too_many += s.too_many;
                all.errors.extend(s.errors);
            }
            Err(_) => all.errors.push("a client thread panicked".into()),
        }
    }
    let elapsed = started.elapsed();
    let depth = queue_depth(&client, &base, deadline).unwrap_or_else(|e| {
        all.errors.push(e.clone());
        format!("? ({e})")
    });
    drop(server);

    all.latencies.sort();
    let served = all.latencies.len();
    let secs = elapsed.as_secs_f64().max(f64::EPSILON);
    let rows: Vec<(&str, String)> = vec![
        ("model", model.display().to_string()),
        (
            "clients / requests / max_tokens / queue",
            format!(
                "{} / {} / {} / {}",
                args.clients, args.requests, args.max_tokens, args.queue
            ),
        ),
        ("requests served", format!("{served} / {}", args.requests)),
        ("429s (expected, retried)", all.too_many.to_string()),
        ("other errors (must be 0)", all.errors.len().to_string()),
        ("latency p50", ms(percentile(&all.latencies, 50.0))),
        ("latency p90", ms(percentile(&all.latencies, 90.0))),
        ("latency p99", ms(percentile(&all.latencies, 99.0))),
        (
            "latency max",
            ms(all.latencies.last().copied().unwrap_or_default()),
        ),
        ("wall time", format!("{secs:.2} s")),
        ("requests/s", format!("{:.2}", served as f64 / secs)),
        (
            "tokens/s (usage.completion_tokens)",
            format!(
                "{:.1} ({} tokens)",
                all.completion_tokens as f64 / secs,
                all.completion_tokens
            ),
        ),
        ("queue depth at end (/metrics)", depth),
    ];
    println!("| metric | value |");
    println!("| --- | --- |");
    for (k, v) in &rows {
        println!("| {k} | {v} |");
    }
    for e in all.errors.iter().take(20) {
        eprintln!("load-test: error: {e}");
    }
    Ok(all.errors.is_empty() && served == args.requests)
}
