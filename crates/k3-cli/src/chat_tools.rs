//! `k3 chat --tools FILE`: `--tool-choice` and `/tools` (README "Chat"); the tools file, the
//! pending calls and the closing of a cut reply are `k3_engine::chat_template::tool_turns`.

use crate::CliError;
use k3_engine::chat_template::ToolSpec;
use k3_engine::{Constraint, ConstraintSpec, ReplyStart, Tokenizer};
use serde_json::Value;

/// The constraint `--tool-choice` asks for: `None` for `auto` (or no flag); a compiled
/// constraint (kept and cloned for each forced reply) for `required` or a declared NAME.
pub fn tool_choice(
    choice: Option<&str>,
    tools: &[ToolSpec],
    tok: &Tokenizer,
    start: ReplyStart,
) -> Result<Option<Constraint>, CliError> {
    let named = match choice {
        None | Some("auto") => return Ok(None),
        Some("required") => None,
        Some(name) if tools.iter().any(|t| t.name == name) => Some(name.to_string()),
        Some(name) => {
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            return Err(CliError::usage(format!(
                "--tool-choice {name}: no such tool in --tools (declared: {}); use auto, required or one of those names",
                names.join(", ")
            )));
        }
    };
    let spec = ConstraintSpec::ToolCalls {
        tools: tools
            .iter()
            .map(|t| (t.name.clone(), t.parameters.clone()))
            .collect(),
        named,
        parallel: false,
    };
    Constraint::new(tok, &spec, start)
        .map(Some)
        .map_err(|e| CliError::usage(format!("--tool-choice: {e}")))
}

/// `/tools`: one line per tool, its parameters' names and the required ones starred.
pub fn list(tools: &[ToolSpec]) -> String {
    if tools.is_empty() {
        return "(no tools declared: start the chat with --tools FILE)".into();
    }
    let mut out = Vec::new();
    for t in tools {
        let required: Vec<&str> = t.parameters["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let params: Vec<String> = t.parameters["properties"]
            .as_object()
            .map(|p| {
                p.keys()
                    .map(|k| match required.contains(&k.as_str()) {
                        true => format!("{k}*"),
                        false => k.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let about = t.description.as_deref().unwrap_or("");
        out.push(format!("{}({})  {about}", t.name, params.join(", ")));
    }
    out.join("\n")
}
