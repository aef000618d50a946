//! `k3 run`/`k3 plan` with memory budgets: the smallest legal budget and a resident run print
//! the same ids and the report shows streamed bytes; too-small budgets and contexts are refused
//! with exit 2 and a message saying what to change.

use std::process::Output;

mod common;
use common::{k3, tiny_arg as tiny};

/// The `--print-ids` line on stderr.
fn ids_line(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .find(|l| l.starts_with("generated ids:"))
        .unwrap_or("")
        .to_string()
}

const PROMPT: &str = "637,229,263,638,730,42,197";

#[test]
fn smallest_budget_and_resident_print_the_same_ids() {
    let resident = k3(&["run", &tiny(), "--ids", PROMPT, "-n", "16", "--print-ids"]);
    assert!(
        resident.status.success(),
        "{}",
        String::from_utf8_lossy(&resident.stderr)
    );
    let json = std::env::temp_dir().join(format!("k3-budget-{}.json", std::process::id()));
    let streamed = k3(&[
        "run",
        &tiny(),
        "--ids",
        PROMPT,
        "-n",
        "16",
        "--mem-gb",
        "0.003",
        "--json",
        json.to_str().unwrap(),
        "--print-ids",
    ]);
    let err = String::from_utf8_lossy(&streamed.stderr);
    assert!(streamed.status.success(), "{err}");
    assert_eq!(ids_line(&streamed), ids_line(&resident));
    assert!(ids_line(&resident)
        .contains("391,655,292,730,776,115,719,393,787,679,255,821,638,667,420,461"));
    assert!(
        err.contains("memory plan") && err.contains("I/O report"),
        "{err}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert!(report["bytes_read_trunk"].as_u64().unwrap() > 0, "{report}");
    assert!(
        report["bytes_read_experts"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(report["expert_requests"].as_u64().unwrap() > 0, "{report}");
}

#[test]
fn too_small_budgets_are_refused_with_what_to_change() {
    for args in [
        vec!["--mem-gb", "0.001"],
        vec!["--trunk-gb", "0.00001", "--cache-gb", "1"],
        vec!["--trunk-gb", "1", "--cache-gb", "0.000001"],
    ] {
        let t = tiny();
        let mut all = vec!["run", t.as_str(), "--ids", "1", "-n", "1"];
        all.extend(args.iter());
        let o = k3(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("raise --"), "{args:?}: {err}");
    }
}

#[test]
fn context_that_cannot_fit_is_refused() {
    // Latent KV for 10^9 positions cannot fit this machine: refused before allocating.
    let o = k3(&["plan", &tiny(), "--mem-gb", "1", "--ctx", "1000000000"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = k3(&[
        "run",
        &tiny(),
        "--ids",
        "1",
        "--mem-gb",
        "1",
        "--ctx",
        "1000000000",
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn presets_and_plan_print() {
    let o = k3(&["presets"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for p in ["laptop", "desktop", "workstation", "server", "max"] {
        assert!(out.contains(p), "{out}");
    }
    let o = k3(&["plan", &tiny(), "--mem-gb", "0.01"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("TOTAL") && out.contains("expert cache"),
        "{out}"
    );
    let o = k3(&["plan", &tiny(), "--preset", "nonsense"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn cache_trace_is_recorded_in_upstream_layout() {
    let dir = std::env::temp_dir().join(format!("k3-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = k3(&[
        "run",
        &tiny(),
        "--ids",
        PROMPT,
        "-n",
        "4",
        "--mem-gb",
        "0.003",
        "--dump-cache-trace",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(dir.join("expert_trace.bin")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !bytes.is_empty() && bytes.len().is_multiple_of(8),
        "{} bytes",
        bytes.len()
    );
    for rec in bytes.chunks_exact(8) {
        let layer = u32::from_le_bytes(rec[..4].try_into().unwrap());
        let expert = u32::from_le_bytes(rec[4..].try_into().unwrap());
        assert!(
            (1..13).contains(&layer) && expert < 8,
            "layer {layer} expert {expert}"
        );
    }
    // Without a budget there is no expert cache to trace: refused.
    let o = k3(&["run", &tiny(), "--ids", "1", "--dump-cache-trace", "/tmp/x"]);
    assert_eq!(o.status.code(), Some(2));
}
