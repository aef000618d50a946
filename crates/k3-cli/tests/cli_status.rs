//! Progress on long work, through a real pseudo-terminal: `k3 chat` draws a status
//! line on stderr while it prefills a turn, then shows the thinking dimmed by default before
//! any response token (`--hide-thinking` hides it, and the status line counts the hidden
//! thinking instead); `k3 run` draws the prefill status line too. Piped, none of it appears,
//! and on a terminal a phase shorter than a second draws nothing; with its text redirected,
//! `k3 run` keeps a `generating` line while it decodes.

mod common;

use common::tiny_arg as tiny;
use rexpect::process::wait::WaitStatus;
use rexpect::session::{spawn_command, PtySession};
use std::process::Command;

const DIM: &str = "\x1b[2m";

fn pty(args: &[&str]) -> PtySession {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.args(args)
        .env_remove("K3_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent/k3-status-xdg")
        .env("XDG_RUNTIME_DIR", common::test_runtime_dir())
        .env("TERM", "xterm")
        // Draw at once: the tiny model's phases last milliseconds (the default waits 1 s).
        .env("K3_STATUS_DELAY_MS", "0");
    spawn_command(cmd, Some(60_000)).expect("k3 starts in a pty")
}

fn exits_0(p: &mut PtySession) {
    p.exp_eof().unwrap();
    match p.process.wait().unwrap() {
        WaitStatus::Exited(_, 0) => {}
        other => panic!("ended with {other:?}"),
    }
}

#[test]
fn chat_shows_a_status_line_then_dimmed_thinking() {
    let t = tiny();
    let mut p = pty(&["chat", &t, "-n", "6", "-t", "2", "--no-history"]);
    p.exp_string("(thinking low)").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("Hello").unwrap();
    p.exp_string("prefill: ").unwrap();
    // The thinking, dimmed, comes before the reply ends (the tiny model's random weights
    // think through all 6 tokens; any response token would follow the dimmed block).
    let before = p.exp_string(DIM).unwrap();
    assert!(!before.contains("[length limit]"), "{before:?}");
    p.exp_string("[length limit]").unwrap();
    p.send_line("/exit").unwrap();
    exits_0(&mut p);

    let mut p = pty(&[
        "chat",
        &t,
        "-n",
        "6",
        "-t",
        "2",
        "--no-history",
        "--hide-thinking",
    ]);
    p.exp_string("> ").unwrap();
    p.send_line("Hello").unwrap();
    let shown = p.exp_string("[thinking only, hidden").unwrap();
    assert!(
        !shown.contains(DIM),
        "hidden thinking is not printed: {shown:?}"
    );
    assert!(
        shown.contains("thinking (hidden): "),
        "the status line counts it: {shown:?}"
    );
    p.send_line("/exit").unwrap();
    exits_0(&mut p);
}

#[test]
fn run_shows_a_prefill_status_line_on_a_terminal_only() {
    let t = tiny();
    let mut p = pty(&["run", &t, "--ids", "637,229,263", "-n", "3", "-t", "2"]);
    p.exp_string("prefill: ").unwrap();
    p.exp_string("stopped:").unwrap();
    exits_0(&mut p);
    // Without the test's zero delay the millisecond prefill draws nothing.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.args(["run", &t, "--ids", "637,229,263", "-n", "3", "-t", "2"]);
    let mut p = spawn_command(cmd, Some(60_000)).expect("k3 starts in a pty");
    let all = p.exp_eof().unwrap();
    assert!(!all.contains("prefill: "), "{all:?}");
    let o = common::k3(&["run", &t, "--ids", "637,229,263", "-n", "3", "-t", "2"]);
    assert!(o.status.success());
    assert!(
        !common::stderr(&o).contains("prefill: "),
        "{}",
        common::stderr(&o)
    );
}

#[test]
fn run_with_its_text_redirected_keeps_a_generating_line() {
    let out = std::env::temp_dir().join(format!("k3-status-redirect-{}.txt", std::process::id()));
    let line = format!(
        "exec '{}' run '{}' --ids 637,229,263 -n 64 --ignore-eos -t 2 > '{}'",
        env!("CARGO_BIN_EXE_k3"),
        tiny(),
        out.display()
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &line])
        .env_remove("K3_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent/k3-status-xdg")
        .env("TERM", "xterm")
        .env("K3_STATUS_DELAY_MS", "0");
    let mut p = spawn_command(cmd, Some(60_000)).expect("k3 starts in a pty");
    p.exp_string("generating: ").unwrap();
    p.exp_string("stopped: length limit").unwrap();
    exits_0(&mut p);
    let text = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    assert!(
        !text.contains("generating"),
        "the status line stays off stdout: {text:?}"
    );
    assert!(text.ends_with('\n') && text.len() > 1, "{text:?}");
}

/// `k3 serve` on a terminal keeps a status line under its log: `idle` at start, a request's
/// generation while it runs (a 40-token reply on the tiny model spans many scheduler steps),
/// and the request's log line printed above the line.
#[test]
fn serve_shows_a_status_line_under_its_log() {
    let t = tiny();
    let mut p = pty(&["serve", &t, "--port", "0", "-t", "2"]);
    let (_, port) = p
        .exp_regex(r"listening on http://127\.0\.0\.1:(\d+)")
        .unwrap();
    let port: u16 = port
        .rsplit(':')
        .next()
        .unwrap()
        .trim()
        .parse()
        .expect("a port");
    p.exp_string("k3 serve: idle, 0 queued").unwrap();
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let request = std::thread::spawn(move || {
        reqwest::blocking::Client::new()
            .post(url)
            .body(r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":40,"ignore_eos":true}"#)
            .send()
            .map(|r| r.status().as_u16())
    });
    p.exp_string(" generating (").unwrap();
    p.exp_string("request chatcmpl-").unwrap();
    p.exp_string("k3 serve: idle").unwrap();
    assert_eq!(request.join().unwrap().unwrap(), 200);
    p.process
        .kill(rexpect::process::signal::Signal::SIGTERM)
        .unwrap();
}
