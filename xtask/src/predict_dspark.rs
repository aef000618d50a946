//! `cargo xtask predict-dspark [--preset laptop] [--tau 3.3] [--disk-gbps 3,5]
//! [--correlation 0.3] [--draft-seconds S]`: Kimi K3 as released with the published DSpark draft
//! — bytes and seconds per generated token at acceptance length τ against plain decoding,
//! from the block drafter's cost model (`k3_engine::block::PassCost`, the one the drafter
//! chooses with and `bench-dspark` checks) over the planner's plan of the preset
//! (docs/STREAMING.md#dspark-block-drafts).
//!
//! A pass over `m` positions: the trunk the plan streams (`S`, from disk), the union of its
//! positions' routed experts — `u(m)·X` with `X = top_k × MoE layers × expert bytes` one
//! position's and `u(m)` the expected distinct experts of `m` positions in units of `top_k`
//! (`k3_engine::block::Routing`: `E·(1 − (1 − k/E)^m)/k` independent, lower with routing
//! correlation `ρ`) — of which the cache's expected hit rate is not read (the planner's
//! decode-view ARC rates, as `predict-dist`), every trunk byte and every expert byte of the
//! union through DRAM once as the compute term (decode runs near its DRAM floor,
//! docs/PERFORMANCE.md), and one DSpark pass (`--draft-seconds`, measured by
//! `bench-dspark-step`). Terms add (reads are not assumed to overlap compute). The draft is
//! planned as what it is: its bf16 weights and its context KV, no session of its own.

use clap::Args;
use k3_engine::block::{PassCost, PassSeconds, Routing};
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
    /// Assumed routing correlation ρ: the fraction of a position's routing kept from the
    /// previous position (0 = independent; the second row of each disk).
    #[arg(long, default_value_t = 0.3)]
    pub correlation: f64,
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

/// Bytes the published draft holds for a context of `ctx`: its bf16 weights and its context
/// KV, 5 layers × (kv_lora 512 + rope 64) × 4 bytes per position.
pub fn draft_held_bytes(ctx: u64) -> u64 {
    draft_bytes() + 5 * 576 * 4 * ctx
}

/// The timed pass model on a `disk` (bytes/s) and `dram` (bytes/s): the streamed trunk
/// `streamed` from disk and the whole trunk `trunk` through DRAM once per pass, one
/// position's experts `x` of which `hit` come from the cache (the union's `u(m)` multiplies
/// both their disk and DRAM terms), the DSpark pass `draft` seconds.
pub struct Released {
    /// Trunk bytes streamed from disk per pass.
    pub streamed: f64,
    /// Trunk bytes through DRAM per pass.
    pub trunk: f64,
    /// One position's routed-expert bytes.
    pub x: f64,
    /// Expected expert-cache hit rate.
    pub hit: f64,
    /// Routing geometry and correlation.
    pub routing: Routing,
    /// Seconds of one DSpark pass.
    pub draft: f64,
}

impl Released {
    /// The cost model at `disk` and `dram` bytes per second.
    pub fn cost(&self, disk: f64, dram: f64) -> PassCost {
        let read = self.x * (1.0 - self.hit);
        PassCost {
            seconds: Some(PassSeconds {
                shared: self.streamed / disk + self.trunk / dram,
                experts: read / disk + self.x / dram,
                per_position: 0.0,
                draft: self.draft,
            }),
            ..PassCost::bytes_only(self.streamed, read).with_routing(self.routing)
        }
    }
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
    let req =
        PlanRequest::new(Budget::Preset(p), args.ctx).with_block_draft(draft_held_bytes(args.ctx));
    let plan = make_plan(&sizes, &req).map_err(|e| e.to_string())?;
    let moe = (cfg.num_hidden_layers - cfg.first_k_dense_replace) as f64;
    let x = moe * f64::from(sizes.top_k) * sizes.expert_bytes as f64;
    let hit = interpolated_hit_rate(plan.expert_slots, sizes.n_routed_experts);
    let independent = Routing::independent(cfg.num_experts, cfg.num_experts_per_token);
    let model = |rho: f64| Released {
        streamed: plan.trunk.streamed_per_token as f64,
        trunk: sizes.layer_run_bytes.iter().sum::<u64>() as f64,
        x,
        hit,
        routing: independent.with_correlation(rho),
        draft: args.draft_seconds,
    };
    let m = args.verified as f64 + 1.0;
    println!(
        "Kimi K3 as released, preset {} with the published DSpark draft held ({:.2} GB bf16 + {:.1} MB context KV, no session of its own): plan {:.2} GB, trunk streamed {:.1} GB per pass, expert hit rate {:.0} %, X = {:.1} GB per position ({:.1} GB read), a pass of {m} positions reads the union of their experts: {:.2} positions' worth independent, {:.2} at ρ = {}; draft pass {:.2} s, DRAM {} GB/s, τ = {}, {} verified",
        args.preset,
        draft_bytes() as f64 / 1e9,
        (draft_held_bytes(args.ctx) - draft_bytes()) as f64 / 1e6,
        plan.total_bytes() as f64 / 1e9,
        plan.trunk.streamed_per_token as f64 / 1e9,
        hit * 100.0,
        x / 1e9,
        x * (1.0 - hit) / 1e9,
        independent.positions(m),
        independent.with_correlation(args.correlation).positions(m),
        args.correlation,
        args.draft_seconds,
        args.dram_gbps,
        args.tau,
        args.verified
    );
    println!("\n| disk | routing | plain GB/token | plain s/token | block GB/token | block s/token | speed-up |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for &gbps in &args.disk_gbps {
        for rho in [0.0, args.correlation] {
            let cost = model(rho).cost(gbps * 1e9, args.dram_gbps * 1e9);
            let plain = cost.per_token(1.0, 0.0, false);
            let block = cost.per_token(args.tau, args.verified as f64, true);
            let (ps, bs) = (plain.seconds.unwrap_or(0.0), block.seconds.unwrap_or(0.0));
            let label = if rho > 0.0 {
                format!("ρ = {rho}")
            } else {
                "independent".to_string()
            };
            println!(
                "| {gbps} GB/s | {label} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2}× |",
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
    fn the_published_draft_is_4_8_gb_in_bf16_and_a_pass_reads_the_union() {
        let gb = draft_bytes() as f64 / 1e9;
        assert!((gb - 4.78).abs() < 0.01, "{gb}");
        assert_eq!(draft_held_bytes(4096) - draft_bytes(), 47_185_920);
        let m = Released {
            streamed: 100.0,
            trunk: 200.0,
            x: 10.0,
            hit: 0.5,
            routing: Routing::independent(32, 16),
            draft: 1.0,
        };
        let c = m.cost(1.0, 10.0);
        // one position: its own experts, 5 read of 10; seconds 100 + 20 + 5 + 1
        assert!((c.bytes(0) - 105.0).abs() < 1e-9);
        assert!((c.seconds(0, false).unwrap() - 126.0).abs() < 1e-9);
        // two positions of top-16 in 32 read 24 experts, 1.5 positions' worth
        assert!((c.bytes(1) - 107.5).abs() < 1e-9);
        assert!((c.seconds(1, true).unwrap() - (120.0 + 1.5 * 6.0 + 1.0)).abs() < 1e-9);
        // correlation reads less still
        let rho = Released {
            routing: Routing::independent(32, 16).with_correlation(0.3),
            ..m
        };
        assert!(rho.cost(1.0, 10.0).bytes(1) < c.bytes(1));
    }
}
