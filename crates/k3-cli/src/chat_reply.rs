//! One streamed reply of `k3 chat`: feed the turn's new ids, generate (under `--tool-choice`'s
//! constraint when the turn is forced; the think channel stays free), close the think
//! channel at `--think-budget`, and print the channels and the tool calls as they come
//! (README "Chat"). A call is printed on its own line on stdout, `→ call NAME {JSON}`,
//! bold on a terminal, and never executed.

use super::{on_screen, Chat, CANCEL, DIM, PLAIN};
use crate::status::Status;
use k3_engine::chat_template::Thinking;
use k3_engine::chat_template::{after_response_tail, cut_reply_keep, response_end};
use k3_engine::chat_template::{Channel, ReplyEvent, ReplyParser, ReplyStream, Template, ToolCall};
use k3_engine::{Constraint, EngineError, Sampler, StopConditions};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// How a tool call line starts on a terminal (bold), and on a pipe.
const CALL_TTY: &str = "\x1b[1m";

/// A finished (or cut) reply.
pub(super) struct Reply {
    pub reasoning: String,
    pub content: String,
    /// The calls that closed (a call cut short is dropped).
    pub calls: Vec<ToolCall>,
    /// Ids still to feed to close the reply well-formed (empty when the model closed it).
    pub tail: Vec<u32>,
}

/// The reply as it streams: both parsers and what the screen shows.
struct View<'t> {
    stream: ReplyStream<'t>,
    /// The channel the reply started in.
    start: Channel,
    /// Tracks the channel and gives the closing ids outside the tools channel.
    parser: ReplyParser,
    ids: Vec<u32>,
    show: bool,
    tty: bool,
    /// The dimmed thinking is on screen and not yet ended by a line break.
    thinking_open: bool,
    /// Text is on the current screen line.
    line_open: bool,
    think_tokens: usize,
    calls_done: usize,
    in_call: bool,
    /// The last thing printed was a whole call line (its line break included).
    after_call: bool,
}

impl<'t> View<'t> {
    fn new(tpl: &Template<'t>, start: Channel, show: bool, tty: bool) -> Self {
        View {
            stream: ReplyStream::new(tpl, start),
            start,
            parser: ReplyParser::new(tpl, start),
            ids: Vec::new(),
            show,
            tty,
            thinking_open: false,
            line_open: false,
            think_tokens: 0,
            calls_done: 0,
            in_call: false,
            after_call: false,
        }
    }

    /// Takes one id of the reply; returns whether it put something on screen.
    fn push(&mut self, id: u32) -> bool {
        self.ids.push(id);
        if self.parser.channel() == Channel::Think {
            self.think_tokens += 1;
        }
        self.parser.push(id);
        let events = self.stream.push(id);
        let mut visible = false;
        for ev in events {
            visible |= self.print(ev);
        }
        let _ = std::io::stdout().flush();
        visible
    }

    fn print(&mut self, ev: ReplyEvent) -> bool {
        let mut out = std::io::stdout();
        if matches!(ev, ReplyEvent::Done) || matches!(ev, ReplyEvent::Reasoning(_)) && !self.show {
            return false;
        }
        self.after_call = matches!(ev, ReplyEvent::CallEnd { .. });
        match ev {
            ReplyEvent::Reasoning(text) if self.show => {
                let dim = if self.tty && !self.thinking_open {
                    DIM
                } else {
                    ""
                };
                let _ = write!(out, "{dim}{}", on_screen(&text, self.tty));
                self.thinking_open = true;
                self.line_open = true;
            }
            ReplyEvent::Reasoning(_) | ReplyEvent::Done => return false,
            ReplyEvent::Content(text) => {
                self.end_thinking();
                let _ = write!(out, "{}", on_screen(&text, self.tty));
                self.line_open = !text.ends_with('\n');
            }
            ReplyEvent::CallStart { name, .. } => {
                self.end_thinking();
                if self.line_open {
                    let _ = writeln!(out);
                }
                let bold = if self.tty { CALL_TTY } else { "" };
                let _ = write!(out, "{bold}→ call {} ", on_screen(&name, self.tty));
                self.in_call = true;
                self.line_open = true;
            }
            ReplyEvent::ArgumentsDelta { json_fragment, .. } => {
                let _ = write!(out, "{}", on_screen(&json_fragment, self.tty));
            }
            ReplyEvent::CallEnd { .. } => {
                let _ = writeln!(out, "{}", if self.tty { PLAIN } else { "" });
                self.in_call = false;
                self.line_open = false;
                self.calls_done += 1;
            }
        }
        true
    }

