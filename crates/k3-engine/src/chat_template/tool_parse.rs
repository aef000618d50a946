//! The incremental reply parser with tool calls (docs/MODEL.md#chat-template): generated ids
//! in, channel text and OpenAI-style call events out.
//!
//! Markers are recognised at the id level: a marker starts with the `<|open|>` or
//! `<|close|>` control id and ends at `<|sep|>`; the text between is its tag and attributes.
//! Text that merely spells a marker is ordinary ids and stays text, so a string argument may
//! contain `<|close|>argument<|sep|>` literally. Ordinary ids are released as soon as they
//! complete a UTF-8 character; only a marker's own ids are held.
//!
//! [`ReplyStream::served`] reads a reply for an API client, which must never see the
//! template's markup: see [`Served`].

use super::markup::{attr, drain_utf8, json_string, parse_tag};
use super::tools::python_json;
use super::{Channel, ParsedReply, Template, ToolCall};
use k3_tokenizer::Tokenizer;
use serde_json::{Map, Value};

/// What one generated id released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyEvent {
    /// Text of the `think` channel.
    Reasoning(String),
    /// Text of the `response` channel (and anything that did not parse as calls).
    Content(String),
    /// A call opened: `index` counts the reply's calls from 0 (as OpenAI's
    /// `delta.tool_calls[].index`), whatever the model wrote in its `index` attribute.
    CallStart { index: usize, name: String },
    /// The next piece of the call's arguments as JSON text; a call's pieces concatenated are
    /// one JSON object, e.g. `{"city": "Paris", "days": 3}`.
    ArgumentsDelta { index: usize, json_fragment: String },
    /// The call closed (its arguments' closing `}` came in the delta before).
    CallEnd { index: usize },
    /// An end id arrived: the reply is over.
    Done,
}

/// Where the reply is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Think,
    /// After `close(think)`: `open(response)` is due.
    AfterThink,
    Response,
    /// After `close(response)`: `open(tools)` or `close(message)` is due.
    AfterResponse,
    /// Inside the tools channel, between calls.
    Tools,
    /// Inside a call, between arguments.
    Call,
    /// Inside an argument's value.
    Arg,
    /// After `close(tools)`: `close(message)` is due.
    AfterTools,
    /// After `close(message)`: an end id is due.
    AwaitEnd,
    /// The tools channel broke: everything else is content.
    Spill,
    Done,
}

/// The call being parsed.
#[derive(Debug)]
struct OpenCall {
    name: String,
    arguments: Map<String, Value>,
    /// The `{` has been sent.
    started: bool,
    /// The argument being read: key, type, and its value's ids.
    arg: Option<(String, String, Vec<u32>)>,
}

/// How a served reply ([`ReplyStream::served`]) differs from a plain one, which returns
/// whatever does not parse as text of its channel (for `k3 chat` and history parsing):
/// * a call's events are held until its `close(call)` and released together; a call the
///   tools channel broke, or that was cut short ([`ReplyStream::flush`]), is dropped with its
///   events, so every call released is complete;
/// * a marker out of place, a broken tools channel and everything after it are dropped,
///   never returned as text;
/// * a control id inside channel text is left out of the text (still counted in
///   `control_ids`) unless `show_control` (the server's `--special`) prints its spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    pub show_control: bool,
}

/// The longest marker (`<|open|>` … `<|sep|>`) accepted, in ids; a longer one is text.
const MAX_MARKER_IDS: usize = 256;

/// Incremental parser of a generated reply: [`ReplyStream::push`] each id and forward the
/// events; [`ReplyStream::finish`] gives the whole reply. Never fails: text that does not
/// parse as calls comes back as [`ReplyEvent::Content`].
#[derive(Debug)]
pub struct ReplyStream<'t> {
    tok: &'t Tokenizer,
    open: u32,
    close: u32,
    sep: u32,
    ends: Vec<u32>,
    state: State,
    /// A marker being read (its ids from the control id on).
    marker: Vec<u32>,
    /// Undecoded bytes of the current text run (an incomplete UTF-8 character).
    pending: Vec<u8>,
    /// Ids of the tools channel not yet part of a call: content again if the channel breaks.
    uncommitted: Vec<u32>,
    call: Option<OpenCall>,
    calls: Vec<ToolCall>,
    reasoning: String,
    content: String,
    control_ids: Vec<u32>,
    well_formed: bool,
    trailing: usize,
    /// Reading for an API client (see [`Served`]); `None`: a plain reply.
    served: Option<Served>,
    /// Served: the open call's events, released when it closes.
    held_call: Vec<ReplyEvent>,
}

