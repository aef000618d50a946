//! Kimi K3's XTML chat template (docs/MODEL.md#chat-template): render a conversation to token ids, parse
//! an assistant reply back into its `think` and `response` channels, and read/write the
//! JSONL history.
//!
//! Control pieces (`<|open|>`, `<|close|>`, `<|sep|>`, `<|end_of_msg|>`) are resolved by name
//! with [`Tokenizer::token_id`]; every text piece — tag names, attributes, message text — is
//! encoded with [`Tokenizer::encode_ordinary`], so text that spells a control token stays
//! plain text (no injection).
//!
//! ```text
//! open(tag, attrs)  = <|open|> tag+attrs <|sep|>        close(tag) = <|close|> tag <|sep|>
//! thinking on:  open(message, ' role="system" type="thinking-effort"') EFFORT_TEXT
//!               close(message) <|end_of_msg|>
//! per message:  open(message, ' role="ROLE"')
//!               assistant: [thinking on: open(think) REASONING close(think)]
//!                          open(response) CONTENT close(response)
//!               others:    CONTENT
//!               close(message) <|end_of_msg|>
//! generation prompt: open(message, ' role="assistant"') open(think)   (open(response) if off)
//! ```

use crate::EngineError;
use k3_tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One message of a conversation; also one line of the JSONL history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text (an assistant's `response` channel).
    pub content: String,
    /// An assistant's `think` channel, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message with no reasoning.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.into(),
            reasoning_content: None,
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

    /// `<|open|>` tag+attrs `<|sep|>`.
    pub fn open_tag(&self, tag_attrs: &str) -> Vec<u32> {
        let mut v = vec![self.open];
        v.extend(self.tok.encode_ordinary(tag_attrs));
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

    /// The thinking-effort system message (empty when thinking is off).
    pub fn preamble(&self, thinking: Thinking) -> Vec<u32> {
        let Some(effort) = thinking.effort() else {
            return Vec::new();
        };
        let mut v = self.open_tag("message role=\"system\" type=\"thinking-effort\"");
        v.extend(self.text(&thinking_effort_text(effort)));
        v.extend(self.close_tag("message"));
        v.push(self.eom);
        v
    }

    /// One message, `open(message)` through `<|end_of_msg|>`.
    pub fn message(&self, m: &ChatMessage, thinking: Thinking) -> Result<Vec<u32>, EngineError> {
        if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
            return Err(EngineError::Invalid(format!(
                "message role `{}`: use system, user or assistant",
                m.role
            )));
        }
        if m.role != "assistant" && m.reasoning_content.is_some() {
            return Err(EngineError::Invalid(format!(
                "a {} message has reasoning_content: only assistant messages do",
                m.role
            )));
        }
        let mut v = self.open_tag(&format!("message role=\"{}\"", m.role));
        if m.role == "assistant" {
            if thinking != Thinking::Off {
                v.extend(self.open_tag("think"));
                v.extend(self.text(m.reasoning_content.as_deref().unwrap_or("")));
                v.extend(self.close_tag("think"));
            }
            v.extend(self.open_tag("response"));
            v.extend(self.text(&m.content));
            v.extend(self.close_tag("response"));
        } else {
            v.extend(self.text(&m.content));
        }
        v.extend(self.close_tag("message"));
        v.push(self.eom);
        Ok(v)
    }

    /// `open(message, ' role="assistant"')` then `open(think)`, or `open(response)` when off.
    pub fn generation_prompt(&self, thinking: Thinking) -> Vec<u32> {
        let mut v = self.open_tag("message role=\"assistant\"");
        v.extend(self.open_tag(if thinking == Thinking::Off {
            "response"
        } else {
            "think"
        }));
        v
    }

    /// `close(think) open(response)`: where reasoning ends and the response begins.
    pub fn think_to_response(&self) -> Vec<u32> {
        let mut v = self.close_tag("think");
        v.extend(self.open_tag("response"));
        v
    }

    /// `close(response) close(message)`: the end of a reply, before its end id.
    pub fn reply_end(&self) -> Vec<u32> {
        let mut v = self.close_tag("response");
        v.extend(self.close_tag("message"));
        v
    }

    /// Ids that end a reply after [`Template::reply_end`]: `<|end_of_msg|>` and EOS.
    pub fn end_ids(&self) -> Vec<u32> {
        let mut ids = vec![self.eom];
        ids.extend(self.tok.end_ids().into_iter().filter(|&e| e != self.eom));
        ids
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
    let t = Template::new(tok)?;
    let mut ids = t.preamble(thinking);
    for m in messages {
        ids.extend(t.message(m, thinking)?);
    }
    if add_generation_prompt {
        ids.extend(t.generation_prompt(thinking));
    }
    Ok(ids)
}

/// Which channel a reply is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// The `think` channel (reasoning).
    Think,
    /// The `response` channel (content).
    Response,
    /// After `close(response) close(message)` and one end id: the reply is complete.
    Done,
}

