//! `cargo xtask predict-dist`: a model of decode s/token for Kimi K3 as released over N
//! machines (docs/PERFORMANCE.md#predicted-stoken-on-216-machines).
//!
//! Per rank, from the same planner `k3 plan --ranks N` uses (each rank's share of the trunk,
//! the routed experts it owns, a preset's budget per rank):
//!
//! * disk: the trunk bytes the plan streams per token + the expected expert misses
//!   (`top_k` experts of each MoE layer, `1/N` of them this rank's, times the miss rate);
//! * DRAM: every weight byte the token touches on this rank (pinned + streamed trunk, the
//!   rank's experts) passes through memory once;
//! * network: every collective of one decoded token (`k3_model::dist_cost`, counted call for
//!   call against the engine in tests) costs `⌈log₂ N⌉` latencies (recursive doubling for
//!   small all-gathers) plus the bytes this rank receives at the link rate.
//!
//! s/token = max(disk, DRAM) + network: reads overlap compute (the ring prefetches), but every
//! collective is a synchronisation point of the pass, so the network term adds. Compute is
//! left out (decode runs at 1.3× its DRAM floor on one machine, docs/PERFORMANCE.md); the
//! figures are floors, like `k3 presets`'s.
//!
//! The model itself is the planner's (`k3_plan::forecast`): the expert hit rate at a cache of
//! a fraction of the owned experts (`interpolated_hit_rate`: piecewise linear through the
//! decode-view ARC rates measured at the presets' cache sizes, docs/PERFORMANCE.md "Decision:
//! ARC is the default") and the group floor (`group_floor_secs`); this command deals the
//! released model over the ranks and prints the table.

use clap::Args;
use k3_engine::planning::{decode_exchange, rank_sizes_of_config};
use k3_engine::{Budget, Preset};
use k3_format::K3Config;
use k3_plan::forecast::{group_floor_secs, interpolated_hit_rate, NetworkCost};
use k3_plan::plan::plan as make_plan;
use k3_plan::{ModelSizes, PlanRequest};
use std::process::ExitCode;

/// Flags of `cargo xtask predict-dist`.
#[derive(Args)]
pub struct PredictDistArgs {
    /// Disk read rate of each machine, GB/s (as `k3 presets --read-gbps`).
    #[arg(long, default_value_t = 3.0)]
    pub disk_gbps: f64,
    /// DRAM bandwidth of each machine, GB/s.
    #[arg(long, default_value_t = 50.0)]
    pub dram_gbps: f64,
    /// Machine counts to predict.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub ranks: Vec<usize>,
    /// Context positions reserved per rank.
    #[arg(short = 'c', long, default_value_t = 4096)]
    pub ctx: u64,
}

/// A network between the machines: link rate and one small-message latency.
#[derive(Clone, Copy, Debug)]
pub struct Network {
    /// Name in the table.
    pub name: &'static str,
    /// Link rate, Gb/s.
    pub gbit: f64,
    /// One point-to-point step of a small collective, seconds.
    pub latency: f64,
}

/// The networks of the table. Latencies are typical MPI small-message figures: kernel TCP
/// over 10 and 25 GbE (tens of µs), RDMA (InfiniBand / RoCE) at 100 Gb/s (a few µs).
pub const NETWORKS: [Network; 3] = [
    Network {
        name: "10 GbE (TCP, 30 µs)",
        gbit: 10.0,
        latency: 30e-6,
    },
    Network {
        name: "25 GbE (TCP, 20 µs)",
        gbit: 25.0,
        latency: 20e-6,
    },
    Network {
        name: "100 Gb/s (RDMA, 3 µs)",
        gbit: 100.0,
        latency: 3e-6,
    },
];

/// One rank's figures per decoded token.
#[derive(Clone, Copy, Debug)]
pub struct RankToken {
    /// RAM the rank's plan takes, bytes.
    pub ram: u64,
    /// Bytes read from disk per token.
    pub disk_bytes: f64,
    /// Weight bytes through DRAM per token.
    pub dram_bytes: f64,
    /// Collective calls per token.
    pub collectives: u64,
    /// Bytes the rank receives per token.
    pub received: u64,
}

/// N ranks' sizes (`k3 plan --ranks N`'s) and what a decoded token exchanges.
pub struct Group {
    /// Every rank's share, in rank order.
    pub sizes: Vec<ModelSizes>,
    /// Collectives and bytes of one decoded token.
    pub exchange: k3_engine::planning::TokenExchange,
}

impl Group {
    /// The release's `whole` sizes dealt over `n` ranks.
    pub fn new(cfg: &K3Config, whole: &ModelSizes, n: usize) -> Result<Group, String> {
        Ok(Group {
            sizes: rank_sizes_of_config(cfg, whole, n).map_err(|e| e.to_string())?,
            exchange: decode_exchange(cfg, n).map_err(|e| e.to_string())?,
        })
    }
}