impl<'t> ReplyStream<'t> {
    /// A parser for a reply that starts in `start` (the channel the generation prompt
    /// opened: `Think`, or `Response` with thinking off).
    pub fn new(t: &Template<'t>, start: Channel) -> Self {
        let [open, close, sep] = t.control_ids();
        ReplyStream {
            tok: t.tokenizer(),
            open,
            close,
            sep,
            ends: t.end_ids(),
            state: match start {
                Channel::Think => State::Think,
                Channel::Response => State::Response,
                Channel::Done => State::Done,
            },
            marker: Vec::new(),
            pending: Vec::new(),
            uncommitted: Vec::new(),
            call: None,
            calls: Vec::new(),
            reasoning: String::new(),
            content: String::new(),
            control_ids: Vec::new(),
            well_formed: true,
            trailing: 0,
            served: None,
            held_call: Vec::new(),
        }
    }

    /// A parser for a reply served to an API client: no markup or (unless
    /// `served.show_control`) control id reaches its text, and only complete calls are
    /// released ([`Served`]).
    pub fn served(t: &Template<'t>, start: Channel, served: Served) -> Self {
        ReplyStream {
            served: Some(served),
            ..Self::new(t, start)
        }
    }

    /// Reads the rest of the reply as served with `served`.
    pub fn set_served(&mut self, served: Served) {
        self.served = Some(served);
    }

    /// A call event: released now, or held until the call closes when served.
    fn call_event(&mut self, event: ReplyEvent, out: &mut Vec<ReplyEvent>) {
        if self.served.is_some() {
            self.held_call.push(event);
        } else {
            out.push(event);
        }
    }

    /// The reply has ended (an end id arrived).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Takes one generated id; returns what it released.
    pub fn push(&mut self, id: u32) -> Vec<ReplyEvent> {
        let mut out = Vec::new();
        self.step(id, &mut out);
        out
    }

    /// Takes several ids; returns what they released.
    pub fn push_all(&mut self, ids: &[u32]) -> Vec<ReplyEvent> {
        let mut out = Vec::new();
        for &id in ids {
            self.step(id, &mut out);
        }
        out
    }

    fn step(&mut self, id: u32, out: &mut Vec<ReplyEvent>) {
        if self.state == State::Done {
            self.trailing += 1;
            return;
        }
        if !self.marker.is_empty() {
            if id == self.sep {
                self.marker.push(id);
                let marker = std::mem::take(&mut self.marker);
                self.on_marker(marker, out);
                return;
            }
            if !self.tok.is_special(id) && self.marker.len() < MAX_MARKER_IDS {
                self.marker.push(id);
                return;
            }
            let held = std::mem::take(&mut self.marker);
            self.literal(&held, out);
        }
        if self.ends.contains(&id) {
            self.end(out);
        } else if id == self.open || id == self.close {
            self.flush_text(out);
            self.marker.push(id);
        } else {
            self.ordinary(id, out);
        }
    }

    /// An ordinary id (or a stray special one) in the current state.
    fn ordinary(&mut self, id: u32, out: &mut Vec<ReplyEvent>) {
        match self.state {
            State::Tools | State::Call | State::AfterTools => {
                let blank = self
                    .tok
                    .token_bytes(id)
                    .is_some_and(|b| b.iter().all(u8::is_ascii_whitespace));
                if blank && !self.tok.is_special(id) {
                    self.uncommitted.push(id);
                } else {
                    self.fault(&[id], out);
                }
            }
            State::Arg if !self.tok.is_special(id) => self.arg_id(id, out),
            State::Arg => self.fault(&[id], out),
            State::AfterThink => {
                self.well_formed = false;
                self.state = State::Response;
                self.text_id(id, out);
            }
            State::AfterResponse | State::AwaitEnd => {
                self.well_formed = false;
                self.text_id(id, out);
            }
            _ => self.text_id(id, out),
        }
    }

    /// An id of channel text: flagged if it is a control id, then decoded.
    fn text_id(&mut self, id: u32, out: &mut Vec<ReplyEvent>) {
        if self.tok.is_special(id) {
            self.control_ids.push(id);
            self.well_formed = false;
            if self.served.is_some_and(|s| !s.show_control) {
                return;
            }
        }
        self.pending
            .extend_from_slice(self.tok.token_bytes(id).unwrap_or("\u{FFFD}".as_bytes()));
        let text = drain_utf8(&mut self.pending, false);
        self.emit_text(text, out);
    }

    /// Ids decoded as text of the current channel, markers included (a marker out of place).
    fn literal(&mut self, ids: &[u32], out: &mut Vec<ReplyEvent>) {
        match self.state {
            State::Tools | State::Call | State::Arg | State::AfterTools => self.fault(ids, out),
            _ => {
                self.well_formed = false;
                if self.state == State::AfterThink {
                    self.state = State::Response;
                }
                if self.served.is_some() {
                    return; // markup out of place is not text
                }
                for &id in ids {
                    self.text_id(id, out);
                }
            }
        }
    }

