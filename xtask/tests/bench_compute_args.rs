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

/// `bench-compute ARGS` exits 2 with `message` on stderr.
fn usage_error(args: &[&str], message: &str) {
    let (code, err) = bench_compute(args);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    assert!(err.contains(message), "{args:?}: {err}");
}

#[test]
fn zero_rounds_is_a_usage_error() {
    usage_error(
        &["--rounds", "0"],
        "--rounds 0: every case needs at least 1 round",
    );
}

#[test]
fn zero_repeats_is_a_usage_error() {
    usage_error(
        &["--model", "/nonexistent/k3", "--repeats", "0"],
        "--repeats 0: each prompt length needs at least 1 warm prefill",
    );
}

#[test]
fn an_unknown_level_is_a_usage_error_that_lists_the_cpus_levels() {
    usage_error(
        &["--level", "avx9000"],
        "--level avx9000: not a SIMD level of this CPU (it has ",
    );
}

#[test]
fn an_unknown_numeric_mode_is_a_usage_error() {
    usage_error(
        &["--numerics", "bogus"],
        "--numerics bogus: not a numeric mode (v2, fast, amx-bf16x2, amx-bf16x1)",
    );
}

/// Without AMX the mode is refused (exit 2) before anything is measured; with AMX it is taken
/// and the run goes on to fail on the missing model (exit 1), not on the mode.
#[test]
fn the_fast_mode_is_refused_where_amx_is_missing() {
    let args = [
        "--numerics",
        "fast",
        "--model",
        "/nonexistent/k3",
        "--secs",
        "0.01",
    ];
    if k3_kernels::fast::amx_usable() {
        let (code, err) = bench_compute(&args);
        assert_eq!(code, Some(1), "{err}");
        assert!(!err.contains("AMX"), "{err}");
    } else {
        usage_error(
            &args,
            "bench-compute: numeric mode fast needs AMX-BF16 tiles",
        );
    }
}
