//! `k3 run --save-session/--load-session`: a resumed run produces the same tokens as the
//! uninterrupted sequence without prefilling the history again; `--quiet` prints only the
//! generated text.

use std::path::PathBuf;
use std::process::Output;

mod common;
use common::{k3, tiny_arg as tiny};

/// The ids of the `--print-ids` line on stderr.
fn ids(o: &Output) -> Vec<String> {
    let out = String::from_utf8_lossy(&o.stderr).into_owned();
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("generated ids: "))
        .unwrap_or("")
        .to_string();
    line.split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn resumed_run_equals_uninterrupted_run() {
    let file = std::env::temp_dir().join(format!("k3-cli-session-{}.k3ss", std::process::id()));
    let f = file.to_str().unwrap();
    let first = k3(&[
        "run",
        &tiny(),
        "--ids",
        "637,229,263",
        "-n",
        "4",
        "--save-session",
        f,
        "--ignore-eos",
        "--print-ids",
    ]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let g1 = ids(&first);
    assert_eq!(g1.len(), 4);
    let second = k3(&[
        "run",
        &tiny(),
        "--load-session",
        f,
        "--ids",
        "42,197",
        "-n",
        "5",
        "--ignore-eos",
        "--json",
        &format!("{f}.json"),
        "--print-ids",
    ]);
    let err = String::from_utf8_lossy(&second.stderr).into_owned();
    assert!(second.status.success(), "{err}");
    assert!(err.contains("prefill tokens saved"), "{err}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{f}.json")).unwrap()).unwrap();
    // 3 prompt tokens + 3 generated were run through the model; the 4th generated was pending.
    assert_eq!(report["prompt_tokens_reused"], 6);
    let whole = format!("637,229,263,{},42,197", g1.join(","));
    let straight = k3(&[
        "run",
        &tiny(),
        "--ids",
        &whole,
        "-n",
        "5",
        "--ignore-eos",
        "--print-ids",
    ]);
    assert_eq!(ids(&second), ids(&straight), "resumed == uninterrupted");
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(format!("{f}.json"));
    // A session of another model is refused by name.
    let wide = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3-wide");
    let s2 = std::env::temp_dir().join(format!("k3-cli-session-w-{}.k3ss", std::process::id()));
    let o = k3(&[
        "run",
        wide.to_str().unwrap(),
        "--ids",
        "1,2",
        "-n",
        "1",
        "--save-session",
        s2.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = k3(&[
        "run",
        &tiny(),
        "--load-session",
        s2.to_str().unwrap(),
        "--ids",
        "1",
    ]);
    let _ = std::fs::remove_file(&s2);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn quiet_prints_only_the_generation() {
    let json = std::env::temp_dir().join(format!("k3-cli-quiet-{}.json", std::process::id()));
    let o = k3(&[
        "run",
        &tiny(),
        "--ids",
        "637,229,263",
        "-n",
        "4",
        "--mem-gb",
        "0.003",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    assert!(
        o.stderr.is_empty(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(r["generated_ids"].as_array().unwrap().len(), 4);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("{}\n", r["generated_text"].as_str().unwrap()),
        "stdout is the text and its newline"
    );
}
