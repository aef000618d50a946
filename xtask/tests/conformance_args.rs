//! `xtask conformance --numerics`: an unknown mode is a usage error (exit 2); `fast` is
//! refused with exit 2 and the kernels' message where AMX is missing, and passes every check
//! where AMX runs (docs/NUMERICS.md#numeric-mode-fast).

use std::process::{Command, Output};

fn conformance(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("conformance")
        .args(args)
        .output()
        .expect("run xtask")
}

#[test]
fn an_unknown_numeric_mode_is_a_usage_error() {
    let out = conformance(&["--numerics", "bogus"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("expected v2, fast, amx-bf16x2 or amx-bf16x1"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn the_fast_mode_is_refused_where_amx_is_missing() {
    let out = conformance(&["--numerics", "fast"]);
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if k3_kernels::fast::amx_usable() {
        assert_eq!(out.status.code(), Some(0), "{stdout}{err}");
        assert!(
            stdout.contains("numerics fast: every check above is in force"),
            "{stdout}"
        );
    } else {
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("conformance: numeric mode fast needs AMX-BF16 tiles")
                && err.contains("run without --numerics (contract v2)"),
            "{err}"
        );
        assert!(stdout.is_empty(), "nothing checked: {stdout}");
    }
}
