//! `k3 serve`'s live status line (docs/SERVER.md "Logging"): on a terminal, one line under the
//! request log says what the scheduler is doing — each prefilling request's progress and ETA,
//! how many are generating (thinking or answering) at what s/token, and how many wait. At tens
//! of seconds per token on the released model it is what tells an operator the server works.
//!
//! Shown only when stderr is a terminal; log lines are printed above it ([`print`]), so it
//! never lands inside a log line. Off a terminal (a file, journald) nothing changes.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

/// The line, once [`start`] found a terminal.
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// Redraws per second of the spinner.
const TICK: Duration = Duration::from_millis(250);

/// Draws the line (`idle`) when stderr is a terminal.
pub fn start() {
    if !std::io::stderr().is_terminal() {
        return;
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(describe(&[], 0, 0.0));
    bar.enable_steady_tick(TICK);
    *BAR.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar);
}

/// Replaces the line's text (no-op off a terminal).
pub fn set(msg: String) {
    if let Some(bar) = BAR.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        bar.set_message(msg);
    }
}

/// Writes one log line to stderr, above the status line when there is one.
pub fn print(line: &str) {
    match BAR.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        Some(bar) => bar.suspend(|| eprintln!("{line}")),
        None => eprintln!("{line}"),
    }
}

/// One request as the line shows it.
pub struct JobView<'a> {
    pub id: &'a str,
    /// Prompt ids fed and in all.
    pub fed: usize,
    pub prompt: usize,
    /// Seconds since the request was picked up.
    pub seconds: f64,
    /// Ids generated so far, and whether the reply is still thinking.
    pub generated: usize,
    pub thinking: bool,
}

/// The line's text: prefilling requests with progress and ETA, then the generating ones.
pub fn describe(jobs: &[JobView<'_>], queued: u64, seconds_per_step: f64) -> String {
    if jobs.is_empty() {
        return format!("k3 serve: idle, {queued} queued");
    }
    let mut parts = Vec::new();
    for j in jobs.iter().filter(|j| j.fed < j.prompt) {
        let eta = match j.fed {
            0 => "eta --".to_string(),
            fed => {
                let left = j.seconds / fed as f64 * (j.prompt - fed) as f64;
                format!("eta {}", k3_plan::plan::fmt_seconds(left))
            }
        };
        parts.push(format!("{} prefill {}/{} ({eta})", j.id, j.fed, j.prompt));
    }
    let generating: Vec<_> = jobs.iter().filter(|j| j.fed >= j.prompt).collect();
    if !generating.is_empty() {
        let thinking = generating.iter().filter(|j| j.thinking).count();
        let tokens: usize = generating.iter().map(|j| j.generated).sum();
        parts.push(format!(
            "{} generating ({thinking} thinking), {tokens} tokens, {seconds_per_step:.2} s/token",
            generating.len()
        ));
    }
    format!("k3 serve: {}; {queued} queued", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::{describe, JobView};

    fn job(id: &str, fed: usize, prompt: usize, generated: usize, thinking: bool) -> JobView<'_> {
        JobView {
            id,
            fed,
            prompt,
            seconds: 10.0,
            generated,
            thinking,
        }
    }

    #[test]
    fn the_line_names_prefill_progress_eta_and_generation() {
        assert_eq!(describe(&[], 2, 0.0), "k3 serve: idle, 2 queued");
        let jobs = [
            job("chatcmpl-1", 100, 500, 0, false),
            job("msg-2", 30, 30, 12, true),
            job("chatcmpl-3", 0, 64, 0, false),
        ];
        assert_eq!(
            describe(&jobs, 1, 0.5),
            "k3 serve: chatcmpl-1 prefill 100/500 (eta 40s), chatcmpl-3 prefill 0/64 (eta --), 1 generating (1 thinking), 12 tokens, 0.50 s/token; 1 queued"
        );
    }
}
