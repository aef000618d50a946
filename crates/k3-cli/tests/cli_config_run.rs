//! `k3 run` takes its model directory, budget and sampling defaults from the config file, and
//! flags override the file.

use std::path::PathBuf;
use std::process::{Command, Output};

fn tiny() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny-k3")
        .to_string_lossy()
        .into_owned()
}

/// `k3 ARGS --print-ids` with `config` as the config file.
fn k3_with(config: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_k3"))
        .env("K3_CONFIG", config)
        .args(args)
        .arg("--print-ids")
        .output()
        .expect("k3 runs")
}

/// The `--print-ids` line on stderr.
fn ids(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .find(|l| l.starts_with("generated ids:"))
        .unwrap_or("")
        .to_string()
}

#[test]
fn config_file_supplies_model_budget_and_sampling() {
    let cfg = std::env::temp_dir().join(format!("k3-config-run-{}.toml", std::process::id()));
    std::fs::write(
        &cfg,
        format!(
            "model = {:?}\nmem_gb = 0.003\ntemp = 0.8\nseed = 7\n",
            tiny()
        ),
    )
    .unwrap();
    let from_file = k3_with(&cfg, &["run", "--ids", "637,229,263", "-n", "8"]);
    let err = String::from_utf8_lossy(&from_file.stderr).into_owned();
    assert!(from_file.status.success(), "{err}");
    assert!(
        err.contains("memory plan (--mem-gb"),
        "budget from the file: {err}"
    );
    let flags = k3_with(
        &cfg,
        &[
            "run",
            &tiny(),
            "--ids",
            "637,229,263",
            "-n",
            "8",
            "--mem-gb",
            "0.003",
            "--temp",
            "0.8",
            "--seed",
            "7",
        ],
    );
    assert_eq!(
        ids(&from_file),
        ids(&flags),
        "file values equal the same flags"
    );
    let greedy = k3_with(
        &cfg,
        &["run", "--ids", "637,229,263", "-n", "8", "--temp", "0"],
    );
    let empty = std::env::temp_dir().join(format!("k3-config-empty-{}.toml", std::process::id()));
    std::fs::write(&empty, "").unwrap();
    let plain = k3_with(&empty, &["run", &tiny(), "--ids", "637,229,263", "-n", "8"]);
    assert!(
        !ids(&plain).is_empty(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    assert_eq!(
        ids(&greedy),
        ids(&plain),
        "--temp 0 overrides the file's temp"
    );
    let _ = std::fs::remove_file(&cfg);
    let _ = std::fs::remove_file(&empty);
}
