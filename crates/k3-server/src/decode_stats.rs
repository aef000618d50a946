//! What a request's decode phase cost and what its drafter bought (docs/SERVER.md
//! "Drafting"): per request in `timings.decode` (OpenAI) and the request's log line, summed
//! over requests in `/metrics` and `/v1/status`.
//!
//! - acceptance length: tokens per verifying pass (the pass's own token plus the drafts it
//!   accepted), as `k3 run --json`'s `draft.acceptance_length`;
//! - tokens per trunk pass: generated tokens ÷ the decode passes the request took part in
//!   (a batched pass counts once for each request in it; the first token comes from the
//!   prompt's pass);
//! - bytes read per generated token: the request's share of the weight bytes its decode
//!   passes read (a batched pass's bytes are split evenly among its requests).

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

/// One request's decode counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeStats {
    /// Which drafter the engine holds: `"dspark"`, `"draft-trunk"` or `None`.
    pub drafter: Option<&'static str>,
    /// Tokens generated.
    pub tokens: usize,
    /// Decode passes the request took part in (verifying passes included).
    pub passes: usize,
    /// Passes that verified drafts.
    pub verify_passes: usize,
    /// Drafts verified, and accepted.
    pub drafted: usize,
    pub accepted: usize,
    /// Weight bytes of the decode passes (this request's share).
    pub bytes_read: f64,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

impl DecodeStats {
    /// Tokens per verifying pass (0 without one).
    pub fn acceptance_length(&self) -> f64 {
        ratio(
            (self.verify_passes + self.accepted) as f64,
            self.verify_passes as f64,
        )
    }

    /// Generated tokens per decode pass (0 without one).
    pub fn tokens_per_trunk_pass(&self) -> f64 {
        ratio(self.tokens as f64, self.passes as f64)
    }

    /// Weight bytes read per generated token.
    pub fn bytes_read_per_generated_token(&self) -> f64 {
        ratio(self.bytes_read, self.tokens as f64)
    }

    /// The JSON object of `timings.decode` and `/v1/status`'s `decode`.
    pub fn json(&self) -> Value {
        json!({
            "drafter": self.drafter,
            "passes": self.passes,
            "verifying_passes": self.verify_passes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_length": self.acceptance_length(),
            "tokens_per_trunk_pass": self.tokens_per_trunk_pass(),
            "bytes_read_per_generated_token": self.bytes_read_per_generated_token(),
        })
    }
}

/// The engine's drafter as the stats name it: a DSpark draft model (block drafts) wins
/// over a draft trunk, as in the scheduler's speculative step.
pub fn drafter(engine: &k3_engine::Engine) -> Option<&'static str> {
    if engine.dspark().is_some() {
        Some("dspark")
    } else if engine.has_draft() {
        Some("draft-trunk")
    } else {
        None
    }
}

/// The sums over finished requests, for `/metrics` and `/v1/status`.
#[derive(Default)]
pub struct DecodeTotals {
    tokens: AtomicU64,
    passes: AtomicU64,
    verify_passes: AtomicU64,
    drafted: AtomicU64,
    accepted: AtomicU64,
    bytes_read: AtomicU64,
}

impl DecodeTotals {
    /// Adds a finished request.
    pub fn add(&self, s: &DecodeStats) {
        let add = |a: &AtomicU64, v: u64| a.fetch_add(v, Ordering::Relaxed);
        add(&self.tokens, s.tokens as u64);
        add(&self.passes, s.passes as u64);
        add(&self.verify_passes, s.verify_passes as u64);
        add(&self.drafted, s.drafted as u64);
        add(&self.accepted, s.accepted as u64);
        add(&self.bytes_read, s.bytes_read as u64);
    }

    /// The sums as one request's stats (`drafter` names the engine's).
    pub fn sum(&self, drafter: Option<&'static str>) -> DecodeStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as usize;
        DecodeStats {
            drafter,
            tokens: load(&self.tokens),
            passes: load(&self.passes),
            verify_passes: load(&self.verify_passes),
            drafted: load(&self.drafted),
            accepted: load(&self.accepted),
            bytes_read: load(&self.bytes_read) as f64,
        }
    }

    /// `/metrics` lines: `(name, type, help, value)`.
    pub fn metric_lines(&self) -> Vec<(&'static str, &'static str, &'static str, String)> {
        let s = self.sum(None);
        vec![
            (
                "k3_decode_passes_total",
                "counter",
                "Decode passes of finished requests (a batched pass once per request in it).",
                s.passes.to_string(),
            ),
            (
                "k3_draft_verifying_passes_total",
                "counter",
                "Decode passes that verified drafts.",
                s.verify_passes.to_string(),
            ),
            (
                "k3_draft_tokens_total",
                "counter",
                "Drafted tokens verified.",
                s.drafted.to_string(),
            ),
            (
                "k3_draft_tokens_accepted_total",
                "counter",
                "Drafted tokens accepted (each a token without its own pass).",
                s.accepted.to_string(),
            ),
            (
                "k3_draft_acceptance_length",
                "gauge",
                "Tokens per verifying pass since start.",
                s.acceptance_length().to_string(),
            ),
            (
                "k3_tokens_per_trunk_pass",
                "gauge",
                "Generated tokens per decode pass since start.",
                s.tokens_per_trunk_pass().to_string(),
            ),
            (
                "k3_bytes_read_per_generated_token",
                "gauge",
                "Weight bytes read by decode passes per generated token since start.",
                s.bytes_read_per_generated_token().to_string(),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_follow_the_counters_and_sum_over_requests() {
        let one = DecodeStats {
            drafter: Some("dspark"),
            tokens: 12,
            passes: 5,
            verify_passes: 4,
            drafted: 10,
            accepted: 6,
            bytes_read: 600.0,
        };
        assert_eq!(one.acceptance_length(), 2.5);
        assert_eq!(one.tokens_per_trunk_pass(), 2.4);
        assert_eq!(one.bytes_read_per_generated_token(), 50.0);
        assert_eq!(DecodeStats::default().acceptance_length(), 0.0);
        let totals = DecodeTotals::default();
        totals.add(&one);
        totals.add(&one);
        let sum = totals.sum(Some("dspark"));
        assert_eq!(sum.tokens, 24);
        assert_eq!(sum.acceptance_length(), 2.5);
        assert_eq!(sum.json()["drafter"], "dspark");
        assert_eq!(totals.metric_lines().len(), 7);
    }
}
