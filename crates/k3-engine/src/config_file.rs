//! The k3 config file: defaults for the model directory, the memory budget and sampling that
//! `k3 run`, `k3 chat` and `k3 serve` read (and any program that wants the user's defaults).
//!
//! Location, first match wins: `$K3_CONFIG` (a file path; it must exist), else
//! `$XDG_CONFIG_HOME/k3/config.toml`, else `~/.config/k3/config.toml`. A missing default file
//! is not an error (built-in defaults apply); an unknown key, a wrong type or an out-of-range
//! value is (exit 2, naming the key and the file).
//!
//! ```toml
//! model = "/models/kimi-k3"
//! preset = "desktop"        # or mem_gb = 48, or trunk_gb = 30 + cache_gb = 16
//! threads = 16
//! temp = 0.7
//! top_k = 40
//! top_p = 0.95
//! min_p = 0.05
//! seed = 42
//! repeat_penalty = 1.1
//! presence_penalty = 0.5
//! frequency_penalty = 0.2
//! ctx = 8192               # -c/--ctx of run, chat and serve
//! n = 256                  # -n of run and chat
//! port = 8080              # --port of serve
//! ```
//!
//! Precedence (for `k3 run` and friends when they merge this in; this module only reads): a command-line flag always
//! wins over the file. The budget keys act as one group: any budget flag on the command line
//! (`--preset`, `--mem-gb`, `--trunk-gb`/`--cache-gb`) replaces all of `preset`, `mem_gb`,
//! `trunk_gb` and `cache_gb` from the file, so a file preset never conflicts with a flag
//! `--mem-gb`. Every other key is overridden one by one by its own flag (`--threads`,
//! `--temp`, …); a MODEL_DIR (positional or `-m`) overrides `model`, which `k3 run`, `k3 chat`
//! and `k3 serve` all use when no model directory is given.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A config file that cannot be used (exit 2 in `k3`); the message names the file and, for a
/// bad value, the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// `$K3_CONFIG` names a file that does not exist.
    #[error("{}: no such config file (named by ${ENV_CONFIG})", path.display())]
    Missing {
        /// The file `$K3_CONFIG` names.
        path: PathBuf,
    },
    /// The file cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The config file.
        path: PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// The file is not TOML of the config's keys and types.
    #[error("{}: {}", path.display(), source.to_string().trim_end())]
    Parse {
        /// The config file.
        path: PathBuf,
        /// The TOML parser's error (line, column, key).
        source: toml::de::Error,
    },
    /// A value out of range, or keys that do not go together.
    #[error("{}: key `{key}`: {why}", path.display())]
    Key {
        /// The config file.
        path: PathBuf,
        /// The key at fault.
        key: &'static str,
        /// What is wrong and what is allowed.
        why: String,
    },
}

/// The preset name that asks for the automatic budget ([`crate::auto_budget`]).
pub const AUTO: &str = "auto";

/// Environment variable naming the config file explicitly.
pub const ENV_CONFIG: &str = "K3_CONFIG";

/// Values from the config file; `None` where the file does not set the key.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Default model directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// Named budget (`laptop`, `desktop`, `workstation`, `server`, `max`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// Total memory budget, GB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_gb: Option<f64>,
    /// Trunk budget, GB (with `cache_gb`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trunk_gb: Option<f64>,
    /// Expert-cache budget, GB (with `trunk_gb`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_gb: Option<f64>,
    /// Worker threads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// Sampling temperature (0 = greedy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temp: Option<f64>,
    /// Keep the k most likely tokens (0 = off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass, in (0, 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Drop tokens below `min_p` × the top probability, in [0, 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    /// Sampling seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Repetition penalty (1 = off), > 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat_penalty: Option<f64>,
    /// Presence penalty (0 = off), in [-2, 2].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    /// Frequency penalty (0 = off), in [-2, 2].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// Context positions (`-c/--ctx`) for run, chat and serve.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctx: Option<usize>,
    /// Tokens to generate (`-n`) for run and chat.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n: Option<usize>,
    /// Port of `k3 serve` (`--port`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

impl FileConfig {
    /// Range and combination checks; the message names the key and the file.
    fn validate(&self, path: &Path) -> Result<(), ConfigFileError> {
        let bad = |key: &'static str, why: String| {
            Err(ConfigFileError::Key {
                path: path.to_path_buf(),
                key,
                why,
            })
        };
        if let Some(p) = &self.preset {
            if p != AUTO && p.parse::<crate::Preset>().is_err() {
                return bad(
                    "preset",
                    format!(
                        "unknown preset {p:?} (auto, laptop, desktop, workstation, server, max)"
                    ),
                );
            }
        }
        for (key, v) in [
            ("mem_gb", self.mem_gb),
            ("trunk_gb", self.trunk_gb),
            ("cache_gb", self.cache_gb),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return bad(key, format!("must be a positive number of GB, got {v}"));
                }
            }
        }
        if self.trunk_gb.is_some() != self.cache_gb.is_some() {
            let key = if self.trunk_gb.is_some() {
                "trunk_gb"
            } else {
                "cache_gb"
            };
            return bad(key, "trunk_gb and cache_gb go together".into());
        }
        let budgets = [
            self.preset.is_some(),
            self.mem_gb.is_some(),
            self.trunk_gb.is_some(),
        ];
        if budgets.iter().filter(|b| **b).count() > 1 {
            return bad(
                "preset",
                "set only one of preset, mem_gb, or trunk_gb + cache_gb".into(),
            );
        }
        if self.threads == Some(0) {
            return bad("threads", "must be at least 1".into());
        }
        if self.ctx == Some(0) {
            return bad("ctx", "must be at least 1".into());
        }
        if let Some(t) = self.temp.filter(|t| !(t.is_finite() && *t >= 0.0)) {
            return bad("temp", format!("must be >= 0, got {t}"));
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return bad("top_p", format!("must be in (0, 1], got {p}"));
        }
        if let Some(p) = self.min_p.filter(|p| !(*p >= 0.0 && *p <= 1.0)) {
            return bad("min_p", format!("must be in [0, 1], got {p}"));
        }
        if let Some(r) = self.repeat_penalty.filter(|r| !(r.is_finite() && *r > 0.0)) {
            return bad("repeat_penalty", format!("must be > 0, got {r}"));
        }
        for (key, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && (-2.0..=2.0).contains(v))) {
                return bad(key, format!("must be in [-2, 2], got {v}"));
            }
        }
        Ok(())
    }
}

