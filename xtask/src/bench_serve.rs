//! `cargo xtask bench-serve [--model fixtures/tiny-k3] [--stream-budget "--trunk-gb 3 --cache-gb 4"]
//! [--clients 1,2,4] [--requests R] [--tokens 8] [--prompt-len 8] [--parallel P] [--queue Q]
//! [--timeout-s 3600]`: `k3 serve` under concurrent clients, measured end to end
//! (docs/SERVER.md#serving-benchmark, docs/PERFORMANCE.md#serving).
//!
//! For each budget (the streaming one given, and the trunk resident), the k3 binary is
//! started as `k3 serve --parallel P --queue Q` (serve_process.rs) and driven with greedy
//! streamed completions of token-id prompts (serve_client.rs). First MAX(C) requests run
//! alone, one after another: their ids are the reference and the run is the "one at a time"
//! baseline. Then, for each C, C clients share R requests (default C): aggregate tokens/s,
//! mean per-request s/token, time to first token, the longest time between tokens, latency
//! percentiles, 429s (retried after `Retry-After`, counted) and bytes read per generated token
//! (trunk and all, from `/metrics`). The command fails if any request's ids differ from its
//! solo run, if any request fails other than by 429, or when `--timeout-s` passes.

use crate::fuzz::workspace_root;
use crate::serve_client::{metric, percentile, prompt, stream_one, Seen};
use crate::serve_process::{build_k3, resolve_model, start_server};
use clap::Args;
use reqwest::blocking::Client;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Longest wait for the server's address: a budgeted open reads the pinned trunk layers
/// first, minutes on a big checkpoint (also capped by `--timeout-s`).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(1200);

/// Flags of `bench-serve`.
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Model directory served (relative: to the current directory, else the workspace root).
    #[arg(long, default_value = "fixtures/tiny-k3")]
    pub model: PathBuf,
    /// `k3 serve` budget flags of the streaming run (empty: skip it).
    #[arg(long, default_value = "--trunk-gb 3 --cache-gb 4")]
    pub stream_budget: String,
    /// Also run with the trunk resident (no budget flags).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub resident: bool,
    /// Concurrent client counts, one row each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub clients: Vec<usize>,
    /// Requests per row, shared by its clients (default: one per client; at least one each).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 8)]
    pub tokens: usize,
    /// Prompt ids per request.
    #[arg(long, default_value_t = 8)]
    pub prompt_len: usize,
    /// The server's `--parallel` (default: the most clients).
    #[arg(long)]
    pub parallel: Option<usize>,
    /// The server's `--queue` (default: twice the most clients); a small queue exercises 429.
    #[arg(long)]
    pub queue: Option<usize>,
    /// Bound on the whole run after the build, in seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout_s: u64,
    /// Tokenizer directory for a model without one (`k3 serve --tok`).
    #[arg(long, default_value = "fixtures/tiny-k3")]
    pub tok: PathBuf,
}

/// A row of the table: C clients at once (or one at a time).
struct Row {
    label: String,
    requests: usize,
    wall: f64,
    tokens: usize,
    per_request_spt: f64,
    ttft: f64,
    max_gap: f64,
    /// Ascending.
    latencies: Vec<f64>,
    too_many: u64,
    bytes: f64,
    trunk_bytes: f64,
}

fn row(label: String, seen: &[Seen], wall: f64, bytes: (f64, f64)) -> Row {
    let tokens: usize = seen.iter().map(|s| s.ids.len()).sum();
    let spt: Vec<f64> = seen
        .iter()
        .filter(|s| s.ids.len() > 1)
        .map(|s| s.decode / (s.ids.len() - 1) as f64)
        .collect();
    let mut latencies: Vec<f64> = seen.iter().map(|s| s.latency).collect();
    latencies.sort_by(f64::total_cmp);
    Row {
        label,
        requests: seen.len(),
        wall,
        tokens,
        per_request_spt: spt.iter().sum::<f64>() / spt.len().max(1) as f64,
        ttft: seen.iter().map(|s| s.first_token).sum::<f64>() / seen.len().max(1) as f64,
        max_gap: seen.iter().map(|s| s.max_gap).fold(0.0, f64::max),
        latencies,
        too_many: seen.iter().map(|s| s.too_many).sum(),
        bytes: bytes.0 / tokens.max(1) as f64,
        trunk_bytes: bytes.1 / tokens.max(1) as f64,
    }
}

/// The server under test and what every request of a run shares.
struct Target<'a> {
    client: Client,
    base: String,
    args: &'a BenchServeArgs,
    deadline: Instant,
    /// Distinct prompts: request `n` sends prompt `n % distinct`.
    distinct: usize,
}

impl Target<'_> {
    fn request(&self, n: usize) -> Result<Seen, String> {
        let ids = prompt(n % self.distinct, self.args.prompt_len);
        stream_one(
            &self.client,
            &self.base,
            &ids,
            self.args.tokens,
            self.deadline,
        )
    }

    /// (all bytes, trunk bytes) read so far.
    fn bytes(&self) -> Result<(f64, f64), String> {
        Ok((
            metric(&self.client, &self.base, "k3_bytes_read_total")?,
            metric(&self.client, &self.base, "k3_trunk_bytes_read_total")?,
        ))
    }

    /// `requests` requests over `clients` threads (client i sends requests i, i + C, …).
    fn concurrent(&self, clients: usize, requests: usize) -> Result<Vec<(usize, Seen)>, String> {
        let per_client: Vec<Result<Vec<(usize, Seen)>, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..clients)
                .map(|i| {
                    s.spawn(move || {
                        (i..requests)
                            .step_by(clients)
                            .map(|n| self.request(n).map(|seen| (n, seen)))
                            .collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a client panicked".into())))
                .collect()
        });
        let mut all = Vec::new();
        for r in per_client {
            all.extend(r?);
        }
        Ok(all)
    }
}

