//! Safe by default: with no budget, plan against the memory the machine leaves (README
//! "Memory budgets"). The model is mapped resident when it fits 90 % of that memory whole
//! (trunk, every expert, the context's state and scratch); otherwise it is planned as a total
//! budget of 90 % of it, so a 1.56 TB checkpoint is never mapped whole by accident.
//!
//! `K3_MEM_AVAILABLE_GB` stands in for the machine's figure (to plan as if on a smaller
//! machine, and for tests); the ranks of an MPI job on one host share it.

use crate::{Budget, EngineError, EngineOptions};
use std::path::Path;

/// Share of the available memory the automatic budget uses (the rest: OS, page cache, KV).
pub const SHARE: f64 = 0.9;

/// What the automatic budget chose, and the line that says why.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoChoice {
    /// The budget to plan with; `None`: map the model resident.
    pub budget: Option<Budget>,
    /// One line for the user: the model's size, the memory, the choice.
    pub why: String,
}

/// The automatic budget for `dir` under `options`; `None` when `options` already has a budget
/// or there is no `config.json` to size (the engine reports that by name when it opens).
/// `resident` is the user's request to map everything anyway; `available` is the memory this
/// process may use and where the figure comes from (`None`: unknown).
pub fn auto_budget(
    dir: &Path,
    options: &EngineOptions,
    resident: bool,
    available: Option<(u64, String)>,
) -> Result<Option<AutoChoice>, EngineError> {
    if options.budget.is_some() || !dir.join("config.json").is_file() {
        return Ok(None);
    }
    let resident_because = |why: String| Ok(Some(AutoChoice { budget: None, why }));
    if resident {
        return resident_because(
            "--resident: the whole model is mapped resident (no budget)".into(),
        );
    }
    // What holding everything costs: the whole trunk and every expert, plus the fixed costs
    // (embedding and head, KDA state, latent KV for the context, scratch). Over MPI ranks:
    // this rank's share (docs/DISTRIBUTED.md#memory-per-rank).
    let group = options
        .comm
        .as_ref()
        .map_or((0, 1), |c| (c.rank(), c.size()));
    let (_, everything) = crate::planning::budget_extremes_rank(dir, group.0, group.1)?;
    let sessions = options.sessions.max(1);
    let (plan, _, _) =
        crate::planning::forecast_rank(dir, everything, options.ctx, sessions, 0, group)?;
    let model = plan.total_bytes();
    let Some((avail, source)) = available else {
        return resident_because(format!(
            "no budget flag and the available memory is unknown: the whole model ({}) is mapped resident; pass --preset or --mem-gb to plan",
            gb(model)
        ));
    };
    let usable = (avail as f64 * SHARE) as u64;
    if model <= usable {
        return resident_because(format!(
            "budget auto (no budget flag): the whole model ({}) fits 90% of the {} available ({source}): mapped resident",
            gb(model),
            gb(avail)
        ));
    }
    Ok(Some(AutoChoice {
        budget: Some(Budget::Total(usable)),
        why: format!(
            "budget auto (no budget flag): the model ({}) is larger than 90% of the {} available ({source}): planning as --mem-gb {} (plan below; --resident maps it whole anyway)",
            gb(model),
            gb(avail),
            flag_gb(usable)
        ),
    }))
}

/// Environment variable overriding the available memory, GB.
pub const ENV_AVAILABLE: &str = "K3_MEM_AVAILABLE_GB";

/// Ranks of this job on this host, from the launcher's environment (Open MPI, MPICH/Hydra).
const LOCAL_RANKS_ENV: [&str; 2] = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"];

/// The automatic budget for `dir` under `options` against the memory this process may use
/// ([`available_to_this_rank`], read only when there is a model to size against it); `None`
/// when `options` already has a budget or there is nothing to size (as [`auto_budget`]).
pub fn choose(
    dir: &Path,
    options: &EngineOptions,
    resident: bool,
) -> Result<Option<AutoChoice>, EngineError> {
    let sized = options.budget.is_none() && !resident && dir.join("config.json").is_file();
    let available = match sized {
        true => available_to_this_rank()?,
        false => None,
    };
    auto_budget(dir, options, resident, available)
}

/// The memory this process may plan against and where the figure comes from:
/// `$K3_MEM_AVAILABLE_GB` when set, else the machine's (MemAvailable, capped by the cgroup),
/// divided among this host's ranks of an MPI job (they all plan against it). `None`: unknown.
pub fn available_to_this_rank() -> Result<Option<(u64, String)>, EngineError> {
    if let Ok(v) = std::env::var(ENV_AVAILABLE) {
        return match v.trim().parse::<f64>() {
            Ok(gb) if gb.is_finite() && gb > 0.0 => {
                Ok(Some(((gb * 1e9) as u64, ENV_AVAILABLE.into())))
            }
            _ => Err(EngineError::Invalid(format!(
                "${ENV_AVAILABLE} must be a positive number of GB, got {v:?}"
            ))),
        };
    }
    let a = k3_store::available_memory();
    Ok(a.bytes()
        .map(|b| per_local_rank((b, a.source().to_string()))))
}

/// The available memory divided among this host's ranks.
fn per_local_rank((bytes, source): (u64, String)) -> (u64, String) {
    let local = LOCAL_RANKS_ENV
        .iter()
        .find_map(|k| std::env::var(k).ok()?.trim().parse::<u64>().ok())
        .filter(|&n| n > 1);
    match local {
        Some(n) => (
            bytes / n,
            format!("{source}, shared by {n} ranks on this host"),
        ),
        None => (bytes, source),
    }
}

/// Bytes as `1.23 GB` (or MB below a GB).
fn gb(bytes: u64) -> String {
    match bytes >= 1_000_000_000 {
        true => format!("{:.2} GB", bytes as f64 / 1e9),
        false => format!("{:.2} MB", bytes as f64 / 1e6),
    }
}

/// Bytes as a `--mem-gb` value: GB to four decimals, trailing zeros dropped.
fn flag_gb(bytes: u64) -> String {
    let text = format!("{:.4}", bytes as f64 / 1e9);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_budget_flag_value_keeps_four_decimals_without_trailing_zeros() {
        assert_eq!(super::flag_gb(7_200_000_000), "7.2");
        assert_eq!(super::flag_gb(12_345_678), "0.0123");
        assert_eq!(super::gb(2_500_000_000), "2.50 GB");
        assert_eq!(super::gb(2_500_000), "2.50 MB");
    }
}
