//! Text in, text out: `k3 run --prompt/--prompt-file` through the model directory's tokenizer
//! reproduce the reference's ids for the same text, and `k3 tokenize` encodes, decodes and
//! exports.

mod common;
use common::{k3, tiny_arg as tiny};

/// The text case of fixtures/tiny-k3/expected.json.
fn text_case() -> (String, Vec<u64>, Vec<u64>) {
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{}/expected.json", tiny())).unwrap(),
    )
    .unwrap();
    let case = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["prompt_text"].is_string())
        .unwrap()
        .clone();
    let ids = |k: &str| {
        case[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    (
        case["prompt_text"].as_str().unwrap().to_string(),
        ids("prompt_ids"),
        ids("greedy_ids"),
    )
}

fn csv(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn prompt_text_gives_the_reference_ids() {
    let (text, prompt, greedy) = text_case();
    let json = std::env::temp_dir().join(format!("k3-text-{}.json", std::process::id()));
    let o = k3(&[
        "run",
        &tiny(),
        "--prompt",
        &text,
        "-n",
        "16",
        "--json",
        json.to_str().unwrap(),
        "--print-ids",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(report["prompt_ids"], serde_json::json!(prompt));
    assert_eq!(report["generated_ids"], serde_json::json!(greedy));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("generated ids: {}\n", csv(&greedy)))
    );
    // stdout is the text and its newline, nothing else.
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("{}\n", report["generated_text"].as_str().unwrap())
    );

    let file = std::env::temp_dir().join(format!("k3-prompt-{}.txt", std::process::id()));
    std::fs::write(&file, text.as_bytes()).unwrap();
    let o = k3(&[
        "run",
        &tiny(),
        "--prompt-file",
        file.to_str().unwrap(),
        "-n",
        "16",
        "--print-ids",
    ]);
    let _ = std::fs::remove_file(&file);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!("generated ids: {}\n", csv(&greedy)))
    );
}

#[test]
fn invalid_utf8_prompt_file_runs() {
    let file = std::env::temp_dir().join(format!("k3-bad-utf8-{}.txt", std::process::id()));
    std::fs::write(&file, b"ok \xff\xfe then \xc3 text").unwrap();
    let o = k3(&[
        "run",
        &tiny(),
        "--prompt-file",
        file.to_str().unwrap(),
        "-n",
        "2",
    ]);
    let _ = std::fs::remove_file(&file);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn tokenize_encodes_decodes_and_exports() {
    let (text, prompt, _) = text_case();
    let o = k3(&["tokenize", &tiny(), "--text", &text]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), csv(&prompt));
    let o = k3(&["tokenize", &tiny(), "--decode", &csv(&prompt)]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim_end_matches('\n'),
        text
    );
    // Control-token text is plain text unless allowed.
    let plain = k3(&["tokenize", &tiny(), "--text", "<|open|>"]);
    let special = k3(&["tokenize", &tiny(), "--text", "<|open|>", "--allow-special"]);
    assert_eq!(String::from_utf8_lossy(&special.stdout).trim(), "771");
    assert_ne!(String::from_utf8_lossy(&plain.stdout).trim(), "771");
    let out = std::env::temp_dir().join(format!("k3-tok-{}.json", std::process::id()));
    let o = k3(&["tokenize", &tiny(), "--export", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read_to_string(&out).unwrap().contains("\"model\""));
    let _ = std::fs::remove_file(&out);
    let o = k3(&["tokenize", &tiny(), "--decode", "99999"]);
    assert_eq!(o.status.code(), Some(2));
}