    /// Ends the dimmed thinking with a line break before other text.
    fn end_thinking(&mut self) {
        if self.thinking_open {
            let _ = writeln!(std::io::stdout(), "{}", if self.tty { PLAIN } else { "" });
            self.thinking_open = false;
            self.line_open = false;
        }
    }

    /// Prints what a cut reply still held, parsing only its first `keep` ids: text, not a
    /// call cut short (marked and dropped) nor a marker cut before its `<|sep|>`.
    fn flush_cut(&mut self, tpl: &Template<'t>, keep: usize) {
        if keep < self.ids.len() {
            self.stream = ReplyStream::new(tpl, self.start);
            self.stream.push_all(&self.ids[..keep]);
        }
        if self.in_call {
            let plain = if self.tty { PLAIN } else { "" };
            let _ = write!(std::io::stdout(), "{plain} [call cut short: dropped]");
            self.in_call = false;
        }
        for ev in self.stream.flush() {
            if matches!(ev, ReplyEvent::Reasoning(_) | ReplyEvent::Content(_)) {
                self.print(ev);
            }
        }
    }
}

impl<'e> Chat<'e> {
    /// Feeds `new`, generates up to `n` tokens (constrained by `constraint` when given) and
    /// prints them; returns the reply and the ids that still have to close it.
    pub(super) fn reply(
        &mut self,
        new: &[u32],
        n: usize,
        constraint: Option<Constraint>,
    ) -> Result<Reply, EngineError> {
        let mut sampler = std::mem::replace(&mut self.sampler, Sampler::greedy());
        if let Some(c) = constraint {
            sampler = sampler.with_constraint(c);
        }
        let result = self.reply_with(new, n, &mut sampler);
        sampler.take_constraint();
        self.sampler = sampler;
        result
    }

