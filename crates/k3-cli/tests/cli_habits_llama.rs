//! More habits users bring: llama.cpp's `-s`, `-r`, `-e`, `--n-predict`, and the
//! multi-letter `-np`, `-ub`, `-sys` (rewritten before clap, README "llama.cpp habits"); the
//! server's API key from `$K3_API_KEY` or `--api-key-file` instead of the command line (where
//! `ps` shows it); and ollama's `k3 run MODEL` with no prompt opening a chat on a terminal.

mod common;
mod serve_common;

use common::{stderr, stdout, tiny_arg as tiny};
use rexpect::process::wait::WaitStatus;
use rexpect::session::spawn_command;
use serve_common::Server;
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn k3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(args)
        .env_remove("K3_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent/k3-habits-llama-xdg")
        .stdin(Stdio::null())
        .output()
        .expect("k3 runs")
}

/// stdout of a successful run.
fn ok(o: &Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}", stderr(o));
    stdout(o)
}

#[test]
fn run_takes_seed_reverse_prompt_escapes_and_n_predict() {
    let t = tiny();
    let sampled = |seed: &[&str]| {
        let base = [
            "run",
            &t,
            "-p",
            "The train",
            "-n",
            "8",
            "--temp",
            "0.9",
            "--print-ids",
        ];
        let o = k3(&[&base[..], seed].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        stderr(&o)
            .lines()
            .find(|l| l.starts_with("generated ids"))
            .unwrap()
            .to_string()
    };
    assert_eq!(sampled(&["-s", "42"]), sampled(&["--seed", "42"]));
    assert_ne!(
        sampled(&["-s", "42"]),
        sampled(&["-s", "43"]),
        "the seed is used"
    );

    let greedy = ok(&k3(&["run", &t, "-p", "The train", "-n", "12"]), "greedy");
    let cut = greedy
        .trim_end()
        .chars()
        .skip(3)
        .take(2)
        .collect::<String>();
    let r = ok(
        &k3(&["run", &t, "-p", "The train", "-n", "12", "-r", &cut]),
        "-r",
    );
    let stop = ok(
        &k3(&["run", &t, "-p", "The train", "-n", "12", "--stop", &cut]),
        "--stop",
    );
    assert_eq!(r, stop);
    assert!(
        r.len() < greedy.len(),
        "-r {cut:?} stops early: {r:?} vs {greedy:?}"
    );
    let long = ok(
        &k3(&[
            "run",
            &t,
            "-p",
            "The train",
            "--reverse-prompt",
            &cut,
            "-n",
            "12",
        ]),
        "long",
    );
    assert_eq!(long, stop);

    let escaped = ok(
        &k3(&["run", &t, "-e", "-p", "a\\nb\\t\\x41", "-n", "4"]),
        "-e",
    );
    let literal = ok(&k3(&["run", &t, "-p", "a\nb\tA", "-n", "4"]), "literal");
    assert_eq!(escaped, literal);
    // Without -e the backslashes are prompt text: a different prompt.
    let o = k3(&["run", &t, "-p", "a\\nb", "-n", "1", "--json", "-"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let o = k3(&["run", &t, "-e", "-p", "a\\nb", "-n", "1", "--json", "-"]);
    let w: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_ne!(v["prompt_ids"], w["prompt_ids"], "-e changes the prompt");

    let n = ok(
        &k3(&["run", &t, "-p", "hi", "--n-predict", "3"]),
        "--n-predict",
    );
    assert_eq!(n, ok(&k3(&["run", &t, "-p", "hi", "-n", "3"]), "-n"));
}

#[test]
fn multi_letter_dashes_reach_their_flags() {
    let t = tiny();
    // -np and -ub are --parallel and --ubatch: 0 is refused by name.
    for flag in ["-np", "-ub"] {
        let o = k3(&["serve", &t, "--port", "0", flag, "0"]);
        assert_eq!(o.status.code(), Some(2), "{flag}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("--parallel and --ubatch must be at least 1"),
            "{flag}: {}",
            stderr(&o)
        );
    }
    let server = Server::start(&["-np", "2", "-ub", "32", "-c", "64"]);
    assert_eq!(server.get("/health").0, 200);
    drop(server);
    // -sys is --system.
    let chat = |system: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_k3"))
            .args(["chat", &t, "--thinking", "off", "-n", "6", "--no-history"])
            .args(system)
            .env_remove("K3_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"Hello\n").unwrap();
        ok(&child.wait_with_output().unwrap(), "chat")
    };
    let with_sys = chat(&["-sys", "Be brief."]);
    assert_eq!(with_sys, chat(&["--system", "Be brief."]));
    assert_ne!(with_sys, chat(&[]), "the system message is used");
}

#[test]
fn the_api_key_comes_from_the_environment_or_a_file() {
    let key = "k3-test-key-0123";
    let check = |server: &Server| {
        let (code, _) = server.get("/v1/models");
        assert_eq!(code, 401, "no key, no models");
        let r = server
            .client
            .get(format!("{}/v1/models", server.base))
            .header("authorization", format!("Bearer {key}"))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    };
    check(&Server::start_env(&["-c", "64"], &[("K3_API_KEY", key)]));
    let scratch = common::scratch_dir("habits-llama", "api-key");
    let file = scratch.join("key");
    std::fs::write(&file, format!("{key}\n")).unwrap();
    check(&Server::start(&[
        "-c",
        "64",
        "--api-key-file",
        file.to_str().unwrap(),
    ]));
    std::fs::write(&file, "\n").unwrap();
    let o = k3(&[
        "serve",
        &tiny(),
        "--port",
        "0",
        "--api-key-file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the API key file is empty"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn run_without_a_prompt_on_a_terminal_opens_a_chat() {
    // The chat history file goes to a fresh state directory, removed at the end.
    let state = common::scratch_dir("habits-llama", "state");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.args(["run", &tiny(), "-n", "3", "-t", "2"])
        .env_remove("K3_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent/k3-habits-llama-xdg")
        .env("XDG_STATE_HOME", &*state)
        .env("TERM", "xterm");
    let mut p = spawn_command(cmd, Some(60_000)).expect("k3 run starts in a pty");
    p.exp_string("k3 chat:").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("Hello").unwrap();
    p.exp_string("[length limit]").unwrap();
    p.send_line("/exit").unwrap();
    p.exp_eof().unwrap();
    match p.process.wait().unwrap() {
        WaitStatus::Exited(_, 0) => {}
        other => panic!("k3 run → chat ended with {other:?}"),
    }
    // Off a terminal the refusal stays (a script gets an error, not a prompt).
    let o = k3(&["run", &tiny()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("give a prompt"), "{}", stderr(&o));
}
