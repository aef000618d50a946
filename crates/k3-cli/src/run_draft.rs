//! The `draft` object of `k3 run --json` for DSpark block drafting (docs/DSPARK.md,
//! docs/STREAMING.md#dspark-block-drafts): every pass, and what the passes bought.

use k3_engine::{Engine, Session, StoreStats};

/// `null` without block drafting; else `{passes: [{position, proposed, confidence,
/// verified, kept}], acceptance_length, tokens_per_trunk_pass, bytes_read_per_generated_token,
/// draft_seconds, failure, draft_model}` over the decode phase (`before` → `after`).
pub fn block_json(
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
    let decode_passes = spec.passes + spec.settle_passes;
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
            "block_size": d.graph().config().block_size,
        })),
    })
}
