//! Reading `k3 chat`'s input. On a terminal: a rustyline editor (line editing, history kept in
//! a history file, Ctrl-C and Ctrl-D as keys) and multi-line messages, either lines ending in
//! `\` (the backslash is dropped, the line break kept) or a block between two `"""` lines.
//! Not on a terminal: plain lines from stdin, exactly as they come, and no history file.

use crate::CliError;
use rustyline::error::ReadlineError;
use rustyline::history::FileHistory;
use rustyline::{Config, Editor};
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// The prompt, and the one for continuation lines.
const PROMPT: &str = "> ";
const MORE: &str = "... ";
/// Opens and closes a multi-line block.
const BLOCK: &str = "\"\"\"";
/// Entries kept in the history file.
const HISTORY_SIZE: usize = 1000;

/// One read.
pub enum Input {
    /// A whole message or command (multi-line input joined with `\n`).
    Line(String),
    /// Ctrl-C at the prompt (the entry so far is dropped).
    Interrupted,
    /// End of input: Ctrl-D on an empty line, or the end of piped stdin.
    Eof,
}

/// Where chat input comes from.
pub enum ChatInput {
    /// stdin is not a terminal.
    Piped(std::io::Stdin),
    /// stdin is a terminal.
    Terminal {
        editor: Box<Editor<(), FileHistory>>,
        /// The history file, if any.
        history: Option<PathBuf>,
    },
}

/// The default history file: `$XDG_STATE_HOME/k3/chat_history`, else
/// `~/.local/state/k3/chat_history`; `None` without either variable.
pub fn default_history() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let state = var("XDG_STATE_HOME")
        .filter(|p| p.is_absolute())
        .or_else(|| var("HOME").map(|h| h.join(".local/state")))?;
    Some(state.join("k3").join("chat_history"))
}

impl ChatInput {
    /// Piped input when `terminal` is false; otherwise an editor whose history is loaded from
    /// (and appended to) `history`. A history file that cannot be read or created is reported
    /// on stderr and chat goes on without it.
    pub fn new(terminal: bool, history: Option<PathBuf>) -> Result<ChatInput, CliError> {
        if !terminal {
            return Ok(ChatInput::Piped(std::io::stdin()));
        }
        let editor_err = |e: ReadlineError| CliError::runtime(format!("terminal input: {e}"));
        let config = Config::builder()
            .auto_add_history(false)
            .max_history_size(HISTORY_SIZE)
            .map_err(editor_err)?
            .history_ignore_dups(true)
            .map_err(editor_err)?
            .build();
        let mut editor = Editor::with_config(config).map_err(editor_err)?;
        let history = history.and_then(|path| match load_history(&mut editor, &path) {
            Ok(()) => Some(path),
            Err(e) => {
                eprintln!(
                    "k3: history file {}: {e}; this chat keeps no history file",
                    path.display()
                );
                None
            }
        });
        Ok(ChatInput::Terminal {
            editor: Box::new(editor),
            history,
        })
    }

    /// The next message or command.
    pub fn read(&mut self) -> Result<Input, CliError> {
        match self {
            ChatInput::Piped(stdin) => {
                let mut line = String::new();
                match stdin.lock().read_line(&mut line) {
                    Ok(0) => Ok(Input::Eof),
                    Ok(_) => Ok(Input::Line(line.trim_end_matches(['\n', '\r']).to_string())),
                    Err(e) => Err(CliError::runtime(format!("reading stdin: {e}"))),
                }
            }
            ChatInput::Terminal { editor, history } => {
                let entry = match read_entry(editor) {
                    Ok(entry) => entry,
                    Err(ReadlineError::Interrupted) => return Ok(Input::Interrupted),
                    Err(ReadlineError::Eof) => return Ok(Input::Eof),
                    Err(e) => return Err(CliError::runtime(format!("terminal input: {e}"))),
                };
                remember(editor, history, &entry);
                Ok(Input::Line(entry))
            }
        }
    }
}

/// Loads `path` into the editor's history, creating its directory; a missing file is fine.
fn load_history(editor: &mut Editor<(), FileHistory>, path: &Path) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    match editor.load_history(path) {
        Ok(()) => Ok(()),
        Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Adds a non-empty entry to the history and appends it to the history file at once (so a
/// killed chat loses nothing); a failed write is reported once and the file dropped.
fn remember(editor: &mut Editor<(), FileHistory>, history: &mut Option<PathBuf>, entry: &str) {
    if entry.trim().is_empty() || !matches!(editor.add_history_entry(entry), Ok(true)) {
        return;
    }
    if let Some(path) = history.as_ref() {
        if let Err(e) = editor.append_history(path) {
            eprintln!(
                "k3: history file {}: {e}; history is no longer saved",
                path.display()
            );
            *history = None;
        }
    }
}

/// One entry: a line, lines joined by trailing backslashes, or a `"""` block.
fn read_entry(editor: &mut Editor<(), FileHistory>) -> Result<String, ReadlineError> {
    let first = editor.readline(PROMPT)?;
    if let Some(rest) = first.trim_start().strip_prefix(BLOCK) {
        return read_block(editor, rest);
    }
    let mut entry = first;
    while entry.ends_with('\\') {
        entry.pop();
        entry.push('\n');
        entry.push_str(&editor.readline(MORE)?);
    }
    Ok(entry)
}

/// The rest of a `"""` block whose first line held `rest` after the opening quotes: lines up
/// to one that ends with `"""` (the quotes dropped; text before them on that line kept).
fn read_block(editor: &mut Editor<(), FileHistory>, rest: &str) -> Result<String, ReadlineError> {
    if let Some(body) = rest.strip_suffix(BLOCK) {
        return Ok(body.to_string());
    }
    let mut lines: Vec<String> = Vec::new();
    if !rest.is_empty() {
        lines.push(rest.to_string());
    }
    loop {
        let line = editor.readline(MORE)?;
        if let Some(last) = line.trim_end().strip_suffix(BLOCK) {
            if !last.is_empty() {
                lines.push(last.to_string());
            }
            return Ok(lines.join("\n"));
        }
        lines.push(line);
    }
}
