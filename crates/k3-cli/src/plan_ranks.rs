//! `k3 plan --ranks N` (docs/DISTRIBUTED.md#memory-per-rank): each rank's plan under the
//! (per-rank) budget — pins, ring, expert cache, total — the trunk and expert bytes it reads
//! per token, and the collectives and bytes the ranks exchange per token. With a model its
//! shapes; without one the release's (from its tensor shapes, as `k3 plan` does).

use crate::CliError;
use k3_engine::planning::{decode_exchange, rank_sizes, rank_sizes_of_config, TokenExchange};
use k3_engine::rank_plan::{rank_rows, RankRow};
use k3_engine::{Budget, K3Config};
use k3_plan::plan::fmt_bytes;
use k3_plan::PlanRequest;
use std::path::Path;

/// Prints every rank's plan (a table, or JSON with `json`); exits 2 when a rank's plan is
/// refused by the planner or does not fit this machine.
pub fn plan_ranks(
    model_dir: Option<&Path>,
    req: PlanRequest,
    ranks: usize,
    json: bool,
) -> Result<(), CliError> {
    let usage = |e: &dyn std::fmt::Display| CliError::usage(e.to_string());
    let (cfg, what, per_rank) = match model_dir {
        Some(dir) => {
            let cfg = K3Config::load(dir.join("config.json")).map_err(|e| usage(&e))?;
            let ck = k3_format::Checkpoint::open(dir).map_err(|e| usage(&e))?;
            let b = k3_format::bind_model(&ck, &cfg).map_err(|e| usage(&e))?;
            let sizes: Result<Vec<_>, _> =
                (0..ranks).map(|r| rank_sizes(&cfg, &b, r, ranks)).collect();
            (cfg, dir.display().to_string(), sizes?)
        }
        None => {
            let (whole, _) = k3_engine::release_sizes::released_sizes();
            let cfg = K3Config::released();
            let sizes = rank_sizes_of_config(&cfg, &whole, ranks)?;
            (
                cfg,
                "Kimi K3 as released (from its tensor shapes)".into(),
                sizes,
            )
        }
    };
    let moe_layers = cfg
        .num_hidden_layers
        .saturating_sub(cfg.first_k_dense_replace) as u64;
    let available = k3_store::available_memory();
    let rows = rank_rows(&per_rank, &req, moe_layers, &available)
        .map_err(|(r, e)| usage(&format!("rank {r}: {e}")))?;
    let exchange = decode_exchange(&cfg, ranks)?;
    if json {
        let v = serde_json::json!({
            "model": what,
            "ranks": ranks,
            "budget_per_rank": format!("{:?}", req.budget),
            "per_rank": rows,
            "exchange_per_token": exchange,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        print_table(&what, ranks, req.budget, &rows, &exchange);
    }
    match rows.iter().find(|r| !r.fits) {
        Some(r) => Err(CliError::usage(format!(
            "rank {}'s plan ({}) does not fit this machine's available memory: lower the per-rank budget or add ranks",
            r.rank,
            fmt_bytes(r.total_bytes)
        ))),
        None => Ok(()),
    }
}

fn print_table(what: &str, ranks: usize, budget: Budget, rows: &[RankRow], x: &TokenExchange) {
    let per_rank = match budget {
        Budget::Preset(p) => format!("--preset {}", p.name()),
        Budget::Total(b) => format!("--mem-gb {}", b as f64 / 1e9),
        Budget::Split { trunk, cache } => format!(
            "--trunk-gb {} --cache-gb {}",
            trunk as f64 / 1e9,
            cache as f64 / 1e9
        ),
    };
    println!("{what} over {ranks} ranks; budget per rank: {per_rank}");
    println!(
        "{:>4} {:>10} {:>16} {:>14} {:>20} {:>12} {:>14}",
        "rank", "RAM", "trunk pinned", "ring", "expert cache", "trunk/token", "experts/token"
    );
    for r in rows {
        println!(
            "{:>4} {:>10} {:>16} {:>14} {:>20} {:>12} {:>14}",
            r.rank,
            fmt_bytes(r.total_bytes),
            format!(
                "{} ({} layers)",
                fmt_bytes(r.trunk_pinned_bytes),
                r.trunk_pinned_layers
            ),
            format!("{} x{}", fmt_bytes(r.trunk_ring_bytes), r.trunk_ring_slots),
            format!(
                "{} ({}/{})",
                fmt_bytes(r.expert_cache_bytes),
                r.expert_slots,
                r.owned_experts
            ),
            fmt_bytes(r.trunk_bytes_per_token),
            format!("≤ {}", fmt_bytes(r.expert_bytes_asked_per_token)),
        );
    }
    println!(
        "per token: {} collectives, {} gathered over all ranks ({} received by each rank)",
        x.collectives,
        fmt_bytes(x.bytes_total),
        fmt_bytes(x.bytes_received_per_rank)
    );
    println!("experts/token: the rank's share of every MoE layer's top-k, read only on cache misses (expert cache: slots/owned experts).");
    println!("trunk/token: each rank's share of the shards' trunk rows; with a packed trunk (plain or compressed) every rank streams whole layers, as `k3 plan MODEL --trunk DIR` plans and forecasts them (docs/DISTRIBUTED.md#memory-per-rank).");
}
