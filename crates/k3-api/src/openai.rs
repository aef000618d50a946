//! OpenAI's chat request (`/v1/chat/completions`) parsed and validated into the neutral
//! request (docs/SERVER.md "Request fields", "Tools").

use super::neutral::{self, Message, Request, ResponseFormat, Role, ToolCall, ToolChoice, ToolDef};
use super::{extra_fields, field_names, typed, validate_sampling, ApiError, Body, SamplingFields};
use k3_engine::chat_template::Thinking;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize, Debug)]
pub struct InMessage {
    pub role: String,
    pub content: Option<Value>,
    pub reasoning_content: Option<String>,
    pub tool_calls: Option<Vec<InToolCall>>,
    pub tool_call_id: Option<String>,
    /// A participant's name: informational, unused.
    #[allow(dead_code)]
    pub name: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct InToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: InFunctionCall,
}

#[derive(Deserialize, Debug)]
pub struct InFunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Deserialize, Debug)]
pub struct InTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: InFunction,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct InFunction {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    /// Strict schema adherence: `parameters` must be closed and complete
    /// (docs/SERVER.md "Strict schemas"); a required or named call is always enforced.
    pub strict: Option<bool>,
}

/// The chat-only fields of the body.
#[derive(Deserialize, Debug)]
pub struct ChatFields {
    pub messages: Option<Vec<InMessage>>,
    pub reasoning_effort: Option<String>,
    pub thinking: Option<Value>,
    pub tools: Option<Vec<InTool>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<Value>,
}

/// A `/v1/chat/completions` body.
#[derive(Debug)]
pub struct ChatRequest {
    pub chat: ChatFields,
    pub common: SamplingFields,
}

impl Body for ChatRequest {
    fn from_value(body: &Value) -> Result<Self, ApiError> {
        let mut common: SamplingFields = typed(body, "")?;
        let chat: ChatFields = typed(body, "")?;
        let known = [field_names::<SamplingFields>(), field_names::<ChatFields>()];
        common.extra = extra_fields(body, &known);
        Ok(ChatRequest { chat, common })
    }
}

/// The thinking effort from `reasoning_effort` or `thinking` (a string, a bool, or
/// `{"type": "enabled"|"disabled", "budget_tokens": N}`; off when neither is given) and the
/// reasoning budget, enforced by the scheduler (docs/SERVER.md "Request fields").
fn thinking_and_budget(req: &ChatFields) -> Result<(Thinking, Option<usize>), ApiError> {
    if let Some(Value::Object(o)) = &req.thinking {
        if let Some(b) = o.get("budget_tokens").filter(|b| !b.is_null()) {
            let budget = b.as_u64().filter(|&b| b >= 1).ok_or_else(|| {
                ApiError::invalid(
                    "thinking.budget_tokens",
                    "thinking.budget_tokens must be an integer >= 1",
                )
            })? as usize;
            return match o.get("type").and_then(Value::as_str) {
                Some("enabled") => Ok((neutral::effort_for_budget(budget), Some(budget))),
                _ => Err(ApiError::invalid(
                    "thinking.type",
                    "thinking.budget_tokens needs thinking.type enabled",
                )),
            };
        }
    }
    Ok((thinking_effort(req)?, None))
}

/// The effort alone (no budget given).
fn thinking_effort(req: &ChatFields) -> Result<Thinking, ApiError> {
    let parse = |param: &str, s: &str| -> Result<Thinking, ApiError> {
        match s {
            "none" | "off" => Ok(Thinking::Off),
            "minimal" | "low" => Ok(Thinking::Low),
            "medium" | "high" => Ok(Thinking::High),
            "max" => Ok(Thinking::Max),
            _ => Err(ApiError::invalid(
                param,
                format!("{param} `{s}`: use off, low, high or max"),
            )),
        }
    };
    if let Some(s) = &req.reasoning_effort {
        return parse("reasoning_effort", s);
    }
    match &req.thinking {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(Thinking::Off),
        Some(Value::Bool(true)) => Ok(Thinking::Max),
        Some(Value::String(s)) => parse("thinking", s),
        Some(Value::Object(o)) => match o.get("type").and_then(Value::as_str) {
            Some("enabled") => Ok(Thinking::Max),
            Some("disabled") => Ok(Thinking::Off),
            _ => Err(ApiError::invalid(
                "thinking.type",
                "thinking.type must be enabled or disabled",
            )),
        },
        Some(_) => Err(ApiError::invalid(
            "thinking",
            "thinking must be off, low, high, max, a boolean or {\"type\": ...}",
        )),
    }
}

