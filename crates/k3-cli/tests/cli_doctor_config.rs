//! `k3 doctor` (machine facts without a model, a recommendation with one) and `k3 config`
//! (the config file found through `$K3_CONFIG` / `$XDG_CONFIG_HOME`, unknown keys refused).

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

fn k3_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_k3"));
    c.args(args).env_remove("K3_CONFIG");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("k3 runs")
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3")
}

fn scratch(name: &str) -> common::Scratch {
    common::scratch_dir("doctor", name)
}

#[test]
fn doctor_without_a_model_prints_machine_facts() {
    let disk = scratch("facts");
    let o = k3_env(
        &[
            "doctor",
            "--io-seconds",
            "0.05",
            "--disk",
            disk.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let text = out(&o);
    for key in [
        "cpu",
        "simd",
        "trunk decoder",
        "numerics fast",
        "logical cores",
        "RAM total",
        "MemAvailable",
        "cgroup memory",
        "free disk",
    ] {
        assert!(text.contains(key), "{key} missing: {text}");
    }
}

#[test]
fn doctor_with_the_tiny_model_measures_and_recommends() {
    let o = k3_env(
        &["doctor", tiny().to_str().unwrap(), "--io-seconds", "0.05"],
        &[],
    );
    let text = out(&o);
    // Exit 2 only when even the smallest plan does not fit (not on a CI machine for 6 MB).
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(
        text.contains(" 1 outstanding") && text.contains("16 outstanding"),
        "{text}"
    );
    assert!(text.contains("cache-dominated"), "{text}");
    assert!(text.contains("recommended: k3 run"), "{text}");
}

#[test]
fn doctor_on_a_missing_model_is_a_usage_error() {
    let o = k3_env(&["doctor", "/nonexistent/k3-model"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    assert!(out(&o).contains("/nonexistent/k3-model"), "{}", out(&o));
}

#[test]
fn config_show_and_path_honour_k3_config() {
    let dir = scratch("config");
    let f = dir.join("k3.toml");
    std::fs::write(
        &f,
        "model = \"/models/k3\"\npreset = \"desktop\"\ntemp = 0.7\ntop_p = 0.9\nseed = 7\n",
    )
    .unwrap();
    let fs = f.to_str().unwrap();
    let o = k3_env(&["config", "path"], &[("K3_CONFIG", fs)]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), fs);
    let o = k3_env(&["config", "show"], &[("K3_CONFIG", fs)]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let text = out(&o);
    assert!(text.contains(&format!("# config file: {fs}")), "{text}");
    assert!(
        text.contains("model = \"/models/k3\"") && text.contains("preset = \"desktop\""),
        "{text}"
    );
    assert!(
        text.contains("seed = 7") && text.contains("unset"),
        "{text}"
    );
}

#[test]
fn config_unknown_key_is_refused_naming_key_and_file() {
    let dir = scratch("unknown");
    let f = dir.join("k3.toml");
    std::fs::write(&f, "temp = 0.5\ntop_q = 3\n").unwrap();
    let o = k3_env(&["config", "show"], &[("K3_CONFIG", f.to_str().unwrap())]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    let text = out(&o);
    assert!(
        text.contains("top_q") && text.contains(f.to_str().unwrap()),
        "{text}"
    );
}

#[test]
fn config_falls_back_to_xdg_and_reports_no_file() {
    let dir = scratch("xdg");
    let xdg = dir.to_str().unwrap();
    let o = k3_env(&["config", "show"], &[("XDG_CONFIG_HOME", xdg)]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(out(&o).contains("no config file"), "{}", out(&o));
    let o = k3_env(&["config", "path"], &[("XDG_CONFIG_HOME", xdg)]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        dir.join("k3/config.toml").to_str().unwrap()
    );
    std::fs::create_dir_all(dir.join("k3")).unwrap();
    std::fs::write(dir.join("k3/config.toml"), "mem_gb = 48\nthreads = 8\n").unwrap();
    let o = k3_env(&["config", "show"], &[("XDG_CONFIG_HOME", xdg)]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(
        out(&o).contains("mem_gb = 48.0") && out(&o).contains("threads = 8"),
        "{}",
        out(&o)
    );
    // An explicit $K3_CONFIG that does not exist is an error, not a silent default.
    let missing = dir.join("nope.toml");
    let o = k3_env(
        &["config", "show"],
        &[("K3_CONFIG", missing.to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    assert!(out(&o).contains("nope.toml"), "{}", out(&o));
}

#[test]
fn doctor_without_a_model_sizes_the_release_against_the_disk() {
    let dir = scratch("release");
    let o = k3_env(
        &[
            "doctor",
            "--io-seconds",
            "0.05",
            "--disk",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    let text = out(&o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    // The three disk needs with the running total and a verdict against the free space.
    for (what, size) in [
        ("checkpoint", "1560.49 GB"),
        ("packed trunk", "108.81 GB"),
        ("q8 draft trunk", "55.06 GB"),
    ] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(what))
            .unwrap_or_else(|| panic!("{what} missing: {text}"));
        assert!(line.contains(size), "{line}");
        assert!(line.contains("fits") || line.contains("short by"), "{line}");
    }
    assert!(text.contains(&format!("at {}", dir.display())), "{text}");
    // Each preset's s/token over the read test on that disk.
    assert!(text.contains("16 outstanding"), "{text}");
    for p in ["laptop", "desktop", "workstation", "server", "max"] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(p) && l.contains("≥"))
            .unwrap_or_else(|| panic!("{p} missing: {text}"));
        assert!(line.contains("GB"), "{line}");
    }
    // The scratch file is gone.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// The `TOTAL` line of a `k3 plan` table, in bytes' display form.
fn plan_total(text: &str) -> String {
    text.lines()
        .find(|l| l.trim_start().starts_with("TOTAL"))
        .unwrap_or_else(|| panic!("no TOTAL: {text}"))
        .trim()
        .to_string()
}

#[test]
fn plan_and_presets_without_a_model_use_the_release_and_sessions() {
    let one = k3_env(&["plan", "--preset", "laptop"], &[]);
    let eight = k3_env(&["plan", "--preset", "laptop", "--sessions", "8"], &[]);
    for o in [&one, &eight] {
        assert!(out(o).contains("Kimi K3 as released"), "{}", out(o));
        assert!(out(o).contains("0/93 layers"), "{}", out(o));
    }
    // 8 sessions reserve 8 × (KDA state + latent KV): the released 69 KDA layers' state.
    assert!(out(&eight).contains("8 sessions"), "{}", out(&eight));
    assert_ne!(plan_total(&out(&one)), plan_total(&out(&eight)));
    let p1 = k3_env(&["presets"], &[]);
    let p8 = k3_env(&["presets", "--sessions", "8"], &[]);
    assert_eq!(p8.status.code(), Some(0), "{}", out(&p8));
    let laptop = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.starts_with("laptop"))
            .map(str::to_owned)
            .unwrap()
    };
    // The RAM column is the plan's TOTAL.
    let total8 = plan_total(&out(&eight));
    let ram8 = total8
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(laptop(&p8).contains(&ram8), "{} vs {total8}", laptop(&p8));
    assert_ne!(laptop(&p1), laptop(&p8));
    assert!(out(&p8).contains("8 sessions"), "{}", out(&p8));
    // A draft trunk needs the model it was packed from.
    let o = k3_env(&["plan", "--draft-trunk", "/tmp/x"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    assert!(out(&o).contains("needs the model directory"), "{}", out(&o));
}
