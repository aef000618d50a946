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
//! With `--tools`, the tools are declared in the conversation header, the reply's calls are
//! shown as they stream and kept in the history, and `/tool RESULT` answers them one by one
//! ([`crate::chat_tools`] and `k3_engine::chat_template::tool_turns`, the reply loop in
//! `chat_reply.rs`, the slash commands in `chat_commands.rs`); `--tool-choice` forces a call
//! in each reply to a user message by constrained decoding, the think channel left free.
//!
//! `/undo` restores a snapshot of the session taken just before the last turn (in memory,
//! [`Session::to_bytes`]); older turns, whose snapshots are not kept, are undone by resetting
//! the session and re-feeding the conversation's own token prefix with the next message
//! (bit-identical: prefill equals incremental decode).

pub use crate::chat_args::ChatArgs;
use crate::chat_input::{ChatInput, Input};
use crate::chat_ranks::Said;
use crate::CliError;
use k3_engine::chat_template::ToolSpec;
use k3_engine::chat_template::{self as chat, pending_calls, ChatMessage, Template, Thinking};
use k3_engine::{Constraint, DecodeMode, Engine, ReplyStart, Sampler, Session, Tokenizer};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

#[path = "chat_commands.rs"]
mod commands;
#[path = "chat_reply.rs"]
mod reply;

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

const HELP: &str = "commands: /reset  /undo  /save PATH  /load PATH  /stats  /tools  /tool RESULT  /help  /exit  (Ctrl-C stops a reply; Ctrl-D exits)";

/// `/help`: the commands and, on a terminal, the input keys.
const LONG_HELP: &str = "\
/reset        clear the conversation (the system message is kept)
/undo         drop the last exchange (repeatable)
/save PATH    write the conversation as JSONL
/load PATH    replace the conversation with a JSONL transcript
/stats        context use, messages, speed of the last turn
/tools        the tools declared with --tools
/tool RESULT  answer the model's next pending tool call with RESULT (calls are shown as
              `→ call NAME {JSON}` and never executed); after the last one the model replies
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
    /// From --tools (declared in the conversation header).
    tools: Vec<ToolSpec>,
    /// From --tool-choice: compiled once, a clone constrains each reply to a user message.
    tool_choice: Option<Constraint>,
    /// From --think-budget.
    think_budget: Option<usize>,
    /// The MPI group this chat is one rank of (docs/DISTRIBUTED.md#chat-over-ranks).
    group: Option<std::sync::Arc<dyn k3_engine::Comm>>,
    /// What rank 0 read for the next `/load` (over ranks), instead of reading the file here.
    preloaded: Option<Result<Vec<ChatMessage>, String>>,
}

pub fn chat(args: ChatArgs, ranks: &crate::mpi_comm::Group) -> Result<(), CliError> {
    let file = k3_engine::config_file::load()?;
    let model_dir = args.model.resolve(&file)?;
    let params = args.sampling.params(&file)?;
    let thinking: Thinking = args
        .thinking
        .parse()
        .map_err(|e: k3_engine::EngineError| CliError::usage(e.to_string()))?;
    let tools = match &args.tools {
        Some(path) => k3_engine::chat_template::load_tools(path)
            .map_err(|e| CliError::usage(e.to_string()))?,
        None => Vec::new(),
    };
    let trained = crate::context::trained_context(&model_dir);
    let explicit_ctx = args.ctx.or(file.ctx);
    let ctx = explicit_ctx.unwrap_or(crate::context::default_ctx(trained));
    let max_new = args.max_new(&file);
    let mut options = args.engine.options(&file, ctx, ranks.comm())?;
    options.draft_policy = args.sampling.draft_policy(options.draft_trunk.as_deref())?;
    options.max_drafts = args.sampling.planned_drafts();
    let resident = args.engine.resident;
    args.engine.set_numerics()?;
    let engine = crate::engine_args::open_engine(&model_dir, options, resident, true)?;
    crate::engine_args::print_plan(&engine);
    let tok = crate::engine_args::tokenizer_of(&engine, &model_dir)?;
    let tpl = Template::new(tok)?;
    let session = engine.new_session(ctx)?;
    let start = match thinking {
        Thinking::Off => ReplyStart::Response,
        _ => ReplyStart::Think,
    };
    let tool_choice =
        crate::chat_tools::tool_choice(args.tool_choice.as_deref(), &tools, tok, start)?;
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
        tools,
        tool_choice,
        think_budget: args.think_budget,
        group: None,
        preloaded: None,
    };
    c.carry = c.header()?;
    let what = format!(
        "the conversation header ({} tokens), -n {max_new} and {TAIL_RESERVE} positions for closing a reply",
        c.carry.len()
    );
    let need = c.carry.len() + max_new + TAIL_RESERVE;
    crate::context::check_trained(&model_dir, trained, need, explicit_ctx, &what)?;
    check_reply_room(c.carry.len(), max_new, ctx)?;
    let group = ranks.comm();
    let follower = ranks.is_follower();
    c.group = group.clone();
    on_ctrl_c(follower)?;
    let interactive = !follower && std::io::stdin().is_terminal();
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
    // A follower reads nothing: every input is rank 0's, broadcast (crate::chat_ranks).
    let input = match follower {
        true => None,
        false => Some(ChatInput::new(interactive, history)?),
    };
    converse(&mut c, input, interactive, group.as_ref(), follower)
}

