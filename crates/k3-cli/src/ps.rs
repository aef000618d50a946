//! `k3 ps` (docs/MODELS.md#k3-ps): what the running `k3 serve` processes hold, from their
//! records (`k3_server::registry`).

use crate::CliError;
use clap::Args;
use k3_plan::plan::fmt_bytes;
use k3_server::registry::{rss_bytes, running_servers};

#[derive(Args)]
#[command(after_help = "Example:\n  k3 ps")]
pub struct PsArgs {}

/// One line per running server on stdout: pid, port, model (stored NAME or path), RSS, plan.
pub fn ps(_args: PsArgs) -> Result<(), CliError> {
    let root = k3_hub::store::models_root()
        .ok()
        .and_then(|r| std::fs::canonicalize(r).ok());
    println!(
        "{:<8} {:<6} {:<24} {:>10} PLAN",
        "PID", "PORT", "MODEL", "RSS"
    );
    for r in running_servers() {
        let model = match (&root, r.model_dir.parent(), r.model_dir.file_name()) {
            (Some(root), Some(parent), Some(name)) if parent == root => {
                name.to_string_lossy().into_owned()
            }
            _ => r.model_dir.display().to_string(),
        };
        let rss = rss_bytes(r.pid).map_or_else(|| "?".to_string(), fmt_bytes);
        println!(
            "{:<8} {:<6} {:<24} {:>10} {}",
            r.pid, r.port, model, rss, r.plan
        );
    }
    Ok(())
}
