//! The budget to run a model with on this machine (`k3 doctor MODEL`): every preset, the
//! smallest split that holds the whole model and 90 % of the available memory, each planned
//! with its expected expert hit rate, and the pick among those that fit. Pure: the caller
//! measures the machine and prints.
//!
//! ```text
//! bytes/token = unpinned trunk + MoE layers · top-k · (1 − hit rate) · expert bytes
//! ```
//!
//! The hit rate is 100 % when the cache holds every expert, else the decode-view ARC figure of
//! docs/PERFORMANCE.md for a preset (0 for a `--mem-gb` budget: conservative).

use crate::forecast::{hit_rate, holds_everything};
use crate::plan::{plan as make_plan, GB};
use crate::{Available, Budget, MemoryPlan, ModelSizes, PlanError, PlanRequest, Preset};

/// A candidate budget and its plan.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// What it is, for the table: `preset laptop`, `whole model`, `--mem-gb 12.3`.
    pub label: String,
    /// The flags that ask for it on a `k3 run` command line.
    pub flag: String,
    /// Its plan.
    pub plan: MemoryPlan,
    /// Whether the plan fits the available memory.
    pub fits: bool,
    /// The expected expert-cache hit rate, in [0, 1].
    pub hit: f64,
}

/// Every preset, the smallest split holding the whole model (`everything`, from the engine's
/// `budget_extremes`), and 90 % of the available memory, planned for `ctx` positions.
pub fn candidates(
    sizes: &ModelSizes,
    everything: Budget,
    ctx: usize,
    avail: &Available,
) -> Result<Vec<Candidate>, PlanError> {
    let fits = |p: &MemoryPlan| p.check(sizes, avail).is_ok();
    let whole_or_none = |p: &MemoryPlan| f64::from(u8::from(holds_everything(p, sizes)));
    let mut cands = Vec::new();
    let mut add = |label: String, flag: String, plan: MemoryPlan, hit: f64| {
        let fits = fits(&plan);
        cands.push(Candidate {
            label,
            flag,
            fits,
            plan,
            hit,
        });
    };
    for p in Preset::ALL {
        let plan = make_plan(sizes, &PlanRequest::new(Budget::Preset(p), ctx as u64))?;
        let hit = hit_rate(p, &plan, sizes);
        add(format!("preset {p}"), format!("--preset {p}"), plan, hit);
    }
    if let Budget::Split { trunk, cache } = everything {
        // The smallest split that holds the whole model, rounded up to whole MB.
        let (t, c) = (gb_up(trunk), gb_up(cache));
        let budget = Budget::Split {
            trunk: (t * GB as f64) as u64,
            cache: (c * GB as f64) as u64,
        };
        if let Ok(plan) = make_plan(sizes, &PlanRequest::new(budget, ctx as u64)) {
            let hit = whole_or_none(&plan);
            let flag = format!("--trunk-gb {t} --cache-gb {c}");
            add("whole model".into(), flag, plan, hit);
        }
    }
    // 90 % of what is available, rounded down to 0.1 GB: room for the page cache and the OS.
    let gb = avail.bytes().map_or(0.0, |a| {
        ((a as f64 * 0.9 / GB as f64) * 10.0).floor() / 10.0
    });
    if gb > 0.0 {
        let budget = Budget::Total((gb * GB as f64) as u64);
        if let Ok(plan) = make_plan(sizes, &PlanRequest::new(budget, ctx as u64)) {
            let hit = whole_or_none(&plan);
            add(
                format!("--mem-gb {gb}"),
                format!("--mem-gb {gb}"),
                plan,
                hit,
            );
        }
    }
    Ok(cands)
}

/// The smallest fitting budget that already holds everything, else the largest fitting
/// preset, else any that fits.
pub fn pick<'a>(cands: &'a [Candidate], sizes: &ModelSizes) -> Option<&'a Candidate> {
    cands
        .iter()
        .filter(|c| c.fits && holds_everything(&c.plan, sizes))
        .min_by_key(|c| c.plan.total_bytes())
        .or_else(|| {
            cands
                .iter()
                .filter(|c| c.fits && c.label.starts_with("preset"))
                .max_by_key(|c| c.plan.total_bytes())
        })
        .or_else(|| cands.iter().find(|c| c.fits))
}

/// Bytes → GB rounded up to a whole MB (so the flag value plans at least as much).
fn gb_up(bytes: u64) -> f64 {
    (bytes as f64 / 1e6).ceil() / 1e3
}

/// Bytes a token reads under `plan` at expert hit rate `hit`: `(trunk, experts)`, the unpinned
/// trunk and the expected expert misses of `moe_layers` MoE layers (the module's formula).
pub fn bytes_per_token(
    plan: &MemoryPlan,
    hit: f64,
    sizes: &ModelSizes,
    moe_layers: f64,
) -> (f64, f64) {
    let trunk = plan.trunk.streamed_per_token as f64;
    let experts = moe_layers * f64::from(sizes.top_k) * (1.0 - hit) * sizes.expert_bytes as f64;
    (trunk, experts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values_round_up_to_whole_megabytes() {
        assert_eq!(gb_up(1_000_000_000), 1.0);
        assert_eq!(gb_up(1_000_000_001), 1.001);
        assert_eq!(gb_up(0), 0.0);
    }
}
