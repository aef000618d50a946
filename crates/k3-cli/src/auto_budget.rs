//! Safe by default (README "Memory budgets"): with no budget flag and no budget in the config
//! file (or with `--preset auto`), `run`, `chat` and `serve` plan against the memory this
//! machine, or its cgroup, leaves them, and say so in one stderr line:
//!
//! - the whole model (trunk and every expert, with the context's state and scratch) within
//!   90 % of that memory: it is mapped resident, as before (nothing to plan);
//! - otherwise: planned as `--mem-gb` of 90 % of it (the plan table follows), so a 1.56 TB
//!   checkpoint is never mapped whole by accident. `--resident` asks for the mapping anyway.
//!
//! `K3_MEM_AVAILABLE_GB` stands in for the machine's figure (to plan as if on a smaller
//! machine, and for tests).

use crate::CliError;
use k3_engine::{Budget, EngineOptions};
use std::path::Path;

/// Share of the available memory the automatic budget uses (the rest: OS, page cache, KV).
const SHARE: f64 = 0.9;

/// Environment variable overriding the available memory, GB.
pub const ENV_AVAILABLE: &str = "K3_MEM_AVAILABLE_GB";

/// Available bytes and where the figure comes from.
fn available() -> Result<Option<(u64, String)>, CliError> {
    if let Ok(v) = std::env::var(ENV_AVAILABLE) {
        return match v.trim().parse::<f64>() {
            Ok(gb) if gb.is_finite() && gb > 0.0 => {
                Ok(Some(((gb * 1e9) as u64, ENV_AVAILABLE.into())))
            }
            _ => Err(CliError::usage(format!(
                "${ENV_AVAILABLE} must be a positive number of GB, got {v:?}"
            ))),
        };
    }
    let a = k3_store::available_memory();
    Ok(a.bytes().map(|b| (b, a.source().to_string())))
}

/// Fills in `options.budget` when no budget was given (`resident` = `--resident`), and says
/// what was chosen on stderr unless `quiet`.
pub fn apply(
    dir: &Path,
    options: &mut EngineOptions,
    resident: bool,
    quiet: bool,
) -> Result<(), CliError> {
    let say = |line: String| {
        if !quiet {
            eprintln!("k3: {line}");
        }
    };
    // A missing model directory or config is the engine's to report, by name.
    if options.budget.is_some() || !dir.join("config.json").is_file() {
        return Ok(());
    }
    if resident {
        say("--resident: the whole model is mapped resident (no budget)".into());
        return Ok(());
    }
    // What holding everything costs: the whole trunk and every expert, plus the fixed costs
    // (embedding and head, KDA state, latent KV for the context, scratch).
    // Over MPI ranks: this rank's share (docs/DISTRIBUTED.md#memory-per-rank).
    let group = options
        .comm
        .as_ref()
        .map_or((0, 1), |c| (c.rank(), c.size()));
    let (_, everything) = k3_engine::planning::budget_extremes_rank(dir, group.0, group.1)?;
    let sessions = options.sessions.max(1);
    let (plan, _, _) =
        k3_engine::planning::forecast_rank(dir, everything, options.ctx, sessions, 0, group)?;
    let model = plan.total_bytes();
    let Some((avail, source)) = available()?.map(per_local_rank) else {
        say(format!(
            "no budget flag and the available memory is unknown: the whole model ({}) is mapped resident; pass --preset or --mem-gb to plan",
            gb(model)
        ));
        return Ok(());
    };
    let usable = (avail as f64 * SHARE) as u64;
    if model <= usable {
        say(format!(
            "budget auto (no budget flag): the whole model ({}) fits 90% of the {} available ({source}): mapped resident",
            gb(model),
            gb(avail)
        ));
        return Ok(());
    }
    say(format!(
        "budget auto (no budget flag): the model ({}) is larger than 90% of the {} available ({source}): planning as --mem-gb {} (plan below; --resident maps it whole anyway)",
        gb(model),
        gb(avail),
        flag_gb(usable)
    ));
    options.budget = Some(Budget::Total(usable));
    Ok(())
}

/// Ranks of this job on this host, from the launcher's environment (Open MPI, MPICH/Hydra).
const LOCAL_RANKS_ENV: [&str; 2] = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"];

/// The available memory divided among this host's ranks (they all plan against it).
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