/// An assistant reply split into its channels.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedReply {
    /// The `think` channel's text.
    pub reasoning: String,
    /// The `response` channel's text.
    pub content: String,
    /// The reply ended with `close(response) close(message)` + exactly one end id, nothing
    /// followed, and no control id appeared inside a payload.
    pub complete: bool,
    /// Control ids found inside the payloads (rejected by the template; decoded literally).
    pub control_ids: Vec<u32>,
}

/// Incremental reply parser: push generated ids one at a time; payload ids come out tagged
/// with their channel as soon as they cannot be the start of a channel marker.
#[derive(Clone, Debug)]
pub struct ReplyParser {
    channel: Channel,
    think_to_response: Vec<u32>,
    terminators: Vec<Vec<u32>>,
    buf: Vec<u32>,
    eom: u32,
    trailing: usize,
}

impl ReplyParser {
    /// A parser for a reply that starts in `start` (the channel the generation prompt opened).
    pub fn new(t: &Template<'_>, start: Channel) -> Self {
        let end = t.reply_end();
        let terminators = t
            .end_ids()
            .into_iter()
            .map(|e| end.iter().copied().chain([e]).collect())
            .collect();
        ReplyParser {
            channel: start,
            think_to_response: t.think_to_response(),
            terminators,
            buf: Vec::new(),
            eom: t.eom,
            trailing: 0,
        }
    }

    /// The channel the reply is in now.
    pub fn channel(&self) -> Channel {
        self.channel
    }

    fn markers(&self) -> Vec<(&[u32], Channel)> {
        match self.channel {
            Channel::Think => vec![(self.think_to_response.as_slice(), Channel::Response)],
            Channel::Response => self
                .terminators
                .iter()
                .map(|t| (t.as_slice(), Channel::Done))
                .collect(),
            Channel::Done => Vec::new(),
        }
    }

    /// Takes one generated id; returns the payload ids it releases, each with its channel.
    pub fn push(&mut self, id: u32) -> Vec<(Channel, u32)> {
        if self.channel == Channel::Done {
            self.trailing += 1;
            return Vec::new();
        }
        self.buf.push(id);
        let mut out = Vec::new();
        while !self.buf.is_empty() {
            let markers = self.markers();
            if let Some(&(_, next)) = markers.iter().find(|(m, _)| *m == self.buf.as_slice()) {
                self.channel = next;
                self.buf.clear();
                break;
            }
            if markers.iter().any(|(m, _)| m.starts_with(&self.buf)) {
                break;
            }
            out.push((self.channel, self.buf.remove(0)));
        }
        out
    }

