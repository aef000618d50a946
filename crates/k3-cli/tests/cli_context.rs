//! Context limits: a prompt plus `-n` that cannot fit `-c` is refused before anything is fed
//! (exit 2, naming both numbers and the flags to change), a run that fits exactly ends with
//! finish reason `length`, and `k3 chat` stops a reply at the end of its context with exit 0
//! and the reason on stderr.

use std::io::Write;
use std::process::{Command, Output, Stdio};

mod common;
use common::{k3, tiny_arg as tiny};

const PROMPT: &str = "637,229,263,638,730,42,197";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn refused(o: &Output, needles: &[&str]) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(o.stdout.is_empty(), "nothing printed: {}", text(&o.stdout));
    for n in needles {
        assert!(err.contains(n), "{n:?} in {err}");
    }
}

#[test]
fn n_beyond_the_context_is_refused_up_front() {
    let t = tiny();
    refused(
        &k3(&["run", &t, "--ids", PROMPT, "-n", "4", "-c", "10"]),
        &[
            "the prompt (7 tokens) and -n 4 need 11 positions but the context has 10",
            "lower -n or raise -c/--ctx to at least 11",
        ],
    );
    // A text prompt is counted once tokenized.
    refused(
        &k3(&["run", &t, "-p", "hi", "-n", "4", "-c", "3"]),
        &["the prompt (2 tokens) and -n 4 need 6 positions but the context has 3"],
    );
}

#[test]
fn a_run_that_fits_exactly_ends_with_length() {
    let json = std::env::temp_dir().join(format!("k3-ctx-exact-{}.json", std::process::id()));
    let o = k3(&[
        "run",
        &tiny(),
        "--ids",
        PROMPT,
        "-n",
        "4",
        "-c",
        "11",
        "--ignore-eos",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(r["generated_ids"], serde_json::json!([391, 655, 292, 730]));
    assert_eq!(r["stop_reason"], "length");
    assert!(text(&o.stderr).contains("stopped: length limit"));
}

#[test]
fn a_loaded_session_counts_toward_the_context() {
    let s = std::env::temp_dir().join(format!("k3-ctx-session-{}.k3ss", std::process::id()));
    let f = s.to_str().unwrap();
    let t = tiny();
    let o = k3(&["run", &t, "--ids", PROMPT, "-n", "4", "--save-session", f]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = k3(&[
        "run",
        &t,
        "--load-session",
        f,
        "--ids",
        "42",
        "-n",
        "4",
        "-c",
        "12",
    ]);
    let _ = std::fs::remove_file(&s);
    refused(
        &o,
        &["the loaded session (11 tokens), the prompt (1 tokens) and -n 4 need 16 positions but the context has 12"],
    );
}

fn chat(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(["chat", &tiny(), "--thinking", "off", "-t", "2"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn chat_refuses_an_n_no_reply_can_reach() {
    let o = chat(&["-n", "5000", "-c", "4096"], b"");
    refused(
        &o,
        &[
            "-n 5000 does not fit the context",
            "the context has 4096",
            "-c/--ctx",
        ],
    );
}

#[test]
fn chat_stops_at_the_end_of_the_context() {
    // Each turn adds ~47 tokens; 32 positions stay free for closing a reply. The first reply
    // gets what is left of 90 (less than -n 40), the second message finds no room.
    let o = chat(&["-n", "40", "-c", "90"], b"hi\nhello there\n");
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(out.contains("[length limit]"), "{out}");
    assert!(
        err.contains("the reply stopped at the end of the context")
            && err.contains("of 90 positions used"),
        "{err}"
    );
    assert!(err.contains("no room for a reply"), "{err}");
    assert!(!err.contains("error"), "{err}");
}
