//! `xtask bench-compute` refuses bad flags with exit code 2 and a message naming the flag,
//! before it measures anything.

use std::process::Command;

/// Runs `xtask bench-compute ARGS`; (exit code, stderr).
fn bench_compute(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("bench-compute")
        .args(args)
        .output()
        .expect("run xtask");
    assert!(out.stdout.is_empty(), "nothing measured, nothing printed");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn zero_rounds_is_a_usage_error() {
    let (code, err) = bench_compute(&["--rounds", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--rounds 0: every case needs at least 1 round"),
        "{err}"
    );
}

#[test]
fn zero_repeats_is_a_usage_error() {
    let (code, err) = bench_compute(&["--model", "/nonexistent/k3", "--repeats", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--repeats 0: each prompt length needs at least 1 warm prefill"),
        "{err}"
    );
}

#[test]
fn an_unknown_level_is_a_usage_error_that_lists_the_cpus_levels() {
    let (code, err) = bench_compute(&["--level", "avx9000"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--level avx9000: not a SIMD level of this CPU (it has "),
        "{err}"
    );
}