/// A message's text: a string or an array of `{"type":"text","text":...}` parts (joined).
fn content_of(content: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match part.get("text").and_then(Value::as_str) {
                    Some(t) => text.push_str(t),
                    None => {
                        return Err(ApiError::invalid(
                            &format!("{param}[{j}]"),
                            format!("{param}[{j}]: only text content parts are supported"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::invalid(
            param,
            format!("{param}: must be a string or an array of text parts"),
        )),
    }
}

/// One message; `developer` is treated as `system`.
fn message_of(m: &InMessage, at: String) -> Result<Message, ApiError> {
    let role = match m.role.as_str() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        r => {
            return Err(ApiError::invalid(
                &format!("{at}.role"),
                format!("{at}.role: unsupported role `{r}`: use system, user, assistant or tool"),
            ))
        }
    };
    let content = content_of(m.content.as_ref(), &format!("{at}.content"))?;
    let mut msg = Message::new(role, content, at.clone());
    if role == Role::Assistant {
        msg.reasoning = m.reasoning_content.clone();
    }
    if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
        if role != Role::Assistant {
            return Err(ApiError::invalid(
                &format!("{at}.tool_calls"),
                "only assistant messages carry tool_calls",
            ));
        }
        for (j, c) in calls.iter().enumerate() {
            let call_at = format!("{at}.tool_calls[{j}]");
            if c.kind.as_deref().is_some_and(|k| k != "function") {
                return Err(ApiError::invalid(
                    &format!("{call_at}.type"),
                    "a tool call's type must be function",
                ));
            }
            neutral::check_tool_name(&c.function.name, &format!("{call_at}.function.name"))?;
            msg.tool_calls.push(ToolCall {
                id: c.id.clone(),
                name: c.function.name.clone(),
                arguments: c.function.arguments.clone(),
            });
        }
    }
    match (role, &m.tool_call_id) {
        (Role::Tool, None) => Err(ApiError::invalid(
            &format!("{at}.tool_call_id"),
            "a tool message needs tool_call_id",
        )),
        (Role::Tool, Some(id)) => {
            msg.tool_call_id = Some(id.clone());
            Ok(msg)
        }
        (_, Some(_)) => Err(ApiError::invalid(
            &format!("{at}.tool_call_id"),
            "only tool messages carry tool_call_id",
        )),
        _ => Ok(msg),
    }
}

fn tools_of(tools: Option<&Vec<InTool>>) -> Result<Vec<ToolDef>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.into_iter().flatten().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::invalid(
                &format!("tools[{i}].type"),
                "a tool's type must be function",
            ));
        }
        neutral::check_tool_name(&t.function.name, &format!("tools[{i}].function.name"))?;
        if let (Some(true), Some(params)) = (t.function.strict, &t.function.parameters) {
            super::strict_schema::check(params, &format!("tools[{i}].function.parameters"))?;
        }
        out.push(ToolDef {
            name: t.function.name.clone(),
            description: t.function.description.clone(),
            parameters: t
                .function
                .parameters
                .clone()
                .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}})),
        });
    }
    Ok(out)
}

/// `tool_choice`: `none`, `auto`, `required` or `{"type":"function","function":{"name"}}`.
fn tool_choice_of(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let bad = || {
        ApiError::invalid(
            "tool_choice",
            "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": NAME}}",
        )
    };
    match v {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            _ => Err(bad()),
        },
        Some(Value::Object(o)) if o.get("type") == Some(&Value::from("function")) => {
            match o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            {
                Some(name) => Ok(ToolChoice::Named(name.to_string())),
                None => Err(ApiError::invalid(
                    "tool_choice.function.name",
                    "tool_choice.function.name must be a string",
                )),
            }
        }
        Some(_) => Err(bad()),
    }
}

/// `response_format`: `text`, `json_object`, or `json_schema` with `{name, schema, strict}`.
fn response_format_of(v: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct JsonSchema {
        name: String,
        #[allow(dead_code)]
        description: Option<String>,
        schema: Option<Value>,
        strict: Option<bool>,
    }
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(ResponseFormat::Text);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => {
            let spec = v.get("json_schema").ok_or_else(|| {
                ApiError::invalid(
                    "response_format.json_schema",
                    "response_format.json_schema is required with type json_schema",
                )
            })?;
            let s: JsonSchema = typed(spec, "response_format.json_schema")?;
            let schema = s.schema.unwrap_or_else(|| serde_json::json!({}));
            if !schema.is_object() {
                return Err(ApiError::invalid(
                    "response_format.json_schema.schema",
                    "response_format.json_schema.schema must be a JSON object",
                ));
            }
            let strict = s.strict.unwrap_or(false);
            if strict {
                super::strict_schema::check(&schema, "response_format.json_schema.schema")?;
            }
            Ok(ResponseFormat::JsonSchema {
                name: s.name,
                schema,
                strict,
            })
        }
        _ => Err(ApiError::invalid(
            "response_format.type",
            "response_format.type must be text, json_object or json_schema",
        )),
    }
}

