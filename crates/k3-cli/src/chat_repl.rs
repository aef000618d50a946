//! `k3 chat`: an interactive conversation on stdin/stdout with Kimi K3's chat template.
//!
//! Each turn feeds only the NEW tokens (the user message, the assistant generation prompt and
//! whatever closed the previous reply) into one long-lived session: the history is never
//! prefilled again. Replies stream as they decode; on a terminal the `think` channel is shown
//! dimmed unless `--hide-thinking` (piped, hidden unless `--show-thinking`), and a status line
//! on stderr covers the prefill and hidden thinking ([`crate::status`]; defaults:
//! [`crate::chat_args`]). Ctrl-C during a reply stops it at the next token
//! boundary and keeps the partial reply; at the prompt, twice in a row quits. On a terminal
//! input is line-edited with history and multi-line entries ([`crate::chat_input`]).
//!
//! `/undo` restores a snapshot of the session taken just before the last turn (in memory,
//! [`Session::to_bytes`]); older turns, whose snapshots are not kept, are undone by resetting
//! the session and re-feeding the conversation's own token prefix with the next message
//! (bit-identical: prefill equals incremental decode).

pub use crate::chat_args::ChatArgs;
use crate::chat_input::{ChatInput, Input};
use crate::status::Status;
use crate::CliError;
use k3_engine::chat_template::{
    self as chat, Channel, ChatMessage, ReplyParser, Template, Thinking,
};
use k3_engine::{DecodeMode, Engine, Sampler, Session, StopConditions, Tokenizer};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

/// Set by Ctrl-C while a reply is generated; checked between tokens.
static CANCEL: AtomicBool = AtomicBool::new(false);
/// A reply is being generated (Ctrl-C cancels it rather than counting toward quitting).
static GENERATING: AtomicBool = AtomicBool::new(false);
/// Ctrl-C presses at the prompt since the last input line.
static IDLE_INTERRUPTS: AtomicUsize = AtomicUsize::new(0);

const DIM: &str = "\x1b[2m";
const PLAIN: &str = "\x1b[0m";
/// Positions kept free after a reply for the ids that close it.
const TAIL_RESERVE: usize = 32;

const HELP: &str = "commands: /reset  /undo  /save PATH  /load PATH  /stats  /help  /exit  (Ctrl-C stops a reply; Ctrl-D exits)";

/// `/help`: the commands and, on a terminal, the input keys.
const LONG_HELP: &str = "\
/reset        clear the conversation (the system message is kept)
/undo         drop the last exchange (repeatable)
/save PATH    write the conversation as JSONL
/load PATH    replace the conversation with a JSONL transcript
/stats        context use, messages, speed of the last turn
/help         this text
/exit         leave (also /quit, or Ctrl-D on an empty line)
On a terminal: arrows and Emacs keys edit the line, Up/Down recall earlier entries (kept in the
history file), a line ending in \\ continues on the next line, and a block between two \"\"\"
lines is one message. Ctrl-C stops a reply; at the prompt it drops the line, twice quits.";

/// One exchange, as needed to undo it.
struct Turn {
    /// Session tokens before the turn; with `carry` they are the conversation's token prefix.
    prefix_len: usize,
    carry: Vec<u32>,
    messages_len: usize,
    /// The whole session before the turn (only the latest turn keeps one).
    snapshot: Option<Vec<u8>>,
    /// /stats counters before the turn, restored by /undo.
    stats: Stats,
}

/// Counters for /stats.
#[derive(Clone, Default)]
struct Stats {
    turns: usize,
    fed_new: usize,
    prefill_s: f64,
    generated: usize,
    decode_s: f64,
    reused: usize,
}

struct Chat<'e> {
    engine: &'e Engine,
    tok: &'e Tokenizer,
    tpl: Template<'e>,
    thinking: Thinking,
    show_thinking: bool,
    tty: bool,
    session: Session<'e>,
    ctx: usize,
    max_new: usize,
    /// The conversation (a system message first when there is one).
    messages: Vec<ChatMessage>,
    /// Ids to feed before the next message: the header, or what closes a cut-short reply.
    carry: Vec<u32>,
    turns: Vec<Turn>,
    /// From --temp/--top-k/… over the config file (greedy by default).
    sampler: Sampler,
    /// From --draft (speculative decoding when the trunk streams, by default).
    mode: DecodeMode,
    stats: Stats,
}

