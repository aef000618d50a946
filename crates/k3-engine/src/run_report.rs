//! The JSON report of a finished generation, as `k3 run --json` writes it (docs/STREAMING.md#reports):
//! data built from the engine's counters, for any program that reports a run the same way.

use crate::{
    DecodeMode, Engine, Generation, RankFigures, SamplingParams, Session, StopConditions,
    StoreStats,
};
use k3_store::probe::peak_rss_bytes;
use std::path::Path;

/// The `--json` report of a finished run (docs/STREAMING.md#reports): the ids and text, the
/// sampling in force, timings, the decode mode and drafting figures, the plan beside the
/// measured peak, every rank's figures and the I/O counters, whole-run and per phase.
/// `interrupted`: the run was stopped by Ctrl-C.
pub fn run_json(
    engine: &Engine,
    session: &Session<'_>,
    facts: &RunFacts<'_>,
    ignore_eos: bool,
    interrupted: bool,
    ranks: &[RankFigures],
) -> serde_json::Value {
    let (g, stats, spec) = (facts.generation, engine.stats(), session.spec_stats());
    let report = serde_json::json!({
        "model_dir": facts.dir,
        "prompt_ids": facts.prompt,
        "generated_ids": g.ids,
        "generated_text": g.text,
        "stop_reason": g.stop_reason.name(),
        "stop_value": serde_json::to_value(&g.stop_reason).ok().and_then(|v| v.get("value").cloned()),
        "sampling": sampling_json(facts.params, facts.stop, ignore_eos),
        "prefill_seconds": facts.prefill_s,
        "prompt_tokens_reused": facts.reused,
        "seconds_per_token": facts.per_token(),
        "seconds_per_generated_token": facts.per_generated_token(),
        "interrupted": interrupted,
        "wall_seconds": facts.wall,
        "threads": engine.threads(),
        "mode": match facts.mode {
            DecodeMode::Recompute => "recompute",
            DecodeMode::Speculative(_) => "speculative",
            DecodeMode::Hybrid(_) => "hybrid",
            DecodeMode::Block(_) => "block",
            _ => "incremental",
        },
        "draft": block_json(engine, session, facts.generation.ids.len(),
            &facts.stats_prefill, &stats),
        "draft_passes": spec.passes,
        "draft_tokens": spec.drafted,
        "draft_accepted": spec.accepted,
        "draft_model": session.draft_stats().map(|d| serde_json::json!({
            "passes": d.passes,
            "tokens_fed": d.tokens_fed,
            "seconds": d.seconds,
            "rollbacks": d.rollbacks,
            "expert_requests": stats.draft_expert_requests,
            "expert_hits": stats.draft_expert_hits,
            "failure": session.draft_failure(),
        })),
        "draft_trunk": engine.draft_info().map(|(d, quant, bytes)| serde_json::json!({
            "dir": d.display().to_string(), "quant": quant, "bytes": bytes,
        })),
        "peak_rss_bytes": peak_rss_bytes(),
        "streaming": engine.plan().is_some(),
        "plan": plan_json(engine),
        "ranks": ranks,
        "prefill": phase_json(&facts.stats_open, &facts.stats_prefill, facts.prefill_s, engine),
        "decode": phase_json(&facts.stats_prefill, &stats, facts.decode_s, engine),
    });
    let mut report = report;
    if let (Some(all), serde_json::Value::Object(io)) = (report.as_object_mut(), io_json(&stats)) {
        all.extend(io);
    }
    report
}

