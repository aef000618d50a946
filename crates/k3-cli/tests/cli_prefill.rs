//! A long prompt is prefilled in one pass per planner chunk whether stderr is a terminal (a
//! progress bar is shown, driven by the engine layer by layer) or not: the trunk bytes it
//! reads equal those of a one-token prompt. Before, a terminal meant 64-token chunks, each
//! re-streaming the unpinned trunk.

mod common;

use common::{k3, tiny_arg};
use rexpect::process::wait::WaitStatus;
use rexpect::session::spawn_command;
use std::path::PathBuf;
use std::process::Command;

/// 300 ids (past the 256-token progress threshold), deterministic, no specials.
fn long_ids() -> String {
    let ids: Vec<String> = (0..300u32)
        .map(|i| ((i * 197 + 31) % 700).to_string())
        .collect();
    ids.join(",")
}

/// `k3 run` arguments at a budget that streams the trunk (smallest trunk budget) and whose
/// prefill chunk (64 MB cache budget / 8 ÷ per-token scratch) covers a 512-token context.
fn run_args(ids: &str, json: &str) -> Vec<String> {
    let args = [
        "run",
        &tiny_arg(),
        "--ids",
        ids,
        "-n",
        "1",
        "--json",
        json,
        "--trunk-gb",
        "0.00011",
        "--cache-gb",
        "0.064",
        "--ctx",
        "512",
        "--draft",
        "off",
        "--threads",
        "2",
    ];
    args.iter().map(|s| s.to_string()).collect()
}

fn json_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("k3-prefill-{tag}-{}.json", std::process::id()))
}

/// `bytes_read_trunk` of a finished run's JSON report.
fn trunk_bytes(json: &PathBuf) -> u64 {
    let text = std::fs::read_to_string(json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let _ = std::fs::remove_file(json);
    v["bytes_read_trunk"].as_u64().unwrap()
}

/// Trunk bytes of a run without a terminal.
fn piped(ids: &str, tag: &str) -> u64 {
    let json = json_path(tag);
    let args = run_args(ids, &json.to_string_lossy());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = k3(&refs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    trunk_bytes(&json)
}

#[test]
fn a_long_prompt_reads_the_trunk_once_on_a_terminal_and_off_it() {
    let one_pass = piped("31", "one");
    assert!(one_pass > 0, "the budget streams the trunk");
    assert_eq!(piped(&long_ids(), "piped"), one_pass);

    let json = json_path("pty");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_k3"));
    cmd.args(run_args(&long_ids(), &json.to_string_lossy()));
    let mut p = spawn_command(cmd, Some(60_000)).expect("k3 run starts in a pty");
    p.exp_eof().unwrap();
    match p.process.wait().unwrap() {
        WaitStatus::Exited(_, 0) => {}
        other => panic!("k3 run on a pty ended with {other:?}"),
    }
    assert_eq!(trunk_bytes(&json), one_pass);
}