/// Where the config file is looked for (it may not exist), and whether `$K3_CONFIG` named it.
pub fn config_path() -> Option<(PathBuf, bool)> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = env(ENV_CONFIG) {
        return Some((p, true));
    }
    if let Some(x) = env("XDG_CONFIG_HOME").filter(|p| p.is_absolute()) {
        return Some((x.join("k3/config.toml"), false));
    }
    env("HOME").map(|h| (h.join(".config/k3/config.toml"), false))
}

/// The config file's values and its path; defaults and `None` when there is no file.
pub fn load_with_path() -> Result<(FileConfig, Option<PathBuf>), ConfigFileError> {
    let Some((path, explicit)) = config_path() else {
        return Ok((FileConfig::default(), None));
    };
    if !path.is_file() {
        if explicit {
            return Err(ConfigFileError::Missing { path });
        }
        return Ok((FileConfig::default(), None));
    }
    let cfg = parse_file(&path)?;
    Ok((cfg, Some(path)))
}

/// The config file's values (all `None` when there is no file), read by `k3 run`, `k3 chat`
/// and `k3 serve` (flags merged over it, see the module doc).
pub fn load() -> Result<FileConfig, ConfigFileError> {
    load_with_path().map(|(c, _)| c)
}

/// Reads and checks one config file.
pub fn parse_file(path: &Path) -> Result<FileConfig, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let cfg: FileConfig = toml::from_str(&text).map_err(|source| ConfigFileError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    cfg.validate(path)?;
    Ok(cfg)
}

impl FileConfig {
    /// Names of the keys the file leaves unset.
    pub fn unset_keys(&self) -> Vec<&'static str> {
        let c = self;
        let set = [
            ("model", c.model.is_some()),
            ("preset", c.preset.is_some()),
            ("mem_gb", c.mem_gb.is_some()),
            ("trunk_gb", c.trunk_gb.is_some()),
            ("cache_gb", c.cache_gb.is_some()),
            ("threads", c.threads.is_some()),
            ("temp", c.temp.is_some()),
            ("top_k", c.top_k.is_some()),
            ("top_p", c.top_p.is_some()),
            ("min_p", c.min_p.is_some()),
            ("seed", c.seed.is_some()),
            ("repeat_penalty", c.repeat_penalty.is_some()),
            ("presence_penalty", c.presence_penalty.is_some()),
            ("frequency_penalty", c.frequency_penalty.is_some()),
            ("ctx", c.ctx.is_some()),
            ("n", c.n.is_some()),
            ("port", c.port.is_some()),
        ];
        set.iter().filter(|(_, s)| !s).map(|(k, _)| *k).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FileConfig, String> {
        let dir = std::env::temp_dir().join(format!(
            "k3-config-unit-{}-{}",
            std::process::id(),
            text.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("config.toml");
        std::fs::write(&p, text).unwrap();
        let r = parse_file(&p).map_err(|e| e.to_string());
        std::fs::remove_dir_all(&dir).unwrap();
        r
    }

    #[test]
    fn parses_every_key() {
        let c = parse("model = \"/m\"\nmem_gb = 48\nthreads = 8\ntemp = 0.7\ntop_k = 40\ntop_p = 0.9\nmin_p = 0.05\nseed = 1\nrepeat_penalty = 1.1\npresence_penalty = 0.5\nfrequency_penalty = -0.25\nctx = 8192\nn = 64\nport = 9000\n").unwrap();
        assert_eq!((c.ctx, c.n, c.port), (Some(8192), Some(64), Some(9000)));
        assert_eq!(
            (c.presence_penalty, c.frequency_penalty),
            (Some(0.5), Some(-0.25))
        );
        assert_eq!(c.model.as_deref(), Some(Path::new("/m")));
        assert_eq!(c.mem_gb, Some(48.0));
        assert_eq!((c.threads, c.top_k, c.seed), (Some(8), Some(40), Some(1)));
    }

    #[test]
    fn preset_auto_is_a_budget_key_value() {
        assert_eq!(
            parse("preset = \"auto\"\n").unwrap().preset.as_deref(),
            Some("auto")
        );
    }

    #[test]
    fn rejects_bad_values_naming_the_key() {
        for (text, key) in [
            ("preset = \"huge\"", "preset"),
            ("top_p = 1.5", "top_p"),
            ("trunk_gb = 3", "trunk_gb"),
            ("preset = \"laptop\"\nmem_gb = 4", "preset"),
            ("threads = 0", "threads"),
            ("ctx = 0", "ctx"),
            ("port = 70000", "port"),
            ("temp = -1", "temp"),
            ("presence_penalty = 2.5", "presence_penalty"),
            ("frequency_penalty = -3", "frequency_penalty"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(key) && e.contains("config.toml"), "{text}: {e}");
        }
    }
}