pub fn chat(args: ChatArgs) -> Result<(), CliError> {
    let file = crate::config_file::load()?;
    let model_dir = args.model.resolve(&file)?;
    let params = args.sampling.params(&file)?;
    let thinking: Thinking = args
        .thinking
        .parse()
        .map_err(|e: k3_engine::EngineError| CliError::usage(e.to_string()))?;
    let trained = crate::context::trained_context(&model_dir);
    let explicit_ctx = args.ctx.or(file.ctx);
    let ctx = explicit_ctx.unwrap_or(crate::context::default_ctx(trained));
    let max_new = args.max_new(&file);
    let mut options = args.engine.options(&file, ctx)?;
    options.draft_policy = args.sampling.draft_policy(options.draft_trunk.as_deref())?;
    let resident = args.engine.resident;
    let engine = crate::engine_args::open_engine(&model_dir, options, resident, true)?;
    crate::engine_args::print_plan(&engine);
    let tok = crate::engine_args::tokenizer_of(&engine, &model_dir)?;
    let tpl = Template::new(tok)?;
    let session = engine.new_session(ctx)?;
    let tty = std::io::stdout().is_terminal();
    let messages: Vec<ChatMessage> = args
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.clone()))
        .collect();
    let mut c = Chat {
        engine: &engine,
        tok,
        tpl,
        thinking,
        show_thinking: args.shows_thinking(tty),
        tty,
        session,
        ctx,
        max_new,
        carry: Vec::new(),
        messages,
        turns: Vec::new(),
        sampler: Sampler::new(params).map_err(CliError::from)?,
        mode: args.sampling.decode_mode(&engine),
        stats: Stats::default(),
    };
    c.carry = c.header()?;
    let what = format!(
        "the conversation header ({} tokens), -n {max_new} and {TAIL_RESERVE} positions for closing a reply",
        c.carry.len()
    );
    let need = c.carry.len() + max_new + TAIL_RESERVE;
    crate::context::check_trained(&model_dir, trained, need, explicit_ctx, &what)?;
    check_reply_room(c.carry.len(), max_new, ctx)?;
    ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) {
            CANCEL.store(true, Ordering::SeqCst);
        } else if IDLE_INTERRUPTS.fetch_add(1, Ordering::SeqCst) >= 1 {
            std::process::exit(130);
        } else {
            eprint!("\n(Ctrl-C again quits; /exit or Ctrl-D leaves cleanly)\n");
        }
    })
    .map_err(|e| CliError::runtime(format!("cannot install the Ctrl-C handler: {e}")))?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "k3 chat: {} (thinking {}). {HELP}",
            model_dir.display(),
            args.thinking
        );
    }
    let history = match (args.no_history, args.history) {
        (true, _) => None,
        (false, Some(path)) => Some(path),
        (false, None) => crate::chat_input::default_history(),
    };
    let mut input = ChatInput::new(interactive, history)?;
    loop {
        let line = match input.read()? {
            Input::Line(line) => line,
            Input::Eof => {
                if interactive {
                    println!();
                }
                return Ok(());
            }
            Input::Interrupted => {
                if IDLE_INTERRUPTS.fetch_add(1, Ordering::SeqCst) >= 1 {
                    std::process::exit(130);
                }
                eprintln!("(Ctrl-C again quits; /exit or Ctrl-D leaves cleanly)");
                continue;
            }
        };
        IDLE_INTERRUPTS.store(0, Ordering::SeqCst);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(cmd) = line.strip_prefix('/') {
            if !c.command(cmd.trim())? {
                return Ok(());
            }
            continue;
        }
        c.turn(&line)?;
    }
}

