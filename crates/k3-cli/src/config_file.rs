//! `k3 config show|path`: the config file (`k3_engine::config_file`: where it is looked for,
//! its keys, their checks and precedence).

use crate::CliError;
use clap::{Args, Subcommand};
use k3_engine::config_file::{config_path, load_with_path, ENV_CONFIG};

impl From<k3_engine::config_file::ConfigFileError> for CliError {
    fn from(e: k3_engine::config_file::ConfigFileError) -> Self {
        CliError::usage(e.to_string())
    }
}

#[derive(Args)]
#[command(after_help = "Examples:\n  k3 config path\n  k3 config show")]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub action: ConfigAction,
}

#[derive(Subcommand)]
pub enum ConfigAction {
    /// Print the effective config and the file it came from.
    Show,
    /// Print where the config file is looked for.
    Path,
}

/// `k3 config show|path`.
pub fn config(args: ConfigArgs) -> Result<(), CliError> {
    match args.action {
        ConfigAction::Path => {
            match config_path() {
                Some((p, _)) => println!("{}", p.display()),
                None => {
                    return Err(CliError::usage(format!(
                        "no config location: set ${ENV_CONFIG}, $XDG_CONFIG_HOME or $HOME"
                    )))
                }
            }
            Ok(())
        }
        ConfigAction::Show => {
            let (cfg, path) = load_with_path()?;
            match &path {
                Some(p) => println!("# config file: {}", p.display()),
                None => match config_path() {
                    Some((p, _)) => println!(
                        "# no config file ({} does not exist): built-in defaults",
                        p.display()
                    ),
                    None => println!("# no config file: built-in defaults"),
                },
            }
            let text =
                toml::to_string(&cfg).map_err(|e| CliError::runtime(format!("config: {e}")))?;
            print!("{text}");
            let unset = cfg.unset_keys();
            if !unset.is_empty() {
                println!("# unset (built-in default or flag): {}", unset.join(", "));
            }
            Ok(())
        }
    }
}
