//! The tool turns of a chat program (README "Chat", docs/MODEL.md#chat-template): the tools
//! file a program declares its tools in, the calls of the last reply still waiting for a
//! result, and the ids that close a reply cut short inside its tools channel. Calls are
//! parsed and shown by the caller, never executed here.

use super::{ChatMessage, Template, Thinking, ToolCall, ToolSpec};
use k3_tokenizer::Tokenizer;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// A tools file that cannot be used; the message names the file and the entry (counted from
/// 1) and says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ToolsFileError {
    /// The file cannot be read.
    #[error("{}: cannot read the tools file: {source}", path.display())]
    Read {
        /// The tools file.
        path: PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("{}:{}:{}: not JSON: {source}", path.display(), source.line(), source.column())]
    NotJson {
        /// The tools file.
        path: PathBuf,
        /// The parser's error, with its line and column.
        source: serde_json::Error,
    },
    /// The JSON is not an array.
    #[error("{}: the tools file must hold a JSON array of tools, e.g. [{{\"type\":\"function\",\"function\":{{\"name\":\"get_weather\",\"parameters\":{{...}}}}}}]", path.display())]
    NotArray {
        /// The tools file.
        path: PathBuf,
    },
    /// One entry is not a tool.
    #[error("{}: tool {index}: {why}", path.display())]
    Entry {
        /// The tools file.
        path: PathBuf,
        /// The entry, counted from 1.
        index: usize,
        /// What is wrong with it.
        why: String,
    },
    /// Two entries declare the same name.
    #[error("{}: tool {index}: the name `{name}` is declared twice: tool names must be unique", path.display())]
    Duplicate {
        /// The tools file.
        path: PathBuf,
        /// The second entry with the name, counted from 1.
        index: usize,
        /// The name.
        name: String,
    },
    /// The array is empty.
    #[error("{}: the tools array is empty: declare at least one tool or drop --tools", path.display())]
    Empty {
        /// The tools file.
        path: PathBuf,
    },
}

/// The tools in `path`: a JSON array of OpenAI tools or bare function objects.
pub fn load_tools(path: &Path) -> Result<Vec<ToolSpec>, ToolsFileError> {
    let path_buf = || path.to_path_buf();
    let text = std::fs::read_to_string(path).map_err(|source| ToolsFileError::Read {
        path: path_buf(),
        source,
    })?;
    let value: Value = serde_json::from_str(&text).map_err(|source| ToolsFileError::NotJson {
        path: path_buf(),
        source,
    })?;
    let Value::Array(entries) = value else {
        return Err(ToolsFileError::NotArray { path: path_buf() });
    };
    let mut tools: Vec<ToolSpec> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let tool = tool_entry(entry).map_err(|why| ToolsFileError::Entry {
            path: path_buf(),
            index: i + 1,
            why,
        })?;
        if tools.iter().any(|t| t.name == tool.name) {
            return Err(ToolsFileError::Duplicate {
                path: path_buf(),
                index: i + 1,
                name: tool.name,
            });
        }
        tools.push(tool);
    }
    if tools.is_empty() {
        return Err(ToolsFileError::Empty { path: path_buf() });
    }
    Ok(tools)
}

/// One entry: `{"type":"function","function":{…}}` or the bare function object.
fn tool_entry(entry: &Value) -> Result<ToolSpec, String> {
    let Value::Object(map) = entry else {
        return Err(
            "not a JSON object: give {\"type\":\"function\",\"function\":{...}} or {\"name\":...}"
                .into(),
        );
    };
    let function = match map.get("type") {
        None => map,
        Some(Value::String(t)) if t == "function" => {
            if let Some(key) = map.keys().find(|k| *k != "type" && *k != "function") {
                return Err(format!("unknown key `{key}` beside `type` and `function`"));
            }
            match map.get("function") {
                Some(Value::Object(f)) => f,
                _ => return Err("`type` is \"function\" but there is no `function` object".into()),
            }
        }
        Some(other) => {
            return Err(format!(
                "`type` is {other}: only \"function\" tools are supported"
            ))
        }
    };
    function_object(function)
}

