//! What the handlers and the scheduler ([`super::scheduler`]) exchange: jobs, their events and
//! summaries, the `/metrics` counters, the saved-session LRU for conversation state reuse,
//! and the per-job output that turns ids into text deltas.
//!
//! Handlers send [`Job`]s over a bounded channel; the scheduler answers each on the job's own
//! unbounded event channel. A job whose event receiver is gone (the client disconnected, its
//! response future or SSE body was dropped) is cancelled at the next step.

use k3_api::GenSettings;
use k3_engine::chat_template::{
    Channel, ReplyEvent, ReplyParser, ReplyStream, Served, Template, Thinking,
};
use k3_engine::{
    Constraint, ConstraintSpec, EngineError, ReplyStart, StopReason, StopScanner, TokenLogprob,
    Tokenizer,
};
use std::sync::atomic::AtomicU64;
use std::time::Instant;
use tokio::sync::mpsc;

/// Saved sessions kept for reuse.
pub const LRU_CAPACITY: usize = 4;

/// A chat job: how its reply is read and bounded.
#[derive(Clone, Copy, Debug)]
pub struct ChatJob {
    pub thinking: Thinking,
    /// Keep generating past the end of the reply.
    pub ignore_eos: bool,
    /// Reasoning ids at most; then the think→response transition is forced.
    pub think_budget: Option<usize>,
    /// The endpoint that queued it (`/v1/chat/completions`, `/v1/messages`).
    pub endpoint: &'static str,
    /// With tools declared: the reply is parsed for tool calls, whose ids start with this
    /// (`call_` for OpenAI, `toolu_` for Anthropic); `None`: reasoning and content only.
    pub call_id_prefix: Option<&'static str>,
}

/// What the prompt is: a chat (its reply is split into reasoning and content) or raw text.
#[derive(Clone, Copy, Debug)]
pub enum JobKind {
    Chat(ChatJob),
    Completion { ignore_eos: bool },
}

impl JobKind {
    /// The endpoint that queued it.
    pub fn endpoint(self) -> &'static str {
        match self {
            JobKind::Chat(c) => c.endpoint,
            JobKind::Completion { .. } => "/v1/completions",
        }
    }
}

/// Why a generation ended, whichever protocol names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The reply ended (its end id).
    Stop,
    /// A stop string matched (which one).
    StopSequence(String),
    /// `max_tokens` (or the context) reached.
    Length,
    /// The reply ended with tool calls.
    ToolCalls,
    /// The client left.
    Cancelled,
}

impl Finish {
    /// OpenAI's `finish_reason` (also the log line's `finish`).
    pub fn openai(&self) -> &'static str {
        match self {
            Finish::Stop | Finish::StopSequence(_) => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
            Finish::Cancelled => "cancelled",
        }
    }

    /// Anthropic's `stop_reason`.
    pub fn anthropic(&self) -> &'static str {
        match self {
            Finish::Stop | Finish::Cancelled => "end_turn",
            Finish::StopSequence(_) => "stop_sequence",
            Finish::Length => "max_tokens",
            Finish::ToolCalls => "tool_use",
        }
    }
}

/// One generation request, already rendered to token ids and checked against the context.
pub struct Job {
    /// The response's id (`chatcmpl-N`, `cmpl-N`), also in the request's log line.
    pub id: String,
    /// When the handler queued it.
    pub queued: Instant,
    pub kind: JobKind,
    pub prompt: Vec<u32>,
    pub settings: GenSettings,
    /// What the sampler enforces (docs/SERVER.md "Tools"): each choice's own copy.
    pub constraint: Option<JobConstraint>,
    /// New tokens to generate at most (already clamped to the context).
    pub max_new: usize,
    /// Which choice of the request this job generates (`n` > 1 queues one job per choice).
    pub index: usize,
    pub events: mpsc::UnboundedSender<Event>,
    /// Its place among the `--parallel` + `--queue` admitted jobs, freed when it is dropped.
    pub _admission: tokio::sync::OwnedSemaphorePermit,
}