/// Refuses an `-n` that no reply could ever reach: the header, one reply of `max_new` tokens
/// and the positions kept for closing it must fit the context.
fn check_reply_room(header: usize, max_new: usize, ctx: usize) -> Result<(), CliError> {
    let need = header + max_new + TAIL_RESERVE;
    if need <= ctx {
        return Ok(());
    }
    Err(CliError::usage(format!(
        "-n {max_new} does not fit the context: the conversation header ({header} tokens), -n {max_new} and {TAIL_RESERVE} positions for closing a reply need {need} but the context has {ctx}: lower -n or raise -c/--ctx to at least {need}"
    )))
}

/// Model text as written to stdout: control characters escaped on a terminal.
fn on_screen(text: &str, tty: bool) -> std::borrow::Cow<'_, str> {
    match tty {
        true => crate::escape::escape_str(text, crate::escape::Style::Text),
        false => text.into(),
    }
}

fn flush() {
    let _ = std::io::stdout().flush();
}

impl<'e> Chat<'e> {
    /// Thinking-effort message plus the system message: what a fresh session starts with.
    fn header(&self) -> Result<Vec<u32>, CliError> {
        let system: Vec<ChatMessage> = self
            .messages
            .iter()
            .take(1)
            .filter(|m| m.role == "system")
            .cloned()
            .collect();
        Ok(chat::render(self.tok, &system, self.thinking, false)?)
    }

    /// Runs a slash command; `false` means exit.
    fn command(&mut self, cmd: &str) -> Result<bool, CliError> {
        let (name, arg) = cmd
            .split_once(char::is_whitespace)
            .map_or((cmd, ""), |(n, a)| (n, a.trim()));
        match (name, arg.is_empty()) {
            ("exit" | "quit", _) => return Ok(false),
            ("reset", _) => {
                self.session.reset();
                self.messages.truncate(usize::from(
                    self.messages.first().is_some_and(|m| m.role == "system"),
                ));
                self.carry = self.header()?;
                self.turns.clear();
                println!("(conversation cleared; system message kept)");
            }
            ("undo", _) => self.undo()?,
            ("save", false) => match chat::save_history(Path::new(arg), &self.messages) {
                Ok(()) => println!("(saved {} messages to {arg})", self.messages.len()),
                Err(e) => println!("k3: error: {e}"),
            },
            ("load", false) => self.load(Path::new(arg))?,
            ("stats", _) => self.print_stats(),
            ("help", _) => println!("{LONG_HELP}"),
            _ => println!("unknown command /{cmd}: {HELP}"),
        }
        Ok(true)
    }

    fn undo(&mut self) -> Result<(), CliError> {
        let Some(turn) = self.turns.pop() else {
            println!("(nothing to undo)");
            return Ok(());
        };
        self.messages.truncate(turn.messages_len);
        self.stats = turn.stats;
        match turn.snapshot {
            Some(bytes) => {
                self.session = self.engine.session_from_bytes(&bytes, self.ctx)?;
                self.carry = turn.carry;
                println!("(last exchange removed; session restored from its snapshot)");
            }
            None => {
                let mut prefix = self.session.tokens();
                prefix.truncate(turn.prefix_len);
                prefix.extend(turn.carry);
                self.session.reset();
                self.carry = prefix;
                println!("(last exchange removed; its history is re-fed with the next message)");
            }
        }
        Ok(())
    }

    fn load(&mut self, path: &Path) -> Result<(), CliError> {
        let msgs = match chat::load_history(path) {
            Ok(m) => m,
            Err(e) => {
                println!("k3: error: {e}");
                return Ok(());
            }
        };
        let rendered = chat::render(self.tok, &msgs, self.thinking, false)?;
        if rendered.len() + TAIL_RESERVE >= self.ctx {
            println!(
                "k3: error: {} needs {} positions; the context has {}: raise -c/--ctx",
                path.display(),
                rendered.len(),
                self.ctx
            );
            return Ok(());
        }
        // Every user message starts an undoable exchange whose prefix is the rendering before it.
        let mut turns = Vec::new();
        for (i, m) in msgs.iter().enumerate().filter(|(_, m)| m.role == "user") {
            let _ = m;
            let carry = chat::render(self.tok, &msgs[..i], self.thinking, false)?;
            turns.push(Turn {
                prefix_len: 0,
                carry,
                messages_len: i,
                snapshot: None,
                stats: self.stats.clone(),
            });
        }
        self.session.reset();
        self.turns = turns;
        self.carry = rendered;
        println!(
            "(loaded {} messages from {}; they are fed with the next message)",
            msgs.len(),
            path.display()
        );
        self.messages = msgs;
        Ok(())
    }

