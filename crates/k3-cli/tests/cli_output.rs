//! stdout carries the product and nothing else: the generated text and one newline (control
//! characters escaped on a terminal), or `1,2,3` for a model without a tokenizer. Ids on
//! request (`--print-ids`), per-token lines (`-v`) and the I/O report go to stderr, and the
//! report's share of wall clock never passes 100 %.

use rexpect::session::spawn_command;
use std::process::{Command, Output};

mod common;
use common::{copy_tiny, k3, tiny_arg as tiny};

const PROMPT: &str = "637,229,263,638,730,42,197";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn scratch(name: &str) -> common::Scratch {
    common::scratch_dir("output", name)
}

/// `k3 run ARGS --json FILE`: the output and the report.
fn run_json(name: &str, args: &[&str]) -> (Output, serde_json::Value) {
    let dir = scratch(name);
    let json = dir.join("out.json");
    let mut a = vec!["run"];
    a.extend_from_slice(args);
    a.extend(["--json", json.to_str().unwrap()]);
    let o = k3(&a);
    assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
    let r = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (o, r)
}

#[test]
fn stdout_is_the_text_and_stderr_the_rest() {
    let t = tiny();
    let (o, r) = run_json(
        "text",
        &[&t, "--ids", PROMPT, "-n", "16", "--mem-gb", "0.003"],
    );
    let want = format!("{}\n", r["generated_text"].as_str().unwrap());
    assert_eq!(text(&o.stdout), want);
    let err = text(&o.stderr);
    assert!(
        err.contains("stopped: length limit") && err.contains("I/O report"),
        "{err}"
    );
    assert!(
        !err.contains("generated ids") && !err.contains("step "),
        "{err}"
    );
    // --print-ids adds the ids on stderr, even with -q; stdout is unchanged.
    let (o, r) = run_json(
        "ids",
        &[&t, "--ids", PROMPT, "-n", "16", "-q", "--print-ids"],
    );
    assert_eq!(text(&o.stdout), want);
    let ids: Vec<String> = r["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_eq!(
        text(&o.stderr),
        format!("generated ids: {}\n", ids.join(","))
    );
}

#[test]
fn a_model_without_a_tokenizer_prints_its_ids() {
    let dir = scratch("ids-only");
    copy_tiny(&dir);
    std::fs::remove_file(dir.join("tiktoken.model")).unwrap();
    let d = dir.to_str().unwrap();
    let (o, r) = run_json("ids-only-run", &[d, "--ids", PROMPT, "-n", "4"]);
    assert_eq!(text(&o.stdout), "391,655,292,730\n");
    assert_eq!(r["generated_ids"], serde_json::json!([391, 655, 292, 730]));
    assert_eq!(r["generated_text"], serde_json::Value::Null);
    let o = k3(&["run", d, "-p", "hi"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("no tokenizer"),
        "{}",
        text(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn verbose_prints_one_line_per_token_on_stderr() {
    let t = tiny();
    let o = k3(&[
        "run", &t, "--ids", PROMPT, "-n", "5", "-v", "--mem-gb", "0.003",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    let steps: Vec<&str> = err.lines().filter(|l| l.starts_with("step ")).collect();
    assert_eq!(steps.len(), 5, "{err}");
    assert!(steps[0].contains("token     391") && steps[0].contains("expert hits"));
    assert!(!text(&o.stdout).contains("step "));
    let o = k3(&["run", &t, "--ids", PROMPT, "-n", "5", "-v"]);
    let err = text(&o.stderr);
    assert_eq!(err.lines().filter(|l| l.starts_with("step ")).count(), 5);
    let o = k3(&["run", &t, "--ids", PROMPT, "-q", "-v"]);
    assert_eq!(o.status.code(), Some(2), "-q and -v conflict");
}

#[test]
fn io_wait_share_stays_within_wall_clock() {
    let t = tiny();
    let (o, r) = run_json("io", &[&t, "--ids", PROMPT, "-n", "8", "--mem-gb", "0.003"]);
    let err = text(&o.stderr);
    let line = err.lines().find(|l| l.contains("I/O wait")).unwrap();
    let pct: f64 = line
        .split('(')
        .nth(1)
        .and_then(|s| s.split('%').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.0..=100.0).contains(&pct), "{line}");
    assert!(line.contains("reader threads busy"), "{line}");
    let waits =
        r["trunk_wait_seconds"].as_f64().unwrap() + r["expert_wait_seconds"].as_f64().unwrap();
    assert!(waits <= r["wall_seconds"].as_f64().unwrap(), "{r}");
}

/// What the terminal should show for `text`: control characters other than newline and tab
/// as escapes.
fn escaped(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c.to_string(),
            '\r' => "\\r".into(),
            c if c.is_control() && (c as u32) < 0x80 => format!("\\x{:02x}", c as u32),
            c if c.is_control() => format!("\\u{{{:x}}}", c as u32),
            c => c.to_string(),
        })
        .collect()
}

/// On a terminal the text's control bytes are shown escaped, and `-v` lines wait until the
/// text has ended. Greedy "The train left at" on the tiny model produces \x04, \x1a and \x07.
#[test]
fn a_terminal_gets_escaped_text_then_the_token_lines() {
    let t = tiny();
    let args = [&t, "-p", "The train left at", "-n", "64", "--ignore-eos"];
    let (_, r) = run_json("tty", &args);
    let generated = r["generated_text"].as_str().unwrap();
    assert!(
        generated.contains('\x04') && generated.contains('\x07'),
        "{generated:?}"
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.arg("run").args(args).arg("-v");
    let mut p = spawn_command(cmd, Some(60_000)).expect("k3 runs in a pty");
    // rexpect hands back one char per byte: rebuild the bytes, then the text.
    let raw: Vec<u8> = p
        .exp_eof()
        .unwrap()
        .chars()
        .map(|c| c as u32 as u8)
        .collect();
    let shown = String::from_utf8_lossy(&raw).replace("\r\n", "\n");
    // Without a budget flag, one line first says what was chosen (README "Memory budgets").
    let (auto, shown) = shown.split_once('\n').unwrap();
    assert!(auto.starts_with("k3: budget auto"), "{auto:?}");
    assert!(
        !shown.contains('\x04') && !shown.contains('\x1b'),
        "{shown:?}"
    );
    let head = format!("{}\nstep    0  token", escaped(generated));
    assert!(shown.starts_with(&head), "{shown:?}\nwanted {head:?}");
}
