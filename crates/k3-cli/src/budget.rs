//! Memory-budget flags shared by `k3 run` and `k3 plan`.

use crate::CliError;
use clap::Args;
use k3_engine::{Budget, Preset};

pub use k3_engine::config_file::AUTO;

/// Bytes per GB as the presets count them (10^9).
const GB: f64 = 1e9;

#[derive(Args, Clone, Debug, Default)]
pub struct BudgetArgs {
    /// Named budget: laptop (3/1 GB trunk/cache), desktop (16/10), workstation (60/30),
    /// server (110/13), max (110/109), or auto (the default for run/chat/serve: plan against
    /// the memory this machine has). See `k3 presets`.
    #[arg(long, conflicts_with_all = ["trunk_gb", "cache_gb", "mem_gb"])]
    pub preset: Option<String>,
    /// Trunk budget in GB (pinned layers + streaming ring); needs --cache-gb.
    #[arg(long, requires = "cache_gb", conflicts_with = "mem_gb")]
    pub trunk_gb: Option<f64>,
    /// Expert-cache budget in GB; needs --trunk-gb.
    #[arg(long, requires = "trunk_gb", conflicts_with = "mem_gb")]
    pub cache_gb: Option<f64>,
    /// Total memory budget in GB, split trunk-first.
    #[arg(long)]
    pub mem_gb: Option<f64>,
}

fn gb(flag: &str, v: f64) -> Result<u64, CliError> {
    if !v.is_finite() || v <= 0.0 {
        return Err(CliError::usage(format!(
            "{flag} must be a positive number of GB, got {v}"
        )));
    }
    Ok((v * GB) as u64)
}

impl BudgetArgs {
    /// Whether `--preset auto` was given.
    pub fn is_auto(&self) -> bool {
        self.preset.as_deref() == Some(AUTO)
    }

    /// The budget the flags describe; `None` when no budget flag was given. `--preset auto`
    /// needs the model and the machine, which only run, chat and serve resolve
    /// ([`BudgetArgs::budget_or_file`] then `k3_engine::auto_budget`): refused here.
    pub fn budget(&self) -> Result<Option<Budget>, CliError> {
        if self.is_auto() {
            return Err(CliError::usage(
                "--preset auto is what run, chat and serve do without a budget flag; here give a named preset, --mem-gb or --trunk-gb/--cache-gb",
            ));
        }
        if let Some(name) = &self.preset {
            let p: Preset = name
                .parse()
                .map_err(|e: k3_plan::PlanError| CliError::usage(e.to_string()))?;
            return Ok(Some(Budget::Preset(p)));
        }
        if let Some(total) = self.mem_gb {
            return Ok(Some(Budget::Total(gb("--mem-gb", total)?)));
        }
        match (self.trunk_gb, self.cache_gb) {
            (Some(t), Some(c)) => Ok(Some(Budget::Split {
                trunk: gb("--trunk-gb", t)?,
                cache: gb("--cache-gb", c)?,
            })),
            _ => Ok(None),
        }
    }
}

impl BudgetArgs {
    /// The flags' budget; without any budget flag, the config file's budget keys (as a group).
    pub fn budget_or_file(
        &self,
        file: &k3_engine::config_file::FileConfig,
    ) -> Result<Option<Budget>, CliError> {
        if self.is_auto() {
            return Ok(None);
        }
        if let Some(b) = self.budget()? {
            return Ok(Some(b));
        }
        let from_file = BudgetArgs {
            preset: file.preset.clone(),
            trunk_gb: file.trunk_gb,
            cache_gb: file.cache_gb,
            mem_gb: file.mem_gb,
        };
        if from_file.is_auto() {
            return Ok(None);
        }
        if from_file.trunk_gb.is_some() != from_file.cache_gb.is_some() {
            return Err(CliError::usage(
                "config file: trunk_gb and cache_gb must be set together",
            ));
        }
        from_file
            .budget()
            .map_err(|e| CliError::usage(format!("config file: {}", e.message)))
    }
}