/// A job's constraint, compiled, with the spec it was compiled from (which is what rank 0
/// sends the other ranks: docs/DISTRIBUTED.md#serve-over-ranks).
#[derive(Clone)]
pub struct JobConstraint {
    pub compiled: Constraint,
    pub spec: ConstraintSpec,
    pub start: ReplyStart,
}

/// What the worker reports for a job: the core's protocol-neutral output, which each
/// adapter (OpenAI, Anthropic) formats (docs/SERVER.md "Tools").
pub enum Event {
    /// Newly decoded text: the response channel (`content`) and the think channel.
    Delta {
        content: String,
        reasoning: String,
        /// Log-probabilities of the ids behind this delta (when the request asked).
        logprobs: Vec<TokenLogprob>,
    },
    /// Tool call `call` (0, 1, … within the reply) begins.
    ToolCallStart {
        call: usize,
        id: String,
        name: String,
    },
    /// A fragment of tool call `call`'s arguments (JSON text).
    ToolCallArguments {
        call: usize,
        fragment: String,
    },
    /// Tool call `call` is complete.
    ToolCallEnd {
        /// Both adapters close the block open at this point, so none reads it.
        #[allow(dead_code)]
        call: usize,
    },
    Done(Summary),
    Failed(String),
}

/// Counts and timings of a finished generation.
#[derive(Clone, Debug)]
pub struct Summary {
    pub finish: Finish,
    pub prompt_tokens: usize,
    pub prompt_tokens_reused: usize,
    pub completion_tokens: usize,
    pub prompt_seconds: f64,
    pub predicted_seconds: f64,
    /// From queued to picked up by the worker.
    pub queue_seconds: f64,
    /// From queued to the first generated token (0 when none was).
    pub first_token_seconds: f64,
    /// Longest wait between two of this job's tokens (0 with fewer than two).
    pub max_token_gap_seconds: f64,
    /// Sessions that shared this job's decode steps, on average (1 when it ran alone).
    pub mean_batch: f64,
    /// The generated token ids.
    pub ids: Vec<u32>,
    pub bytes_read: u64,
    pub expert_hit_rate: f64,
    /// The decode phase: passes, drafts, bytes per token (docs/SERVER.md "Drafting").
    pub decode: crate::decode_stats::DecodeStats,
}

/// Counters for `/metrics`, shared with the handlers.
#[derive(Default)]
pub struct Metrics {
    pub tokens_generated: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub prompt_tokens_reused: AtomicU64,
    /// `f64` bits of the last generation's seconds per token.
    pub seconds_per_token_bits: AtomicU64,
    pub queue_depth: AtomicU64,
    pub requests: AtomicU64,
    /// Sessions generating or prefilling now (the scheduler's batch).
    pub active_sessions: AtomicU64,
    /// `f64` bits of the longest wait between two tokens of the last finished job.
    pub max_token_gap_bits: AtomicU64,
    /// The scheduler's last step and the queue, for `GET /v1/status`.
    pub live: super::live_status::LiveStatus,
    /// Decode passes, drafts and bytes of finished requests.
    pub decode: crate::decode_stats::DecodeTotals,
}

/// Saved sessions keyed by their exact token sequence, least recently used evicted first.
pub struct Lru {
    pub capacity: usize,
    tick: u64,
    entries: Vec<(Vec<u32>, Vec<u8>, u64)>,
}

impl Lru {
    pub fn new(capacity: usize) -> Self {
        Lru {
            capacity,
            tick: 0,
            entries: Vec::new(),
        }
    }

    /// The longest saved sequence that is a strict prefix of `prompt` (at least one prompt
    /// token is left to feed, so the restored session gets fresh logits).
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(usize, &[u8])> {
        self.tick += 1;
        let tick = self.tick;
        let best = self
            .entries
            .iter_mut()
            .filter(|(k, _, _)| !k.is_empty() && k.len() < prompt.len() && prompt.starts_with(k))
            .max_by_key(|(k, _, _)| k.len())?;
        best.2 = tick;
        Some((best.0.len(), best.1.as_slice()))
    }