/// The I/O counters of the whole run, at the report's top level.
fn io_json(stats: &StoreStats) -> serde_json::Value {
    serde_json::json!({
    "bytes_read_trunk": stats.trunk_bytes_read,
    "bytes_decoded_trunk": stats.trunk_bytes_decoded,
    "trunk_decode_seconds": stats.trunk_decode_seconds,
    "bytes_read_experts": stats.expert_bytes_read,
    "expert_requests": stats.expert_requests,
    "expert_resident_hits": stats.expert_resident_hits,
    "expert_evictions": stats.expert_evictions,
    "trunk_binds": stats.trunk_binds,
    "trunk_pinned_hits": stats.trunk_pinned_hits,
    "io_seconds": stats.io_seconds,
    "trunk_wait_seconds": stats.trunk_wait_seconds,
    "expert_wait_seconds": stats.expert_wait_seconds,
    "lookahead_reads": stats.lookahead_reads,
    "lookahead_useful_reads": stats.lookahead_useful_reads,
    "lookahead_recall": stats.lookahead_recall(),
    })
}

/// The `plan` object: the planner's forecast beside the measured peak (null without a budget).
fn plan_json(engine: &Engine) -> serde_json::Value {
    let Some(p) = engine.plan() else {
        return serde_json::Value::Null;
    };
    let peak = peak_rss_bytes();
    serde_json::json!({
        "budget": format!("{:?}", p.request.budget),
        "total_bytes": p.total_bytes(),
        "peak_rss_bytes": peak,
        "forecast_error": (p.total_bytes() as f64 - peak as f64) / (peak.max(1) as f64),
        "trunk_pinned_layers": p.trunk.pinned.len(),
        "trunk_ring_slots": p.trunk.ring_slots,
        "expert_slots": p.expert_slots,
        "prefill_chunk": p.prefill_chunk,
        "max_drafts": p.request.drafts,
        "draft_journal_bytes": p.draft_journal_bytes,
    })
}

/// One phase (prompt or decode) between two counter snapshots: forward passes (trunk binds ÷
/// layers), bytes read and seconds per pass, and the wall split into compute and I/O wait
/// (docs/STREAMING.md#reports).
fn phase_json(a: &StoreStats, b: &StoreStats, wall: f64, engine: &Engine) -> serde_json::Value {
    let layers = engine.config().num_hidden_layers.max(1) as u64;
    let passes = b.trunk_binds.saturating_sub(a.trunk_binds) / layers;
    let per = |x: f64| if passes > 0 { x / passes as f64 } else { 0.0 };
    let trunk = b.trunk_bytes_read.saturating_sub(a.trunk_bytes_read);
    let experts = b.expert_bytes_read.saturating_sub(a.expert_bytes_read);
    let trunk_wait = b.trunk_wait_seconds - a.trunk_wait_seconds;
    let expert_wait = b.expert_wait_seconds - a.expert_wait_seconds;
    serde_json::json!({
        "forward_passes": passes,
        "seconds": wall,
        "seconds_per_pass": per(wall),
        "bytes_read_trunk": trunk,
        "bytes_read_experts": experts,
        "bytes_read_trunk_per_pass": per(trunk as f64),
        "bytes_decoded_trunk": b.trunk_bytes_decoded.saturating_sub(a.trunk_bytes_decoded),
        "trunk_decode_seconds": b.trunk_decode_seconds - a.trunk_decode_seconds,
        "bytes_read_experts_per_pass": per(experts as f64),
        "expert_requests": b.expert_requests.saturating_sub(a.expert_requests),
        "expert_resident_hits": b.expert_resident_hits.saturating_sub(a.expert_resident_hits),
        "trunk_wait_seconds": trunk_wait,
        "expert_wait_seconds": expert_wait,
        "compute_seconds": (wall - trunk_wait - expert_wait).max(0.0),
    })
}

/// The `sampling` object of the JSON report: the parameters, stop strings and end ids in force.
fn sampling_json(
    params: &SamplingParams,
    stop: &StopConditions,
    ignore_eos: bool,
) -> serde_json::Value {
    let mut v = serde_json::to_value(params).unwrap_or_default();
    if let Some(obj) = v.as_object_mut() {
        obj.insert("greedy".into(), params.is_greedy().into());
        obj.insert("stop".into(), serde_json::json!(stop.stop_strings));
        obj.insert("end_ids".into(), serde_json::json!(stop.end_ids));
        obj.insert("ignore_eos".into(), ignore_eos.into());
    }
    v
}

