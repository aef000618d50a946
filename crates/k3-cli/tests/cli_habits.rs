//! Flags users bring from llama.cpp: `-m/--model`, `-p/--prompt`, a positional prompt,
//! `-f FILE` with `-` for stdin, `-t`, `-c/--ctx-size`, `-n` on `run` and `chat`, `tokenize
//! --decode` with `--show-tokens`, and the config file's `model` for `chat` and `serve`.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::{k3, tiny_arg as tiny};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts success with text on stdout and no `generated ids` there; returns stdout.
fn ok_text(o: &Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.len() > 1 && out.ends_with('\n'), "{what}: {out:?}");
    assert!(!out.contains("generated ids"), "{what}: {out:?}");
    out
}

/// `k3 ARGS` with `stdin` piped in.
fn k3_stdin(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("k3 runs");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// A config file naming the tiny model.
fn config_with_model(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("k3-habits-{}-{name}.toml", std::process::id()));
    std::fs::write(&p, format!("model = {:?}\n", tiny())).unwrap();
    p
}

#[test]
fn llama_cpp_spellings_run() {
    let t = tiny();
    let short = k3(&[
        "run", "-m", &t, "-p", "hi", "-n", "4", "-t", "2", "-c", "64",
    ]);
    let long = k3(&[
        "run",
        "--model",
        &t,
        "--prompt",
        "hi",
        "--gen",
        "4",
        "--threads",
        "2",
        "--ctx-size",
        "64",
    ]);
    let want = ok_text(&short, "-m -p -n -t -c");
    assert_eq!(ok_text(&long, "long spellings"), want);
    // A positional prompt after MODEL_DIR, and after -m DIR.
    let positional = k3(&["run", &t, "hi", "-n", "4"]);
    assert_eq!(ok_text(&positional, "k3 run MODEL \"hi\""), want);
    let after_m = k3(&["run", "-m", &t, "hi", "-n", "4"]);
    assert_eq!(ok_text(&after_m, "k3 run -m MODEL \"hi\""), want);
    // The default -n.
    ok_text(&k3(&["run", &t, "hi"]), "k3 run MODEL \"hi\"");
}

#[test]
fn prompt_file_dash_reads_stdin() {
    let t = tiny();
    let piped = k3_stdin(&["run", &t, "-f", "-", "-n", "4"], b"hi\n");
    let want = ok_text(&k3(&["run", &t, "-p", "hi\n", "-n", "4"]), "-p");
    assert_eq!(ok_text(&piped, "echo hi | k3 run MODEL -f -"), want);
    let file = std::env::temp_dir().join(format!("k3-habits-{}.txt", std::process::id()));
    std::fs::write(&file, b"hi\n").unwrap();
    let alias = k3(&["run", &t, "--file", file.to_str().unwrap(), "-n", "4"]);
    let _ = std::fs::remove_file(&file);
    assert_eq!(ok_text(&alias, "--file FILE"), want);
}

#[test]
fn chat_takes_dash_n_and_the_config_model() {
    let cfg = config_with_model("chat");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.args([
        "chat",
        "--thinking",
        "off",
        "-t",
        "2",
        "-n",
        "3",
        "-c",
        "256",
    ])
    .env("K3_CONFIG", &cfg)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"Hello\n").unwrap();
    let o = child.wait_with_output().unwrap();
    let _ = std::fs::remove_file(&cfg);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // Greedy "Hello" runs long: -n 3 cuts it.
    assert!(
        text(&o.stdout).contains("[length limit]"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn serve_takes_the_config_model() {
    let cfg = config_with_model("serve");
    let mut child = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args(["serve", "--port", "0", "-t", "2", "-c", "64"])
        .env("K3_CONFIG", &cfg)
        .env("XDG_RUNTIME_DIR", common::test_runtime_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let listening = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) if l.contains("listening on http://127.0.0.1:") => break true,
            Ok(l) => seen.push(l),
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&cfg);
    assert!(listening, "k3 serve did not start: {seen:?}");
}

#[test]
fn no_model_anywhere_is_a_usage_error() {
    let empty = std::env::temp_dir().join(format!("k3-habits-{}-empty.toml", std::process::id()));
    std::fs::write(&empty, "").unwrap();
    for sub in [&["run", "-p", "hi"][..], &["chat"], &["serve"]] {
        let o = Command::new(env!("CARGO_BIN_EXE_k3"))
            .args(sub)
            .env("K3_CONFIG", &empty)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{sub:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("give the model directory (MODEL_DIR or -m DIR)"),
            "{sub:?}: {}",
            text(&o.stderr)
        );
    }
    let _ = std::fs::remove_file(&empty);
}

#[test]
fn tokenize_decode_and_show_tokens() {
    let t = tiny();
    let o = k3(&["tokenize", &t, "--decode", "341,464"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "The train\n");
    let o = k3(&["tokenize", &t, "--decode", "341,464,7,10", "--show-tokens"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "341\t\"The\"\n464\t\" train\"\n7\t\"\\x07\"\n10\t\"\\n\"\n"
    );
    let o = k3(&[
        "tokenize",
        &t,
        "--text",
        "The train",
        "--show-tokens",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"tokens": [{"id": 341, "piece": "The"}, {"id": 464, "piece": " train"}]})
    );
}

#[test]
fn short_flags_do_not_clash() {
    // clap checks its definitions when a command is built: --help on each builds it.
    for sub in [
        "run", "chat", "serve", "plan", "doctor", "tokenize", "pack", "verify",
    ] {
        let o = k3(&[sub, "--help"]);
        assert!(o.status.success(), "{sub} --help: {}", text(&o.stderr));
    }
    let help = text(&k3(&["run", "--help"]).stdout);
    for flag in [
        "-m, --model",
        "-p, --prompt",
        "-f, --prompt-file",
        "-t, --threads",
        "-c, --ctx",
        "-n, --gen",
        "-v, --verbose",
        "-q, --quiet",
    ] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
    let help = text(&k3(&["chat", "--help"]).stdout);
    assert!(
        help.contains("-n, --max-new") && help.contains("-c, --ctx"),
        "{help}"
    );
}