    fn emit_text(&mut self, text: String, out: &mut Vec<ReplyEvent>) {
        if text.is_empty() || self.served.is_some() && self.state == State::Spill {
            return;
        }
        if self.state == State::Think {
            self.reasoning.push_str(&text);
            out.push(ReplyEvent::Reasoning(text));
        } else {
            self.content.push_str(&text);
            out.push(ReplyEvent::Content(text));
        }
    }

    /// Releases an incomplete character held at the end of a text run, as U+FFFD.
    fn flush_text(&mut self, out: &mut Vec<ReplyEvent>) {
        let text = drain_utf8(&mut self.pending, true);
        self.emit_text(text, out);
    }

    /// A complete marker `<|open|>`/`<|close|>` … `<|sep|>`.
    fn on_marker(&mut self, marker: Vec<u32>, out: &mut Vec<ReplyEvent>) {
        let opens = marker[0] == self.open;
        let text = self
            .tok
            .decode_lossy(&marker[1..marker.len() - 1])
            .unwrap_or_default();
        let Some((tag, attrs)) = parse_tag(&text) else {
            return self.literal(&marker, out);
        };
        let next = match (self.state, opens, tag.as_str()) {
            (State::Think, false, "think") => State::AfterThink,
            (State::Think | State::AfterThink, true, "response") => {
                self.well_formed &= self.state == State::AfterThink;
                State::Response
            }
            (State::Response, false, "response") => State::AfterResponse,
            (State::AfterThink | State::Response | State::AfterResponse, true, "tools") => {
                self.well_formed &= self.state == State::AfterResponse;
                self.uncommitted = marker;
                State::Tools
            }
            (State::AfterThink | State::Response | State::AfterResponse, false, "message") => {
                self.well_formed &= self.state == State::AfterResponse;
                State::AwaitEnd
            }
            (State::Tools, true, "call") => match attr(&attrs, "tool") {
                Some(name) if !name.is_empty() => {
                    self.start_call(name, out);
                    State::Call
                }
                _ => return self.fault(&marker, out),
            },
            (State::Tools, false, "tools") => {
                self.uncommitted.clear();
                State::AfterTools
            }
            (State::Call, true, "argument") => match attr(&attrs, "key") {
                Some(key) => {
                    let ty = attr(&attrs, "type").unwrap_or_else(|| "string".into());
                    self.start_arg(key, ty, out);
                    State::Arg
                }
                None => return self.fault(&marker, out),
            },
            (State::Call, false, "call") => {
                self.end_call(out);
                State::Tools
            }
            (State::Arg, false, "argument") => {
                self.end_arg(out);
                State::Call
            }
            (State::AfterTools, false, "message") => {
                self.uncommitted.clear();
                State::AwaitEnd
            }
            _ => return self.literal(&marker, out),
        };
        self.state = next;
    }

    /// An end id: the reply is over. Complete only right after `close(message)`.
    fn end(&mut self, out: &mut Vec<ReplyEvent>) {
        if self.state != State::AwaitEnd {
            self.well_formed = false;
        }
        self.flush_into(out);
        self.state = State::Done;
        out.push(ReplyEvent::Done);
    }

    fn start_call(&mut self, name: String, out: &mut Vec<ReplyEvent>) {
        self.uncommitted.clear();
        let start = ReplyEvent::CallStart {
            index: self.calls.len(),
            name: name.clone(),
        };
        self.call_event(start, out);
        self.call = Some(OpenCall {
            name,
            arguments: Map::new(),
            started: false,
            arg: None,
        });
    }

    /// Sends `{` or `, `, then `"KEY": `, and for a string the opening quote.
    fn start_arg(&mut self, key: String, ty: String, out: &mut Vec<ReplyEvent>) {
        let index = self.calls.len();
        let Some(call) = self.call.as_mut() else {
            return;
        };
        let lead = if call.started { ", " } else { "{" };
        let opening = (ty == "string").then(|| format!("{lead}{}: \"", json_string(&key)));
        call.started |= opening.is_some();
        call.arg = Some((key, ty, Vec::new()));
        if let Some(json_fragment) = opening {
            let delta = ReplyEvent::ArgumentsDelta {
                index,
                json_fragment,
            };
            self.call_event(delta, out);
        }
    }

