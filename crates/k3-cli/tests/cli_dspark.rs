//! DSpark block drafting from the command line (docs/DSPARK.md): `k3 run --draft-model DIR`
//! (alias `-md`) gives the plain run's ids and reports every pass in `--json`'s `draft`;
//! `--draft-max` caps the drafts verified per pass; `--draft off` turns it off; a draft for
//! another model is refused with exit 2 naming the file and key.

mod common;
use common::{k3, scratch_dir, stderr, tiny};
use std::path::{Path, PathBuf};

fn dspark() -> PathBuf {
    tiny().parent().unwrap().join("tiny-k3-dspark")
}

fn run(flags: &[&str], json: &Path) -> serde_json::Value {
    common::run_tiny_json(16, flags, json).1
}

#[test]
fn run_with_a_draft_model_gives_the_plain_ids_and_reports_every_pass() {
    let dir = scratch_dir("dspark", "run");
    let json = dir.join("out.json");
    let d = dspark();
    let d = d.to_str().unwrap();
    let plain = run(&["--draft", "off"], &json);
    assert_eq!(plain["draft"], serde_json::Value::Null);
    for (flags, cap) in [
        (vec!["--draft-model", d], 7),
        (vec!["-md", d, "--draft-max", "2"], 2),
        (
            vec!["-md", d, "--trunk-gb", "0.001", "--cache-gb", "0.01"],
            7,
        ),
    ] {
        let r = run(&flags, &json);
        assert_eq!(r["generated_ids"], plain["generated_ids"], "{flags:?}");
        assert_eq!(r["mode"], "block", "{flags:?}");
        let draft = &r["draft"];
        let passes = draft["passes"].as_array().unwrap();
        assert!(!passes.is_empty(), "{r}");
        for p in passes {
            assert_eq!(p["proposed"].as_array().unwrap().len(), 7, "{p}");
            assert_eq!(p["confidence"].as_array().unwrap().len(), 7, "{p}");
            let (v, k) = (p["verified"].as_u64().unwrap(), p["kept"].as_u64().unwrap());
            assert!(k <= v && v <= cap, "{flags:?}: {p}");
            assert!(p["position"].as_u64().unwrap() >= 8, "{p}");
        }
        let kept: u64 = passes.iter().map(|p| p["kept"].as_u64().unwrap()).sum();
        assert_eq!(kept, r["draft_accepted"].as_u64().unwrap());
        assert!(
            draft["acceptance_length"].as_f64().unwrap() >= 1.0,
            "{draft}"
        );
        assert!(
            draft["tokens_per_trunk_pass"].as_f64().unwrap() > 0.0,
            "{draft}"
        );
        assert!(
            draft["bytes_read_per_generated_token"].is_number(),
            "{draft}"
        );
    }
    let off = run(&["-md", d, "--draft", "off"], &json);
    assert_eq!(off["mode"], "incremental");
    assert_eq!(off["generated_ids"], plain["generated_ids"]);
    assert_eq!(off["draft"], serde_json::Value::Null);
    // Under a budget, `--draft off` leaves the draft out of the plan (checked, not held).
    let budget = ["--trunk-gb", "0.001", "--cache-gb", "0.01"];
    let (o, _) = common::run_tiny_json(16, &[&["-md", d][..], &budget[..]].concat(), &json);
    assert!(stderr(&o).contains("DSpark draft"), "{}", stderr(&o));
    let flags = [&["-md", d, "--draft", "off"][..], &budget[..]].concat();
    let (o, off) = common::run_tiny_json(16, &flags, &json);
    assert!(!stderr(&o).contains("DSpark draft"), "{}", stderr(&o));
    assert_eq!(off["generated_ids"], plain["generated_ids"]);
}

#[test]
fn a_draft_model_for_another_model_is_refused_with_exit_2() {
    let dir = scratch_dir("dspark", "refuse");
    let bad = dir.join("draft");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(
        dspark().join("model.safetensors"),
        bad.join("model.safetensors"),
    )
    .unwrap();
    let cfg = std::fs::read_to_string(dspark().join("config.json")).unwrap();
    std::fs::write(
        bad.join("config.json"),
        cfg.replace("\"vocab_size\": 1024", "\"vocab_size\": 163840"),
    )
    .unwrap();
    let model = tiny();
    let o = k3(&[
        "run",
        model.to_str().unwrap(),
        "--ids",
        "1,2,3",
        "-n",
        "2",
        "--draft-model",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let want = format!(
        "k3: error: {}: key `vocab_size` is 163840 but the target's vocabulary is 1024: this draft was made for another model",
        bad.join("config.json").display()
    );
    assert!(stderr(&o).contains(&want), "{}", stderr(&o));
}

#[test]
fn plan_with_a_draft_model_shows_its_bytes_and_the_bytes_per_token() {
    let model = tiny();
    let d = dspark();
    let o = k3(&[
        "plan",
        model.to_str().unwrap(),
        "--mem-gb",
        "0.01",
        "-md",
        d.to_str().unwrap(),
    ]);
    let out = common::stdout(&o);
    assert!(o.status.success(), "{}{out}", stderr(&o));
    assert!(
        out.contains("DSpark draft") && out.contains("of context KV"),
        "{out}"
    );
    assert!(out.contains("plain decoding: trunk"), "{out}");
    for tau in 1..=7 {
        assert!(
            out.contains(&format!("acceptance length {tau}, 7 drafts verified")),
            "{out}"
        );
    }
}