    pub fn insert(&mut self, key: Vec<u32>, bytes: Vec<u8>) {
        if self.capacity == 0 || key.is_empty() {
            return;
        }
        self.tick += 1;
        self.entries.retain(|(k, _, _)| *k != key);
        if self.entries.len() >= self.capacity {
            if let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].2) {
                self.entries.swap_remove(oldest);
            }
        }
        self.entries.push((key, bytes, self.tick));
    }
}

/// A fresh tool call id: `prefix`, this process's start nanoseconds and a counter, so ids
/// stay unique across requests and restarts (a history refuses a repeated id).
fn call_id(prefix: &str) -> String {
    use std::sync::atomic::Ordering;
    use std::sync::OnceLock;
    static NONCE: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let nonce = NONCE.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() ^ d.as_secs() as u32)
    });
    format!(
        "{prefix}{nonce:08x}{:06x}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The reply parser of a chat job: K3's reply grammar read by [`ReplyStream::served`]
/// (docs/MODEL.md#chat-template), so no markup reaches the text; with tools declared its
/// calls are given ids as they are released, without tools they are dropped.
struct Calls<'t> {
    stream: ReplyStream<'t>,
    /// Call ids start with this; `None`: no tools declared, calls are not returned.
    prefix: Option<&'static str>,
    /// Calls closed so far.
    closed: usize,
}

/// Turns generated ids into text deltas and tool call events: a chat reply's channels split
/// and its tools channel parsed (calls returned when the job declares tools), control ids
/// left out of the text unless `--special`, stop strings matched on the content, and a send
/// error marking the job cancelled.
pub struct Output<'t> {
    tok: &'t Tokenizer,
    /// Tracks the channel (for the thinking budget); a completion has none.
    parser: Option<ReplyParser>,
    calls: Option<Calls<'t>>,
    think: k3_tokenizer::StreamDecoder<'t>,
    content: k3_tokenizer::StreamDecoder<'t>,
    scanner: StopScanner,
    events: mpsc::UnboundedSender<Event>,
    /// The stop string that matched.
    stop_hit: Option<String>,
    /// The ids that close the think channel and open the response (chat only).
    pub think_to_response: Vec<u32>,
    pub cancelled: bool,
    /// A failed send (the client left) cancels the job at once. Off over ranks, where only
    /// rank 0's tick cancels (docs/DISTRIBUTED.md#serve-over-ranks).
    pub local_cancel: bool,
    /// When the first id was generated.
    pub first_token: Option<Instant>,
    /// The end-of-turn ids that stop the generation.
    pub end_ids: Vec<u32>,
    /// Control ids in the text are printed as their spellings (`--special`); else left out.
    show_special: bool,
}

impl<'t> Output<'t> {
    pub fn new(tok: &'t Tokenizer, job: &Job) -> Result<Self, EngineError> {
        let mut think_to_response = Vec::new();
        let mut calls = None;
        let (parser, end_ids) = match job.kind {
            JobKind::Chat(chat) => {
                let t = Template::new(tok)?;
                let start = if chat.thinking == Thinking::Off {
                    Channel::Response
                } else {
                    Channel::Think
                };
                think_to_response = t.think_to_response();
                let end_ids = if chat.ignore_eos {
                    Vec::new()
                } else {
                    t.end_ids()
                };
                let served = Served {
                    show_control: false,
                };
                calls = Some(Calls {
                    stream: ReplyStream::served(&t, start, served),
                    prefix: chat.call_id_prefix,
                    closed: 0,
                });
                (Some(ReplyParser::new(&t, start)), end_ids)
            }
            JobKind::Completion { ignore_eos: true } => (None, Vec::new()),
            JobKind::Completion { ignore_eos: false } => (None, tok.end_ids()),
        };
        Ok(Output {
            tok,
            end_ids,
            parser,
            calls,
            think: tok.stream_decoder(),
            content: tok.stream_decoder(),
            scanner: StopScanner::new(&job.settings.stop),
            events: job.events.clone(),
            stop_hit: None,
            think_to_response,
            cancelled: false,
            local_cancel: true,
            first_token: None,
            show_special: false,
        })
    }

