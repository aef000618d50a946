//! Flags that open the engine, shared by `k3 run`, `k3 chat` and `k3 serve`.

use crate::budget::BudgetArgs;
use crate::config_file::FileConfig;
use crate::CliError;
use clap::Args;
use k3_engine::EngineOptions;
use std::path::PathBuf;

#[derive(Args, Clone, Debug, Default)]
pub struct EngineArgs {
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Tokenizer directory (default: the model directory's tiktoken.model / tokenizer.json).
    #[arg(long)]
    pub tok: Option<PathBuf>,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Read trunk layers from a packed trunk (`k3 pack`) instead of the shards; needs a budget.
    #[arg(long)]
    pub trunk: Option<PathBuf>,
    /// Read with the page cache instead of O_DIRECT (streaming only).
    #[arg(long)]
    pub no_direct_io: bool,
}

impl EngineArgs {
    /// Engine options from these flags over the config file, reserving `ctx` positions.
    pub fn options(&self, file: &FileConfig, ctx: usize) -> Result<EngineOptions, CliError> {
        Ok(EngineOptions {
            threads: self.threads.or(file.threads),
            budget: self.budget.budget_or_file(file)?,
            ctx,
            direct_io: !self.no_direct_io,
            tokenizer_dir: self.tok.clone(),
            trunk_dir: self.trunk.clone(),
            ..EngineOptions::default()
        })
    }
}
