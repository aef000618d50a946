//! `cargo xtask conformance`: one line per check, then `N passed, M failed`.
//!
//! `--numerics MODE` runs them in another numeric mode (docs/NUMERICS.md#numeric-mode-fast),
//! refused with exit 2 where the mode cannot run. No check is defined by contract v2's bits,
//! so every one stays in force in every mode: the format checks decode and parse (no weight
//! product), the op fixtures have f32 weights (contract v2 in every mode) against upstream's
//! float reference, and the tiny models' logits, argmax and greedy ids are compared with the
//! float64 reference's (`ops::tiny`). Before the summary, a table gives each tiny model's
//! figures labelled with the mode: worst logit ratio to the tolerance and ids matched.

mod format;
mod ops;

use k3_kernels::fast::Numerics;
use ops::tiny::Figures;
use std::path::Path;
use std::process::ExitCode;

/// k3's own tiny checkpoints under `fixtures/`, checked end to end when present.
const TINY_MODELS: [&str; 2] = ["tiny-k3", "tiny-k3-wide"];

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

/// `--numerics`: any [`Numerics::name`] (and `amx-bf16x3`).
pub fn parse_numerics(s: &str) -> Result<Numerics, String> {
    Numerics::parse(s).ok_or_else(|| "expected v2, fast, amx-bf16x2 or amx-bf16x1".into())
}

/// Runs every group of checks (in `numerics`, when given) and prints the summary; exit 1
/// when any failed, 2 when the fixtures are missing or the mode cannot run here.
pub fn run(upstream: &Path, numerics: Option<Numerics>) -> ExitCode {
    if !upstream.is_dir() {
        eprintln!(
            "conformance: upstream fixtures not found at {} (pass --upstream DIR)",
            upstream.display()
        );
        return ExitCode::from(2);
    }
    if let Err(e) = numerics.map_or(Ok(()), k3_kernels::fast::set_numerics) {
        eprintln!("conformance: {e}");
        return ExitCode::from(2);
    }
    let mut checks = Vec::new();
    checks.extend(format::checks(upstream));
    checks.extend(ops::checks(upstream));
    let mut figures = Vec::new();
    for m in TINY_MODELS {
        let dir = crate::fuzz::workspace_root().join("fixtures").join(m);
        if dir.join("expected.json").is_file() {
            let measured = ops::tiny::measure(&dir);
            checks.push(Check {
                name: format!("model/{m}"),
                result: measured
                    .as_ref()
                    .map_err(Clone::clone)
                    .and_then(Figures::verdict),
            });
            figures.push((m, measured.ok()));
        }
    }
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
    if let Some(mode) = numerics {
        print_figures(mode, &figures);
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The tiny models' figures in `mode`, one row each, as docs/NUMERICS.md#numeric-mode-fast
/// tabulates them: worst logit ratio to the tolerance (≤ 1 passes), then cases whose ids all
/// match the reference's (ids matched in brackets; greedy: up to the first difference).
fn print_figures(mode: Numerics, figures: &[(&str, Option<Figures>)]) {
    println!(
        "numerics {}: every check above is in force (none is defined by contract v2's bits)",
        mode.name()
    );
    println!(
        "{:<14} {:<11} {:>10}  {:<14} greedy ids",
        "model", "numerics", "ratio", "tf argmax"
    );
    for (m, f) in figures {
        let Some(f) = f else {
            println!("{m:<14} {:<11} (did not run: see model/{m})", mode.name());
            continue;
        };
        let matched =
            |cases: usize, (ids, of): (usize, usize)| format!("{cases}/{} ({ids}/{of})", f.cases);
        println!(
            "{m:<14} {:<11} {:>10.4}  {:<14} {}",
            mode.name(),
            f.worst,
            matched(f.tf_cases, f.tf_ids),
            matched(f.greedy_cases, f.greedy_ids)
        );
    }
}