    fn reply_with(
        &mut self,
        new: &[u32],
        n: usize,
        sampler: &mut Sampler,
    ) -> Result<Reply, EngineError> {
        let t0 = Instant::now();
        let mut status = Status::new(true);
        status.start(&format!("prefill: {} new tokens", new.len()));
        let st = &status;
        self.session
            .feed_with_progress(new, &mut |p: k3_engine::FeedProgress| st.prefill(&p))?;
        (self.stats.fed_new, self.stats.prefill_s) = (new.len(), t0.elapsed().as_secs_f64());
        let start = match self.thinking {
            Thinking::Off => Channel::Response,
            _ => Channel::Think,
        };
        let (show, tty) = (self.show_thinking, self.tty);
        let mut view = View::new(&self.tpl, start, show, tty);
        let phase = match (start, show) {
            (Channel::Think, false) => "thinking (hidden)",
            (Channel::Think, true) => "thinking",
            _ => "generating",
        };
        status.start(&format!("{phase}: first token"));
        let end_ids = self.tpl.end_ids();
        let stop = StopConditions {
            end_ids: end_ids.clone(),
            ..StopConditions::none()
        };
        let budget = self.think_budget.filter(|_| start == Channel::Think);
        let t1 = Instant::now();
        let mut generated = 0usize;
        loop {
            let mut over_budget = false;
            let left = n.saturating_sub(view.ids.len());
            let generation = self
                .session
                .generate_with(left, self.mode, sampler, &stop, |id| {
                    let visible = view.push(id);
                    if end_ids.contains(&id) {
                        return true;
                    }
                    match visible {
                        true => status.clear(),
                        false => status.tokens(phase, view.ids.len()),
                    }
                    let thinking = view.parser.channel() == Channel::Think;
                    over_budget = thinking && budget.is_some_and(|b| view.think_tokens >= b);
                    !over_budget && !CANCEL.load(Ordering::SeqCst)
                })?;
            generated += generation.ids.len();
            // Over ranks every rank takes rank 0's Ctrl-C (docs/DISTRIBUTED.md#chat-over-ranks).
            let cancelled = shared_cancel(self.group.as_ref())?;
            // `close(think) open(response)`, less any start of it the model already wrote.
            let mut forced = self.tpl.think_to_response();
            let held = view.parser.held();
            forced.drain(
                ..if forced.starts_with(held) {
                    held.len()
                } else {
                    0
                },
            );
            if !over_budget || cancelled || view.ids.len() + forced.len() > n {
                break;
            }
            // The think budget is spent: close the think channel as the model would have.
            self.session.feed(&forced)?;
            if let Some(mut c) = sampler.take_constraint() {
                forced.iter().try_for_each(|&id| c.advance(id))?;
                *sampler = std::mem::replace(sampler, Sampler::greedy()).with_constraint(c);
            }
            forced.iter().for_each(|&id| {
                view.push(id);
            });
        }
        status.clear();
        self.stats.decode_s = t1.elapsed().as_secs_f64();
        self.stats.generated = generated;
        if let Some(why) = sampler.constraint_failure() {
            eprintln!("k3: --tool-choice: {why}");
        }
        Ok(self.finish(view, &end_ids))
    }

    /// Closes the screen line and works out what the reply holds and what still closes it.
    fn finish(&self, mut view: View<'e>, end_ids: &[u32]) -> Reply {
        let ended = view.ids.last().is_some_and(|id| end_ids.contains(id));
        let response_end = response_end(&self.tpl, self.thinking, &view.ids);
        let tail = match (ended, response_end) {
            (true, _) => Vec::new(),
            (false, Some(at)) => after_response_tail(&self.tpl, self.tok, &view.ids[at..]),
            (false, None) => view.parser.closing_tail(),
        };
        if !ended {
            let keep = cut_reply_keep(&self.tpl, &view.ids, response_end);
            view.flush_cut(&self.tpl, keep);
        }
        let calls_done = view.calls_done;
        let (show, tty, thinking_open) = (view.show, view.tty, view.thinking_open);
        let mut parsed = view.stream.finish();
        parsed.tool_calls.truncate(calls_done);
        let mut out = std::io::stdout();
        if thinking_open && tty {
            let _ = write!(out, "{PLAIN}");
        }
        let nothing_shown = parsed.content.is_empty() && parsed.tool_calls.is_empty();
        if !show && nothing_shown && !parsed.reasoning.is_empty() {
            let _ = write!(out, "[thinking only, hidden: --show-thinking shows it]");
        }
        if CANCEL.load(Ordering::SeqCst) {
            let _ = write!(out, " [stopped]");
        } else if !ended {
            let _ = write!(out, " [length limit]");
        }
        if !(view.after_call && ended && !CANCEL.load(Ordering::SeqCst)) {
            let _ = writeln!(out);
        }
        let _ = out.flush();
        Reply {
            reasoning: parsed.reasoning,
            content: parsed.content,
            calls: parsed.tool_calls,
            tail,
        }
    }
}

/// Rank 0's Ctrl-C flag, stored on every rank (one process: its own).
fn shared_cancel(group: Option<&std::sync::Arc<dyn k3_engine::Comm>>) -> Result<bool, EngineError> {
    let mine = CANCEL.load(Ordering::SeqCst);
    let shared =
        crate::chat_ranks::share_flag(group, mine).map_err(|e| EngineError::Invalid(e.message))?;
    CANCEL.store(shared, Ordering::SeqCst);
    Ok(shared)
}
