//! Tool declarations, assistant tool calls and tool results, rendered as the release's
//! encoder renders them (docs/MODEL.md#chat-template).

use super::{ChatMessage, Template};
use crate::EngineError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A tool the model may call: an OpenAI `function` tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The function's name.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its parameters as a JSON Schema (`null` when it takes none).
    #[serde(default)]
    pub parameters: Value,
}

impl ToolSpec {
    /// The OpenAI request shape the release's encoder declares:
    /// `{"type":"function","function":{"name","description"?,"parameters"?}}`.
    pub fn openai_value(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), Value::String(self.name.clone()));
        if let Some(d) = &self.description {
            function.insert("description".into(), Value::String(d.clone()));
        }
        if !self.parameters.is_null() {
            function.insert("parameters".into(), self.parameters.clone());
        }
        let mut tool = Map::new();
        tool.insert("type".into(), Value::String("function".into()));
        tool.insert("function".into(), Value::Object(function));
        Value::Object(tool)
    }
}

/// One tool call of an assistant message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The call's id (OpenAI `tool_calls[].id`); tool results name it in `tool_call_id`. The
    /// template does not render it: it only orders and names the results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The tool's name.
    pub name: String,
    /// The arguments, in the order the model (or client) gave them.
    #[serde(default)]
    pub arguments: Map<String, Value>,
}

/// The `type` attribute of an argument, from its JSON value: `string`, `number`, `boolean`,
/// `null`, `object` or `array`.
pub fn argument_type(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
        Value::Object(_) => "object",
        Value::Array(_) => "array",
    }
}

/// The text of an argument's value: a string's raw text, any other value as JSON written
/// with `", "` and `": "` separators (as Python's `json.dumps` writes it).
pub fn argument_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => python_json(other),
    }
}

/// JSON with Python's default `json.dumps` separators (`", "`, `": "`), non-ASCII unescaped.
pub(crate) fn python_json(value: &Value) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonSeparators);
    // Writing a Value into a Vec cannot fail.
    if value.serialize(&mut ser).is_err() {
        return String::new();
    }
    String::from_utf8(out).unwrap_or_default()
}

struct PythonSeparators;

impl serde_json::ser::Formatter for PythonSeparators {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// `value` with every object's keys sorted, recursively (arrays keep their order).
fn deep_sort(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), deep_sort(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(deep_sort).collect()),
        other => other.clone(),
    }
}

/// The body of the tool-declaration system message: the tools in OpenAI shape, keys sorted
/// at every level, as compact JSON in a fenced block.
pub fn tool_declare_text(tools: &[ToolSpec]) -> Result<String, EngineError> {
    let list = Value::Array(tools.iter().map(ToolSpec::openai_value).collect());
    let compact = serde_json::to_string(&deep_sort(&list))
        .map_err(|e| EngineError::Invalid(format!("cannot encode the tool list: {e}")))?;
    Ok(format!(
        "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{compact}\n```"
    ))
}