    fn print_stats(&self) {
        let pos = self.session.tokens().len();
        let s = &self.stats;
        println!(
            "context    {pos} / {} positions ({} more queued)",
            self.ctx,
            self.carry.len()
        );
        println!(
            "messages   {} ({} turns this run)",
            self.messages.len(),
            s.turns
        );
        println!("reused     {} positions of history never re-fed", s.reused);
        let rate = if s.decode_s > 0.0 {
            s.generated as f64 / s.decode_s
        } else {
            0.0
        };
        println!(
            "last turn  fed {} new tokens in {:.3} s; generated {} tokens in {:.3} s ({rate:.1} tokens/s)",
            s.fed_new, s.prefill_s, s.generated, s.decode_s
        );
        if self.engine.plan().is_some() {
            println!("{}", self.engine.stats().report(None));
        }
    }

    /// One exchange: feed the new tokens, stream the reply, record both messages.
    fn turn(&mut self, text: &str) -> Result<(), CliError> {
        let user = ChatMessage::new("user", text);
        let mut new = self.carry.clone();
        new.extend(self.tpl.message(&user, self.thinking)?);
        new.extend(self.tpl.generation_prompt(self.thinking));
        let before = self.session.tokens().len();
        let room = self.ctx.saturating_sub(before + new.len() + TAIL_RESERVE);
        if room == 0 {
            eprintln!(
                "k3: no room for a reply: this message needs {} positions and {TAIL_RESERVE} are kept for closing the reply, but {} of {} are free: /reset, /undo, or restart with a larger -c/--ctx",
                new.len(),
                self.ctx.saturating_sub(before),
                self.ctx
            );
            return Ok(());
        }
        let snapshot = self.session.to_bytes()?;
        let stats_before = self.stats.clone();
        CANCEL.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let result = self.reply(&new, room.min(self.max_new));
        if let Ok((_, _, tail)) = &result {
            self.note_context_end(room, tail);
        }
        GENERATING.store(false, Ordering::SeqCst);
        let (reasoning, content, tail) = match result {
            Ok(r) => r,
            Err(e) if e.exit_code() == k3_engine::EXIT_EXPERT => return Err(e.into()),
            Err(e) => {
                println!("\nk3: error: {e}");
                self.session = self.engine.session_from_bytes(&snapshot, self.ctx)?;
                self.stats = stats_before;
                return Ok(());
            }
        };
        self.turns.iter_mut().for_each(|t| t.snapshot = None);
        let prefix_len = before;
        let carry = std::mem::replace(&mut self.carry, tail);
        self.turns.push(Turn {
            prefix_len,
            carry,
            messages_len: self.messages.len(),
            snapshot: Some(snapshot),
            stats: stats_before,
        });
        let reasoning_content = (self.thinking != Thinking::Off).then_some(reasoning);
        self.messages.push(user);
        self.messages.push(ChatMessage {
            reasoning_content,
            ..ChatMessage::new("assistant", content)
        });
        self.stats.turns += 1;
        self.stats.reused += before;
        Ok(())
    }

    /// Says on stderr when the context, not `-n`, cut the reply (finish reason `length`).
    fn note_context_end(&self, room: usize, tail: &[u32]) {
        let cut = !tail.is_empty() && room < self.max_new && self.stats.generated >= room;
        if cut && !CANCEL.load(Ordering::SeqCst) {
            eprintln!(
                "k3: the reply stopped at the end of the context ({} of {} positions used, {TAIL_RESERVE} kept for closing it): /reset, /undo, or restart with a larger -c/--ctx",
                self.session.tokens().len(),
                self.ctx
            );
        }
    }

