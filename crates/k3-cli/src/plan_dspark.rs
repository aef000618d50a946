//! `k3 plan MODEL --draft-model DIR`: the plan with a DSpark draft held in memory (its
//! weights and every reserved session's context KV), and the bytes read per generated token
//! at acceptance lengths 1–7 (docs/STREAMING.md#dspark-block-drafts).

use crate::CliError;
use k3_engine::block::Routing;
use k3_engine::dspark::DsparkDraft;
use k3_engine::planning::model_sizes;
use k3_engine::Budget;
use k3_format::K3Config;
use k3_plan::plan::fmt_bytes;
use std::path::Path;

/// Prints the plan with the draft and the per-token table; exit 2 when the draft is for
/// another model or the plan does not fit.
pub fn plan(
    model_dir: &Path,
    draft_dir: &Path,
    budget: Budget,
    ctx: usize,
    sessions: usize,
) -> Result<(), CliError> {
    let usage = |e: &dyn std::fmt::Display| CliError::usage(e.to_string());
    let cfg = K3Config::load(model_dir.join("config.json")).map_err(|e| usage(&e))?;
    let held = DsparkDraft::open(draft_dir, &cfg).map_err(|e| usage(&e))?;
    let c = held.graph().config();
    // every layer's latent row per verified position, f32
    let kv_per_pos = (c.num_hidden_layers * c.kv_width() * 4) as u64;
    let kv = held.context_kv_bytes(ctx, sessions);
    // the form `k3 run` would hold the draft in: the first that fits (docs/DSPARK.md#memory)
    let (plan, available, fits, hold) =
        k3_engine::dspark_hold::forecast(model_dir, budget, ctx, sessions, &held)?;
    println!("{}", plan.table(Some(&available)).trim_end());
    println!(
        "DSpark draft {}: {} of weights held as {} + {} of context KV ({} per position × {ctx} positions × {sessions} sessions), planned in the draft row",
        draft_dir.display(),
        fmt_bytes(held.held_weight_bytes(hold)),
        hold.name(),
        fmt_bytes(kv),
        fmt_bytes(kv_per_pos)
    );
    let ckpt = k3_format::Checkpoint::open(model_dir).map_err(|e| usage(&e))?;
    let binding = k3_format::bind_model(&ckpt, &cfg).map_err(|e| usage(&e))?;
    let sizes = model_sizes(&cfg, &binding)?;
    let moe = (0..cfg.num_hidden_layers)
        .filter(|&l| !cfg.is_dense(l))
        .count() as u64;
    let x = sizes.top_k as u64 * moe * sizes.expert_bytes;
    let s = plan.trunk.streamed_per_token;
    println!(
        "bytes read per generated token (trunk streamed {} per pass; routed experts at most {} per position and a pass reads the union of its positions' experts, cache hits read less):",
        fmt_bytes(s),
        fmt_bytes(x)
    );
    println!(
        "  plain decoding: trunk {}, experts {}",
        fmt_bytes(s),
        fmt_bytes(x)
    );
    let block = c.block_size as u64;
    let routing = Routing::independent(cfg.num_experts, cfg.num_experts_per_token);
    let union = x as f64 * routing.positions((block + 1) as f64);
    for tau in 1..=block {
        println!(
            "  acceptance length {tau}, {block} drafts verified: trunk {}, experts {}",
            fmt_bytes(s / tau),
            fmt_bytes((union / tau as f64) as u64)
        );
    }
    fits.map_err(CliError::from)
}
