//! `cargo xtask bench-serve --model DIR [--stream-budget "--trunk-gb 3 --cache-gb 4"]
//! [--clients 1,2,4] [--tokens 8] [--prompt-len 8]`: continuous batching measured end to end
//! (docs/SERVER.md "Batching", docs/PERFORMANCE.md "Serving").
//!
//! For each budget (the streaming one given, and the trunk resident), the k3 binary is
//! started as `k3 serve --parallel MAX(C)` and driven with greedy streaming completions of
//! token-id prompts (client i has its own prompt). First every client's request runs alone,
//! one after another: its ids are the reference and the run is the "one at a time" baseline.
//! Then C clients run at once, for each C: aggregate tokens/s, mean per-client s/token, time
//! to first token, the longest time between tokens, and bytes read per generated token
//! (trunk and all, from `/metrics`). Every concurrent client's ids must equal its solo run,
//! else the command fails.

use crate::load_test::{build_k3, resolve_model, start_server_with, workspace_root};
use clap::Args;
use reqwest::blocking::Client;
use serde_json::{json, Value};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Flags of `bench-serve`.
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Model directory served.
    #[arg(long)]
    pub model: std::path::PathBuf,
    /// `k3 serve` budget flags of the streaming run (empty: skip it).
    #[arg(long, default_value = "--trunk-gb 3 --cache-gb 4")]
    pub stream_budget: String,
    /// Also run with the trunk resident (no budget flags).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub resident: bool,
    /// Concurrent client counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub clients: Vec<usize>,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 8)]
    pub tokens: usize,
    /// Prompt ids per request.
    #[arg(long, default_value_t = 8)]
    pub prompt_len: usize,
    /// Tokenizer directory for a model without one (`k3 serve --tok`).
    #[arg(long, default_value = "fixtures/tiny-k3")]
    pub tok: std::path::PathBuf,
}

/// One streamed request: its ids and the server's timings of it (seconds).
struct Seen {
    ids: Vec<u32>,
    /// From queueing to the first token.
    first_token: f64,
    /// From the first token to the last.
    decode: f64,
    /// Longest wait between two tokens.
    max_gap: f64,
}

fn prompt(client: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| ((client * 7919 + j * 104_729) % 997 + 1) as u32)
        .collect()
}

fn stream_one(client: &Client, base: &str, ids: &[u32], tokens: usize) -> Result<Seen, String> {
    use std::io::{BufRead, BufReader};
    let body = json!({"prompt": ids, "max_tokens": tokens, "temperature": 0, "ignore_eos": true,
                      "stream": true, "return_tokens": true});
    let resp = client
        .post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .map_err(|e| format!("request: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("status {}", resp.status()));
    }
    let mut seen = Seen {
        ids: Vec::new(),
        first_token: 0.0,
        decode: 0.0,
        max_gap: 0.0,
    };
    for line in BufReader::new(resp).lines() {
        let line = line.map_err(|e| format!("stream: {e}"))?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("chunk: {e}"))?;
        let c = &v["choices"][0];
        if let Some(t) = c["tokens"].as_array() {
            seen.ids = t
                .iter()
                .filter_map(|x| x.as_u64().map(|x| x as u32))
                .collect();
        }
        // The server's own clock: a bench model's ids past the tokenizer's vocabulary decode
        // to no text, so text chunks cannot time the tokens.
        let t = &v["timings"];
        let ms = |k: &str| t[k].as_f64().unwrap_or(0.0) / 1e3;
        if !t.is_null() {
            seen.first_token = ms("first_token_ms");
            seen.decode = ms("predicted_ms");
            seen.max_gap = ms("max_token_gap_ms");
        }
    }
    Ok(seen)
}