/// The pure part of `/v1/chat/completions` after the body parsed: sampling settings,
/// thinking, tools and messages, in that order (fuzzed by `cargo xtask fuzz serve`).
pub fn validate_chat(req: &ChatRequest) -> Result<Request, ApiError> {
    let settings = validate_sampling(&req.common)?;
    let (thinking, thinking_budget) = thinking_and_budget(&req.chat)?;
    let tools = tools_of(req.chat.tools.as_ref())?;
    let tool_choice = tool_choice_of(req.chat.tool_choice.as_ref())?;
    neutral::check_tools(
        &tools,
        &tool_choice,
        |i| format!("tools[{i}]"),
        "tool_choice",
    )?;
    let response_format = response_format_of(req.chat.response_format.as_ref())?;
    let raw = match &req.chat.messages {
        None => return Err(ApiError::invalid("messages", "messages is required")),
        Some(m) if m.is_empty() => {
            return Err(ApiError::invalid("messages", "messages must not be empty"))
        }
        Some(m) => m,
    };
    let messages = raw
        .iter()
        .enumerate()
        .map(|(i, m)| message_of(m, format!("messages[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    neutral::check_history(&messages)?;
    Ok(Request {
        messages,
        tools,
        tool_choice,
        parallel_tool_calls: req.chat.parallel_tool_calls.unwrap_or(true),
        response_format,
        thinking,
        thinking_budget,
        ignore_eos: req.common.ignore_eos,
        settings,
    })
}

#[cfg(test)]
mod tests {
    use super::super::parse_body;
    use super::*;
    use serde_json::json;

    fn refusal(body: Value) -> Option<String> {
        parse_body::<ChatRequest>(body.to_string().as_bytes())
            .and_then(|r| validate_chat(&r))
            .err()
            .and_then(|e| e.param)
    }

    #[test]
    fn tools_tool_choice_and_formats_parse_into_the_neutral_request() {
        let body = json!({
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": false,
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object", "additionalProperties": false}, "strict": true}},
        });
        let r = validate_chat(&parse_body::<ChatRequest>(body.to_string().as_bytes()).unwrap())
            .unwrap();
        assert_eq!(r.tools.len(), 1);
        assert_eq!(r.tool_choice, ToolChoice::Named("get_weather".into()));
        assert!(!r.parallel_tool_calls);
        assert!(matches!(
            r.response_format,
            ResponseFormat::JsonSchema { strict: true, .. }
        ));
        assert_eq!(r.messages[1].tool_calls[0].name, "get_weather");
        assert_eq!(r.messages[2].role, Role::Tool);
        let messages = r.to_template().unwrap();
        assert_eq!(messages[1].tool_calls[0].id.as_deref(), Some("c1"));
        assert_eq!(messages[1].tool_calls[0].arguments["city"], "Paris");
        assert_eq!(messages[2].tool_call_id.as_deref(), Some("c1"));
        // A named tool choice is the constraint, even beside a JSON response format.
        assert!(matches!(
            r.constraint_spec(),
            Some(k3_engine::ConstraintSpec::ToolCalls {
                named: Some(_),
                parallel: false,
                ..
            })
        ));
    }

    #[test]
    fn a_thinking_budget_sets_effort_and_budget() {
        let body = json!({"messages": [{"role": "user", "content": "hi"}],
                          "thinking": {"type": "enabled", "budget_tokens": 5000}});
        let r = validate_chat(&parse_body::<ChatRequest>(body.to_string().as_bytes()).unwrap())
            .unwrap();
        assert_eq!(
            (r.thinking, r.thinking_budget),
            (Thinking::High, Some(5000))
        );
        let bad = json!({"messages": [{"role": "user", "content": "hi"}],
                         "thinking": {"type": "enabled", "budget_tokens": 0}});
        assert_eq!(refusal(bad).as_deref(), Some("thinking.budget_tokens"));
    }

    #[test]
    fn every_refusal_names_its_path() {
        let user = json!([{"role": "user", "content": "hi"}]);
        for (body, want) in [
            (
                json!({"messages": user, "max_tokens": "many"}),
                "max_tokens",
            ),
            (
                json!({"messages": user, "temperature": "hot"}),
                "temperature",
            ),
            (
                json!({"messages": [{"role": "user", "content": "a"}, {"role": 5}]}),
                "messages[1].role",
            ),
            (
                json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": 5}]}),
                "messages[1].content",
            ),
            (
                json!({"messages": user, "tools": [{"type": "function", "function": {"name": 3}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"messages": user, "tools": [{"type": "x", "function": {"name": "f"}}]}),
                "tools[0].type",
            ),
            (
                json!({"messages": user, "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"messages": user, "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"messages": user, "parallel_tool_calls": "yes"}),
                "parallel_tool_calls",
            ),
            (
                json!({"messages": user, "response_format": {"type": "xml"}}),
                "response_format.type",
            ),
            (
                json!({"messages": user, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
                "response_format.json_schema",
            ),
            (
                json!({"messages": [{"role": "tool", "content": "x"}]}),
                "messages[0].tool_call_id",
            ),
            (
                json!({"messages": [{"role": "tool", "content": "x", "tool_call_id": "nope"}]}),
                "messages[0].tool_call_id",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 1}}]}]}),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (json!({"max_tokens": 3}), "messages"),
            (json!({"messages": user, "bogus": 1}), "bogus"),
        ] {
            assert_eq!(refusal(body.clone()).as_deref(), Some(want), "{body}");
        }
    }
}