/// `null` without block drafting; else `{passes: [{position, proposed, confidence,
/// verified, kept}], acceptance_length, tokens_per_trunk_pass, bytes_read_per_generated_token,
/// draft_seconds, failure, draft_model}` over the decode phase (`before` → `after`).
fn block_json(
    engine: &Engine,
    session: &Session<'_>,
    generated: usize,
    before: &StoreStats,
    after: &StoreStats,
) -> serde_json::Value {
    let Some(passes) = session.block_passes() else {
        return serde_json::Value::Null;
    };
    let spec = session.spec_stats();
    let verifying = spec.passes.max(1) as f64;
    let bytes = (after.trunk_bytes_read + after.expert_bytes_read)
        .saturating_sub(before.trunk_bytes_read + before.expert_bytes_read);
    let (seconds, failure) = session.block_drafting().unwrap_or((0.0, None));
    let decode_passes = spec.passes;
    serde_json::json!({
        "passes": passes.iter().map(|p| serde_json::json!({
            "position": p.position,
            "proposed": p.proposed,
            "confidence": p.confidence,
            "verified": p.verified,
            "kept": p.kept,
        })).collect::<Vec<_>>(),
        // tokens per verifying pass: the pass's own token plus its accepted drafts
        "acceptance_length": (spec.passes + spec.accepted) as f64 / verifying,
        "tokens_per_trunk_pass": generated as f64 / decode_passes.max(1) as f64,
        "bytes_read_per_generated_token": bytes as f64 / generated.max(1) as f64,
        "draft_seconds": seconds,
        "failure": failure,
        "draft_model": engine.dspark().map(|d| serde_json::json!({
            "dir": d.dir().display().to_string(),
            "bytes": d.weight_bytes(),
            "form": d.hold().name(),
            "block_size": d.graph().config().block_size,
        })),
    })
}

/// The `--dump-cache-trace` file's bytes: per expert request, u32 LE layer then u32 LE expert.
pub fn expert_trace_bytes(trace: &[(u32, u32)]) -> Vec<u8> {
    trace
        .iter()
        .flat_map(|(l, e)| l.to_le_bytes().into_iter().chain(e.to_le_bytes()))
        .collect()
}

/// What a finished run hands to its reports.
pub struct RunFacts<'a> {
    /// The model directory.
    pub dir: &'a Path,
    /// The prompt's ids.
    pub prompt: &'a [u32],
    /// What was generated and why it stopped.
    pub generation: &'a Generation,
    /// The sampling parameters in force.
    pub params: &'a SamplingParams,
    /// The stop strings and end ids in force.
    pub stop: &'a StopConditions,
    /// How the tokens were decoded.
    pub mode: DecodeMode,
    /// Prompt positions reused from a loaded session.
    pub reused: usize,
    /// Seconds of the prompt pass.
    pub prefill_s: f64,
    /// I/O counters after open (pins read), for per-phase reports.
    pub stats_open: StoreStats,
    /// I/O counters after the prompt.
    pub stats_prefill: StoreStats,
    /// Seconds of the decode passes.
    pub decode_s: f64,
    /// Seconds from open to the end.
    pub wall: f64,
}

impl RunFacts<'_> {
    /// Decode seconds per token: the decode time over the tokens the decode passes made. The
    /// first generated token comes from the prompt pass (its logits), so it is not counted
    /// (0 when at most one token was generated).
    pub fn per_token(&self) -> f64 {
        match self.generation.ids.len() {
            0 | 1 => 0.0,
            n => self.decode_s / (n - 1) as f64,
        }
    }

    /// The figure `seconds_per_token` held before: decode time over every generated token,
    /// the first one (made by the prompt pass) included.
    pub fn per_generated_token(&self) -> f64 {
        match self.generation.ids.len() {
            0 => 0.0,
            n => self.decode_s / n as f64,
        }
    }
}