    /// Feeds `new`, generates up to `n` tokens and prints them; returns the reasoning, the
    /// content and the ids that still have to close the reply.
    fn reply(
        &mut self,
        new: &[u32],
        n: usize,
    ) -> Result<(String, String, Vec<u32>), k3_engine::EngineError> {
        let t0 = Instant::now();
        let mut status = Status::new(true);
        status.start(&format!("prefill: {} new tokens", new.len()));
        let st = &status;
        self.session
            .feed_with_progress(new, &mut |p: k3_engine::FeedProgress| st.prefill(&p))?;
        (self.stats.fed_new, self.stats.prefill_s) = (new.len(), t0.elapsed().as_secs_f64());
        let start = if self.thinking == Thinking::Off {
            Channel::Response
        } else {
            Channel::Think
        };
        let mut parser = ReplyParser::new(&self.tpl, start);
        let end_ids = self.tpl.end_ids();
        let (mut think_dec, mut resp_dec) = (self.tok.stream_decoder(), self.tok.stream_decoder());
        let (mut reasoning, mut content) = (String::new(), String::new());
        let (show, tty) = (self.show_thinking, self.tty);
        let mut shown_thinking = false;
        let mut out = std::io::stdout();
        let phase = match (start, show) {
            (Channel::Think, false) => "thinking (hidden)",
            (Channel::Think, true) => "thinking",
            _ => "generating",
        };
        status.start(&format!("{phase}: first token"));
        let mut tokens = 0usize;
        let stop = StopConditions {
            end_ids: end_ids.clone(),
            ..StopConditions::none()
        };
        let t1 = Instant::now();
        let generation =
            self.session
                .generate_with(n, self.mode, &mut self.sampler, &stop, |id| {
                    tokens += 1;
                    if end_ids.contains(&id) {
                        parser.push(id);
                        return true;
                    }
                    let pieces = parser.push(id);
                    // The line gives way to the first visible text: from then on the text is
                    // the progress.
                    let visible = pieces.iter().any(|(ch, _)| show || *ch != Channel::Think);
                    match visible {
                        true => status.clear(),
                        false => status.tokens(phase, tokens),
                    }
                    for (ch, pid) in pieces {
                        if ch == Channel::Think {
                            let piece = think_dec.push(pid).unwrap_or_default();
                            reasoning.push_str(&piece);
                            if show {
                                let _ = write!(
                                    out,
                                    "{}{}",
                                    if tty && !shown_thinking { DIM } else { "" },
                                    on_screen(&piece, tty)
                                );
                                shown_thinking = true;
                            }
                        } else {
                            let piece = resp_dec.push(pid).unwrap_or_default();
                            if shown_thinking {
                                let _ = writeln!(out, "{}", if tty { PLAIN } else { "" });
                                shown_thinking = false;
                            }
                            content.push_str(&piece);
                            let _ = write!(out, "{}", on_screen(&piece, tty));
                        }
                    }
                    let _ = out.flush();
                    !CANCEL.load(Ordering::SeqCst)
                })?;
        status.clear();
        self.stats.decode_s = t1.elapsed().as_secs_f64();
        self.stats.generated = generation.ids.len();
        // A reply that ended at an end id is closed as the model closed it; otherwise the ids
        // that close it well-formed are fed with the next message.
        let ended = generation.ids.last().is_some_and(|id| end_ids.contains(id));
        let tail = if ended {
            Vec::new()
        } else {
            parser.closing_tail()
        };
        reasoning.push_str(&think_dec.finish());
        let rest = resp_dec.finish();
        content.push_str(&rest);
        print!(
            "{}{}",
            on_screen(&rest, tty),
            if shown_thinking && tty { PLAIN } else { "" }
        );
        if !show && content.is_empty() && !reasoning.is_empty() {
            print!("[thinking only, hidden: --show-thinking shows it]");
        }
        if CANCEL.load(Ordering::SeqCst) {
            print!(" [stopped]");
        } else if !ended {
            print!(" [length limit]");
        }
        println!();
        flush();
        Ok((reasoning, content, tail))
    }
}
