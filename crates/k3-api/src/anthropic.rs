//! Anthropic's Messages request (`/v1/messages`, `/v1/messages/count_tokens`) parsed and
//! validated into the neutral request (docs/SERVER.md "Anthropic Messages API").

use super::neutral::{self, Message, Request, Role, ToolCall, ToolChoice, ToolDef};
use super::{extra_fields, field_names, typed, validate_sampling, ApiError, Body, SamplingFields};
use k3_engine::chat_template::Thinking;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize, Debug)]
pub struct InMessage {
    pub role: String,
    pub content: Value,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct InTool {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Value,
    /// `custom` or absent; server tools (web search…) are refused.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Prompt caching hints: accepted, unused.
    #[allow(dead_code)]
    pub cache_control: Option<Value>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct InToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub disable_parallel_tool_use: Option<bool>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct InThinking {
    #[serde(rename = "type")]
    pub kind: String,
    pub budget_tokens: Option<i64>,
    /// `summarized` (k3 returns the thinking whole) or absent; `omitted` is refused.
    pub display: Option<String>,
}

/// The fields of a Messages body (any other field is refused by name).
#[derive(Deserialize, Debug)]
pub struct MessagesFields {
    /// Any name: the one served model answers.
    #[allow(dead_code)]
    pub model: Option<String>,
    pub messages: Option<Vec<InMessage>>,
    pub system: Option<Value>,
    pub max_tokens: Option<i64>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub thinking: Option<InThinking>,
    pub tools: Option<Vec<InTool>>,
    pub tool_choice: Option<InToolChoice>,
    /// `{"user_id": …}`: informational, unused.
    #[allow(dead_code)]
    pub metadata: Option<Value>,
    #[allow(dead_code)]
    pub service_tier: Option<String>,
    /// k3 extension (as on the OpenAI side): the sampler seed.
    pub seed: Option<i64>,
}

/// A `/v1/messages` body.
#[derive(Debug)]
pub struct MessagesRequest {
    pub fields: MessagesFields,
    pub extra: serde_json::Map<String, Value>,
}

impl Body for MessagesRequest {
    fn from_value(body: &Value) -> Result<Self, ApiError> {
        let fields: MessagesFields = typed(body, "")?;
        let extra = extra_fields(body, &[field_names::<MessagesFields>()]);
        Ok(MessagesRequest { fields, extra })
    }
}

/// `thinking` → effort and budget. The budget picks the effort the template announces
/// (< 4096 low, < 16384 high, else max) and is enforced by the scheduler.
fn thinking_of(
    t: Option<&InThinking>,
    max_tokens: Option<i64>,
) -> Result<(Thinking, Option<usize>), ApiError> {
    let Some(t) = t else {
        return Ok((Thinking::Off, None));
    };
    if let Some(d) = t.display.as_deref().filter(|&d| d != "summarized") {
        return Err(ApiError::invalid(
            "thinking.display",
            format!("thinking.display `{d}`: only summarized is supported"),
        ));
    }
    match t.kind.as_str() {
        "disabled" => Ok((Thinking::Off, None)),
        // The model decides how long to think: effort high, no budget.
        "adaptive" => Ok((Thinking::High, None)),
        "enabled" => {
            let budget = t.budget_tokens.ok_or_else(|| {
                ApiError::invalid(
                    "thinking.budget_tokens",
                    "thinking.budget_tokens: Field required",
                )
            })?;
            if budget < 1 || max_tokens.is_some_and(|m| budget >= m) {
                return Err(ApiError::invalid(
                    "thinking.budget_tokens",
                    "thinking.budget_tokens must be at least 1 and less than max_tokens",
                ));
            }
            let budget = budget as usize;
            Ok((neutral::effort_for_budget(budget), Some(budget)))
        }
        other => Err(ApiError::invalid(
            "thinking.type",
            format!("thinking.type `{other}`: use enabled, adaptive or disabled"),
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TextBlock {
    text: String,
    #[allow(dead_code)]
    cache_control: Option<Value>,
    #[allow(dead_code)]
    citations: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ThinkingBlock {
    thinking: String,
    /// Opaque; k3 does not check it.
    #[allow(dead_code)]
    signature: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolUseBlock {
    id: String,
    name: String,
    input: Value,
    #[allow(dead_code)]
    cache_control: Option<Value>,
    /// Response fields the official SDK echoes back when a client resends the reply's
    /// blocks (`caller`, `toolset_name`, null for k3's calls); accepted, unused.
    #[allow(dead_code)]
    caller: Option<Value>,
    #[allow(dead_code)]
    toolset_name: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolResultBlock {
    tool_use_id: String,
    content: Option<Value>,
    is_error: Option<bool>,
    #[allow(dead_code)]
    cache_control: Option<Value>,
}

/// Text from a string or an array of text blocks (`system`, a tool result's content).
fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let at = format!("{at}[{j}]");
                if b.get("type").and_then(Value::as_str) != Some("text") {
                    return Err(ApiError::invalid(
                        &format!("{at}.type"),
                        format!("{at}.type: only text blocks are supported here"),
                    ));
                }
                text.push_str(&strip_type::<TextBlock>(b, &at)?.text);
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid(
            at,
            format!("{at}: must be a string or an array of text blocks"),
        )),
    }
}

/// A block's fields without its `type` tag.
fn strip_type<T: serde::de::DeserializeOwned>(b: &Value, at: &str) -> Result<T, ApiError> {
    let mut b = b.clone();
    if let Some(o) = b.as_object_mut() {
        o.remove("type");
    }
    typed(&b, at)
}

/// One message's blocks → neutral messages: tool results become tool messages (before the
/// rest of a user turn), an assistant's thinking/text/tool_use blocks one assistant message.
fn message_of(m: &InMessage, i: usize, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = match m.role.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        r => {
            return Err(ApiError::invalid(
                &format!("{at}.role"),
                format!("{at}.role `{r}`: use user or assistant (system goes in `system`)"),
            ))
        }
    };
    let mut msg = Message::new(role, String::new(), at.clone());
    let blocks = match &m.content {
        Value::String(s) => {
            msg.content = s.clone();
            out.push(msg);
            return Ok(());
        }
        Value::Array(b) => b,
        _ => {
            return Err(ApiError::invalid(
                &format!("{at}.content"),
                format!("{at}.content: must be a string or an array of content blocks"),
            ))
        }
    };
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let wrong_role = |what: &str| {
            ApiError::invalid(
                &at,
                format!(
                    "{at}: {what} blocks belong in {} messages",
                    if role == Role::User {
                        "assistant"
                    } else {
                        "user"
                    }
                ),
            )
        };
        match b.get("type").and_then(Value::as_str) {
            Some("text") => msg.content.push_str(&strip_type::<TextBlock>(b, &at)?.text),
            Some("thinking") if role == Role::Assistant => {
                let t: ThinkingBlock = strip_type(b, &at)?;
                msg.reasoning.get_or_insert_with(String::new).push_str(&t.thinking);
            }
            Some("tool_use") if role == Role::Assistant => {
                let t: ToolUseBlock = strip_type(b, &at)?;
                neutral::check_tool_name(&t.name, &format!("{at}.name"))?;
                if !t.input.is_object() {
                    return Err(ApiError::invalid(&format!("{at}.input"), format!("{at}.input: must be an object")));
                }
                msg.tool_calls.push(ToolCall { id: t.id, name: t.name, arguments: t.input.to_string() });
            }
            Some("tool_result") if role == Role::User => {
                let t: ToolResultBlock = strip_type(b, &at)?;
                let content = match &t.content {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &format!("{at}.content"))?,
                };
                let mut result = Message::new(Role::Tool, content, at.clone());
                result.tool_call_id = Some(t.tool_use_id);
                result.id_field = "tool_use_id";
                result.is_error = t.is_error.unwrap_or(false);
                out.push(result);
            }
            Some(kind @ ("thinking" | "tool_use" | "tool_result")) => return Err(wrong_role(kind)),
            Some(other) => {
                return Err(ApiError::invalid(
                    &format!("{at}.type"),
                    format!("{at}.type `{other}`: supported blocks are text, thinking, tool_use and tool_result"),
                ))
            }
            None => return Err(ApiError::invalid(&format!("{at}.type"), format!("{at}.type: Field required"))),
        }
    }
    if !msg.content.is_empty()
        || msg.reasoning.is_some()
        || !msg.tool_calls.is_empty()
        || role == Role::Assistant
    {
        out.push(msg);
    }
    Ok(())
}

fn tools_of(tools: Option<&Vec<InTool>>) -> Result<Vec<ToolDef>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.into_iter().flatten().enumerate() {
        if t.kind.as_deref().is_some_and(|k| k != "custom") {
            return Err(ApiError::invalid(
                &format!("tools[{i}].type"),
                format!("tools[{i}].type: server tools are not supported (only custom tools)"),
            ));
        }
        neutral::check_tool_name(&t.name, &format!("tools[{i}].name"))?;
        out.push(ToolDef {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: t.input_schema.clone(),
        });
    }
    Ok(out)
}

/// `tool_choice` → neutral choice and whether several calls per reply are allowed.
fn tool_choice_of(c: Option<&InToolChoice>) -> Result<(ToolChoice, bool), ApiError> {
    let Some(c) = c else {
        return Ok((ToolChoice::Auto, true));
    };
    let parallel = !c.disable_parallel_tool_use.unwrap_or(false);
    let choice = match (c.kind.as_str(), &c.name) {
        ("auto", None) => ToolChoice::Auto,
        ("any", None) => ToolChoice::Required,
        ("none", None) => ToolChoice::None,
        ("tool", Some(name)) => ToolChoice::Named(name.clone()),
        ("tool", None) => {
            return Err(ApiError::invalid(
                "tool_choice.name",
                "tool_choice.name: Field required with type tool",
            ))
        }
        ("auto" | "any" | "none", Some(_)) => {
            return Err(ApiError::invalid(
                "tool_choice.name",
                "tool_choice.name is only allowed with type tool",
            ))
        }
        (other, _) => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("tool_choice.type `{other}`: use auto, any, tool or none"),
            ))
        }
    };
    Ok((choice, parallel))
}

