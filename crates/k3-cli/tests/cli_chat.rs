//! `k3 chat` driven through a real pseudo-terminal (rexpect): it answers, `/undo`, `/reset`,
//! `/save` and `/load` work, Ctrl-C stops a reply without losing the conversation, `/exit`
//! exits 0. Also the piped (non-terminal) mode and EOF. Every expectation has a timeout.

use rexpect::process::wait::WaitStatus;
use rexpect::session::spawn_command;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn tiny() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny-k3")
        .to_string_lossy()
        .into_owned()
}

fn k3_chat(extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.args(["chat", &tiny(), "--thinking", "off", "--threads", "2"])
        .args(extra);
    cmd
}

#[test]
fn chat_through_a_pty() {
    let jsonl = std::env::temp_dir().join(format!("k3-chat-pty-{}.jsonl", std::process::id()));
    let jsonl_s = jsonl.to_string_lossy().into_owned();
    let cmd = k3_chat(&[
        "--system",
        "Be brief.",
        "--max-new",
        "4000",
        "--ctx",
        // Room for the whole transcript at /load however many tokens the Ctrl-C'd reply got
        // (the greedy "Hello" reply runs ~1900 tokens; a fast machine reaches ~1600 before
        // the Ctrl-C lands, and the re-rendered history then needs ~9100 positions).
        "32768",
    ]);
    let mut p = spawn_command(cmd, Some(60_000)).expect("k3 chat starts in a pty");
    p.exp_string("k3 chat:").unwrap();
    p.exp_string("> ").unwrap();

    // It answers a message (greedy on the tiny model: this reply ends at an end id).
    p.send_line("ok").unwrap();
    p.send_line("/stats").unwrap();
    p.exp_regex(r"messages\s+3 ").unwrap();

    // /undo drops the exchange (snapshot restore), /stats agrees.
    p.send_line("/undo").unwrap();
    p.exp_string("last exchange removed; session restored from its snapshot")
        .unwrap();
    p.send_line("/stats").unwrap();
    p.exp_regex(r"context\s+0 / 32768").unwrap();
    p.exp_regex(r"messages\s+1 ").unwrap();

    // Ctrl-C stops a long reply (greedy "Hello" runs for ~1900 tokens) and keeps the turn.
    p.send_line("Hello").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(400));
    p.send_control('c').unwrap();
    p.exp_string("[stopped]").unwrap();
    p.send_line("/stats").unwrap();
    p.exp_regex(r"messages\s+3 ").unwrap();

    // The next turn feeds only its new tokens: the history is reused.
    p.send_line("ok").unwrap();
    p.send_line("/stats").unwrap();
    p.exp_regex(r"messages\s+5 ").unwrap();
    p.exp_regex(r"last turn\s+fed [1-9][0-9]? new tokens")
        .unwrap();

    // /save writes the transcript as JSONL.
    p.send_line(&format!("/save {jsonl_s}")).unwrap();
    p.exp_string("saved 5 messages").unwrap();
    let text = std::fs::read_to_string(&jsonl).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let roles: Vec<&str> = lines.iter().map(|v| v["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
    assert_eq!(lines[0]["content"], "Be brief.");
    assert_eq!(
        (lines[1]["content"].as_str(), lines[3]["content"].as_str()),
        (Some("Hello"), Some("ok"))
    );

    // /reset keeps the system message.
    p.send_line("/reset").unwrap();
    p.exp_string("conversation cleared").unwrap();
    p.send_line("/stats").unwrap();
    p.exp_regex(r"messages\s+1 ").unwrap();

    // /load brings the transcript back.
    p.send_line(&format!("/load {jsonl_s}")).unwrap();
    p.exp_string("loaded 5 messages").unwrap();
    // Undoing a loaded exchange re-feeds the history before it from its tokens.
    p.send_line("/undo").unwrap();
    p.exp_string("its history is re-fed with the next message")
        .unwrap();
    p.send_line("/stats").unwrap();
    p.exp_regex(r"messages\s+3 ").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
    let status = p.process.wait().unwrap();
    let _ = std::fs::remove_file(&jsonl);
    assert!(matches!(status, WaitStatus::Exited(_, 0)), "{status:?}");
}

#[test]
fn piped_stdin_and_eof() {
    let mut child = k3_chat(&["--max-new", "16"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Hello\n/stats\n/bogus\n")
        .unwrap(); // then EOF
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("messages   2 "), "{stdout}");
    assert!(stdout.contains("unknown command /bogus"), "{stdout}");
    assert!(
        !stdout.contains("> "),
        "no prompt when stdin is not a terminal: {stdout}"
    );
}

#[test]
fn bad_thinking_flag_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(["chat", &tiny(), "--thinking", "medium"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("thinking effort `medium`"));
}
