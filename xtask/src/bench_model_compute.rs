//! The model half of `cargo xtask bench-compute --model DIR`: what the kernels buy end to
//! end, with every weight resident (memory-mapped, page cache warmed first) so no read is
//! timed:
//!
//! * prefill marginal s/token: `(t(long) − t(short)) / (long − short)` for two prompt
//!   lengths whose chunk unions read the same experts (every expert of a `gen-bench` model is
//!   chosen by 16 tokens already), i.e. the arithmetic of one more prompt token;
//! * compute-bound decode s/token: greedy steps after the long prompt, experts warm.

use crate::bench_util::{median, prompt_ids};
use k3_engine::{argmax, DecodeMode, Engine, EngineOptions};
use std::path::Path;
use std::time::Instant;

/// What one model run measured.
#[derive(Clone, Debug)]
pub struct ModelRates {
    /// Tokens of the short and the long prompt.
    pub short: usize,
    /// See `short`.
    pub long: usize,
    /// Seconds to prefill the short prompt.
    pub short_s: f64,
    /// Seconds to prefill the long prompt.
    pub long_s: f64,
    /// Median seconds per decode step.
    pub decode_s: f64,
    /// Greedy ids of the decode steps (for comparing runs).
    pub ids: Vec<u32>,
}

impl ModelRates {
    /// Marginal prefill seconds per prompt token.
    pub fn prefill_marginal_s(&self) -> f64 {
        (self.long_s - self.short_s) / (self.long - self.short).max(1) as f64
    }
}

/// Opens `dir` resident on `threads` compute threads and measures it (see the module docs).
pub fn measure(
    dir: &Path,
    threads: usize,
    short: usize,
    long: usize,
    steps: usize,
) -> Result<ModelRates, String> {
    if short == 0 || long <= short || steps == 0 {
        return Err("need 0 < short < long prompt tokens and at least 1 decode step".into());
    }
    let options = EngineOptions {
        threads: Some(threads),
        ctx: long + steps + 1,
        ..EngineOptions::default()
    };
    let engine = Engine::open(dir, options).map_err(|e| e.to_string())?;
    let vocab = engine.config().vocab_size;
    let prompt = prompt_ids(long, vocab, 7);
    let feed = |ids: &[u32]| -> Result<f64, String> {
        let mut s = engine
            .new_session(long + steps + 1)
            .map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        s.feed(ids).map_err(|e| e.to_string())?;
        Ok(t0.elapsed().as_secs_f64())
    };
    feed(&prompt)?; // warm the page cache: every trunk tensor and expert is touched
    let short_s = feed(&prompt[..short])?;
    let long_s = feed(&prompt)?;
    let mut s = engine
        .new_session(long + steps + 1)
        .map_err(|e| e.to_string())?;
    s.feed(&prompt).map_err(|e| e.to_string())?;
    let (mut times, mut ids) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let id = argmax(s.logits());
        ids.push(id);
        let t0 = Instant::now();
        s.step(id, DecodeMode::Incremental)
            .map_err(|e| e.to_string())?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(ModelRates {
        short,
        long,
        short_s,
        long_s,
        decode_s: median(&times),
        ids,
    })
}
