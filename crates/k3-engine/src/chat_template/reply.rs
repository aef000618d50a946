//! The reply channels and the id-level parsers of an assistant reply
//! (docs/MODEL.md#chat-template).

use super::{ReplyStream, Template, ToolCall};
use crate::EngineError;
use k3_tokenizer::Tokenizer;

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
    /// The reply ended with `close(response) [tools channel] close(message)` + exactly one
    /// end id, nothing followed, every marker was where the grammar puts it, and no control
    /// id appeared inside a payload (docs/MODEL.md#chat-template).
    pub complete: bool,
    /// Control ids found inside the payloads (rejected by the template; decoded literally).
    pub control_ids: Vec<u32>,
    /// The calls of the `tools` channel, in order (empty without one).
    pub tool_calls: Vec<ToolCall>,
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

/// Splits an assistant reply into reasoning, content and tool calls. `ids` is the assistant
/// message's body as generated: optionally starting with `open(message, role="assistant")`,
/// then `open(think)` or `open(response)` (without one, the text is reasoning when a
/// `close(think) open(response)` follows, else content). Malformed tool output never fails:
/// what does not parse as calls comes back as content ([`ReplyStream`]).
pub fn parse_assistant(tok: &Tokenizer, ids: &[u32]) -> Result<ParsedReply, EngineError> {
    let t = Template::new(tok)?;
    let mut rest = ids;
    let head = t.open_with("message", &[("role", "assistant")]);
    if rest.starts_with(&head) {
        rest = &rest[head.len()..];
    }
    let (think, response) = (t.open_with("think", &[]), t.open_with("response", &[]));
    let think_to_response = t.think_to_response();
    let start = if rest.starts_with(&think) {
        rest = &rest[think.len()..];
        Channel::Think
    } else if rest.starts_with(&response) {
        rest = &rest[response.len()..];
        Channel::Response
    } else if rest
        .windows(think_to_response.len())
        .any(|w| w == think_to_response.as_slice())
    {
        Channel::Think
    } else {
        Channel::Response
    };
    let mut stream = ReplyStream::new(&t, start);
    for &id in rest {
        stream.push(id);
    }
    Ok(stream.finish())
}
