//! Hybrid drafting from the command line: `k3 pack --draft-quant`, `k3 run|chat --draft-trunk`
//! giving the plain run's ids and output, `k3 plan --draft-trunk`, and the refusals (exit 2,
//! the flag named).

mod common;
use common::{k3, scratch_dir, stderr, stdout, tiny, Scratch};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn scratch(name: &str) -> Scratch {
    scratch_dir("draft", name)
}

fn pack_draft(dir: &Path, quant: &str) -> PathBuf {
    let out = dir.join(format!("draft-{quant}"));
    let o = k3(&[
        "pack",
        "--draft-quant",
        quant,
        tiny().to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("a {quant} draft trunk")),
        "{}",
        stderr(&o)
    );
    let json = std::fs::read_to_string(out.join("trunk.json")).unwrap();
    assert!(json.contains(&format!("\"draft\": \"{quant}\"")), "{json}");
    out
}

fn run_ids(flags: &[&str], json: &Path) -> (Output, serde_json::Value) {
    common::run_tiny_json(20, flags, json)
}

#[test]
fn run_with_a_draft_trunk_gives_the_plain_ids_and_reports_the_draft() {
    let dir = scratch("run");
    let json = dir.join("out.json");
    let (_, plain) = run_ids(&["--draft", "off"], &json);
    for quant in ["q8", "mxfp4"] {
        let draft = pack_draft(&dir, quant);
        let d = draft.to_str().unwrap();
        for budget in [&[][..], &["--trunk-gb", "0.001", "--cache-gb", "0.01"][..]] {
            let mut flags = vec!["--draft", "hybrid", "--draft-trunk", d];
            flags.extend_from_slice(budget);
            let (o, r) = run_ids(&flags, &json);
            assert_eq!(
                r["generated_ids"], plain["generated_ids"],
                "{quant} {budget:?}"
            );
            assert_eq!(r["mode"], "hybrid");
            assert_eq!(r["draft_trunk"]["quant"], quant);
            assert!(r["draft_tokens"].as_u64().unwrap() > 0, "{r}");
            assert!(r["draft_model"]["passes"].as_u64().unwrap() > 0, "{r}");
            let e = stderr(&o);
            assert!(
                e.contains("hybrid drafting: on") && e.contains("draft model:"),
                "{e}"
            );
        }
        // --draft auto: on where the trunk streams, off (and said why) where nothing does.
        let (o, r) = run_ids(
            &[
                "--draft-trunk",
                d,
                "--trunk-gb",
                "0.001",
                "--cache-gb",
                "0.01",
            ],
            &json,
        );
        assert_eq!(
            (r["mode"].as_str(), &r["generated_ids"]),
            (Some("hybrid"), &plain["generated_ids"])
        );
        assert!(stderr(&o).contains("hybrid drafting: on"), "{}", stderr(&o));
        let (o, r) = run_ids(&["--draft-trunk", d], &json);
        assert_eq!(r["mode"], "incremental");
        assert!(
            stderr(&o).contains("hybrid drafting: off: no memory budget"),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn chat_with_a_draft_trunk_says_the_same_things() {
    let dir = scratch("chat");
    let draft = pack_draft(&dir, "q8");
    let model = tiny();
    let chat = |extra: &[&str]| {
        let mut args = vec![
            "chat",
            model.to_str().unwrap(),
            "--max-new",
            "12",
            "--no-history",
        ];
        args.extend_from_slice(extra);
        let mut child = Command::new(env!("CARGO_BIN_EXE_k3"))
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"Hello\nAnd then?\n").unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let plain = chat(&["--draft", "off"]);
    let hybrid = chat(&[
        "--draft",
        "hybrid",
        "--draft-trunk",
        draft.to_str().unwrap(),
    ]);
    assert_eq!(hybrid, plain);
    assert!(!plain.trim().is_empty());
}

#[test]
fn plan_shows_the_draft_trunk_and_the_auto_decision() {
    let dir = scratch("plan");
    let draft = pack_draft(&dir, "mxfp4");
    let o = k3(&[
        "plan",
        tiny().to_str().unwrap(),
        "--trunk-gb",
        "0.001",
        "--cache-gb",
        "0.01",
        "--draft-trunk",
        draft.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "draft trunk",
        "session + draft model",
        "without the draft trunk",
        "--draft auto: hybrid drafting on",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
}

#[test]
fn drafting_refusals_name_the_flag_and_exit_2() {
    let dir = scratch("refuse");
    let draft = pack_draft(&dir, "q8");
    let model = tiny();
    let m = model.to_str().unwrap();
    let (x, nothing) = (dir.join("x"), dir.join("nothing"));
    let cases: [(&[&str], &str); 4] = [
        (
            &["run", m, "--ids", "1,2", "--draft", "hybrid"],
            "--draft-trunk",
        ),
        (
            &[
                "run",
                m,
                "--ids",
                "1,2",
                "--trunk",
                draft.to_str().unwrap(),
                "--trunk-gb",
                "0.001",
                "--cache-gb",
                "0.01",
            ],
            "--draft-trunk",
        ),
        (
            &["pack", "--draft-quant", "q4", m, x.to_str().unwrap()],
            "q8 or mxfp4",
        ),
        (
            &[
                "run",
                m,
                "--ids",
                "1,2",
                "--draft",
                "hybrid",
                "--draft-trunk",
                nothing.to_str().unwrap(),
            ],
            "no trunk.json",
        ),
    ];
    for (args, want) in cases {
        let o = k3(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    // An existing draft trunk is kept unless --overwrite.
    let o = k3(&["pack", "--draft-quant", "q8", m, draft.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--overwrite"), "{}", stderr(&o));
}
