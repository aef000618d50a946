//! `k3 run` sampling flags: accepted and reported, reproducible by `--seed` at any thread count
//! and budget, refused with exit 2 naming the flag, and `--stop` text never printed.

mod common;
use common::{k3, tiny_arg as tiny};

fn scratch(name: &str) -> common::Scratch {
    common::scratch_dir("sampling", name)
}

const PROMPT: &str = "637,229,263,638,730,42,197";

/// Runs `k3 run` on tiny-k3 with `extra` flags; returns the JSON report.
fn run_json(name: &str, extra: &[&str]) -> serde_json::Value {
    let dir = scratch(name);
    let json = dir.join("out.json");
    let model = tiny();
    let mut args = vec!["run", model.as_str(), "--json", json.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = k3(&args);
    assert!(
        o.status.success(),
        "{:?}: {}",
        extra,
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

fn ids(report: &serde_json::Value) -> Vec<u64> {
    report["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn sampling_flags_are_accepted_and_reported() {
    let r = run_json(
        "flags",
        &[
            "--ids",
            PROMPT,
            "--temp",
            "0.8",
            "--top-k",
            "40",
            "--top-p",
            "0.9",
            "--min-p",
            "0.05",
            "--repeat-penalty",
            "1.1",
            "--repeat-last-n",
            "32",
            "--seed",
            "7",
            "--presence-penalty",
            "0.5",
            "--frequency-penalty",
            "-0.25",
            "--max-tokens",
            "12",
        ],
    );
    assert_eq!(ids(&r).len(), 12);
    assert_eq!(r["stop_reason"], "length");
    let s = &r["sampling"];
    assert_eq!(s["top_k"], 40);
    assert_eq!(s["repeat_last_n"], 32);
    assert_eq!(s["seed"], 7);
    assert_eq!(s["greedy"], false);
    assert!((s["temperature"].as_f64().unwrap() - 0.8).abs() < 1e-6);
    assert!((s["top_p"].as_f64().unwrap() - 0.9).abs() < 1e-6);
    assert!((s["min_p"].as_f64().unwrap() - 0.05).abs() < 1e-6);
    assert!((s["repeat_penalty"].as_f64().unwrap() - 1.1).abs() < 1e-6);
    assert_eq!(s["presence_penalty"].as_f64(), Some(0.5));
    assert_eq!(s["frequency_penalty"].as_f64(), Some(-0.25));
    assert_eq!(
        s["end_ids"],
        serde_json::json!([769, 770]),
        "the tokenizer's EOS and <|end_of_msg|>"
    );
    assert_eq!(s["ignore_eos"], false);
    let r = run_json("defaults", &["--ids", PROMPT, "-n", "16", "--ignore-eos"]);
    let s = &r["sampling"];
    assert_eq!(
        (
            s["temperature"].as_f64(),
            s["greedy"].as_bool(),
            s["seed"].as_u64()
        ),
        (Some(0.0), Some(true), Some(0))
    );
    assert_eq!(
        (
            s["repeat_last_n"].as_u64(),
            s["end_ids"].as_array().map(Vec::len)
        ),
        (Some(64), Some(0))
    );
    assert_eq!(
        ids(&r),
        vec![391, 655, 292, 730, 776, 115, 719, 393, 787, 679, 255, 821, 638, 667, 420, 461]
    );
}

#[test]
fn a_seed_reproduces_the_ids_at_every_thread_count_and_budget() {
    let flags = |seed: &'static str, extra: &[&'static str]| {
        let mut v = vec![
            "--ids", PROMPT, "-n", "12", "--temp", "1", "--top-p", "0.95", "--seed", seed,
        ];
        v.extend_from_slice(extra);
        v
    };
    let a = ids(&run_json("seed-a", &flags("11", &["--threads", "1"])));
    let b = ids(&run_json("seed-b", &flags("11", &["--threads", "2"])));
    let c = ids(&run_json(
        "seed-c",
        &flags("11", &["--threads", "1", "--mem-gb", "0.003"]),
    ));
    let d = ids(&run_json("seed-d", &flags("12", &["--threads", "1"])));
    assert_eq!(a, b, "1 vs 2 threads");
    assert_eq!(a, c, "resident vs a streaming budget");
    assert_ne!(a, d, "another seed, other ids");
}

#[test]
fn bad_values_exit_2_naming_the_flag() {
    let model = tiny();
    for (flag, value) in [
        ("--temp", "-1"),
        ("--temp", "abc"),
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--min-p", "2"),
        ("--min-p", "-0.5"),
        ("--repeat-penalty", "0"),
        ("--repeat-penalty", "-2"),
        ("--presence-penalty", "3"),
        ("--frequency-penalty", "-2.5"),
        ("--top-k", "-3"),
        ("--repeat-last-n", "x"),
        ("--seed", "-1"),
        ("--stop", ""),
    ] {
        let o = k3(&["run", &model, "--ids", PROMPT, flag, value]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(flag),
            "{flag} {value}: the error names the flag: {err}"
        );
    }
}

#[test]
fn stop_text_ends_the_output_before_it() {
    let base = ["--prompt", "The train left at", "-n", "16"];
    let greedy = run_json("stop-greedy", &base);
    let text = greedy["generated_text"].as_str().unwrap().to_string();
    // A three-character stop string from the middle of the greedy text.
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let (from, _) = chars[chars.len() / 2];
    let to = chars
        .get(chars.len() / 2 + 3)
        .map_or(text.len(), |&(i, _)| i);
    let stop = &text[from..to];
    let cut = text.find(stop).unwrap();

    let dir = scratch("stop");
    let json = dir.join("out.json");
    let model = tiny();
    let mut args = vec![
        "run",
        model.as_str(),
        "--json",
        json.to_str().unwrap(),
        "--stop",
        stop,
        "--stop",
        "never-there",
    ];
    args.extend_from_slice(&base);
    let o = k3(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let printed = stdout.strip_suffix('\n').unwrap();
    assert_eq!(printed, &text[..cut], "stdout stops before {stop:?}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["stop_reason"], "stop_text");
    assert_eq!(r["stop_value"], stop);
    assert_eq!(r["generated_text"], &text[..cut]);
    let (got, all) = (ids(&r), ids(&greedy));
    assert!(
        got.len() < all.len() && all.starts_with(&got),
        "{got:?} is a prefix of {all:?}"
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("stopped: stop text"));
}
