//! `k3 plan` (the memory forecast, reading no weights) and `k3 presets`.

use crate::budget::BudgetArgs;
use crate::CliError;
use clap::Args;
use k3_engine::planning::forecast;
use k3_engine::{Budget, Preset};
use std::path::PathBuf;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  k3 plan fixtures/tiny-k3 --mem-gb 0.005\n  k3 plan /models/kimi-k3 --preset desktop --ctx 8192\n  k3 plan /models/kimi-k3 --mem-gb 32 --sessions 8   # k3 serve --parallel 4"
)]
pub struct PlanArgs {
    /// Model directory.
    pub model_dir: PathBuf,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Context positions to reserve latent KV for.
    #[arg(short = 'c', long, visible_alias = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Sessions whose state to reserve: 1 for run/chat; `k3 serve` reserves `--parallel`
    /// plus 4 saved sessions (0 saved with `--no-reuse`).
    #[arg(long, default_value_t = 1)]
    pub sessions: usize,
}

/// Prints the plan table; exits 2 (after printing it) when it does not fit this machine.
pub fn plan(args: PlanArgs) -> Result<(), CliError> {
    let budget = args
        .budget
        .budget()?
        .unwrap_or(Budget::Preset(Preset::Laptop));
    if args.sessions == 0 {
        return Err(CliError::usage("--sessions must be at least 1"));
    }
    let (plan, available, fits) = forecast(&args.model_dir, budget, args.ctx, args.sessions)?;
    println!("{}", plan.table(Some(&available)).trim_end());
    fits.map_err(CliError::from)
}

/// Lists the presets.
pub fn presets() -> Result<(), CliError> {
    println!("{:<12} {:>9} {:>9}", "preset", "trunk GB", "cache GB");
    for p in Preset::ALL {
        let (t, c) = p.gb();
        println!("{:<12} {:>9} {:>9}", p.name(), t, c);
    }
    println!("\n--mem-gb TOTAL splits a total trunk-first; --trunk-gb X --cache-gb Y sets both.");
    Ok(())
}