/// Ctrl-C cancels a reply at a token boundary; at the prompt, twice in a row quits (130). A
/// follower rank ignores its own: rank 0's is broadcast (docs/DISTRIBUTED.md#chat-over-ranks).
fn on_ctrl_c(follower: bool) -> Result<(), CliError> {
    ctrlc::set_handler(move || {
        if follower {
            return;
        }
        if GENERATING.load(Ordering::SeqCst) {
            CANCEL.store(true, Ordering::SeqCst);
        } else if IDLE_INTERRUPTS.fetch_add(1, Ordering::SeqCst) >= 1 {
            std::process::exit(130);
        } else {
            eprint!("\n(Ctrl-C again quits; /exit or Ctrl-D leaves cleanly)\n");
        }
    })
    .map_err(|e| CliError::runtime(format!("cannot install the Ctrl-C handler: {e}")))
}

/// The read–reply loop until end of input or `/exit`.
fn converse(
    c: &mut Chat<'_>,
    mut input: Option<ChatInput>,
    interactive: bool,
    group: Option<&std::sync::Arc<dyn k3_engine::Comm>>,
    follower: bool,
) -> Result<(), CliError> {
    loop {
        let said = match input.as_mut() {
            Some(input) => match read_line(input, interactive, group.is_some())? {
                Some(said) => said,
                None => continue,
            },
            None => Said::Eof, // replaced by rank 0's
        };
        let said = match group {
            Some(comm) => crate::chat_ranks::share(comm, (!follower).then_some(said))?,
            None => said,
        };
        let line = match said {
            Said::Eof => return Ok(()),
            Said::Line(line) => line,
            Said::Load { line, messages } => {
                c.preloaded = Some(messages);
                line
            }
        };
        if let Some(cmd) = line.strip_prefix('/') {
            if !c.command(cmd.trim())? {
                return Ok(());
            }
            continue;
        }
        c.user_turn(&line)?;
    }
}

/// The next input on rank 0 (or one process): `None` for nothing to act on (an empty line,
/// a first Ctrl-C at the prompt); a second Ctrl-C in a row exits 130.
fn read_line(
    input: &mut ChatInput,
    interactive: bool,
    over_ranks: bool,
) -> Result<Option<Said>, CliError> {
    let line = match input.read()? {
        Input::Line(line) => line,
        Input::Eof => {
            if interactive {
                println!();
            }
            return Ok(Some(Said::Eof));
        }
        Input::Interrupted => {
            if IDLE_INTERRUPTS.fetch_add(1, Ordering::SeqCst) >= 1 {
                std::process::exit(130);
            }
            eprintln!("(Ctrl-C again quits; /exit or Ctrl-D leaves cleanly)");
            return Ok(None);
        }
    };
    IDLE_INTERRUPTS.store(0, Ordering::SeqCst);
    if line.trim().is_empty() {
        return Ok(None);
    }
    Ok(Some(match over_ranks {
        true => crate::chat_ranks::said_of(line),
        false => Said::Line(line),
    }))
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
        true => k3_tokenizer::escape::escape_str(text, k3_tokenizer::escape::Style::Text),
        false => text.into(),
    }
}

