//! `cargo xtask predict-dspark [--preset laptop] [--tau 3.3] [--disk-gbps 3,5]
//! [--overlap 0.3] [--draft-seconds S]`: Kimi K3 as released with the published DSpark draft
//! — bytes and seconds per generated token at acceptance length τ against plain decoding,
//! from the block drafter's cost model (`k3_engine::block::PassCost`, the one the drafter
//! chooses with and `bench-dspark` checks) over the planner's plan of the preset
//! (docs/STREAMING.md#dspark-block-drafts).
//!
//! A pass: the trunk the plan streams (`S`, from disk), each position's routed experts
//! `X = top_k × MoE layers × expert bytes` of which the cache's expected hit rate is not read
//! (the planner's decode-view ARC rates, as `predict-dist`), every trunk and expert byte
//! through DRAM once as the compute term (decode runs near its DRAM floor,
//! docs/PERFORMANCE.md), and one DSpark pass (`--draft-seconds`, measured by
//! `bench-dspark-step`). Terms add (reads are not assumed to overlap compute). Routing
//! correlation: with overlap `o` between the experts of consecutive positions, a pass of
//! `n + 1` positions reads `X·(1 + n·(1 − o))` expert bytes instead of `(n + 1)·X`.

use clap::Args;
use k3_engine::block::{PassCost, Rates};
use k3_engine::planning::rank_sizes_of_config;
use k3_engine::{Budget, Preset};
use k3_format::K3Config;
use k3_plan::forecast::interpolated_hit_rate;
use k3_plan::plan::plan as make_plan;
use k3_plan::{ModelSizes, PlanRequest};
use std::process::ExitCode;

/// Flags of `predict-dspark`.
#[derive(Args, Debug)]
pub struct PredictDsparkArgs {
    /// Budget preset (`k3 presets`).
    #[arg(long, default_value = "laptop")]
    pub preset: String,
    /// Acceptance length: tokens per verifying pass.
    #[arg(long, default_value_t = 3.3)]
    pub tau: f64,
    /// Drafts verified per pass.
    #[arg(long, default_value_t = 7)]
    pub verified: usize,
    /// Disk read rates, GB/s.
    #[arg(long, value_delimiter = ',', default_values_t = [3.0, 5.0])]
    pub disk_gbps: Vec<f64>,
    /// DRAM bandwidth, GB/s (the compute term).
    #[arg(long, default_value_t = 50.0)]
    pub dram_gbps: f64,
    /// Assumed overlap of the routed experts of consecutive positions (0 = independent).
    #[arg(long, default_value_t = 0.3)]
    pub overlap: f64,
    /// Seconds of one DSpark block pass (bf16, published dims; `bench-dspark-step`).
    #[arg(long, default_value_t = 1.0)]
    pub draft_seconds: f64,
    /// Context positions reserved.
    #[arg(short = 'c', long, default_value_t = 4096)]
    pub ctx: u64,
}

/// Bytes of the published draft in bf16: 5 layers, context_proj over 5 taps, Markov head.
pub fn draft_bytes() -> u64 {
    let (e, i, h) = (7168u64, 14336u64, 64u64);
    let layer = 1536 * e + h * 192 * 1536 + 576 * e + h * 256 * 512 + e * h * 128 + 3 * i * e;
    2 * (5 * layer + e * 5 * e + 2 * 163_840 * 256)
}

/// A pass model with `o` of each further position's expert bytes shared with the one
/// before: `S + X + n·(1−o)·X` = `(S + o·X) + (n+1)·(1−o)·X`.
pub fn with_overlap(c: PassCost, o: f64) -> PassCost {
    PassCost::bytes_only(c.shared + o * c.per_position, (1.0 - o) * c.per_position)
}

fn preset(name: &str) -> Result<Preset, String> {
    Preset::ALL
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| format!("unknown preset {name}"))
}

fn predict(args: &PredictDsparkArgs) -> Result<(), String> {
    let cfg = K3Config::released();
    let whole = ModelSizes::k3_estimate();
    let sizes = rank_sizes_of_config(&cfg, &whole, 1)
        .map_err(|e| e.to_string())?
        .remove(0);
    let p = preset(&args.preset)?;
    let held = draft_bytes() + 5 * 576 * 4 * args.ctx;
    let req = PlanRequest::new(Budget::Preset(p), args.ctx).with_draft(held);
    let plan = make_plan(&sizes, &req).map_err(|e| e.to_string())?;
    let moe = (cfg.num_hidden_layers - cfg.first_k_dense_replace) as f64;
    let x = moe * f64::from(sizes.top_k) * sizes.expert_bytes as f64;
    let hit = interpolated_hit_rate(plan.expert_slots, sizes.n_routed_experts);
    let streamed = plan.trunk.streamed_per_token as f64;
    let trunk: f64 = sizes.layer_run_bytes.iter().sum::<u64>() as f64;
    println!(
        "Kimi K3 as released, preset {} with the published DSpark draft held ({:.2} GB bf16 + context KV): plan {:.2} GB, trunk streamed {:.1} GB per pass, expert hit rate {:.0} %, X = {:.1} GB per position ({:.1} GB read), draft pass {:.2} s, DRAM {} GB/s, τ = {}, {} verified",
        args.preset,
        draft_bytes() as f64 / 1e9,
        plan.total_bytes() as f64 / 1e9,
        streamed / 1e9,
        hit * 100.0,
        x / 1e9,
        x * (1.0 - hit) / 1e9,
        args.draft_seconds,
        args.dram_gbps,
        args.tau,
        args.verified
    );
    println!("\n| disk | routing | plain GB/token | plain s/token | block GB/token | block s/token | speed-up |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let dram = args.dram_gbps * 1e9;
    for &gbps in &args.disk_gbps {
        for (label, o) in [("independent", 0.0), ("overlap", args.overlap)] {
            let bytes = PassCost::bytes_only(streamed, x * (1.0 - hit));
            // the compute term: every trunk byte once per pass, each position's experts
            let compute = with_overlap(PassCost::bytes_only(trunk, x), o);
            let cost = with_overlap(bytes, o).with_rates(&Rates {
                trunk_disk: gbps * 1e9,
                expert_disk: gbps * 1e9,
                compute_shared: compute.shared / dram,
                compute_per_position: compute.per_position / dram,
                draft: args.draft_seconds,
            });
            let plain = cost.per_token(1.0, 0.0, false);
            let block = cost.per_token(args.tau, args.verified as f64, true);
            let (ps, bs) = (plain.seconds.unwrap_or(0.0), block.seconds.unwrap_or(0.0));
            println!(
                "| {gbps} GB/s | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}× |",
                if o > 0.0 {
                    format!("{label} {o}")
                } else {
                    label.to_string()
                },
                plain.bytes / 1e9,
                ps,
                block.bytes / 1e9,
                bs,
                ps / bs.max(1e-12)
            );
        }
    }
    Ok(())
}

/// Runs the prediction.
pub fn run(args: &PredictDsparkArgs) -> ExitCode {
    match predict(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("predict-dspark: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_draft_is_4_8_gb_in_bf16_and_overlap_keeps_plain_decoding() {
        let gb = draft_bytes() as f64 / 1e9;
        assert!((gb - 4.78).abs() < 0.01, "{gb}");
        let c = PassCost::bytes_only(100.0, 10.0);
        let o = with_overlap(c, 0.3);
        assert!(
            (o.bytes(0) - c.bytes(0)).abs() < 1e-9,
            "one position: no overlap"
        );
        assert!((o.bytes(7) - (100.0 + 10.0 + 7.0 * 7.0)).abs() < 1e-9);
    }
}