    /// One id of an argument's value: a string's text is sent as it completes, JSON-escaped;
    /// any other value waits for its close.
    fn arg_id(&mut self, id: u32, out: &mut Vec<ReplyEvent>) {
        let index = self.calls.len();
        let Some((_, ty, ids)) = self.call.as_mut().and_then(|c| c.arg.as_mut()) else {
            return;
        };
        ids.push(id);
        if ty != "string" {
            return;
        }
        self.pending
            .extend_from_slice(self.tok.token_bytes(id).unwrap_or("\u{FFFD}".as_bytes()));
        let text = drain_utf8(&mut self.pending, false);
        if !text.is_empty() {
            let escaped = json_string(&text);
            let delta = ReplyEvent::ArgumentsDelta {
                index,
                json_fragment: escaped[1..escaped.len() - 1].to_string(),
            };
            self.call_event(delta, out);
        }
    }

    /// Closes the argument being read: a string's closing quote, or the whole `"KEY": VALUE`
    /// of any other type (its text as JSON, or as a string when it is not JSON).
    fn end_arg(&mut self, out: &mut Vec<ReplyEvent>) {
        let index = self.calls.len();
        let tail = drain_utf8(&mut self.pending, true);
        let tok = self.tok;
        let Some(call) = self.call.as_mut() else {
            return;
        };
        let Some((key, ty, ids)) = call.arg.take() else {
            return;
        };
        let raw = tok.decode_lossy(&ids).unwrap_or_default();
        let json_fragment = if ty == "string" {
            let escaped = json_string(&tail);
            call.arguments.insert(key, Value::String(raw));
            format!("{}\"", &escaped[1..escaped.len() - 1])
        } else {
            let value = serde_json::from_str(raw.trim()).unwrap_or(Value::String(raw));
            let lead = if call.started { ", " } else { "{" };
            call.started = true;
            let fragment = format!("{lead}{}: {}", json_string(&key), python_json(&value));
            call.arguments.insert(key, value);
            fragment
        };
        let delta = ReplyEvent::ArgumentsDelta {
            index,
            json_fragment,
        };
        self.call_event(delta, out);
    }

    /// Closes the call being read: its argument (if open), `}`, `CallEnd`.
    fn end_call(&mut self, out: &mut Vec<ReplyEvent>) {
        if self.call.as_ref().is_some_and(|c| c.arg.is_some()) {
            self.end_arg(out);
        }
        let index = self.calls.len();
        let Some(call) = self.call.take() else {
            return;
        };
        self.uncommitted.clear();
        let json_fragment = if call.started { "}" } else { "{}" }.to_string();
        let delta = ReplyEvent::ArgumentsDelta {
            index,
            json_fragment,
        };
        self.call_event(delta, out);
        out.append(&mut self.held_call);
        out.push(ReplyEvent::CallEnd { index });
        self.calls.push(ToolCall {
            id: None,
            name: call.name,
            arguments: call.arguments,
        });
    }

    /// The tools channel broke at `ids`: an open call ends with what it has, the ids not
    /// yet part of a call and `ids` come back as content, and so does the rest of the reply.
    /// Served, the open call, those ids and the rest are dropped instead.
    fn fault(&mut self, ids: &[u32], out: &mut Vec<ReplyEvent>) {
        self.well_formed = false;
        if self.served.is_some() {
            self.call = None;
            self.held_call.clear();
        }
        if self.call.is_some() {
            self.end_call(out);
        }
        let mut spill = std::mem::take(&mut self.uncommitted);
        spill.extend_from_slice(ids);
        self.state = State::Spill;
        for id in spill {
            self.text_id(id, out);
        }
    }

    /// Releases what is held (a half-read marker, an incomplete character, an open call) as
    /// if the reply stopped here; for a reply cut short. Served, the half-read marker and the
    /// open call are dropped instead.
    pub fn flush(&mut self) -> Vec<ReplyEvent> {
        let mut out = Vec::new();
        self.flush_into(&mut out);
        out
    }

    fn flush_into(&mut self, out: &mut Vec<ReplyEvent>) {
        if !self.marker.is_empty() {
            let held = std::mem::take(&mut self.marker);
            self.literal(&held, out);
        }
        if self.call.is_some() {
            self.fault(&[], out);
        }
        if self.state == State::Tools && !self.uncommitted.is_empty() {
            self.fault(&[], out);
        }
        self.flush_text(out);
    }

    /// The whole reply: its channels' text (held text included), its complete calls, and
    /// whether it was well formed and ended by exactly one end id.
    pub fn finish(mut self) -> ParsedReply {
        let mut out = Vec::new();
        self.flush_into(&mut out);
        ParsedReply {
            reasoning: self.reasoning,
            content: self.content,
            complete: self.state == State::Done
                && self.well_formed
                && self.trailing == 0
                && self.control_ids.is_empty(),
            control_ids: self.control_ids,
            tool_calls: self.calls,
        }
    }
}
