//! `cargo xtask conformance`: one line per check, then `N passed, M failed`.

mod format;
mod ops;

use std::path::Path;
use std::process::ExitCode;

/// Outcome of one named check.
pub struct Check {
    pub name: String,
    pub result: Result<String, String>,
}

impl Check {
    pub fn pass(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            result: Ok(detail.into()),
        }
    }
    pub fn fail(name: impl Into<String>, why: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            result: Err(why.into()),
        }
    }
}

/// Runs every group of checks and prints the summary; exit 1 when any failed.
pub fn run(upstream: &Path) -> ExitCode {
    if !upstream.is_dir() {
        eprintln!(
            "conformance: upstream fixtures not found at {} (pass --upstream DIR)",
            upstream.display()
        );
        return ExitCode::from(2);
    }
    let mut checks = Vec::new();
    checks.extend(format::checks(upstream));
    checks.extend(ops::checks(upstream));
    let (mut passed, mut failed) = (0, 0);
    for c in &checks {
        match &c.result {
            Ok(detail) => {
                passed += 1;
                println!("PASS {:<28} {}", c.name, detail);
            }
            Err(why) => {
                failed += 1;
                println!("FAIL {:<28} {}", c.name, why);
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
