//! Kimi K3's XTML chat template (docs/MODEL.md#chat-template): render a conversation — tool
//! declarations, assistant tool calls and tool results included — to token ids, parse an
//! assistant reply back into its `think`, `response` and `tools` channels, and read/write the
//! JSONL history.
//!
//! Control pieces (`<|open|>`, `<|close|>`, `<|sep|>`, `<|end_of_msg|>`) are resolved by name
//! with [`Tokenizer::token_id`]; every text piece — tag names, attributes, message text — is
//! encoded with [`Tokenizer::encode_ordinary`], so text that spells a control token stays
//! plain text (no injection). Text pieces are encoded one segment at a time, split where the
//! release's encoder splits them (docs/MODEL.md#chat-template): an attribute is the four
//! segments ` key`, `="`, the escaped value, `"`.
//!
//! ```text
//! open(tag, attrs)  = <|open|> tag {attr} <|sep|>        close(tag) = <|close|> tag <|sep|>
//! tools declared:   open(message, role="system" type="tool-declare") TOOLS_TEXT close(message) EOM
//! thinking on:      open(message, role="system" type="thinking-effort") EFFORT_TEXT close(message) EOM
//! per message:      open(message, role="ROLE" [name="NAME"])
//!                   assistant: [thinking on: open(think) REASONING close(think)]
//!                              open(response) CONTENT close(response) [TOOLS_CHANNEL]
//!                   tool:      (open carries tool="NAME" index="N") CONTENT
//!                   others:    CONTENT
//!                   close(message) <|end_of_msg|>
//! generation prompt: open(message, role="assistant") open(think)   (open(response) if off)
//! ```

mod history;
mod markup;
mod reply;
mod tool_parse;
mod tool_turns;
mod tools;

pub use history::{history_jsonl, load_history, parse_history, save_history, validate_history};
pub use reply::{parse_assistant, Channel, ParsedReply, ReplyParser};
pub use tool_parse::{ReplyEvent, ReplyStream, Served};
pub use tool_turns::{
    after_response_tail, cut_reply_keep, half_marker_len, load_tools, pending_calls, response_end,
    ToolsFileError,
};
pub use tools::{argument_text, argument_type, tool_declare_text, ToolCall, ToolSpec};

use crate::EngineError;
use k3_tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};

/// One message of a conversation; also one line of the JSONL history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text (an assistant's `response` channel; a tool's result).
    pub content: String,
    /// An assistant's `think` channel, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant's tool calls (its `tools` channel).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A tool result: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool result: the tool's name. On other roles: the speaker's `name` attribute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with no reasoning, calls or names.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }

    /// A tool result answering call `tool_call_id` of tool `name`.
    pub fn tool_result(tool_call_id: &str, name: &str, content: impl Into<String>) -> Self {
        ChatMessage {
            tool_call_id: Some(tool_call_id.to_string()),
            name: Some(name.to_string()),
            ..ChatMessage::new("tool", content)
        }
    }
}

/// Thinking effort: `Off` renders no thinking-effort system message and opens the response
/// channel directly; the others open the `think` channel (default `Max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Thinking {
    /// No thinking channel.
    Off,
    /// `thinking_effort=low`.
    Low,
    /// `thinking_effort=high`.
    High,
    /// `thinking_effort=max` (the default).
    #[default]
    Max,
}

impl Thinking {
    /// The effort name written into the system message; `None` when off.
    pub fn effort(self) -> Option<&'static str> {
        match self {
            Thinking::Off => None,
            Thinking::Low => Some("low"),
            Thinking::High => Some("high"),
            Thinking::Max => Some("max"),
        }
    }
}

impl std::str::FromStr for Thinking {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, EngineError> {
        match s {
            "off" => Ok(Thinking::Off),
            "low" => Ok(Thinking::Low),
            "high" => Ok(Thinking::High),
            "max" => Ok(Thinking::Max),
            _ => Err(EngineError::Invalid(format!(
                "thinking effort `{s}`: use off, low, high or max"
            ))),
        }
    }
}

/// The text of the thinking-effort system message for `effort`.
pub fn thinking_effort_text(effort: &str) -> String {
    format!(
        "`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort={effort}`."
    )
}

/// Escapes an attribute value: `&` → `&amp;`, then `"` → `&quot;`.
pub fn escape_attr(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;")
}

/// The template's control ids, resolved by name, and its piece builders.
#[derive(Clone, Debug)]
pub struct Template<'t> {
    tok: &'t Tokenizer,
    open: u32,
    close: u32,
    sep: u32,
    eom: u32,
}

