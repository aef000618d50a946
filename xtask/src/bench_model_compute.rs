//! The model half of `cargo xtask bench-compute --model DIR`: what the kernels buy end to
//! end, with every weight resident (memory-mapped, page cache warmed first) so no read is
//! timed:
//!
//! * prefill marginal s/token: `(t(long) − t(short)) / (long − short)` for two prompt
//!   lengths whose chunk unions read the same experts (every expert of a `gen-bench` model is
//!   chosen by 16 tokens already), i.e. the arithmetic of one more prompt token; `t` is the
//!   best of `repeats` warm prefills of each length, taken in turns (a shared machine's other
//!   tenants only ever slow a prefill);
//! * compute-bound decode s/token: greedy steps after the long prompt, experts warm;
//! * the compute floor of the marginal: [`marginal_flops`], the arithmetic of one more prompt
//!   token counted from the model's shapes, which `bench-compute` divides by the same run's
//!   FMA peak;
//! * the first (cold) prefill of the long prompt, whose excess over the warm one is the cost of
//!   first touches (page faults on the mapped weights, scratch growth).

use crate::bench_util::{median, prompt_ids};
use k3_engine::{argmax, DecodeMode, Engine, EngineOptions};
use k3_format::K3Config;
use std::path::Path;
use std::time::Instant;

/// What one model run measured.
#[derive(Clone, Debug)]
pub struct ModelRates {
    /// Tokens of the short and the long prompt.
    pub short: usize,
    /// See `short`.
    pub long: usize,
    /// Seconds of the first prefill of the long prompt (cold: every page first touched).
    pub first_s: f64,
    /// Seconds to prefill the short prompt (best of the repeats).
    pub short_s: f64,
    /// Seconds to prefill the long prompt (best of the repeats).
    pub long_s: f64,
    /// Median seconds per decode step.
    pub decode_s: f64,
    /// Greedy ids of the decode steps (for comparing runs).
    pub ids: Vec<u32>,
    /// The arithmetic of one more prompt token between `short` and `long`.
    pub flops: TokenFlops,
}

impl ModelRates {
    /// Marginal prefill seconds per prompt token.
    pub fn prefill_marginal_s(&self) -> f64 {
        (self.long_s - self.short_s) / (self.long - self.short).max(1) as f64
    }
}

/// Wall-clock seconds since the Unix epoch (perf's `-k realtime` sample clock).
fn unix_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Prompt lengths and repetitions of one model run.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Tokens of the short prompt.
    pub short: usize,
    /// Tokens of the long prompt.
    pub long: usize,
    /// Greedy decode steps timed after the long prompt.
    pub steps: usize,
    /// Warm prefills of each length (short, long in turns); the best of each counts.
    pub repeats: usize,
}

/// Opens `dir` resident on `threads` compute threads and measures it (see the module docs).
pub fn measure(dir: &Path, threads: usize, plan: Plan) -> Result<ModelRates, String> {
    let Plan {
        short,
        long,
        steps,
        repeats,
    } = plan;
    if short == 0 || long <= short || steps == 0 || repeats == 0 {
        return Err(
            "need 0 < short < long prompt tokens, at least 1 decode step and 1 repeat".into(),
        );
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
        let (t0, u0) = (Instant::now(), unix_s());
        s.feed(ids).map_err(|e| e.to_string())?;
        let secs = t0.elapsed().as_secs_f64();
        // For `perf record -k realtime` windows (tools/perf/prefill_profile.py).
        eprintln!(
            "phase prefill {} tokens: {u0:.6} .. {:.6} unix s",
            ids.len(),
            unix_s()
        );
        Ok(secs)
    };
    // Warms the page cache and the mappings: every trunk tensor and expert is touched.
    let first_s = feed(&prompt)?;
    let (mut short_s, mut long_s) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..repeats {
        short_s = short_s.min(feed(&prompt[..short])?);
        long_s = long_s.min(feed(&prompt)?);
    }
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
        first_s,
        short_s,
        long_s,
        decode_s: median(&times),
        ids,
        flops: marginal_flops(engine.config(), short, long),
    })
}