impl<'e> Chat<'e> {
    /// The tool declaration, the thinking-effort message and the system message: what a fresh
    /// session starts with.
    fn header(&self) -> Result<Vec<u32>, CliError> {
        let system: Vec<ChatMessage> = self
            .messages
            .iter()
            .take(1)
            .filter(|m| m.role == "system")
            .cloned()
            .collect();
        self.render(&system)
    }

    /// `messages` as a fresh session is fed them (tools declared first).
    fn render(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, CliError> {
        let tools = &self.tools;
        Ok(chat::render_with_tools(
            self.tok,
            messages,
            tools,
            self.thinking,
            false,
        )?)
    }

    /// A user message and the reply to it (forced to call a tool under --tool-choice).
    fn user_turn(&mut self, text: &str) -> Result<(), CliError> {
        let pending = pending_calls(&self.messages);
        if let Some((_, call)) = pending.first() {
            println!(
                "(the model called {} tool(s) and waits for the result of `{}`: answer with /tool RESULT, or /undo the exchange)",
                pending.len(),
                call.name
            );
            return Ok(());
        }
        let user = ChatMessage::new("user", text);
        let ids = self.tpl.message(&user, self.thinking)?;
        let forced = self.tool_choice.clone();
        self.exchange(user, ids, forced)
    }

    /// `/tool RESULT`: answers the next pending call; after the last one the model replies.
    fn tool_result(&mut self, text: &str) -> Result<(), CliError> {
        let pending = pending_calls(&self.messages);
        let Some(&(index, call)) = pending.first() else {
            println!("(no tool call is waiting for a result)");
            return Ok(());
        };
        let name = call.name.clone();
        let message = ChatMessage {
            tool_call_id: call.id.clone(),
            name: Some(name.clone()),
            ..ChatMessage::new("tool", text)
        };
        let ids = self.tpl.tool_result(&name, index + 1, text);
        if pending.len() > 1 {
            let next = pending[1].1.name.clone();
            self.messages.push(message);
            self.carry.extend(ids);
            println!("(result of `{name}` recorded; next: /tool RESULT for `{next}`)");
            return Ok(());
        }
        self.exchange(message, ids, None)
    }

    /// One exchange: feed the new tokens (`added`'s `ids` after what is carried), stream the
    /// reply, record both messages.
    fn exchange(
        &mut self,
        added: ChatMessage,
        ids: Vec<u32>,
        constraint: Option<Constraint>,
    ) -> Result<(), CliError> {
        let mut new = self.carry.clone();
        new.extend(ids);
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
        let result = self.reply(&new, room.min(self.max_new), constraint);
        if let Ok(r) = &result {
            self.note_context_end(room, &r.tail);
        }
        GENERATING.store(false, Ordering::SeqCst);
        let reply = match result {
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
        let carry = std::mem::replace(&mut self.carry, reply.tail);
        self.turns.push(Turn {
            prefix_len: before,
            carry,
            messages_len: self.messages.len(),
            snapshot: Some(snapshot),
            stats: stats_before,
        });
        let reasoning_content = (self.thinking != Thinking::Off).then_some(reply.reasoning);
        let at = self.messages.len() + 1;
        let tool_calls = reply.calls.into_iter().enumerate();
        let tool_calls = tool_calls
            .map(|(i, call)| chat::ToolCall {
                id: Some(format!("call_{at}_{}", i + 1)),
                ..call
            })
            .collect();
        self.messages.push(added);
        self.messages.push(ChatMessage {
            reasoning_content,
            tool_calls,
            ..ChatMessage::new("assistant", reply.content)
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
}