impl<'t> Template<'t> {
    /// Resolves `<|open|>`, `<|close|>`, `<|sep|>` and `<|end_of_msg|>`; refuses a tokenizer
    /// that lacks any of them.
    pub fn new(tok: &'t Tokenizer) -> Result<Self, EngineError> {
        let id = |name: &str| {
            tok.token_id(name).ok_or_else(|| {
                EngineError::Invalid(format!("the tokenizer has no `{name}` token: the chat template needs Kimi K3's control tokens"))
            })
        };
        Ok(Template {
            tok,
            open: id("<|open|>")?,
            close: id("<|close|>")?,
            sep: id("<|sep|>")?,
            eom: id(k3_tokenizer::END_OF_MSG)?,
        })
    }

    /// The tokenizer this template encodes with.
    pub fn tokenizer(&self) -> &'t Tokenizer {
        self.tok
    }

    /// `<|end_of_msg|>`, the id that closes every rendered message.
    pub fn end_of_msg(&self) -> u32 {
        self.eom
    }

    /// The ids of `<|open|>`, `<|close|>` and `<|sep|>`.
    pub fn control_ids(&self) -> [u32; 3] {
        [self.open, self.close, self.sep]
    }

    /// `<|open|>` tag+attrs `<|sep|>`, the tag and attributes encoded as one text segment.
    /// Equal to [`Template::open_with`] for a tag without attributes; the renderer itself
    /// uses `open_with`, which splits attributes as the release's encoder does.
    pub fn open_tag(&self, tag_attrs: &str) -> Vec<u32> {
        let mut v = vec![self.open];
        v.extend(self.tok.encode_ordinary(tag_attrs));
        v.push(self.sep);
        v
    }

    /// `<|open|>` tag {` key` `="` escaped-value `"`} `<|sep|>`, each text segment encoded on
    /// its own (docs/MODEL.md#chat-template).
    pub fn open_with(&self, tag: &str, attrs: &[(&str, &str)]) -> Vec<u32> {
        let mut v = vec![self.open];
        v.extend(self.tok.encode_ordinary(tag));
        for (key, value) in attrs {
            v.extend(self.tok.encode_ordinary(&format!(" {key}")));
            v.extend(self.tok.encode_ordinary("=\""));
            v.extend(self.tok.encode_ordinary(&escape_attr(value)));
            v.extend(self.tok.encode_ordinary("\""));
        }
        v.push(self.sep);
        v
    }

    /// `<|close|>` tag `<|sep|>`.
    pub fn close_tag(&self, tag: &str) -> Vec<u32> {
        let mut v = vec![self.close];
        v.extend(self.tok.encode_ordinary(tag));
        v.push(self.sep);
        v
    }

    /// Text as plain text: control-token spellings stay text.
    pub fn text(&self, text: &str) -> Vec<u32> {
        self.tok.encode_ordinary(text)
    }

    /// An internal system message: `open(message, role="system" type=KIND)` BODY
    /// `close(message) <|end_of_msg|>`.
    pub(crate) fn system_note(&self, kind: &str, body: &str) -> Vec<u32> {
        let mut v = self.open_with("message", &[("role", "system"), ("type", kind)]);
        v.extend(self.text(body));
        v.extend(self.close_tag("message"));
        v.push(self.eom);
        v
    }

    /// The thinking-effort system message (empty when thinking is off).
    pub fn preamble(&self, thinking: Thinking) -> Vec<u32> {
        match thinking.effort() {
            Some(effort) => self.system_note("thinking-effort", &thinking_effort_text(effort)),
            None => Vec::new(),
        }
    }

    /// One system, user or assistant message, `open(message)` through `<|end_of_msg|>`. A
    /// tool result needs its place in the conversation (tool name, index): render it with
    /// [`render_with_tools`] or [`Template::tool_result`].
    pub fn message(&self, m: &ChatMessage, thinking: Thinking) -> Result<Vec<u32>, EngineError> {
        check_fields(m)?;
        if m.role == "tool" {
            return Err(EngineError::Invalid(
                "a tool message is rendered by render_with_tools (it needs its tool name and index)".into(),
            ));
        }
        let mut attrs = vec![("role", m.role.as_str())];
        if let Some(name) = m.name.as_deref().filter(|n| !n.is_empty()) {
            attrs.push(("name", name));
        }
        let mut v = self.open_with("message", &attrs);
        if m.role == "assistant" {
            if thinking != Thinking::Off {
                v.extend(self.open_with("think", &[]));
                let reasoning = m.reasoning_content.as_deref().unwrap_or("");
                if !reasoning.trim().is_empty() {
                    v.extend(self.text(reasoning));
                }
                v.extend(self.close_tag("think"));
            }
            v.extend(self.open_with("response", &[]));
            v.extend(self.text(&m.content));
            v.extend(self.close_tag("response"));
            v.extend(self.tools_channel(&m.tool_calls)?);
        } else {
            v.extend(self.text(&m.content));
        }
        v.extend(self.close_tag("message"));
        v.push(self.eom);
        Ok(v)
    }

    /// `open(message, role="assistant")` then `open(think)`, or `open(response)` when off.
    pub fn generation_prompt(&self, thinking: Thinking) -> Vec<u32> {
        let mut v = self.open_with("message", &[("role", "assistant")]);
        v.extend(self.open_with(
            if thinking == Thinking::Off {
                "response"
            } else {
                "think"
            },
            &[],
        ));
        v
    }

    /// `close(think) open(response)`: where reasoning ends and the response begins.
    pub fn think_to_response(&self) -> Vec<u32> {
        let mut v = self.close_tag("think");
        v.extend(self.open_with("response", &[]));
        v
    }

    /// `close(response) close(message)`: the end of a reply without tool calls, before its
    /// end id.
    pub fn reply_end(&self) -> Vec<u32> {
        let mut v = self.close_tag("response");
        v.extend(self.close_tag("message"));
        v
    }

    /// `close(message)`: what follows the response channel, or the tools channel, at the end
    /// of a reply (then one of [`Template::end_ids`]).
    pub fn message_close(&self) -> Vec<u32> {
        self.close_tag("message")
    }

    /// Ids that end a reply after [`Template::reply_end`]: `<|end_of_msg|>` and EOS.
    pub fn end_ids(&self) -> Vec<u32> {
        let mut ids = vec![self.eom];
        ids.extend(self.tok.end_ids().into_iter().filter(|&e| e != self.eom));
        ids
    }
}