impl Template<'_> {
    /// The tool-declaration system message: `open(message, role="system"
    /// type="tool-declare")` [`tool_declare_text`] `close(message) <|end_of_msg|>`.
    pub fn tool_declare(&self, tools: &[ToolSpec]) -> Result<Vec<u32>, EngineError> {
        for (i, t) in tools.iter().enumerate() {
            if t.name.is_empty() {
                return Err(EngineError::Invalid(format!(
                    "tool {}: empty name: every tool needs a name",
                    i + 1
                )));
            }
        }
        Ok(self.system_note("tool-declare", &tool_declare_text(tools)?))
    }

    /// `open(tools)`: opens the tools channel, after `close(response)`.
    pub fn tools_open(&self) -> Vec<u32> {
        self.open_with("tools", &[])
    }

    /// `close(tools)`: closes the tools channel; `close(message)` and an end id follow.
    pub fn tools_close(&self) -> Vec<u32> {
        self.close_tag("tools")
    }

    /// `open(call, tool="NAME" index="INDEX")`; the encoder numbers a turn's calls from 1.
    pub fn call_open(&self, name: &str, index: usize) -> Vec<u32> {
        self.open_with("call", &[("tool", name), ("index", &index.to_string())])
    }

    /// `close(call)`.
    pub fn call_close(&self) -> Vec<u32> {
        self.close_tag("call")
    }

    /// `open(argument, key="KEY" type="TYPE")`; TYPE as [`argument_type`] names it.
    pub fn argument_open(&self, key: &str, ty: &str) -> Vec<u32> {
        self.open_with("argument", &[("key", key), ("type", ty)])
    }

    /// `close(argument)`.
    pub fn argument_close(&self) -> Vec<u32> {
        self.close_tag("argument")
    }

    /// One argument: `argument_open(key, type)` [`argument_text`] `argument_close()`.
    pub fn argument(&self, key: &str, value: &Value) -> Vec<u32> {
        let mut v = self.argument_open(key, argument_type(value));
        v.extend(self.text(&argument_text(value)));
        v.extend(self.argument_close());
        v
    }

    /// The tools channel of an assistant message (empty without calls): `tools_open()`, per
    /// call `call_open(name, n)` (n from 1) its arguments `call_close()`, `tools_close()`.
    pub fn tools_channel(&self, calls: &[ToolCall]) -> Result<Vec<u32>, EngineError> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let mut v = self.tools_open();
        for (i, call) in calls.iter().enumerate() {
            if call.name.is_empty() {
                return Err(EngineError::Invalid(format!(
                    "tool call {}: empty name: every call names its tool",
                    i + 1
                )));
            }
            v.extend(self.call_open(&call.name, i + 1));
            for (key, value) in &call.arguments {
                v.extend(self.argument(key, value));
            }
            v.extend(self.call_close());
        }
        v.extend(self.tools_close());
        Ok(v)
    }

    /// One tool result: `open(message, role="tool" tool="NAME" index="INDEX")` CONTENT
    /// `close(message) <|end_of_msg|>`.
    pub fn tool_result(&self, name: &str, index: usize, content: &str) -> Vec<u32> {
        let index = index.to_string();
        let mut v = self.open_with(
            "message",
            &[("role", "tool"), ("tool", name), ("index", &index)],
        );
        v.extend(self.text(content));
        v.extend(self.close_tag("message"));
        v.push(self.end_of_msg());
        v
    }

    /// A run of consecutive tool results after an assistant message with `calls`. When every
    /// result's `tool_call_id` names one of the calls, the results are put in call order and
    /// each takes its call's tool name; otherwise they keep their order and take their own
    /// `name`, or the name of the call at their position. They are numbered from 1.
    /// `first` is the run's position in the conversation, for errors.
    pub(crate) fn tool_results(
        &self,
        run: &[ChatMessage],
        calls: &[ToolCall],
        first: usize,
    ) -> Result<Vec<u32>, EngineError> {
        let position = |id: &str| calls.iter().position(|c| c.id.as_deref() == Some(id));
        let matched: Option<Vec<usize>> = run
            .iter()
            .map(|m| m.tool_call_id.as_deref().and_then(position))
            .collect();
        let order: Vec<(usize, Option<&str>)> = match &matched {
            Some(positions) => positions
                .iter()
                .map(|&p| (p, Some(calls[p].name.as_str())))
                .collect(),
            None => (0..run.len()).map(|i| (i, None)).collect(),
        };
        let mut rows: Vec<usize> = (0..run.len()).collect();
        if matched.is_some() {
            rows.sort_by_key(|&r| order[r].0);
        }
        let mut v = Vec::new();
        for (n, &r) in rows.iter().enumerate() {
            let m = &run[r];
            super::check_fields(m)?;
            let name = order[r]
                .1
                .or(m.name.as_deref())
                .or_else(|| calls.get(n).map(|c| c.name.as_str()))
                .ok_or_else(|| {
                    EngineError::Invalid(format!(
                        "message {}: a tool result with no `name` and no `tool_call_id` matching a call of the assistant message before it: give it one of them",
                        first + r + 1
                    ))
                })?;
            v.extend(self.tool_result(name, n + 1, &m.content));
        }
        Ok(v)
    }
}
