//! `k3 serve --draft-trunk`: with one session decoding alone, hybrid drafting verifies the
//! draft model's ids in one pass — and every reply (greedy, seeded sampling, with logprobs)
//! is the one the server gives without a draft trunk.

mod common;
mod serve_common;

use serde_json::{json, Value};
use serve_common::Server;
use std::process::Command;

/// A scratch directory (removed when dropped) holding the tiny model's q8 draft trunk in
/// `draft/`.
fn draft_trunk() -> common::Scratch {
    let scratch = common::scratch_dir("serve", "draft");
    let dir = scratch.join("draft");
    let out = Command::new(env!("CARGO_BIN_EXE_k3"))
        .args([
            "pack",
            "--draft-quant",
            "q8",
            &serve_common::tiny(),
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    scratch
}

fn replies(s: &Server) -> Vec<Value> {
    let bodies = [
        json!({"prompt": "the cat sat on", "max_tokens": 16, "temperature": 0, "ignore_eos": true}),
        json!({"prompt": "once upon a time", "max_tokens": 14, "temperature": 0.8, "seed": 5, "ignore_eos": true, "logprobs": 2}),
        json!({"prompt": "stop here", "max_tokens": 3, "temperature": 0, "ignore_eos": true}),
    ];
    bodies
        .iter()
        .map(|b| {
            let (st, v) = s.post_json("/v1/completions", b);
            assert_eq!(st, 200, "{v}");
            json!({"text": v["choices"][0]["text"], "logprobs": v["choices"][0]["logprobs"]})
        })
        .collect()
}

#[test]
fn a_draft_trunk_changes_no_reply() {
    let budget = ["--trunk-gb", "0.001", "--cache-gb", "0.01"];
    let plain = Server::start(&budget);
    let want = replies(&plain);
    drop(plain);
    let scratch = draft_trunk();
    let dir = scratch.join("draft");
    let mut flags = budget.to_vec();
    flags.extend(["--draft-trunk", dir.to_str().unwrap()]);
    let hybrid = Server::start(&flags);
    assert_eq!(replies(&hybrid), want);
    let log = hybrid
        .wait_stderr(|l| l.contains("hybrid drafting accepted"))
        .join("\n");
    assert!(log.contains("hybrid drafting: on"), "{log}");
    assert!(log.contains("hybrid drafting accepted"), "{log}");
}