/// Field placement: reasoning and calls only on assistant messages, a call id only on tool
/// results; the role one of the four.
fn check_fields(m: &ChatMessage) -> Result<(), EngineError> {
    if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
        return Err(EngineError::Invalid(format!(
            "message role `{}`: use system, user, assistant or tool",
            m.role
        )));
    }
    let misplaced = if m.role != "assistant" && m.reasoning_content.is_some() {
        Some("reasoning_content")
    } else if m.role != "assistant" && !m.tool_calls.is_empty() {
        Some("tool_calls")
    } else if m.role != "tool" && m.tool_call_id.is_some() {
        Some("tool_call_id")
    } else {
        None
    };
    match misplaced {
        Some(field) => Err(EngineError::Invalid(format!(
            "a {} message has {field}: only {} messages do",
            m.role,
            if field == "tool_call_id" {
                "tool"
            } else {
                "assistant"
            }
        ))),
        None => Ok(()),
    }
}

/// Renders `messages` (preceded by the thinking-effort system message unless thinking is
/// off) and, with `add_generation_prompt`, the opening of the assistant's reply.
pub fn render(
    tok: &Tokenizer,
    messages: &[ChatMessage],
    thinking: Thinking,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, EngineError> {
    render_with_tools(tok, messages, &[], thinking, add_generation_prompt)
}

/// Renders a conversation with tools as the release's encoder does: the tool declaration
/// (when `tools` is not empty), the thinking-effort message (unless thinking is off), the
/// messages — each run of tool results ordered and named after the calls of the assistant
/// message before it — and, with `add_generation_prompt`, the opening of the reply.
pub fn render_with_tools(
    tok: &Tokenizer,
    messages: &[ChatMessage],
    tools: &[ToolSpec],
    thinking: Thinking,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, EngineError> {
    let t = Template::new(tok)?;
    let mut ids = if tools.is_empty() {
        Vec::new()
    } else {
        t.tool_declare(tools)?
    };
    ids.extend(t.preamble(thinking));
    let mut calls: &[ToolCall] = &[];
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        if m.role != "tool" {
            ids.extend(t.message(m, thinking)?);
            if m.role == "assistant" {
                calls = &m.tool_calls;
            }
            i += 1;
            continue;
        }
        let end = i + messages[i..]
            .iter()
            .take_while(|m| m.role == "tool")
            .count();
        ids.extend(t.tool_results(&messages[i..end], calls, i)?);
        i = end;
    }
    if add_generation_prompt {
        ids.extend(t.generation_prompt(thinking));
    }
    Ok(ids)
}
