//! Context honesty (README "Context"): the model's trained range is `max_position_embeddings`
//! in its `config.json` (top level or under `text_config`). A run, chat or server whose
//! positions would pass it is refused up front (exit 2, naming both numbers and `-c`) unless
//! `-c/--ctx` explicitly asks for more, which warns once. A config without the key sets no
//! limit (the tiny fixtures have none).

use crate::CliError;
use std::path::Path;

/// Default context of `chat` and `serve` (and of a run that loads a session).
pub const DEFAULT_CTX: usize = 4096;

/// `max_position_embeddings` from `dir/config.json`; `None` when absent or unreadable (the
/// engine reports an unreadable config itself).
pub fn trained_context(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let key = "max_position_embeddings";
    v.get(key)
        .or_else(|| v.get("text_config").and_then(|t| t.get(key)))
        .and_then(serde_json::Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n > 0)
}

/// The context when `-c` (or the config file's `ctx`) is not given: `DEFAULT_CTX`, or the
/// trained range when that is smaller.
pub fn default_ctx(trained: Option<usize>) -> usize {
    trained.map_or(DEFAULT_CTX, |t| t.min(DEFAULT_CTX))
}

/// Refuses `need` positions past the trained range when `-c` was not given explicitly; with
/// an explicit `-c` past it, warns once. `what` says what needs the positions.
pub fn check_trained(
    dir: &Path,
    trained: Option<usize>,
    need: usize,
    explicit_ctx: Option<usize>,
    what: &str,
) -> Result<(), CliError> {
    let Some(trained) = trained else {
        return Ok(());
    };
    match explicit_ctx {
        Some(ctx) if ctx > trained => {
            eprintln!(
                "k3: warning: -c/--ctx {ctx} is past the model's trained context (max_position_embeddings {trained} in {}): positions past {trained} were never trained",
                dir.join("config.json").display()
            );
            Ok(())
        }
        Some(_) => Ok(()),
        None if need > trained => Err(CliError::usage(format!(
            "{what} need {need} positions, past the model's trained context of {trained} (max_position_embeddings in {}): lower -n, or pass -c/--ctx {need} to run past it anyway",
            dir.join("config.json").display()
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_unless_asked_for() {
        let d = Path::new("/m");
        let e =
            check_trained(d, Some(16), 20, None, "the prompt (4 tokens) and -n 16").unwrap_err();
        assert_eq!(e.code, 2);
        assert!(
            e.message.contains("need 20 positions")
                && e.message.contains("trained context of 16")
                && e.message.contains("-c/--ctx 20"),
            "{}",
            e.message
        );
        assert!(check_trained(d, Some(16), 20, Some(32), "x").is_ok());
        assert!(check_trained(d, Some(16), 16, None, "x").is_ok());
        assert!(check_trained(d, None, 1 << 20, None, "x").is_ok());
        assert_eq!(default_ctx(Some(16)), 16);
        assert_eq!(default_ctx(None), DEFAULT_CTX);
    }
}