    /// `--special`: control ids the model writes in its text are printed as their spellings
    /// instead of left out (docs/SERVER.md "Control tokens"); markup is never text.
    pub fn set_show_special(&mut self, show: bool) {
        self.show_special = show;
        if let Some(calls) = self.calls.as_mut() {
            calls.stream.set_served(Served { show_control: show });
        }
    }

    fn send(&mut self, content: String, reasoning: String, logprobs: Vec<TokenLogprob>) {
        if content.is_empty() && reasoning.is_empty() && logprobs.is_empty() {
            if self.events.is_closed() && self.local_cancel {
                self.cancelled = true;
            }
            return;
        }
        self.send_event(Event::Delta {
            content,
            reasoning,
            logprobs,
        });
    }

    fn send_event(&mut self, event: Event) {
        if self.events.send(event).is_err() && self.local_cancel {
            self.cancelled = true;
        }
    }

    /// Content text through the stop-string scanner; returns what may be sent now.
    fn scan(&mut self, piece: &str) -> String {
        let step = self.scanner.push(piece);
        if step.hit.is_some() {
            self.stop_hit = step.hit;
        }
        step.emit
    }

    /// Handles one generated id (and its log-probability, when asked); `false` stops the
    /// generation.
    pub fn on_token(&mut self, id: u32, logprob: Option<TokenLogprob>) -> bool {
        self.first_token.get_or_insert_with(Instant::now);
        let logprobs: Vec<TokenLogprob> = logprob.into_iter().collect();
        if let Some(calls) = self.calls.as_mut() {
            if let Some(p) = self.parser.as_mut() {
                p.push(id);
            }
            let events = calls.stream.push(id);
            self.reply_events(events, logprobs);
            return self.stop_hit.is_none() && !self.cancelled;
        }
        if self.end_ids.contains(&id) {
            if let Some(p) = self.parser.as_mut() {
                p.push(id);
            }
            return true; // the engine stops at its end ids
        }
        let (mut content, mut reasoning) = (String::new(), String::new());
        let payload = match self.parser.as_mut() {
            Some(p) => p.push(id),
            None => vec![(Channel::Response, id)],
        };
        for (channel, pid) in payload {
            if self.stop_hit.is_some() {
                break;
            }
            if self.tok.is_special(pid) && !self.show_special {
                continue; // a control id is not text
            }
            if channel == Channel::Think {
                reasoning.push_str(&self.think.push(pid).unwrap_or_default());
            } else {
                let piece = self.content.push(pid).unwrap_or_default();
                content.push_str(&self.scan(&piece));
            }
        }
        self.send(content, reasoning, logprobs);
        self.stop_hit.is_none() && !self.cancelled
    }

    /// Forwards what the tool-call parser released, in order: text as deltas (content
    /// through the stop scanner), each call's start (with a fresh id), argument fragments
    /// and end as tool call events.
    fn reply_events(&mut self, events: Vec<ReplyEvent>, logprobs: Vec<TokenLogprob>) {
        let (mut content, mut reasoning) = (String::new(), String::new());
        let tools = self.calls.as_ref().and_then(|c| c.prefix);
        for event in events {
            if self.stop_hit.is_some() {
                break;
            }
            let call_event = match event {
                ReplyEvent::CallStart { .. }
                | ReplyEvent::ArgumentsDelta { .. }
                | ReplyEvent::CallEnd { .. }
                    if tools.is_none() =>
                {
                    continue; // no tools declared: a call is not returned
                }
                ReplyEvent::Reasoning(text) => {
                    reasoning.push_str(&text);
                    continue;
                }
                ReplyEvent::Content(text) => {
                    let emit = self.scan(&text);
                    content.push_str(&emit);
                    continue;
                }
                ReplyEvent::Done => continue,
                ReplyEvent::CallStart { index, name } => {
                    let id = call_id(tools.unwrap_or_default());
                    Event::ToolCallStart {
                        call: index,
                        id,
                        name,
                    }
                }
                ReplyEvent::ArgumentsDelta {
                    index,
                    json_fragment,
                } => Event::ToolCallArguments {
                    call: index,
                    fragment: json_fragment,
                },
                ReplyEvent::CallEnd { index } => {
                    if let Some(calls) = self.calls.as_mut() {
                        calls.closed += 1;
                    }
                    Event::ToolCallEnd { call: index }
                }
            };
            let (c, r) = (std::mem::take(&mut content), std::mem::take(&mut reasoning));
            self.send(c, r, Vec::new());
            self.send_event(call_event);
        }
        self.send(content, reasoning, logprobs);
    }