/// Arithmetic of one more prompt token, counted from the model's shapes (2 FLOP per
/// multiply-add; docs/PERFORMANCE.md "Prefill against its compute floor"). The few O(width)
/// ops per layer (norms, activations, residual mixes, the short conv, the router's top-k) are
/// left out: under 0.1 % of the total at real widths.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TokenFlops {
    /// bf16 trunk projections (KDA, MLA, dense MLP, MoE latent down/up, shared experts).
    pub trunk: f64,
    /// The `top-k` routed experts' MXFP4 w1, w3, w2.
    pub experts: f64,
    /// The router's logits (f64, one row per expert).
    pub router: f64,
    /// KDA recurrence: per head decay, read, write and output over the `D × D` state.
    pub kda: f64,
    /// MLA absorbed attention: the absorbed query, scores and context over `positions`
    /// cached positions, the value rows.
    pub mla: f64,
}

impl TokenFlops {
    /// Everything counted.
    pub fn total(&self) -> f64 {
        self.trunk + self.experts + self.router + self.kda + self.mla
    }
}

/// [`TokenFlops`] of a token that attends to `positions` cached positions (itself included)
/// in every MLA layer. The logits are not counted: a prompt's lm_head runs for its last token
/// only.
pub fn token_flops(c: &K3Config, positions: f64) -> TokenFlops {
    let (e, p, d) = (c.hidden_size, c.kda_proj(), c.kda_head_dim);
    let (h, nope, rope) = (
        c.num_attention_heads,
        c.qk_nope_head_dim,
        c.qk_rope_head_dim,
    );
    let (kv, v) = (c.kv_lora_rank, c.v_head_dim);
    let (lat, inter) = (c.routed_expert_hidden_size, c.moe_intermediate_size);
    let mut f = TokenFlops::default();
    for l in 0..c.num_hidden_layers {
        let mut macs = 0usize;
        if c.is_mla(l) {
            let gate = if c.mla_use_output_gate { h * v * e } else { 0 };
            macs += c.q_lora_rank * e + h * c.mla_qk_head() * c.q_lora_rank;
            macs += c.mla_kv_a_width() * e + e * h * v + gate;
            let per_head = ((nope + v) * kv) as f64 + positions * (2 * kv + rope) as f64;
            f.mla += 2.0 * h as f64 * per_head;
        } else {
            let heads = c.kda_num_heads;
            macs += 5 * p * e + d * e + p * d + heads * e;
            // decay (1 multiply), read, write, output (a multiply-add each) per state element.
            f.kda += 7.0 * (heads * d * d) as f64;
        }
        if c.is_dense(l) {
            macs += 3 * c.intermediate_size * e;
        } else {
            macs += 2 * lat * e + 3 * c.shared_inter() * e;
            f.router += 2.0 * (c.num_experts * e) as f64;
            f.experts += 2.0 * (c.num_experts_per_token * 3 * inter * lat) as f64;
        }
        f.trunk += 2.0 * macs as f64;
    }
    f
}

/// [`token_flops`] averaged over the tokens `short .. long` of a prompt (token `i` attends to
/// `i + 1` positions): the arithmetic behind [`ModelRates::prefill_marginal_s`].
pub fn marginal_flops(c: &K3Config, short: usize, long: usize) -> TokenFlops {
    token_flops(c, (short + 1 + long) as f64 / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_token_is_about_206_gflop() {
        // The released model costs ~206 GFLOP per token (docs/PERFORMANCE.md#prefill-against-its-compute-floor).
        let f = token_flops(&K3Config::released(), 1.0);
        let g = f.total() / 1e9;
        assert!((200.0..212.0).contains(&g), "{g} GFLOP");
        // 92 MoE layers × 16 experts × 3 × 3072 × 3584 multiply-adds.
        assert_eq!(f.experts, 2.0 * (92 * 16 * 3 * 3072 * 3584u64) as f64);
    }

    #[test]
    fn attention_grows_with_position_only() {
        let c = K3Config::released();
        let (a, b) = (token_flops(&c, 1.0), token_flops(&c, 101.0));
        assert_eq!((a.trunk, a.experts, a.kda), (b.trunk, b.experts, b.kda));
        let per_pos = 2.0 * (24 * 96 * (2 * 512 + 64)) as f64;
        assert_eq!(b.mla - a.mla, 100.0 * per_pos);
    }

    #[test]
    fn a_plan_without_repeats_is_refused_before_the_model_opens() {
        let plan = |repeats| Plan {
            short: 16,
            long: 128,
            steps: 1,
            repeats,
        };
        let missing = Path::new("/nonexistent/k3-bench-model");
        let e = measure(missing, 1, plan(0)).unwrap_err();
        assert!(e.contains("1 repeat"), "{e}");
        // One repeat passes the check and then fails on the missing directory instead.
        let e = measure(missing, 1, plan(1)).unwrap_err();
        assert!(!e.contains("repeat"), "{e}");
    }
}
