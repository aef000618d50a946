//! The server core's protocol-neutral request (docs/SERVER.md "Design"): the OpenAI and
//! Anthropic adapters both parse their bodies into a [`Request`] — messages with tool calls
//! and tool results, tool definitions, a tool choice, a response format, thinking and the
//! generation settings — and the scheduler serves it the same way whichever protocol asked.
//!
//! [`Request::to_template`] gives the template's messages (tool calls and results included),
//! [`Request::declared_tools`] the tools the prompt declares and
//! [`Request::constraint_spec`] what constrained decoding enforces (docs/SERVER.md "Tools").

use super::{ApiError, GenSettings};
use k3_engine::chat_template::{ChatMessage, Thinking, ToolCall as TemplateCall, ToolSpec};
use k3_engine::ConstraintSpec;
use serde_json::Value;

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: Option<String>,
    /// The arguments' JSON Schema (an object).
    pub parameters: Value,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ToolChoice {
    /// The model decides (the default).
    #[default]
    Auto,
    /// No tool call.
    None,
    /// At least one tool call (OpenAI `required`, Anthropic `any`).
    Required,
    /// This tool.
    Named(String),
}

/// The shape of the reply's content.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ResponseFormat {
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching `schema`.
    JsonSchema {
        name: String,
        schema: Value,
        strict: bool,
    },
}

/// A tool call the assistant made earlier in the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result (`tool_call_id` says which call).
    Tool,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// An assistant's reasoning (think channel).
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
    /// A tool result that reports a failure (Anthropic `is_error`).
    pub is_error: bool,
    /// Where it is in the body (`messages[2]`), for error messages.
    pub at: String,
    /// The name of the body field holding `tool_call_id` (`tool_call_id`, Anthropic's
    /// `tool_use_id`), for error messages.
    pub id_field: &'static str,
}

impl Message {
    pub fn new(role: Role, content: String, at: String) -> Self {
        Message {
            role,
            content,
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            is_error: false,
            at,
            id_field: "tool_call_id",
        }
    }
}

/// A chat request, whichever protocol it came in.
#[derive(Debug, Clone)]
pub struct Request {
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    pub tool_choice: ToolChoice,
    /// Several tool calls in one reply allowed (enforced when the choice is constrained).
    pub parallel_tool_calls: bool,
    pub response_format: ResponseFormat,
    pub thinking: Thinking,
    /// Reasoning tokens at most; then the reply is moved to its response channel.
    pub thinking_budget: Option<usize>,
    pub settings: GenSettings,
    /// Keep generating past the end of the reply.
    pub ignore_eos: bool,
}

/// The thinking effort a reasoning budget announces: < 4096 low, < 16384 high, else max
/// (docs/SERVER.md "Anthropic Messages API"); the scheduler enforces the budget itself.
pub fn effort_for_budget(budget: usize) -> Thinking {
    match budget {
        ..=4095 => Thinking::Low,
        4096..=16383 => Thinking::High,
        _ => Thinking::Max,
    }
}

/// Tool names: 1–64 of `a-z A-Z 0-9 _ -` (OpenAI's and Anthropic's rule).
pub fn check_tool_name(name: &str, param: &str) -> Result<(), ApiError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            param,
            format!("{param} `{name}`: a tool name is 1 to 64 of a-z, A-Z, 0-9, _ and -"),
        ))
    }
}

/// Tool definitions: unique names, object schemas; a named choice names one of them and a
/// required call needs at least one. `at(i)` is the body path of tool `i`.
pub fn check_tools(
    tools: &[ToolDef],
    choice: &ToolChoice,
    at: impl Fn(usize) -> String,
    choice_param: &str,
) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|o| o.name == t.name) {
            return Err(ApiError::invalid(
                &format!("{}.name", at(i)),
                format!("tool name `{}` is declared twice", t.name),
            ));
        }
        if !t.parameters.is_object() {
            return Err(ApiError::invalid(
                &at(i),
                format!("tool `{}`: its schema must be a JSON object", t.name),
            ));
        }
    }
    match choice {
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => {
            Err(ApiError::invalid(
                choice_param,
                format!("{choice_param} names `{name}`, which is not among the tools"),
            ))
        }
        ToolChoice::Required if tools.is_empty() => Err(ApiError::invalid(
            choice_param,
            format!("{choice_param} requires a tool call but no tools are given"),
        )),
        _ => Ok(()),
    }
}

/// Tool calls and results in the history: every result answers an earlier call by id, call
/// ids are unique, and call arguments are JSON.
pub fn check_history(messages: &[Message]) -> Result<(), ApiError> {
    let mut calls: Vec<&str> = Vec::new();
    for m in messages {
        for (j, c) in m.tool_calls.iter().enumerate() {
            let at = format!("{}.tool_calls[{j}]", m.at);
            if c.id.is_empty() || calls.contains(&c.id.as_str()) {
                return Err(ApiError::invalid(
                    &format!("{at}.id"),
                    format!("tool call id `{}` is empty or used twice", c.id),
                ));
            }
            if serde_json::from_str::<Value>(&c.arguments).is_err() {
                return Err(ApiError::invalid(
                    &format!("{at}.arguments"),
                    "tool call arguments must be JSON",
                ));
            }
            calls.push(&c.id);
        }
        if m.role == Role::Tool {
            let id = m.tool_call_id.as_deref().unwrap_or("");
            if !calls.contains(&id) {
                return Err(ApiError::invalid(
                    &format!("{}.{}", m.at, m.id_field),
                    format!("tool result for `{id}`, which no earlier assistant tool call has"),
                ));
            }
        }
    }
    Ok(())
}