/// Every row of one server configuration (the solo runs first), and a line on the server.
fn bench_budget(
    args: &BenchServeArgs,
    bin: &Path,
    model: &Path,
    flags: &[String],
    deadline: Instant,
) -> Result<(Vec<Row>, String), String> {
    let max_c = args.clients.iter().copied().max().unwrap_or(1);
    let parallel = args.parallel.unwrap_or(max_c);
    let mut extra: Vec<String> = vec!["--parallel".into(), parallel.to_string()];
    extra.extend(["--no-reuse", "--threads", "2", "--ctx", "256"].map(String::from));
    if !model.join("tiktoken.model").is_file() && !model.join("tokenizer.json").is_file() {
        extra.extend(["--tok".into(), args.tok.display().to_string()]);
    }
    extra.extend_from_slice(flags);
    let queue = args.queue.unwrap_or(2 * max_c);
    let (_guard, base) = start_server(bin, model, queue, &extra, STARTUP_TIMEOUT, deadline)?;
    let client = Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let target = Target {
        client,
        base,
        args,
        deadline,
        distinct: max_c,
    };
    // warm-up: one token, so page-cache and allocator state are comparable
    stream_one(
        &target.client,
        &target.base,
        &prompt(99, args.prompt_len),
        1,
        deadline,
    )?;
    let (b0, t0) = (target.bytes()?, Instant::now());
    let solo = (0..max_c)
        .map(|n| target.request(n))
        .collect::<Result<Vec<_>, _>>()?;
    let b1 = target.bytes()?;
    let wall = t0.elapsed().as_secs_f64();
    let mut rows = vec![row(
        format!("{max_c} one at a time"),
        &solo,
        wall,
        (b1.0 - b0.0, b1.1 - b0.1),
    )];
    for &c in &args.clients {
        let requests = args.requests.unwrap_or(c).max(c);
        let (b0, t0) = (target.bytes()?, Instant::now());
        let seen = target.concurrent(c, requests)?;
        let wall = t0.elapsed().as_secs_f64();
        for (n, s) in &seen {
            let want = &solo[n % max_c].ids;
            if &s.ids != want {
                return Err(format!(
                    "C={c} request {n}: ids {:?} differ from its solo run {want:?}",
                    s.ids
                ));
            }
        }
        let b1 = target.bytes()?;
        let seen: Vec<Seen> = seen.into_iter().map(|(_, s)| s).collect();
        let bytes = (b1.0 - b0.0, b1.1 - b0.1);
        rows.push(row(format!("{c} at once"), &seen, wall, bytes));
    }
    let depth = metric(&target.client, &target.base, "k3_queue_depth")?;
    let server =
        format!("server: --parallel {parallel} --queue {queue}; queue depth at the end: {depth}");
    Ok((rows, server))
}

fn print(label: &str, rows: &[Row], server: &str) {
    println!("\n{label}\n");
    println!("| clients | requests | wall s | tokens | aggregate tok/s | vs one at a time | per-request s/token | first token s | max gap s | latency p50 / p99 s | 429s | bytes read / token | trunk bytes / token |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let base = rows.first().map_or(1.0, |r| r.tokens as f64 / r.wall);
    for r in rows {
        let agg = r.tokens as f64 / r.wall;
        println!(
            "| {} | {} | {:.2} | {} | {:.3} | {:.2}× | {:.3} | {:.2} | {:.2} | {:.2} / {:.2} | {} | {:.1} MB | {:.1} MB |",
            r.label,
            r.requests,
            r.wall,
            r.tokens,
            agg,
            agg / base,
            r.per_request_spt,
            r.ttft,
            r.max_gap,
            percentile(&r.latencies, 50.0),
            percentile(&r.latencies, 99.0),
            r.too_many,
            r.bytes / 1e6,
            r.trunk_bytes / 1e6
        );
    }
    println!("\n{server}");
}

fn bench(args: &BenchServeArgs) -> Result<(), String> {
    let zero = |n: usize| n == 0;
    if args.clients.iter().copied().any(zero)
        || [args.tokens, args.prompt_len].into_iter().any(zero)
        || args.parallel.is_some_and(zero)
        || args.queue.is_some_and(zero)
    {
        return Err(
            "--clients, --tokens, --prompt-len, --parallel and --queue must be at least 1".into(),
        );
    }
    let root = workspace_root();
    let model = resolve_model(&args.model, &root)?;
    let bin = build_k3(&root)?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    let mut configs: Vec<(String, Vec<String>)> = Vec::new();
    if !args.stream_budget.trim().is_empty() {
        let flags = args
            .stream_budget
            .split_whitespace()
            .map(String::from)
            .collect();
        configs.push((format!("streaming budget `{}`", args.stream_budget), flags));
    }
    if args.resident {
        configs.push(("trunk resident (no budget)".into(), Vec::new()));
    }
    println!(
        "bench-serve: {} — {} tokens per request, {}-id prompts, greedy; every request's ids equal its solo run",
        model.display(),
        args.tokens,
        args.prompt_len
    );
    for (label, flags) in configs {
        let (rows, server) = bench_budget(args, &bin, &model, &flags, deadline)?;
        print(&label, &rows, &server);
    }
    Ok(())
}

pub fn run(args: &BenchServeArgs) -> ExitCode {
    match bench(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-serve: {e}");
            ExitCode::FAILURE
        }
    }
}