/// `{name, description?, parameters?, strict?}`.
fn function_object(f: &Map<String, Value>) -> Result<ToolSpec, String> {
    if let Some(key) = f
        .keys()
        .find(|k| !matches!(k.as_str(), "name" | "description" | "parameters" | "strict"))
    {
        return Err(format!(
            "unknown key `{key}`: a function has name, description and parameters"
        ));
    }
    let name = match f.get("name") {
        Some(Value::String(n)) if valid_name(n) => n.clone(),
        Some(Value::String(n)) => {
            return Err(format!(
                "the name `{n}` is not a function name: use letters, digits, `_`, `-` or `.`"
            ))
        }
        _ => return Err("no `name` string: every tool needs a name".into()),
    };
    let description = match f.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => return Err(format!("tool `{name}`: `description` must be a string")),
    };
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => Value::Null,
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(format!(
                "tool `{name}`: `parameters` must be a JSON Schema object"
            ))
        }
    };
    Ok(ToolSpec {
        name,
        description,
        parameters,
    })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The calls of the last assistant message that no tool message answers yet, with their
/// position (from 0) among that message's calls.
pub fn pending_calls(messages: &[ChatMessage]) -> Vec<(usize, &ToolCall)> {
    let Some(at) = messages.iter().rposition(|m| m.role == "assistant") else {
        return Vec::new();
    };
    let answered = messages[at + 1..]
        .iter()
        .take_while(|m| m.role == "tool")
        .count();
    messages[at]
        .tool_calls
        .iter()
        .enumerate()
        .skip(answered)
        .collect()
}

/// The ids that close a reply cut short after its response channel closed: the markers
/// still open (`tools`, `call`, `argument`) closed innermost first, then `close(message)`
/// and `<|end_of_msg|>`. A marker cut in its middle is ended with `<|sep|>` first (and then
/// closed like the others when it opened one). `generated` is the reply's ids after its
/// `close(response)`.
pub fn after_response_tail(tpl: &Template<'_>, tok: &Tokenizer, generated: &[u32]) -> Vec<u32> {
    let [open, close, sep] = tpl.control_ids();
    let mut stack: Vec<String> = Vec::new();
    let mut tail = Vec::new();
    let mut marker: Option<(bool, Vec<u32>)> = None;
    let end_marker = |stack: &mut Vec<String>, opens: bool, text: &[u32]| {
        let tag = tok.decode_lossy(text).unwrap_or_default();
        let tag = tag.split(' ').next().unwrap_or_default().to_string();
        match opens {
            true => stack.push(tag),
            false if stack.last() == Some(&tag) => {
                stack.pop();
            }
            false => {}
        }
    };
    for &id in generated {
        match marker.as_mut() {
            Some((opens, text)) if id == sep => {
                end_marker(&mut stack, *opens, text);
                marker = None;
            }
            Some((_, text)) => text.push(id),
            None if id == open || id == close => marker = Some((id == open, Vec::new())),
            None => {}
        }
    }
    if let Some((opens, text)) = marker {
        tail.push(sep);
        end_marker(&mut stack, opens, &text);
    }
    for tag in stack.iter().rev() {
        tail.extend(tpl.close_tag(tag));
    }
    tail.extend(tpl.message_close());
    tail.push(tpl.end_of_msg());
    tail
}

/// How many ids at the end of `ids` are a marker cut before its `<|sep|>` (0 if none).
pub fn half_marker_len(tpl: &Template<'_>, ids: &[u32]) -> usize {
    let [open, close, sep] = tpl.control_ids();
    match ids
        .iter()
        .rposition(|&id| id == open || id == close || id == sep)
    {
        Some(at) if ids[at] != sep => ids.len() - at,
        _ => 0,
    }
}

/// Where a reply's response channel ended, if it did: just after the last `close(response)`
/// after the think channel closed (`thinking` is the effort the reply was generated under).
pub fn response_end(tpl: &Template<'_>, thinking: Thinking, ids: &[u32]) -> Option<usize> {
    let after_think = match thinking {
        Thinking::Off => 0,
        _ => find_last(ids, &tpl.think_to_response())?,
    };
    let close = tpl.close_tag("response");
    find_last(&ids[after_think..], &close).map(|at| after_think + at + close.len())
}

/// How many ids of a reply cut short still parse as shown: after its response channel (which
/// ended at `response_end`), up to its last whole call; in the response, all but a marker cut
/// before its `<|sep|>`.
pub fn cut_reply_keep(tpl: &Template<'_>, ids: &[u32], response_end: Option<usize>) -> usize {
    let close_call = tpl.call_close();
    match response_end {
        Some(at) => find_last(&ids[at..], &close_call).map_or(at, |c| at + c + close_call.len()),
        None => ids.len() - half_marker_len(tpl, ids),
    }
}