fn metric(client: &Client, base: &str, name: &str) -> Result<f64, String> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.text())
        .map_err(|e| format!("/metrics: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .ok_or_else(|| format!("no {name} in /metrics"))
}

/// A row of the table: C clients at once (or one at a time).
struct Row {
    label: String,
    wall: f64,
    tokens: usize,
    per_client_spt: f64,
    ttft: f64,
    max_gap: f64,
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
    let ttft = seen.iter().map(|s| s.first_token).sum::<f64>() / seen.len().max(1) as f64;
    Row {
        label,
        wall,
        tokens,
        per_client_spt: spt.iter().sum::<f64>() / spt.len().max(1) as f64,
        ttft,
        max_gap: seen.iter().map(|s| s.max_gap).fold(0.0, f64::max),
        bytes: bytes.0 / tokens.max(1) as f64,
        trunk_bytes: bytes.1 / tokens.max(1) as f64,
    }
}

/// Every client of one configuration; the solo runs first.
fn bench_budget(
    args: &BenchServeArgs,
    bin: &Path,
    model: &Path,
    flags: &[String],
) -> Result<Vec<Row>, String> {
    let max_c = args.clients.iter().copied().max().unwrap_or(1);
    let mut extra: Vec<String> = vec!["--parallel".into(), max_c.to_string(), "--no-reuse".into()];
    extra.extend(["--threads".into(), "2".into(), "--ctx".into(), "256".into()]);
    if !model.join("tiktoken.model").is_file() && !model.join("tokenizer.json").is_file() {
        extra.extend(["--tok".into(), args.tok.display().to_string()]);
    }
    extra.extend_from_slice(flags);
    let deadline = Instant::now() + Duration::from_secs(3600);
    // a budgeted open reads the pinned trunk layers first: minutes on a big checkpoint
    let startup = Duration::from_secs(1200);
    let (_guard, base) = start_server_with(bin, model, 2 * max_c, &extra, startup, deadline)?;
    let client = Client::builder()
        .timeout(Duration::from_secs(3600))
        .no_proxy()
        .build()
        .map_err(|e| format!("client: {e}"))?;
    let bytes = |c: &Client| -> Result<(f64, f64), String> {
        Ok((
            metric(c, &base, "k3_bytes_read_total")?,
            metric(c, &base, "k3_trunk_bytes_read_total")?,
        ))
    };
    // warm-up: one token, so page-cache and allocator state are comparable
    stream_one(&client, &base, &prompt(99, args.prompt_len), 1)?;
    let mut rows = Vec::new();
    let (b0, t0) = (bytes(&client)?, Instant::now());
    let mut solo = Vec::new();
    for c in 0..max_c {
        solo.push(stream_one(
            &client,
            &base,
            &prompt(c, args.prompt_len),
            args.tokens,
        )?);
    }
    let b1 = bytes(&client)?;
    let delta = (b1.0 - b0.0, b1.1 - b0.1);
    rows.push(row(
        format!("{max_c} one at a time"),
        &solo,
        t0.elapsed().as_secs_f64(),
        delta,
    ));
    for &c in &args.clients {
        let (b0, t0) = (bytes(&client)?, Instant::now());
        let seen: Vec<Result<Seen, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..c)
                .map(|i| {
                    let (client, base) = (&client, &base);
                    let ids = prompt(i, args.prompt_len);
                    s.spawn(move || stream_one(client, base, &ids, args.tokens))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("client panicked".into())))
                .collect()
        });
        let wall = t0.elapsed().as_secs_f64();
        let seen: Vec<Seen> = seen.into_iter().collect::<Result<_, _>>()?;
        for (i, s) in seen.iter().enumerate() {
            if s.ids != solo[i].ids {
                return Err(format!(
                    "C={c} client {i}: ids {:?} differ from its solo run {:?}",
                    s.ids, solo[i].ids
                ));
            }
        }
        let b1 = bytes(&client)?;
        rows.push(row(
            format!("{c} at once"),
            &seen,
            wall,
            (b1.0 - b0.0, b1.1 - b0.1),
        ));
    }
    Ok(rows)
}

fn print(label: &str, rows: &[Row]) {
    println!("\n{label}\n");
    println!("| clients | wall s | tokens | aggregate tok/s | vs one at a time | per-client s/token | first token s | max gap s | bytes read / token | trunk bytes / token |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let base = rows.first().map_or(1.0, |r| r.tokens as f64 / r.wall);
    for r in rows {
        let agg = r.tokens as f64 / r.wall;
        println!(
            "| {} | {:.2} | {} | {:.3} | {:.2}× | {:.3} | {:.2} | {:.2} | {:.1} MB | {:.1} MB |",
            r.label,
            r.wall,
            r.tokens,
            agg,
            agg / base,
            r.per_client_spt,
            r.ttft,
            r.max_gap,
            r.bytes / 1e6,
            r.trunk_bytes / 1e6
        );
    }
}

pub fn run(args: &BenchServeArgs) -> ExitCode {
    let root = workspace_root();
    let result = (|| -> Result<(), String> {
        let model = resolve_model(&args.model, &root)?;
        let bin = build_k3(&root)?;
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
            "bench-serve: {} — {} tokens per request, {}-id prompts, greedy; every concurrent client's ids equal its solo run",
            model.display(),
            args.tokens,
            args.prompt_len
        );
        for (label, flags) in configs {
            let rows = bench_budget(args, &bin, &model, &flags)?;
            print(&label, &rows);
        }
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-serve: {e}");
            ExitCode::FAILURE
        }
    }
}
