//! `k3 run`'s files: the `--json` report and the `--dump-cache-trace` expert trace.

use crate::run::{peak_rss_bytes, Done, RunArgs};
use crate::CliError;
use k3_engine::{DecodeMode, Engine, SamplingParams, Session, StopConditions};
use std::path::Path;

/// Writes the `--json` report of a finished run.
pub fn write_json(
    path: &Path,
    args: &RunArgs,
    engine: &Engine,
    session: &Session<'_>,
    done: &Done<'_>,
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
        "wall_seconds": done.wall,
        "threads": engine.threads(),
        "mode": match done.mode {
            DecodeMode::Recompute => "recompute",
            DecodeMode::Speculative(_) => "speculative",
            _ => "incremental",
        },
        "draft_passes": spec.passes,
        "draft_tokens": spec.drafted,
        "draft_accepted": spec.accepted,
        "peak_rss_bytes": peak_rss_bytes(),
        "streaming": engine.plan().is_some(),
        "bytes_read_trunk": stats.trunk_bytes_read,
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
    });
    let text = serde_json::to_string_pretty(&report).unwrap_or_default();
    std::fs::write(path, text + "\n").map_err(|e| {
        CliError::runtime(format!("{}: cannot write JSON report: {e}", path.display()))
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