impl Request {
    /// The messages as the chat template takes them: assistant tool calls keep their ids
    /// (the template maps each result's `tool_call_id` to its call's position, K3's `index`),
    /// tool results their call's id. An Anthropic `is_error` result is rendered with an
    /// `Error: ` prefix (K3's template has no error flag; docs/SERVER.md "Tools").
    pub fn to_template(&self) -> Result<Vec<ChatMessage>, ApiError> {
        let mut out = Vec::with_capacity(self.messages.len());
        for m in &self.messages {
            let role = match m.role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::Tool => "tool",
            };
            let content = if m.is_error {
                format!("Error: {}", m.content)
            } else {
                m.content.clone()
            };
            let mut msg = ChatMessage::new(role, content);
            msg.reasoning_content = m.reasoning.clone();
            msg.tool_call_id = m.tool_call_id.clone();
            for (j, c) in m.tool_calls.iter().enumerate() {
                let arguments = match serde_json::from_str::<Value>(&c.arguments) {
                    Ok(Value::Object(map)) => map,
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{}.tool_calls[{j}].arguments", m.at),
                            "tool call arguments must be a JSON object",
                        ))
                    }
                };
                msg.tool_calls.push(TemplateCall {
                    id: Some(c.id.clone()),
                    name: c.name.clone(),
                    arguments,
                });
            }
            out.push(msg);
        }
        Ok(out)
    }

    /// The tools declared in the prompt: none with `tool_choice` `none` (the model is not
    /// told of tools it may not call), else every tool.
    pub fn declared_tools(&self) -> Vec<ToolSpec> {
        if self.tool_choice == ToolChoice::None {
            return Vec::new();
        }
        self.tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
            })
            .collect()
    }

    /// Whether the reply is parsed for tool calls (tools declared and not `none`).
    pub fn parses_calls(&self) -> bool {
        !self.declared_tools().is_empty()
    }

    /// What constrained decoding enforces (docs/SERVER.md "Tools"): a required or named tool
    /// choice → tool calls; else a JSON `response_format` → that JSON; else nothing.
    pub fn constraint_spec(&self) -> Option<ConstraintSpec> {
        let tools = || {
            self.tools
                .iter()
                .map(|t| (t.name.clone(), t.parameters.clone()))
                .collect()
        };
        match (&self.tool_choice, &self.response_format) {
            (ToolChoice::Required, _) if !self.tools.is_empty() => {
                Some(ConstraintSpec::ToolCalls {
                    tools: tools(),
                    named: None,
                    parallel: self.parallel_tool_calls,
                })
            }
            (ToolChoice::Named(name), _) => Some(ConstraintSpec::ToolCalls {
                tools: tools(),
                named: Some(name.clone()),
                parallel: self.parallel_tool_calls,
            }),
            (_, ResponseFormat::Text) => None,
            (_, ResponseFormat::JsonObject) => Some(ConstraintSpec::JsonObject),
            (_, ResponseFormat::JsonSchema { schema, strict, .. }) => {
                Some(ConstraintSpec::JsonSchema {
                    schema: schema.clone(),
                    strict: *strict,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str) -> ToolDef {
        ToolDef {
            name: name.into(),
            description: None,
            parameters: json!({"type": "object"}),
        }
    }

    fn param(r: Result<(), ApiError>) -> Option<String> {
        r.err().and_then(|e| e.param)
    }

    #[test]
    fn tools_are_checked_by_name_schema_and_choice() {
        let at = |i: usize| format!("tools[{i}]");
        let ok = [tool("get_weather"), tool("run-2")];
        assert!(check_tools(&ok, &ToolChoice::Named("run-2".into()), at, "tool_choice").is_ok());
        let twice = [tool("a"), tool("a")];
        assert_eq!(
            param(check_tools(&twice, &ToolChoice::Auto, at, "tool_choice")).as_deref(),
            Some("tools[1].name")
        );
        let mut bad = tool("b");
        bad.parameters = json!("x");
        assert_eq!(
            param(check_tools(&[bad], &ToolChoice::Auto, at, "tool_choice")).as_deref(),
            Some("tools[0]")
        );
        let named = ToolChoice::Named("zz".into());
        assert_eq!(
            param(check_tools(&ok, &named, at, "tool_choice")).as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            param(check_tools(&[], &ToolChoice::Required, at, "tool_choice")).as_deref(),
            Some("tool_choice")
        );
        assert!(check_tool_name("a_b-9", "x").is_ok());
        for bad in ["", "a b", "é", &"x".repeat(65)] {
            assert!(check_tool_name(bad, "x").is_err(), "{bad}");
        }
    }

    #[test]
    fn history_results_must_answer_earlier_calls() {
        let mut call = Message::new(Role::Assistant, String::new(), "messages[0]".into());
        call.tool_calls.push(ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: "{\"a\":1}".into(),
        });
        let mut result = Message::new(Role::Tool, "42".into(), "messages[1]".into());
        result.tool_call_id = Some("c1".into());
        assert!(check_history(&[call.clone(), result.clone()]).is_ok());
        assert_eq!(
            param(check_history(&[result.clone()])).as_deref(),
            Some("messages[1].tool_call_id")
        );
        let mut broken = call.clone();
        broken.tool_calls[0].arguments = "{".into();
        assert_eq!(
            param(check_history(&[broken])).as_deref(),
            Some("messages[0].tool_calls[0].arguments")
        );
        assert_eq!(
            param(check_history(&[call.clone(), call])).as_deref(),
            Some("messages[0].tool_calls[0].id")
        );
    }
}
