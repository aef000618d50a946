//! `k3 run`'s files: the `--json` report and the `--dump-cache-trace` expert trace.

use crate::run_args::{json_to_stdout, RunArgs};
use crate::CliError;
use k3_engine::{
    DecodeMode, Engine, Generation, SamplingParams, Session, StopConditions, StoreStats,
};
use k3_store::probe::peak_rss_bytes;
use std::path::Path;

/// Writes the `--json` report of a finished run.
pub fn write_json(
    path: &Path,
    args: &RunArgs,
    engine: &Engine,
    session: &Session<'_>,
    done: &Done<'_>,
    ranks: &[k3_engine::RankFigures],
) -> Result<(), CliError> {
    let (g, stats, spec) = (done.generation, engine.stats(), session.spec_stats());
    let report = serde_json::json!({
        "model_dir": done.dir,
        "prompt_ids": done.prompt,
        "generated_ids": g.ids,
        "generated_text": g.text,
        "stop_reason": g.stop_reason.name(),
        "stop_value": serde_json::to_value(&g.stop_reason).ok().and_then(|v| v.get("value").cloned()),
        "sampling": sampling_json(done.params, done.stop, args.ignore_eos),
        "prefill_seconds": done.prefill_s,
        "prompt_tokens_reused": done.reused,
        "seconds_per_token": done.per_token(),
        "seconds_per_generated_token": done.per_generated_token(),
        "interrupted": crate::interrupt::requested(),
        "wall_seconds": done.wall,
        "threads": engine.threads(),
        "mode": match done.mode {
            DecodeMode::Recompute => "recompute",
            DecodeMode::Speculative(_) => "speculative",
            DecodeMode::Hybrid(_) => "hybrid",
            DecodeMode::Block(_) => "block",
            _ => "incremental",
        },
        "draft": crate::run_draft::block_json(engine, session, done.generation.ids.len(),
            &done.stats_prefill, &stats),
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
        "prefill": phase_json(&done.stats_open, &done.stats_prefill, done.prefill_s, engine),
        "decode": phase_json(&done.stats_prefill, &stats, done.decode_s, engine),
    });
    let mut report = report;
    if let (Some(all), serde_json::Value::Object(io)) = (report.as_object_mut(), io_json(&stats)) {
        all.extend(io);
    }
    let text = serde_json::to_string_pretty(&report).unwrap_or_default();
    if json_to_stdout(args) {
        println!("{text}");
        return Ok(());
    }
    std::fs::write(path, text + "\n").map_err(|e| {
        CliError::runtime(format!("{}: cannot write JSON report: {e}", path.display()))
    })
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

/// Writes `DIR/expert_trace.bin`: per request, u32 LE layer then u32 LE expert.
pub fn write_trace(dir: &Path, trace: &[(u32, u32)]) -> Result<(), CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::runtime(format!("{}: {e}", dir.display())))?;
    let path = dir.join("expert_trace.bin");
    let bytes: Vec<u8> = trace
        .iter()
        .flat_map(|(l, e)| l.to_le_bytes().into_iter().chain(e.to_le_bytes()))
        .collect();
    std::fs::write(&path, bytes)
        .map_err(|e| CliError::runtime(format!("{}: {e}", path.display())))?;
    eprintln!(
        "expert trace: {} requests written to {}",
        trace.len(),
        path.display()
    );
    Ok(())
}

/// What a finished run hands to its reports.
pub struct Done<'a> {
    pub dir: &'a Path,
    pub prompt: &'a [u32],
    pub generation: &'a Generation,
    pub params: &'a SamplingParams,
    pub stop: &'a StopConditions,
    pub mode: DecodeMode,
    pub reused: usize,
    pub prefill_s: f64,
    /// I/O counters after open (pins read) and after the prompt, for per-phase reports.
    pub stats_open: k3_engine::StoreStats,
    pub stats_prefill: k3_engine::StoreStats,
    pub decode_s: f64,
    pub wall: f64,
}

impl Done<'_> {
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
