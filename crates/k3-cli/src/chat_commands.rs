//! `k3 chat`'s slash commands (README "Chat"): `/reset`, `/undo`, `/save`, `/load`, `/stats`,
//! `/tools`, `/tool RESULT`, `/help`, `/exit`.

use super::{Chat, Turn, HELP, LONG_HELP, TAIL_RESERVE};
use crate::CliError;
use k3_engine::chat_template as chat;
use std::path::Path;

impl<'e> Chat<'e> {
    /// Runs a slash command; `false` means exit.
    pub(super) fn command(&mut self, cmd: &str) -> Result<bool, CliError> {
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
            // rank 0 alone writes files
            ("save", false) if self.group.as_ref().is_some_and(|c| c.rank() > 0) => {}
            ("save", false) => match chat::save_history(Path::new(arg), &self.messages) {
                Ok(()) => println!("(saved {} messages to {arg})", self.messages.len()),
                Err(e) => println!("k3: error: {e}"),
            },
            ("load", false) => self.load(Path::new(arg))?,
            ("stats", _) => self.print_stats(),
            ("tools", _) => println!("{}", crate::chat_tools::list(&self.tools)),
            ("tool", false) => self.tool_result(arg)?,
            ("tool", true) => println!("usage: /tool RESULT (the text the pending call returned)"),
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
        let loaded = match self.preloaded.take() {
            Some(loaded) => loaded,
            None => chat::load_history(path).map_err(|e| e.to_string()),
        };
        let msgs = match loaded {
            Ok(m) => m,
            Err(e) => {
                println!("k3: error: {e}");
                return Ok(());
            }
        };
        let rendered = match self.render(&msgs) {
            Ok(r) => r,
            Err(e) => {
                println!("k3: error: {}: {}", path.display(), e.message);
                return Ok(());
            }
        };
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
            let carry = self.render(&msgs[..i])?;
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
}