/// The pure part of `/v1/messages` (`count_only`: `/v1/messages/count_tokens`, where
/// `max_tokens` and the sampling fields are not taken).
pub fn validate_messages(req: &MessagesRequest, count_only: bool) -> Result<Request, ApiError> {
    let f = &req.fields;
    if let Some(name) = req.extra.keys().min() {
        return Err(ApiError::invalid(
            name,
            format!("{name}: unknown field, not supported by this server"),
        ));
    }
    if !count_only && f.max_tokens.is_none() {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens: Field required",
        ));
    }
    if let Some(t) = f.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature {t}: must be in [0, 1]"),
        ));
    }
    let stop = f.stop_sequences.clone().unwrap_or_default();
    if stop.len() > 16 {
        return Err(ApiError::invalid(
            "stop_sequences",
            "stop_sequences: at most 16",
        ));
    }
    let sampling = SamplingFields {
        temperature: f.temperature,
        top_p: f.top_p,
        top_k: f.top_k,
        seed: f.seed,
        max_tokens: f.max_tokens,
        stream: f.stream.unwrap_or(false),
        ..SamplingFields::default()
    };
    let mut settings = validate_sampling(&sampling)?;
    settings.stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
    let (thinking, thinking_budget) =
        thinking_of(f.thinking.as_ref(), f.max_tokens.filter(|_| !count_only))?;
    let tools = tools_of(f.tools.as_ref())?;
    let (tool_choice, parallel_tool_calls) = tool_choice_of(f.tool_choice.as_ref())?;
    neutral::check_tools(
        &tools,
        &tool_choice,
        |i| format!("tools[{i}].input_schema"),
        "tool_choice",
    )?;
    let mut messages = Vec::new();
    if let Some(system) = f.system.as_ref().filter(|s| !s.is_null()) {
        messages.push(Message::new(
            Role::System,
            text_of(system, "system")?,
            "system".into(),
        ));
    }
    match &f.messages {
        None => return Err(ApiError::invalid("messages", "messages: Field required")),
        Some(m) if m.is_empty() => {
            return Err(ApiError::invalid("messages", "messages: must not be empty"))
        }
        Some(m) => {
            for (i, m) in m.iter().enumerate() {
                message_of(m, i, &mut messages)?;
            }
        }
    }
    neutral::check_history(&messages)?;
    Ok(Request {
        messages,
        tools,
        tool_choice,
        parallel_tool_calls,
        response_format: neutral::ResponseFormat::Text,
        thinking,
        thinking_budget,
        settings,
        ignore_eos: false,
    })
}

