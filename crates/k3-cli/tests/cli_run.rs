//! `k3 run` driven as a user would: exact ids on the tiny model, JSON report, logits dump, and
//! refusals with the documented exit codes and messages that name the culprit.

mod common;
use common::{doctored_copy, k3, scratch_dir, stderr, tiny, Scratch};

fn scratch(name: &str) -> Scratch {
    scratch_dir("run", name)
}

#[test]
fn run_reproduces_expected_ids_and_writes_reports() {
    let dir = scratch("reports");
    let json = dir.join("out.json");
    let logits = dir.join("logits.bin");
    let o = k3(&[
        "run",
        tiny().to_str().unwrap(),
        "--ids",
        "637,229,263,638,730,42,197",
        "-n",
        "16",
        "--json",
        json.to_str().unwrap(),
        "--dump-logits",
        logits.to_str().unwrap(),
        "--print-ids",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "generated ids: 391,655,292,730,776,115,719,393,787,679,255,821,638,667,420,461\n"
        ),
        "{}",
        stderr(&o)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(!stdout.contains("generated ids"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        report["prompt_ids"],
        serde_json::json!([637, 229, 263, 638, 730, 42, 197])
    );
    assert_eq!(report["generated_ids"].as_array().unwrap().len(), 16);
    assert!(report["seconds_per_token"].as_f64().unwrap() >= 0.0);
    assert!(report["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert_eq!(
        std::fs::metadata(&logits).unwrap().len(),
        1024 * 4,
        "vocab_size f32 values"
    );
}

#[test]
fn bad_ids_are_usage_errors() {
    for (ids, needle) in [
        ("1,abc", "not a decimal"),
        ("-3", "negative"),
        ("4294967301", "larger than"),
        ("5000", "vocab_size is 1024"),
        ("", "empty"),
    ] {
        let flag = format!("--ids={ids}");
        let o = k3(&["run", tiny().to_str().unwrap(), &flag]);
        assert_eq!(o.status.code(), Some(2), "--ids {ids:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "--ids {ids:?}: {}", stderr(&o));
    }
}

#[test]
fn missing_model_dir_and_missing_prompt_are_usage_errors() {
    let o = k3(&["run", "/nonexistent/k3-model", "--ids", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("/nonexistent/k3-model"),
        "{}",
        stderr(&o)
    );
    let o = k3(&["run", tiny().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

const VICTIM: &str = "language_model.model.layers.2.self_attn.f_a_proj.weight"; // [16, 64]

#[test]
fn missing_tensor_exits_2_naming_it() {
    let dir = scratch("missing");
    doctored_copy(&dir, |s| {
        if s.name == VICTIM {
            s.name = format!("{}.renamed", s.name)
        }
    });
    let o = k3(&["run", dir.to_str().unwrap(), "--ids", "1", "-n", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(VICTIM), "{}", stderr(&o));
}

#[test]
fn transposed_tensor_exits_2_naming_it() {
    let dir = scratch("transposed");
    // Same element count, wrong shape: must be refused, not read as weights.
    doctored_copy(&dir, |s| {
        if s.name == VICTIM {
            s.shape.reverse()
        }
    });
    let o = k3(&["run", dir.to_str().unwrap(), "--ids", "1", "-n", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(VICTIM) && err.contains("16") && err.contains("64"),
        "{err}"
    );
}

/// `--draft` and `--lookahead` change how the tokens are computed, never which: the same ids
/// as the plain run, with the mode and counters in the JSON report.
#[test]
fn draft_and_lookahead_flags_keep_the_ids_and_report_themselves() {
    let dir = scratch("draft");
    let json = dir.join("out.json");
    let want = "391,655,292,730,776,115,719,393,787,679,255,821,638,667,420,461";
    let cases: [(&[&str], &str); 3] = [
        (&["--mem-gb", "0.003", "--draft", "off"], "incremental"),
        (&["--mem-gb", "0.003", "--draft", "4"], "speculative"),
        (
            &["--trunk-gb", "1", "--cache-gb", "0.0005", "--lookahead"],
            "incremental",
        ),
    ];
    let model = tiny();
    for (flags, mode) in cases {
        let mut a = vec![
            "run",
            model.to_str().unwrap(),
            "--ids",
            "637,229,263,638,730,42,197",
            "-n",
            "16",
            "--json",
            json.to_str().unwrap(),
            "--print-ids",
        ];
        a.extend_from_slice(flags);
        let o = k3(&a);
        assert!(o.status.success(), "{flags:?}: {}", stderr(&o));
        let want = format!("generated ids: {want}\n");
        assert!(stderr(&o).contains(&want), "{flags:?}: {}", stderr(&o));
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(r["mode"], mode, "{flags:?}");
        // the plan holds the journal of the drafts a verifying pass may carry: none with
        // --draft off; at most N with --draft N (this tight --mem-gb holds fewer)
        if flags.contains(&"--mem-gb") {
            let plan = &r["plan"];
            let drafts = plan["max_drafts"].as_u64().unwrap();
            let journal = plan["draft_journal_bytes"].as_u64().unwrap();
            match mode {
                "incremental" => assert_eq!((drafts, journal), (0, 0), "{plan}"),
                _ => assert!(drafts <= 4 && (drafts == 0) == (journal == 0), "{plan}"),
            }
        }
        if mode == "speculative" {
            assert_eq!(
                r["draft_passes"], 15,
                "one pass per token when nothing is drafted"
            );
        }
        if flags.contains(&"--lookahead") {
            assert!(r["lookahead_reads"].as_u64().unwrap() > 0, "{r}");
            assert!(stderr(&o).contains("lookahead  recall"), "{}", stderr(&o));
        } else {
            assert_eq!(r["lookahead_reads"], 0, "{flags:?}");
        }
    }
}

/// The plan reserves the draft journal for the drafts `--draft` asks for
/// (docs/STREAMING.md#keeping-accepted-drafts): N with `--draft N`, none with `--draft off`.
#[test]
fn the_plan_holds_the_journal_of_the_drafts_asked_for() {
    let dir = scratch("journal");
    let json = dir.join("out.json");
    let model = tiny();
    let plan_of = |draft: &str| {
        let o = k3(&[
            "run",
            model.to_str().unwrap(),
            "--ids",
            "637,229,263",
            "-n",
            "2",
            "--mem-gb",
            "0.01",
            "--draft",
            draft,
            "--json",
            json.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "--draft {draft}: {}", stderr(&o));
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let plan = &r["plan"];
        let n = |k: &str| plan[k].as_u64().unwrap();
        (n("max_drafts"), n("draft_journal_bytes"))
    };
    let (six, journal6) = plan_of("6");
    let (two, journal2) = plan_of("2");
    assert_eq!((six, two), (6, 2));
    // one layer's state copy + each draft's rows: four more drafts, four more rows
    let per_draft = (journal6 - journal2) / 4;
    assert_eq!(journal6 - journal2, 4 * per_draft, "{journal6} {journal2}");
    assert!(
        per_draft > 0 && journal2 > 2 * per_draft,
        "{journal6} {journal2}"
    );
    assert_eq!(plan_of("off"), (0, 0));
}
