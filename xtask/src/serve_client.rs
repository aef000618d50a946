//! One client of `cargo xtask bench-serve`: a greedy streamed completion of token ids, retried
//! after `Retry-After` while the server answers 429 (queue full), and the server's counters
//! from `/metrics`.

use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

/// Retry-After used when a 429 carries none (or an unparsable one).
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One streamed request: its ids and timings (seconds).
pub struct Seen {
    pub ids: Vec<u32>,
    /// The server's clock: from queueing to the first token.
    pub first_token: f64,
    /// The server's clock: from the first token to the last.
    pub decode: f64,
    /// The server's clock: longest wait between two tokens.
    pub max_gap: f64,
    /// The client's clock: the successful attempt, sent to `[DONE]` (queueing included).
    pub latency: f64,
    /// 429s answered before it was admitted.
    pub too_many: u64,
}

/// Prompt ids of request `n`: distinct per `n`, the same in every run.
pub fn prompt(n: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| ((n * 7919 + j * 104_729) % 997 + 1) as u32)
        .collect()
}

fn retry_after(resp: &Response) -> Duration {
    resp.headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_RETRY_AFTER)
}

/// `ids` completed greedily for `tokens` tokens (EOS ignored), streamed; a 429 is retried after
/// its `Retry-After` until `deadline`, any other failure is an error.
pub fn stream_one(
    client: &Client,
    base: &str,
    ids: &[u32],
    tokens: usize,
    deadline: Instant,
) -> Result<Seen, String> {
    let body = json!({"prompt": ids, "max_tokens": tokens, "temperature": 0, "ignore_eos": true,
                      "stream": true, "return_tokens": true})
    .to_string();
    let mut too_many = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("run deadline (--timeout-s) reached".into());
        }
        let started = Instant::now();
        let resp = client
            .post(format!("{base}/v1/completions"))
            .header("content-type", "application/json")
            .body(body.clone())
            .timeout(left)
            .send()
            .map_err(|e| format!("request: {e}"))?;
        if resp.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
            too_many += 1;
            std::thread::sleep(retry_after(&resp).min(left));
            continue;
        }
        if !resp.status().is_success() {
            let status = resp.status();
            return Err(format!(
                "HTTP {status}: {}",
                resp.text().unwrap_or_default()
            ));
        }
        let mut seen = read_stream(resp)?;
        seen.latency = started.elapsed().as_secs_f64();
        seen.too_many = too_many;
        return Ok(seen);
    }
}

/// The ids and the server's timings from an SSE completion stream.
fn read_stream(resp: Response) -> Result<Seen, String> {
    let mut seen = Seen {
        ids: Vec::new(),
        first_token: 0.0,
        decode: 0.0,
        max_gap: 0.0,
        latency: 0.0,
        too_many: 0,
    };
    for line in BufReader::new(resp).lines() {
        let line = line.map_err(|e| format!("stream: {e}"))?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            return Ok(seen);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("chunk: {e}"))?;
        if let Some(t) = v["choices"][0]["tokens"].as_array() {
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
    Err("the stream ended without [DONE]".into())
}

/// The value of counter or gauge `name` in `/metrics`.
pub fn metric(client: &Client, base: &str, name: &str) -> Result<f64, String> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.text())
        .map_err(|e| format!("/metrics: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .ok_or_else(|| format!("no {name} in /metrics"))
}

/// Nearest-rank percentile `p` of ascending `sorted` (0 when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles_are_nearest_rank() {
        let xs: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(super::percentile(&xs, 50.0), 5.0);
        assert_eq!(super::percentile(&xs, 90.0), 9.0);
        assert_eq!(super::percentile(&xs, 99.0), 10.0);
        assert_eq!(super::percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn prompts_differ_per_request_and_stay_in_a_small_vocabulary() {
        let (a, b) = (super::prompt(0, 8), super::prompt(1, 8));
        assert_ne!(a, b);
        assert!(a.iter().chain(&b).all(|&id| (1..=997).contains(&id)));
    }
}
