//! The conversation rules and the JSONL history (docs/MODEL.md#chat-template).

use super::{check_fields, ChatMessage};
use crate::EngineError;
use std::path::Path;

/// Checks the history rules: an optional system message first, then a user message; a user
/// message is followed by an assistant message; an assistant message without tool calls by
/// a user message; one with tool calls by its tool results (role `tool`), which are followed
/// by more tool results, an assistant or a user message. Reasoning and calls only on
/// assistant messages, a call id only on tool results.
pub fn validate_history(messages: &[ChatMessage]) -> Result<(), EngineError> {
    for (i, m) in messages.iter().enumerate() {
        check_fields(m).map_err(|e| EngineError::Invalid(format!("message {}: {e}", i + 1)))?;
    }
    let start = usize::from(messages.first().is_some_and(|m| m.role == "system"));
    let mut prev: Option<&ChatMessage> = None;
    for (i, m) in messages.iter().enumerate().skip(start) {
        let allowed: &[&str] = match prev {
            None => &["user"],
            Some(p) if p.role == "user" => &["assistant"],
            Some(p) if p.role == "assistant" && p.tool_calls.is_empty() => &["user"],
            Some(p) if p.role == "assistant" => &["tool"],
            Some(_) => &["tool", "assistant", "user"],
        };
        if !allowed.contains(&m.role.as_str()) {
            let after = match prev {
                None => "the start (after an optional system message)".to_string(),
                Some(p) if p.role == "assistant" && !p.tool_calls.is_empty() => {
                    "an assistant message with tool calls".to_string()
                }
                Some(p) => format!("a {} message", p.role),
            };
            return Err(EngineError::Invalid(format!(
                "message {}: role `{}` after {after}, expected `{}` (system first, then user and assistant alternating; tool results follow an assistant message with tool calls)",
                i + 1,
                m.role,
                allowed.join("` or `")
            )));
        }
        prev = Some(m);
    }
    Ok(())
}

/// Parses a JSONL history (one `{"role","content","reasoning_content"?,"tool_calls"?,
/// "tool_call_id"?,"name"?}` object per line; blank lines skipped; unknown keys refused) and
/// validates it.
pub fn parse_history(text: &str, name: &str) -> Result<Vec<ChatMessage>, EngineError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let m: ChatMessage = serde_json::from_str(line).map_err(|e| {
            EngineError::Invalid(format!("{name}:{}: not a chat message: {e}", n + 1))
        })?;
        out.push(m);
    }
    validate_history(&out).map_err(|e| EngineError::Invalid(format!("{name}: {e}")))?;
    Ok(out)
}

/// The JSONL text of `messages`, one object per line.
pub fn history_jsonl(messages: &[ChatMessage]) -> Result<String, EngineError> {
    let mut s = String::new();
    for m in messages {
        s.push_str(
            &serde_json::to_string(m)
                .map_err(|e| EngineError::Invalid(format!("cannot encode a message: {e}")))?,
        );
        s.push('\n');
    }
    Ok(s)
}

/// Reads and validates a JSONL history file.
pub fn load_history(path: &Path) -> Result<Vec<ChatMessage>, EngineError> {
    let text = std::fs::read_to_string(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_history(&text, &path.display().to_string())
}

/// Writes `messages` as JSONL, atomically.
pub fn save_history(path: &Path, messages: &[ChatMessage]) -> Result<(), EngineError> {
    crate::write_atomic(path, history_jsonl(messages)?.as_bytes())
}