#[cfg(test)]
mod tests {
    use super::super::parse_body;
    use super::*;
    use serde_json::json;

    fn parse(body: Value) -> Result<Request, ApiError> {
        parse_body::<MessagesRequest>(body.to_string().as_bytes())
            .and_then(|r| validate_messages(&r, false))
    }

    #[test]
    fn blocks_map_onto_neutral_messages() {
        let r = parse(json!({
            "model": "x", "max_tokens": 100, "system": [{"type": "text", "text": "Be brief."}],
            "thinking": {"type": "enabled", "budget_tokens": 50},
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rain", "is_error": false},
                    {"type": "text", "text": "thanks"}]}]
        })).unwrap();
        let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::User
            ]
        );
        assert_eq!(r.messages[2].reasoning.as_deref(), Some("hm"));
        assert_eq!(r.messages[2].tool_calls[0].arguments, "{\"city\":\"Oslo\"}");
        assert_eq!(r.messages[3].tool_call_id.as_deref(), Some("t1"));
        assert_eq!((r.thinking, r.thinking_budget), (Thinking::Low, Some(50)));
        assert_eq!(r.tool_choice, ToolChoice::Named("get_weather".into()));
        assert!(!r.parallel_tool_calls);
    }

    #[test]
    fn every_refusal_names_its_path() {
        let user = json!([{"role": "user", "content": "hi"}]);
        for (body, want) in [
            (json!({"messages": user}), "max_tokens"),
            (
                json!({"messages": user, "max_tokens": "many"}),
                "max_tokens",
            ),
            (
                json!({"messages": user, "max_tokens": 5, "temperature": 1.5}),
                "temperature",
            ),
            (
                json!({"messages": user, "max_tokens": 5, "stop_sequences": "x"}),
                "stop_sequences",
            ),
            (
                json!({"messages": user, "max_tokens": 5, "thinking": {"type": "enabled"}}),
                "thinking.budget_tokens",
            ),
            (
                json!({"messages": user, "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 5}}),
                "thinking.budget_tokens",
            ),
            (
                json!({"messages": user, "max_tokens": 5, "tool_choice": {"type": "some"}}),
                "tool_choice.type",
            ),
            (
                json!({"messages": user, "max_tokens": 5, "tool_choice": {"type": "any"}}),
                "tool_choice",
            ),
            (
                json!({"messages": user, "max_tokens": 5, "tools": [{"name": "f"}]}),
                "tools[0]",
            ),
            (
                json!({"messages": user, "max_tokens": 5, "tools": [{"name": "f", "input_schema": 3}]}),
                "tools[0].input_schema",
            ),
            (
                json!({"messages": [{"role": "system", "content": "x"}], "max_tokens": 5}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image"}]}], "max_tokens": 5}),
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}], "max_tokens": 5}),
                "messages[0].content[0].text",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "z"}]}], "max_tokens": 5}),
                "messages[0].content[0].tool_use_id",
            ),
            (
                json!({"messages": user, "max_tokens": 5, "stream_options": {}}),
                "stream_options",
            ),
        ] {
            let got = parse(body.clone()).err().and_then(|e| e.param);
            assert_eq!(got.as_deref(), Some(want), "{body}");
        }
    }
}
