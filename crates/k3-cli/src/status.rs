//! The live status line on stderr while `k3 run` and `k3 chat` prefill or think: the phase,
//! tokens so far, seconds per token, and for prefill an ETA (README "Progress"). At tens of
//! seconds per token on the released model it is what tells a user the engine is working.
//!
//! Shown only when stderr is a terminal (and not `-q`), and only once a phase has lasted a
//! second (quick work draws nothing); a spinner ticks on its own thread so the elapsed time
//! moves between tokens. It is cleared before any text is written to stdout, so it
//! never lands inside the product.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use k3_engine::FeedProgress;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Redraws per second of the spinner (and the elapsed time).
const TICK: Duration = Duration::from_millis(250);

/// A phase shorter than this draws nothing (no flicker on quick work).
const DELAY: Duration = Duration::from_millis(1000);

/// Environment variable replacing [`DELAY`], in milliseconds (tests use 0).
const ENV_DELAY: &str = "K3_STATUS_DELAY_MS";

/// One status line; a no-op when not shown.
pub struct Status {
    /// stderr is a terminal and a line is wanted.
    shown: bool,
    /// The line of the phase now shown (none between phases), and whether it is still live
    /// (the timer that makes it visible and [`Status::clear`] take the lock in turn).
    bar: Option<(ProgressBar, Arc<Mutex<bool>>)>,
    /// Start of the phase now shown.
    since: Instant,
}

impl Status {
    /// A status line on stderr when `wanted` and stderr is a terminal.
    pub fn new(wanted: bool) -> Status {
        Status {
            shown: wanted && std::io::stderr().is_terminal(),
            bar: None,
            since: Instant::now(),
        }
    }

    /// Whether a line is drawn at all.
    pub fn shown(&self) -> bool {
        self.shown
    }

    /// Starts a phase (`prefill`, `thinking`, `generating`): resets the clock and, once the
    /// phase has lasted [`DELAY`], shows `msg` and what follows.
    pub fn start(&mut self, msg: &str) {
        self.clear();
        self.since = Instant::now();
        if !self.shown {
            return;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(msg.to_string());
        let live = Arc::new(Mutex::new(true));
        let (timer_bar, timer_live) = (bar.clone(), live.clone());
        let delay = std::env::var(ENV_DELAY)
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(DELAY, Duration::from_millis);
        if delay.is_zero() {
            // Drawn before the phase's first update, not by a thread that a millisecond
            // phase can outrun (the tests' K3_STATUS_DELAY_MS=0 on a loaded machine).
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.enable_steady_tick(TICK);
            self.bar = Some((bar, live));
            return;
        }
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            let live = timer_live.lock().unwrap_or_else(|e| e.into_inner());
            if *live {
                timer_bar.set_draw_target(ProgressDrawTarget::stderr());
                timer_bar.enable_steady_tick(TICK);
            }
        });
        self.bar = Some((bar, live));
    }

    /// Prefill progress: tokens done of all, the layer, and the ETA from the share done.
    pub fn prefill(&self, p: &FeedProgress) {
        let Some((bar, _)) = &self.bar else { return };
        let done = p.fraction();
        let elapsed = self.since.elapsed().as_secs_f64();
        let eta = match done > 0.0 {
            true => format!(
                "eta {}",
                k3_plan::plan::fmt_seconds(elapsed / done * (1.0 - done))
            ),
            false => "eta --".into(),
        };
        bar.set_message(format!(
            "prefill: tokens {}..{} of {}, layer {}/{}, {:.0}% ({eta})",
            p.tokens_done,
            p.tokens_done + p.chunk,
            p.tokens,
            p.layers_done,
            p.layers,
            100.0 * done
        ));
    }

    /// Decode progress: `tokens` generated in this phase so far.
    pub fn tokens(&self, phase: &str, tokens: usize) {
        let Some((bar, _)) = &self.bar else { return };
        let per = self.since.elapsed().as_secs_f64() / tokens.max(1) as f64;
        bar.set_message(format!("{phase}: {tokens} tokens, {per:.2} s/token"));
    }

    /// Removes the line (before text goes to stdout, and at the end).
    pub fn clear(&mut self) {
        if let Some((bar, live)) = self.bar.take() {
            let mut live = live.lock().unwrap_or_else(|e| e.into_inner());
            *live = false;
            bar.finish_and_clear();
        }
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        self.clear();
    }
}