    /// Whether the reply is in its think channel.
    pub fn thinking(&self) -> bool {
        self.parser
            .as_ref()
            .is_some_and(|p| p.channel() == Channel::Think)
    }

    /// Flushes held text and names the finish reason: `ToolCalls` when a reply that ended
    /// on its own made at least one complete call.
    pub fn finish(&mut self, reason: &StopReason) -> Finish {
        let finish = match reason {
            StopReason::Length => Finish::Length,
            StopReason::Callback if self.cancelled => Finish::Cancelled,
            _ => Finish::Stop,
        };
        if let Some(calls) = self.calls.as_mut() {
            let events = calls.stream.flush();
            let made = calls.closed > 0;
            if self.stop_hit.is_none() && !self.cancelled {
                self.reply_events(events, Vec::new());
                let scanner = std::mem::replace(&mut self.scanner, StopScanner::new(&[]));
                let rest = scanner.finish();
                self.send(rest, String::new(), Vec::new());
            }
            return match &self.stop_hit {
                Some(s) => Finish::StopSequence(s.clone()),
                None if made && finish == Finish::Stop => Finish::ToolCalls,
                None => finish,
            };
        }
        if self.stop_hit.is_none() && !self.cancelled {
            let think = std::mem::replace(&mut self.think, self.tok.stream_decoder()).finish();
            let rest = std::mem::replace(&mut self.content, self.tok.stream_decoder()).finish();
            let mut content = self.scan(&rest);
            if self.stop_hit.is_none() {
                let scanner = std::mem::replace(&mut self.scanner, StopScanner::new(&[]));
                content.push_str(&scanner.finish());
            }
            self.send(content, think, Vec::new());
        }
        match &self.stop_hit {
            Some(s) => Finish::StopSequence(s.clone()),
            None => finish,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Lru;

    #[test]
    fn lru_reuses_only_whole_strict_prefixes_and_evicts_the_oldest() {
        let mut lru = Lru::new(2);
        lru.insert(vec![1, 2], vec![12]);
        lru.insert(vec![1, 2, 3], vec![123]);
        assert_eq!(lru.lookup(&[1, 2, 3, 4]), Some((3, &[123u8][..])));
        assert_eq!(
            lru.lookup(&[1, 2, 3]),
            Some((2, &[12u8][..])),
            "never the whole prompt"
        );
        assert_eq!(lru.lookup(&[1, 3, 3]), None, "no partial prefix");
        lru.insert(vec![9], vec![9]); // evicts [1, 2, 3], the least recently used
        assert_eq!(lru.lookup(&[1, 2, 3, 4]), Some((2, &[12u8][..])));
        let mut off = Lru::new(0);
        off.insert(vec![1], vec![1]);
        assert_eq!(off.lookup(&[1, 2]), None);
    }

    #[test]
    fn digests_compare_in_constant_time_and_correctly() {
        use crate::{digest_eq, key_digest};
        assert!(digest_eq(&key_digest("k"), &key_digest("k")));
        assert!(!digest_eq(&key_digest("k"), &key_digest("k ")));
    }
}
