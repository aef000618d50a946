//! `k3 plan`'s trunk compression forecast (docs/PERFORMANCE.md#trunk-compression): printed
//! under the table when the plan streams trunk bytes, and `k3 plan --json`.

use crate::plan_cmd::PlanArgs;
use crate::CliError;
use k3_engine::trunk_choice::{default_decoding_cores, TrunkCodecPlan, TrunkPacks};
use k3_format::TrunkPack;
use k3_plan::MemoryPlan;
use std::path::Path;

/// The forecast for `model_dir` (its packs, or `--trunk`), with the rates `args` give.
pub fn codec_plan(model_dir: &Path, args: &PlanArgs) -> Result<TrunkCodecPlan, CliError> {
    let read = match args.read_gbps {
        Some(r) if !(r.is_finite() && r > 0.0) => {
            return Err(CliError::usage(format!(
                "--read-gbps must be positive, got {r}"
            )))
        }
        r => r.map(|r| r * 1e9),
    };
    if args.threads == Some(0) {
        return Err(CliError::usage("--threads must be at least 1"));
    }
    let packs = match &args.trunk {
        Some(d) => TrunkPacks::given(d).map_err(|e| CliError::usage(e.to_string()))?,
        None => TrunkPacks::in_model_dir(model_dir),
    };
    let cores = args.threads.unwrap_or_else(default_decoding_cores);
    // Overlapped with any ring: the trunk store's stager reads the next stored run while the
    // current one decodes, a ring of one slot included (docs/STREAMING.md#overlapped-decode).
    Ok(TrunkCodecPlan::new(packs, read, cores, true))
}

/// The pack the forecast chooses, opened (its staging buffers are planned).
pub fn chosen_pack(codec: &TrunkCodecPlan) -> Result<Option<TrunkPack>, CliError> {
    codec
        .chosen()
        .map(TrunkPack::open)
        .transpose()
        .map_err(|e| CliError::usage(e.to_string()))
}

/// The forecast's lines, under the table.
pub fn print_lines(model_dir: &Path, plan: &MemoryPlan, codec: &TrunkCodecPlan) {
    for line in codec.lines(model_dir, plan.trunk.streamed_per_token) {
        println!("{line}");
    }
}

/// `k3 plan --json`: the plan's totals and the forecast (`null` when no trunk byte streams).
pub fn print_json(plan: &MemoryPlan, codec: Option<&TrunkCodecPlan>, fits: bool) {
    let t = &plan.trunk;
    let v = serde_json::json!({
        "total_bytes": plan.total_bytes(),
        "fits": fits,
        "scratch_bytes": plan.scratch_bytes,
        "trunk": {
            "pinned_layers": t.pinned.len(),
            "pinned_bytes": t.pinned_bytes,
            "ring_bytes": t.ring_bytes(),
            "streamed_bytes_per_token": t.streamed_per_token,
            "read_ahead": t.reads_ahead(),
        },
        "trunk_codec": codec.map(|c| c.json(t.streamed_per_token)),
    });
    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
}
