//! The printed plan (`k3 plan`, and the refusal message).

use super::{Available, Budget, DraftKind, MemoryPlan, GB};
use std::fmt::{self, Write as _};

/// Human bytes in decimal units: `2.37 GB`, `626.25 MB`, `6.68 KB`, `12 B`.
pub fn fmt_bytes(b: u64) -> String {
    let f = b as f64;
    match b {
        b if b >= GB => format!("{:.2} GB", f / 1e9),
        b if b >= 1_000_000 => format!("{:.2} MB", f / 1e6),
        b if b >= 1_000 => format!("{:.2} KB", f / 1e3),
        _ => format!("{b} B"),
    }
}

/// Human durations: `42s`, `3m 05s`, `2h 10m` (ETAs and predictions; negative counts as 0).
pub fn fmt_seconds(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

/// GB rounded up to 0.01 (amounts to add, minimums).
pub(super) fn gb_ceil(b: u64) -> String {
    gb_rounded(b, true)
}

/// GB rounded down (maximums).
pub(super) fn gb_floor(b: u64) -> String {
    gb_rounded(b, false)
}

/// GB with at least two decimals and at least two significant digits, rounded up or down
/// at the last printed digit (so a tiny model's 0.00298 GB is not shown as 0.01).
fn gb_rounded(b: u64, up: bool) -> String {
    let gb = b as f64 / 1e9;
    let decimals = if gb > 0.0 {
        (1 - gb.log10().floor() as i32).max(2) as usize
    } else {
        2
    };
    let scale = 10f64.powi(decimals as i32);
    let v = if up {
        (gb * scale).ceil()
    } else {
        (gb * scale).floor()
    } / scale;
    format!("{v:.decimals$}")
}

impl MemoryPlan {
    /// The plan table: one line per allocation, TOTAL, and (when known) available.
    pub fn table(&self, available: Option<&Available>) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "memory plan ({})", self.budget_label());
        let t = &self.trunk;
        let pinned = format!("{}/{} layers", t.pinned.len(), self.n_layers);
        line(&mut s, "trunk pinned", t.pinned_bytes, &pinned);
        let ring = match (t.ring_slots, t.single_slot_forced) {
            (0, _) => "none: every layer pinned".to_string(),
            (1, true) => format!(
                "1 x {}, HELD AT 1 SLOT: no read-ahead",
                fmt_bytes(t.ring_slot_bytes)
            ),
            _ if !t.piece_slot_bytes.is_empty() => {
                let sizes: Vec<String> = t.piece_slot_bytes.iter().map(|&b| fmt_bytes(b)).collect();
                format!(
                    "{} pieces ({}), read-ahead on",
                    sizes.len(),
                    sizes.join(" + ")
                )
            }
            (r, _) => format!("{r} x {}, read-ahead on", fmt_bytes(t.ring_slot_bytes)),
        };
        line(&mut s, "trunk ring", t.ring_bytes(), &ring);
        line(
            &mut s,
            "head (lm_head, norms)",
            self.head_bytes,
            "embedding rows read per token",
        );
        let pool = 100.0 * self.expert_slots as f64 / self.n_routed_experts.max(1) as f64;
        let slots = format!(
            "{} slots x {} ({pool:.2}% of experts)",
            self.expert_slots,
            fmt_bytes(self.expert_slot_bytes)
        );
        line(&mut s, "expert cache", self.expert_cache_bytes(), &slots);
        let draft = self.draft_trunk_bytes > 0;
        let block = self.request.draft_kind == DraftKind::Block;
        let sessions = match (self.request.sessions, draft && !block) {
            (0 | 1, false) => String::new(),
            (0 | 1, true) => "session + draft model".to_string(),
            (n, false) => format!("{n} sessions"),
            (n, true) => format!("{n} sessions + draft model"),
        };
        line(&mut s, "KDA state", self.kda_state_bytes, &sessions);
        line(
            &mut s,
            &format!("latent KV for ctx {}", self.request.ctx),
            self.latent_kv_bytes,
            &sessions,
        );
        line(&mut s, "scratch", self.scratch_bytes, "");
        let chunk = format!("{} tokens per trunk pass", self.prefill_chunk);
        line(
            &mut s,
            "prefill chunk scratch",
            self.prefill_scratch_bytes,
            &chunk,
        );
        if self.draft_journal_bytes > 0 {
            let what = format!("up to {} drafts per verifying pass", self.request.drafts);
            line(&mut s, "draft journal", self.draft_journal_bytes, &what);
        }
        if draft {
            let (name, what) = if block {
                let form = self.request.draft_form;
                ("DSpark draft", format!("weights ({form}) + context KV"))
            } else {
                ("draft trunk", "hybrid drafting".to_string())
            };
            line(&mut s, name, self.draft_trunk_bytes, &what);
        }
        line(&mut s, "TOTAL", self.total_bytes(), "");
        match available.and_then(|a| a.bytes().map(|b| (b, a.source()))) {
            Some((b, src)) => line(&mut s, "available", b, src),
            None => {
                let _ = writeln!(s, "  {:<24}{:>12}", "available", "unknown");
            }
        }
        let _ = write!(
            s,
            "trunk streams {} per token ({} of {} layers pinned)",
            fmt_bytes(t.streamed_per_token),
            t.pinned.len(),
            self.n_layers
        );
        s
    }

    fn budget_label(&self) -> String {
        match self.request.budget {
            Budget::Preset(p) => {
                let (t, c) = p.gb();
                format!("preset {p}: trunk {t} GB, expert cache {c} GB")
            }
            Budget::Split { trunk, cache } => {
                format!(
                    "--trunk-gb {} --cache-gb {}",
                    gb_floor(trunk),
                    gb_floor(cache)
                )
            }
            Budget::Total(t) => format!("--mem-gb {}, trunk first", gb_floor(t)),
        }
    }
}

fn line(s: &mut String, label: &str, bytes: u64, note: &str) {
    let _ = writeln!(s, "  {label:<24}{:>12}  {note}", fmt_bytes(bytes));
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table(None))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_read_as_time() {
        assert_eq!(super::fmt_seconds(42.4), "42s");
        assert_eq!(super::fmt_seconds(185.0), "3m 05s");
        assert_eq!(super::fmt_seconds(7800.0), "2h 10m");
    }
}
