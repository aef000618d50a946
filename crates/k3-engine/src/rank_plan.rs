//! Each rank's plan over N ranks (`k3 plan --ranks N`, docs/DISTRIBUTED.md#memory-per-rank):
//! the rank's pins, ring and expert cache under the per-rank budget, the trunk and expert bytes
//! a token asks of it, and whether it fits this machine.

use k3_plan::plan::plan as make_plan;
use k3_plan::{Available, MemoryPlan, ModelSizes, PlanError, PlanRequest};

/// One rank's row.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RankRow {
    /// The rank.
    pub rank: usize,
    /// Its plan's total bytes.
    pub total_bytes: u64,
    /// Bytes of its pinned trunk layers.
    pub trunk_pinned_bytes: u64,
    /// How many trunk layers it pins.
    pub trunk_pinned_layers: usize,
    /// Bytes of its trunk ring.
    pub trunk_ring_bytes: u64,
    /// Slots of its trunk ring.
    pub trunk_ring_slots: usize,
    /// Bytes of its expert cache.
    pub expert_cache_bytes: u64,
    /// Slots of its expert cache.
    pub expert_slots: u64,
    /// The routed experts it owns.
    pub owned_experts: u64,
    /// Trunk bytes it streams per token.
    pub trunk_bytes_per_token: u64,
    /// Expert bytes a token asks of this rank (its share of every MoE layer's top-k); read
    /// from disk only on cache misses, so 0 once warm when the cache holds every owned expert.
    pub expert_bytes_asked_per_token: u64,
    /// Whether its cache holds every expert it owns.
    pub holds_every_owned_expert: bool,
    /// Whether its plan fits `available`.
    pub fits: bool,
}

/// Every rank's row: `per_rank` holds each rank's sizes (`planning::rank_sizes`), planned
/// under `req`, with `moe_layers` MoE layers, checked against `available`. Errors name the
/// rank whose plan the planner refused.
pub fn rank_rows(
    per_rank: &[ModelSizes],
    req: &PlanRequest,
    moe_layers: u64,
    available: &Available,
) -> Result<Vec<RankRow>, (usize, PlanError)> {
    let ranks = per_rank.len();
    let mut rows = Vec::with_capacity(ranks);
    for (r, sizes) in per_rank.iter().enumerate() {
        let plan = make_plan(sizes, req).map_err(|e| (r, e))?;
        rows.push(row(r, &plan, sizes, moe_layers, ranks, available));
    }
    Ok(rows)
}

fn row(
    rank: usize,
    plan: &MemoryPlan,
    sizes: &ModelSizes,
    moe_layers: u64,
    ranks: usize,
    available: &Available,
) -> RankRow {
    let asked = moe_layers * u64::from(sizes.top_k) * sizes.expert_bytes / ranks as u64;
    RankRow {
        rank,
        total_bytes: plan.total_bytes(),
        trunk_pinned_bytes: plan.trunk.pinned_bytes,
        trunk_pinned_layers: plan.trunk.pinned.len(),
        trunk_ring_bytes: plan.trunk.ring_bytes(),
        trunk_ring_slots: plan.trunk.ring_slots,
        expert_cache_bytes: plan.expert_cache_bytes(),
        expert_slots: plan.expert_slots,
        owned_experts: sizes.n_routed_experts,
        trunk_bytes_per_token: plan.trunk.streamed_per_token,
        expert_bytes_asked_per_token: asked,
        holds_every_owned_expert: plan.expert_slots >= sizes.n_routed_experts,
        fits: plan.check(sizes, available).is_ok(),
    }
}
