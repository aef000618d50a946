//! The local model store (docs/MODELS.md): `k3 pull` puts a model in
//! `$K3_MODELS/NAME` (default `$XDG_DATA_HOME/k3/models`, else `~/.local/share/k3/models`),
//! and every command that takes a model directory also takes a stored NAME
//! ([`resolve_model`]).

use crate::HubError;
use serde::{Deserialize, Serialize};
use std::path::{Component, Path, PathBuf};

/// What `k3 pull` records about a stored model, in `NAME/k3-model.json`.
pub const RECORD_FILE: &str = "k3-model.json";
/// Where `k3 pull` packs the trunk inside `NAME/` (a `--trunk` directory).
pub const TRUNK_SUBDIR: &str = "trunk";

/// The record of one pulled model.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct PullRecord {
    /// Hub repository it came from (`owner/name`).
    pub repo: String,
    /// Branch, tag or commit fetched.
    pub revision: String,
    /// Hub endpoint it came from.
    pub endpoint: String,
    /// When the pull finished (seconds since the Unix epoch).
    pub pulled_at: u64,
    /// Whether the trunk was packed into `NAME/trunk`.
    pub packed_trunk: bool,
}

/// The store's root directory: `$K3_MODELS`, else `$XDG_DATA_HOME/k3/models`, else
/// `~/.local/share/k3/models` (docs/MODELS.md#where-models-live).
pub fn models_root() -> Result<PathBuf, HubError> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(root) = var("K3_MODELS") {
        return Ok(root);
    }
    if let Some(data) = var("XDG_DATA_HOME") {
        return Ok(data.join("k3/models"));
    }
    var("HOME")
        .map(|h| h.join(".local/share/k3/models"))
        .ok_or_else(|| {
            HubError::Refused(
                "cannot place the model store: set K3_MODELS, XDG_DATA_HOME or HOME".into(),
            )
        })
}

/// Whether `name` can be a stored model's name: one plain path component.
pub fn is_store_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(Component::Normal(_)), None)
    ) && !name.contains('/')
}

/// The store name of a hub repository: its last path component (`owner/name` → `name`).
pub fn name_from_repo(repo: &str) -> Result<String, HubError> {
    let name = repo.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    if is_store_name(name) {
        Ok(name.to_string())
    } else {
        Err(HubError::Refused(format!(
            "cannot derive a model name from the repository {repo:?}: pass --name NAME"
        )))
    }
}

/// The directory a model argument means. An existing path wins; otherwise a stored NAME
/// (`k3 list`); otherwise, for a plain name, a refusal (exit 2) naming it, the stored names
/// and `k3 pull`. A missing path with a `/` is no name: it is returned as it is, for the
/// command's own refusal naming the file it lacks (docs/MODELS.md#names-stand-for-directories).
pub fn resolve_model(arg: &Path) -> Result<PathBuf, HubError> {
    let name = arg.to_str().filter(|n| is_store_name(n));
    let Some(name) = name.filter(|_| !arg.exists()) else {
        return Ok(arg.to_path_buf());
    };
    let root = models_root()?;
    let dir = root.join(name);
    if dir.is_dir() {
        return Ok(dir);
    }
    let names = stored_names(&root);
    let stored = if names.is_empty() {
        format!("the store ({}) holds no models", root.display())
    } else {
        format!("stored models in {}: {}", root.display(), names.join(", "))
    };
    Err(HubError::Refused(format!(
        "{}: no such model directory and no stored model of that name ({stored}): give a model directory, or fetch one with `k3 pull OWNER/REPO`",
        arg.display()
    )))
}

/// The names of the models in `root`, sorted (directories only; none when it is missing).
pub fn stored_names(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The pull record of a stored model (`None` when it has none: an unfinished pull, or a
/// directory put there by hand).
pub fn read_record(dir: &Path) -> Option<PullRecord> {
    let text = std::fs::read_to_string(dir.join(RECORD_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Writes `NAME/k3-model.json`.
pub fn write_record(dir: &Path, record: &PullRecord) -> Result<(), HubError> {
    let path = dir.join(RECORD_FILE);
    let text = serde_json::to_string_pretty(record)
        .map_err(|e| HubError::Failed(format!("{}: {e}", path.display())))?;
    std::fs::write(&path, text + "\n")
        .map_err(|e| HubError::Failed(format!("{}: {e}", path.display())))
}

/// Bytes of every file under `dir` (apparent sizes; symlinks not followed).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_repository_and_must_be_one_component() {
        assert_eq!(
            name_from_repo("moonshotai/Kimi-K3").unwrap_or_default(),
            "Kimi-K3"
        );
        assert_eq!(name_from_repo("tiny").unwrap_or_default(), "tiny");
        assert!(name_from_repo("org/..").is_err());
        assert!(name_from_repo("").is_err());
        assert!(is_store_name("tiny-k3"));
        assert!(!is_store_name("a/b"));
        assert!(!is_store_name(".."));
        assert!(!is_store_name("/abs"));
    }
}