/// Every rank's figures for `preset` per rank over `n` ranks, in rank order.
pub fn rank_tokens(
    cfg: &K3Config,
    group: &Group,
    preset: Preset,
    ctx: u64,
) -> Result<Vec<RankToken>, String> {
    let (n, exchange) = (group.sizes.len(), group.exchange);
    let moe_layers = (cfg.num_hidden_layers - cfg.first_k_dense_replace) as f64;
    group
        .sizes
        .iter()
        .map(|sizes| {
            let plan = make_plan(sizes, &PlanRequest::new(Budget::Preset(preset), ctx))
                .map_err(|e| e.to_string())?;
            // the rank's share of every MoE layer's top-k (owner `e % N` deals them evenly)
            let experts =
                moe_layers * f64::from(sizes.top_k) * sizes.expert_bytes as f64 / n as f64;
            let hit = interpolated_hit_rate(plan.expert_slots, sizes.n_routed_experts);
            let streamed = plan.trunk.streamed_per_token as f64;
            let trunk: u64 = sizes.layer_run_bytes.iter().sum();
            Ok(RankToken {
                ram: plan.total_bytes(),
                disk_bytes: streamed + experts * (1.0 - hit),
                dram_bytes: trunk as f64 + experts,
                collectives: exchange.collectives,
                received: exchange.bytes_received_per_rank,
            })
        })
        .collect()
}

/// Seconds per token of `r` over `n` ranks on `net`, disk and DRAM rates in GB/s: the
/// planner's group floor (`k3_plan::forecast::group_floor_secs`).
pub fn seconds(r: &RankToken, n: usize, net: &Network, disk_gbps: f64, dram_gbps: f64) -> f64 {
    let cost = NetworkCost {
        collectives: r.collectives,
        received_bytes: r.received,
        link_bits_per_s: net.gbit * 1e9,
        latency_s: net.latency,
    };
    group_floor_secs(
        r.disk_bytes / (disk_gbps * 1e9),
        r.dram_bytes / (dram_gbps * 1e9),
        n,
        cost,
    )
}

/// Runs the prediction and prints the table (markdown) on stdout.
pub fn run(args: &PredictDistArgs) -> ExitCode {
    match predict(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("predict-dist: {e}");
            ExitCode::FAILURE
        }
    }
}

fn predict(args: &PredictDistArgs) -> Result<(), String> {
    let cfg = K3Config::released();
    let whole = ModelSizes::k3_estimate();
    println!(
        "Kimi K3 as released, decode floor per token; per machine: a preset's budget, disk {} GB/s, DRAM {} GB/s\n",
        args.disk_gbps, args.dram_gbps
    );
    print!("| preset per machine | N | RAM per rank | disk/token per rank | DRAM/token per rank | collectives | received/rank |");
    for net in NETWORKS {
        print!(" s/token, {} |", net.name);
    }
    println!();
    println!(
        "|---|---|---|---|---|---|---|{}",
        "---|".repeat(NETWORKS.len())
    );
    let groups: Vec<(usize, Group)> = args
        .ranks
        .iter()
        .map(|&n| Ok((n.max(1), Group::new(&cfg, &whole, n.max(1))?)))
        .collect::<Result<_, String>>()?;
    for preset in Preset::ALL {
        for (n, group) in &groups {
            let n = *n;
            let ranks = rank_tokens(&cfg, group, preset, args.ctx)?;
            // the slowest rank sets the pace (every collective waits for it)
            let r = ranks
                .iter()
                .copied()
                .max_by(|a, b| a.disk_bytes.total_cmp(&b.disk_bytes))
                .ok_or("no ranks")?;
            print!(
                "| {} | {n} | {:.1} GB | {:.2} GB | {:.2} GB | {} | {:.2} MB |",
                preset.name(),
                r.ram as f64 / 1e9,
                r.disk_bytes / 1e9,
                r.dram_bytes / 1e9,
                r.collectives,
                r.received as f64 / 1e6
            );
            for net in NETWORKS {
                print!(
                    " {:.3} |",
                    seconds(&r, n, &net, args.disk_gbps, args.dram_gbps)
                );
            }
            println!();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_machine_is_the_presets_io_floor() {
        // N = 1 disk bytes are `k3 presets`'s: trunk streamed + expected misses.
        let cfg = K3Config::released();
        let whole = ModelSizes::k3_estimate();
        let group = Group::new(&cfg, &whole, 1).unwrap();
        let r = rank_tokens(&cfg, &group, Preset::Laptop, 4096).unwrap()[0];
        let plan = make_plan(
            &whole,
            &PlanRequest::new(Budget::Preset(Preset::Laptop), 4096),
        )
        .unwrap();
        let misses = 92.0 * 16.0 * whole.expert_bytes as f64 * (1.0 - 0.096);
        let want = plan.trunk.streamed_per_token as f64 + misses;
        assert!(
            (r.disk_bytes - want).abs() / want < 0.01,
            "{} vs {want}",
            r.disk_bytes
        );
        assert_eq!(r.collectives, 0);
    }

    #[test]
    fn more_ranks_never_read_more_per_rank() {
        let cfg = K3Config::released();
        let whole = ModelSizes::k3_estimate();
        let groups: Vec<_> = [1, 2, 4, 8, 16]
            .map(|n| Group::new(&cfg, &whole, n).unwrap())
            .into_iter()
            .collect();
        for p in Preset::ALL {
            let mut last = f64::INFINITY;
            for (g, n) in groups.iter().zip([1, 2, 4, 8, 16]) {
                let worst = rank_tokens(&cfg, g, p, 4096)
                    .unwrap()
                    .iter()
                    .map(|r| r.disk_bytes)
                    .fold(0.0, f64::max);
                assert!(worst <= last * 1.0001, "{} at {n}", p.name());
                last = worst;
            }
        }
    }
}
