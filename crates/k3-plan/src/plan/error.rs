//! Planner errors; every message says which flag to change and by how much.

use super::table::{gb_ceil, gb_floor};
use super::{fmt_bytes, min_trunk_budget, Available, Budget, MemoryPlan, ModelSizes};

/// Why no plan (or no plan that fits) could be made.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// `--preset` named no preset.
    #[error("unknown preset `{0}` (known: laptop, desktop, workstation, server, max)")]
    UnknownPreset(String),
    /// The trunk budget cannot hold even one ring slot (plus the layers it forces pinned).
    #[error("trunk budget {} cannot hold one ring slot of the largest unpinned layer; the smallest trunk plan needs {}: raise {flag} by {} GB (to at least {} GB)",
        fmt_bytes(*budget), fmt_bytes(*need), gb_ceil(need - budget), gb_ceil(*need))]
    TrunkTooSmall {
        /// Trunk budget given, bytes.
        budget: u64,
        /// Smallest workable trunk budget, bytes.
        need: u64,
        /// The flag to change.
        flag: &'static str,
    },
    /// The expert cache holds fewer than top-k + 1 slots.
    #[error("expert cache {} holds {slots} slots, fewer than top-k + 1 = {min_slots}: raise {flag} by {} GB (to at least {} GB)",
        fmt_bytes(*budget), gb_ceil(need.saturating_sub(*budget)), gb_ceil(*need))]
    CacheTooSmall {
        /// Cache budget given, bytes.
        budget: u64,
        /// Slots it holds.
        slots: u64,
        /// Slots required.
        min_slots: u64,
        /// Bytes required.
        need: u64,
        /// The flag to change.
        flag: &'static str,
    },
    /// `--mem-gb` is below the fixed costs plus the smallest trunk and cache.
    #[error("--mem-gb {} is below the smallest plan ({}: fixed costs + one ring slot + top-k + 1 expert slots): raise --mem-gb by {} GB (to at least {} GB)",
        gb_ceil(*total), fmt_bytes(*need), gb_ceil(need - total), gb_ceil(*need))]
    TotalTooSmall {
        /// Total given, bytes.
        total: u64,
        /// Smallest total, bytes.
        need: u64,
    },
    /// The plan needs more memory than is available.
    #[error("the memory plan needs {} but {} is available ({from}), short by {}: {advice}\n{table}",
        fmt_bytes(*need), fmt_bytes(*available), fmt_bytes(need - available))]
    DoesNotFit {
        /// Plan total, bytes.
        need: u64,
        /// Available, bytes.
        available: u64,
        /// Where `available` comes from.
        from: &'static str,
        /// What to change, with amounts.
        advice: String,
        /// The plan table.
        table: String,
    },
}

/// Builds the refusal for a plan that exceeds `available`.
pub(super) fn does_not_fit(
    plan: &MemoryPlan,
    sizes: &ModelSizes,
    available: &Available,
) -> PlanError {
    let avail = available.bytes().unwrap_or(0);
    let need = plan.total_bytes();
    PlanError::DoesNotFit {
        need,
        available: avail,
        from: available.source(),
        advice: advice(plan, sizes, need - avail, avail),
        table: plan.table(Some(available)),
    }
}

/// What to change to save `short` bytes.
fn advice(plan: &MemoryPlan, sizes: &ModelSizes, short: u64, avail: u64) -> String {
    let min_cache = sizes.min_expert_slots() * plan.expert_slot_bytes;
    let cache = plan.expert_cache_bytes();
    let trunk = plan.trunk.total_bytes();
    let min_trunk = min_trunk_budget(&sizes.layer_costs());
    let mut out = Vec::new();
    if let Budget::Total(t) = plan.request.budget {
        if cache + trunk - min_cache - min_trunk >= short {
            out.push(format!(
                "lower --mem-gb by {} GB (to at most {} GB)",
                gb_ceil(short),
                gb_floor(t - short)
            ));
        }
    } else {
        if cache - min_cache >= short {
            out.push(lower("--cache-gb", cache, short));
        }
        if trunk.saturating_sub(min_trunk) >= short {
            out.push(lower("--trunk-gb", trunk, short));
        }
        if cache + trunk - min_cache - min_trunk >= short && out.is_empty() {
            out.push(format!(
                "lower --cache-gb to {} GB and --trunk-gb by {} GB",
                gb_ceil(min_cache),
                gb_ceil(short - (cache - min_cache))
            ));
        }
        out.push(format!(
            "or pass --mem-gb {} to size both from what is available",
            gb_floor(avail)
        ));
    }
    if plan.latent_kv_bytes >= short && sizes.latent_kv_bytes_per_pos > 0 {
        let n = short.div_ceil(sizes.latent_kv_bytes_per_pos);
        out.push(format!(
            "lower --ctx by {n} (to at most {})",
            plan.request.ctx - n
        ));
    }
    if out.is_empty() || matches!(out.as_slice(), [only] if only.starts_with("or ")) {
        return format!(
            "even the smallest plan does not fit this machine (it needs {} more)",
            fmt_bytes(short)
        );
    }
    out.join("; ")
}

fn lower(flag: &str, current: u64, short: u64) -> String {
    format!(
        "lower {flag} by {} GB (to at most {} GB)",
        gb_ceil(short),
        gb_floor(current - short)
    )
}