    /// Ids that would close the reply well-formed from here (for a reply cut short by the
    /// caller or a length limit): the rest of a half-seen marker, then `close(think)
    /// open(response)` if still thinking, then `close(response) close(message) <|end_of_msg|>`.
    pub fn closing_tail(&self) -> Vec<u32> {
        let mut tail = Vec::new();
        let mut channel = self.channel;
        if channel == Channel::Think {
            let skip = if self.think_to_response.starts_with(&self.buf) {
                self.buf.len()
            } else {
                0
            };
            tail.extend_from_slice(&self.think_to_response[skip..]);
            channel = Channel::Response;
        }
        if channel == Channel::Response {
            let end = self
                .terminators
                .iter()
                .find(|t| t.last() == Some(&self.eom))
                .cloned()
                .unwrap_or_default();
            let seen = if self.channel == Channel::Response && end.starts_with(&self.buf) {
                self.buf.len()
            } else {
                0
            };
            tail.extend_from_slice(&end[seen..]);
        }
        tail
    }

    /// Ids still held as a possible marker start (payload if the reply stops here).
    pub fn held(&self) -> &[u32] {
        &self.buf
    }
}

/// Splits an assistant reply into reasoning and content. `ids` is the assistant message's
/// body as generated: optionally starting with `open(message, ' role="assistant"')`, then
/// `open(think)` or `open(response)` (without one, the text is reasoning when a
/// `close(think) open(response)` follows, else content).
pub fn parse_assistant(tok: &Tokenizer, ids: &[u32]) -> Result<ParsedReply, EngineError> {
    let t = Template::new(tok)?;
    let mut rest = ids;
    let head = t.open_tag("message role=\"assistant\"");
    if rest.starts_with(&head) {
        rest = &rest[head.len()..];
    }
    let (think, response) = (t.open_tag("think"), t.open_tag("response"));
    let start = if rest.starts_with(&think) {
        rest = &rest[think.len()..];
        Channel::Think
    } else if rest.starts_with(&response) {
        rest = &rest[response.len()..];
        Channel::Response
    } else if rest
        .windows(t.think_to_response().len())
        .any(|w| w == t.think_to_response().as_slice())
    {
        Channel::Think
    } else {
        Channel::Response
    };
    let mut p = ReplyParser::new(&t, start);
    let (mut reasoning, mut content) = (Vec::new(), Vec::new());
    let mut sort = |(c, id): (Channel, u32)| {
        if c == Channel::Think {
            reasoning.push(id)
        } else {
            content.push(id)
        }
    };
    for &id in rest {
        p.push(id).into_iter().for_each(&mut sort);
    }
    let channel = p.channel();
    p.held().iter().for_each(|&id| sort((channel, id)));
    let control_ids: Vec<u32> = reasoning
        .iter()
        .chain(&content)
        .copied()
        .filter(|&id| tok.is_special(id))
        .collect();
    Ok(ParsedReply {
        reasoning: tok.decode_lossy(&reasoning)?,
        content: tok.decode_lossy(&content)?,
        complete: channel == Channel::Done && p.trailing == 0 && control_ids.is_empty(),
        control_ids,
    })
}

/// Checks the history rules: an optional system message first, then user and assistant
/// messages alternating, starting with user; reasoning only on assistant messages.
pub fn validate_history(messages: &[ChatMessage]) -> Result<(), EngineError> {
    let start = usize::from(messages.first().is_some_and(|m| m.role == "system"));
    for (i, m) in messages.iter().enumerate().skip(start) {
        let want = if (i - start) % 2 == 0 {
            "user"
        } else {
            "assistant"
        };
        if m.role != want {
            return Err(EngineError::Invalid(format!("message {}: role `{}`, expected `{want}` (system first, then user/assistant alternating)", i + 1, m.role)));
        }
        if m.role != "assistant" && m.reasoning_content.is_some() {
            return Err(EngineError::Invalid(format!(
                "message {}: reasoning_content on a {} message",
                i + 1,
                m.role
            )));
        }
    }
    Ok(())
}

/// Parses a JSONL history (one `{"role","content","reasoning_content"?}` object per line;
/// blank lines skipped; unknown keys refused) and validates it.
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
