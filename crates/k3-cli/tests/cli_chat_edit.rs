//! `k3 chat` on a terminal (a real pseudo-terminal, rexpect): line editing (type, move left,
//! insert, Enter), history (Up recalls earlier entries, and the history file carries them into
//! the next chat), multi-line input (trailing `\` and `"""` blocks), `/stats` after `/undo`
//! equal to `/stats` before the undone turn, and Ctrl-D exiting 0.

use rexpect::process::wait::WaitStatus;
use rexpect::session::{spawn_command, PtySession};
use std::path::{Path, PathBuf};
use std::process::Command;

const LEFT: &str = "\x1b[D";
const UP: &str = "\x1b[A";

fn chat(history: &Path) -> PtySession {
    let tiny = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.arg("chat")
        .arg(&tiny)
        .args([
            "--thinking",
            "off",
            "--threads",
            "2",
            "-n",
            "4",
            "--history",
        ])
        .arg(history)
        .env("TERM", "xterm");
    let mut p = spawn_command(cmd, Some(30_000)).expect("k3 chat starts in a pty");
    p.exp_string("k3 chat:").unwrap();
    p.exp_string("> ").unwrap();
    p
}

/// Sends `/stats` and returns its integers (context, queued, messages, turns, reused, fed,
/// generated; timings and rates are not integers and are left out).
fn stats(p: &mut PtySession, messages: usize) -> Vec<u64> {
    keys(p, "/stats\r");
    let (_, block) = p
        .exp_regex(&format!(
            r"context[\s\S]*?messages\s+{messages} \([\s\S]*?generated \d+ tokens"
        ))
        .unwrap();
    block
        .split_whitespace()
        .filter_map(|t| t.trim_matches(['(', ')', ';']).parse().ok())
        .collect()
}

/// Types `keys` (rexpect buffers what it sends until flushed).
fn keys(p: &mut PtySession, keys: &str) {
    p.send(keys).unwrap();
    p.flush().unwrap();
}

/// `/save`s the conversation of `n` messages and returns the user messages.
fn users_saved(p: &mut PtySession, jsonl: &Path, n: usize) -> Vec<String> {
    keys(p, &format!("/save {}\r", jsonl.display()));
    p.exp_string(&format!("saved {n} messages")).unwrap();
    std::fs::read_to_string(jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect()
}

fn ctrl_d_exits_0(mut p: PtySession) {
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
    let status = p.process.wait().unwrap();
    assert!(matches!(status, WaitStatus::Exited(_, 0)), "{status:?}");
}

#[test]
fn editing_history_multiline_undo_and_ctrl_d() {
    let dir = std::env::temp_dir().join(format!("k3-chat-edit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // The history file's directory does not exist yet: chat creates it.
    let history = dir.join("state/chat_history");
    let jsonl = dir.join("t.jsonl");
    let mut p = chat(&history);

    // Editing: "Hllo", three times left, insert "e", Enter: the message is "Hello".
    keys(&mut p, &format!("Hllo{LEFT}{LEFT}{LEFT}e\r"));
    stats(&mut p, 2);
    // History: Up, Up passes "/stats" and recalls "Hello".
    keys(&mut p, &format!("{UP}{UP}\r"));
    stats(&mut p, 4);
    // A trailing backslash continues the message on the next line.
    keys(&mut p, "one \\\r");
    keys(&mut p, "two\r");
    let before = stats(&mut p, 6);
    // A """ block is one message.
    keys(&mut p, "\"\"\"\r");
    keys(&mut p, "alpha\r");
    keys(&mut p, "beta\r");
    keys(&mut p, "\"\"\"\r");
    stats(&mut p, 8);
    assert_eq!(users_saved(&mut p, &jsonl, 8)[3], "alpha\nbeta");
    // /undo: /stats is again what it was before the undone turn.
    keys(&mut p, "/undo\r");
    p.exp_string("last exchange removed").unwrap();
    assert_eq!(stats(&mut p, 6), before);

    assert_eq!(
        users_saved(&mut p, &jsonl, 6),
        ["Hello", "Hello", "one \ntwo"]
    );
    ctrl_d_exits_0(p);

    // The next chat reads the history file: Up recalls the last entry of the first chat.
    let saved = std::fs::read_to_string(&history).unwrap();
    assert!(
        saved.contains("Hello") && saved.contains("/undo"),
        "{saved}"
    );
    let _ = std::fs::remove_file(&jsonl);
    let mut p = chat(&history);
    keys(&mut p, &format!("{UP}\r"));
    p.exp_string("saved 0 messages").unwrap();
    ctrl_d_exits_0(p);
    let _ = std::fs::remove_dir_all(&dir);
}
