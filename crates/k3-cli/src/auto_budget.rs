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
use k3_engine::EngineOptions;
use std::path::Path;

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
/// what was chosen on stderr unless `quiet` (`k3_engine::auto_budget`).
pub fn apply(
    dir: &Path,
    options: &mut EngineOptions,
    resident: bool,
    quiet: bool,
) -> Result<(), CliError> {
    // The memory is read (and `$K3_MEM_AVAILABLE_GB` checked) only when there is a model to
    // size against it.
    let sized = options.budget.is_none() && !resident && dir.join("config.json").is_file();
    let available = match sized {
        true => available()?.map(per_local_rank),
        false => None,
    };
    if let Some(choice) = k3_engine::auto_budget::auto_budget(dir, options, resident, available)? {
        if !quiet {
            eprintln!("k3: {}", choice.why);
        }
        options.budget = choice.budget;
    }
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