/// The position of the last occurrence of `needle` in `hay`.
fn find_last(hay: &[u32], needle: &[u32]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .rev()
        .find(|&i| hay[i..i + needle.len()] == *needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_template::parse_assistant;
    use serde_json::json;

    fn tiny_tokenizer() -> Tokenizer {
        Tokenizer::from_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/tiny-k3"
        ))
        .unwrap()
    }

    /// Cut an assistant reply with two calls at every id after its `close(response)`: the
    /// prefix plus [`after_response_tail`] parses as a complete reply (docs/MODEL.md's
    /// grammar) keeping every call that closed before the cut, whenever the cut is not
    /// inside a marker; inside one, the tail still ends the message.
    #[test]
    fn a_cut_tools_channel_closes_well_formed() {
        let tok = tiny_tokenizer();
        let tpl = Template::new(&tok).unwrap();
        let calls = vec![
            ToolCall {
                id: None,
                name: "get_weather".into(),
                arguments: json!({"city": "Paris", "days": 3})
                    .as_object()
                    .unwrap()
                    .clone(),
            },
            ToolCall {
                id: None,
                name: "get_time".into(),
                arguments: json!({"zone": {"tz": "CET"}}).as_object().unwrap().clone(),
            },
        ];
        let reply = ChatMessage {
            tool_calls: calls.clone(),
            ..ChatMessage::new("assistant", "ok")
        };
        let ids = tpl.message(&reply, Thinking::Off).unwrap();
        let body = &ids[tpl.generation_prompt(Thinking::Off).len()..];
        let close = tpl.close_tag("response");
        let at = body.windows(close.len()).position(|w| w == close).unwrap() + close.len();
        let end = body.len() - tpl.message_close().len() - 1;
        let call_close = tpl.call_close();
        for cut in at..=end {
            let prefix = &body[..cut];
            let tail = after_response_tail(&tpl, &tok, &prefix[at..]);
            let mut whole = prefix.to_vec();
            whole.extend(&tail);
            assert!(whole.ends_with(&[tpl.message_close(), vec![tpl.end_of_msg()]].concat()));
            if half_marker_len(&tpl, prefix) > 0 {
                continue;
            }
            let parsed = parse_assistant(&tok, &whole).unwrap();
            assert!(parsed.complete, "cut at {cut}: {parsed:?}");
            assert_eq!(parsed.content, "ok");
            let closed = prefix[at..]
                .windows(call_close.len())
                .filter(|w| *w == call_close)
                .count();
            assert!(parsed.tool_calls.len() >= closed, "cut at {cut}");
            assert_eq!(parsed.tool_calls[..closed], calls[..closed], "cut at {cut}");
        }
    }

    #[test]
    fn pending_calls_are_the_unanswered_ones() {
        let call = |name: &str| ToolCall {
            id: Some(format!("id_{name}")),
            name: name.into(),
            arguments: Map::new(),
        };
        let mut messages = vec![
            ChatMessage::new("user", "hi"),
            ChatMessage {
                tool_calls: vec![call("a"), call("b")],
                ..ChatMessage::new("assistant", "")
            },
        ];
        let names = |m: &[ChatMessage]| -> Vec<(usize, String)> {
            pending_calls(m)
                .iter()
                .map(|(i, c)| (*i, c.name.clone()))
                .collect()
        };
        assert_eq!(names(&messages), [(0, "a".into()), (1, "b".into())]);
        messages.push(ChatMessage::tool_result("id_a", "a", "1"));
        assert_eq!(names(&messages), [(1, "b".into())]);
        messages.push(ChatMessage::tool_result("id_b", "b", "2"));
        assert!(names(&messages).is_empty());
        messages.push(ChatMessage::new("assistant", "done"));
        assert!(names(&messages).is_empty());
    }

    #[test]
    fn the_response_ends_after_its_last_close_past_the_think_channel() {
        let tok = tiny_tokenizer();
        let tpl = Template::new(&tok).unwrap();
        let close = tpl.close_tag("response");
        let mut ids = vec![7, 8];
        ids.extend(&close);
        ids.extend([9, 10]);
        assert_eq!(
            response_end(&tpl, Thinking::Off, &ids),
            Some(2 + close.len())
        );
        // With thinking on, a response close before the think channel closed does not count.
        assert_eq!(response_end(&tpl, Thinking::Max, &ids), None);
        let mut thought = tpl.think_to_response();
        thought.extend(&ids);
        let at = tpl.think_to_response().len() + 2 + close.len();
        assert_eq!(response_end(&tpl, Thinking::Max, &thought), Some(at));
        assert_eq!(cut_reply_keep(&tpl, &thought, Some(at)), at);
        assert_eq!(find_last(&[1, 2, 1, 2], &[1, 2]), Some(2));
        assert_eq!(find_last(&[1], &[1, 2]), None);
    }
}
