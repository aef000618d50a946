//! `k3 run`'s files: the `--json` report (built by `k3_engine::run_report`) and the
//! `--dump-cache-trace` expert trace.

use crate::run_args::{json_to_stdout, RunArgs};
use crate::CliError;
use k3_engine::run_report::{expert_trace_bytes, run_json, RunFacts};
use k3_engine::{Engine, Session};
use std::path::Path;

/// Writes the `--json` report of a finished run.
pub fn write_json(
    path: &Path,
    args: &RunArgs,
    engine: &Engine,
    session: &Session<'_>,
    done: &RunFacts<'_>,
    ranks: &[k3_engine::RankFigures],
) -> Result<(), CliError> {
    let interrupted = crate::interrupt::requested();
    let report = run_json(engine, session, done, args.ignore_eos, interrupted, ranks);
    let text = serde_json::to_string_pretty(&report).unwrap_or_default();
    if json_to_stdout(args) {
        println!("{text}");
        return Ok(());
    }
    std::fs::write(path, text + "\n").map_err(|e| {
        CliError::runtime(format!("{}: cannot write JSON report: {e}", path.display()))
    })
}

/// Writes `DIR/expert_trace.bin`: per request, u32 LE layer then u32 LE expert.
pub fn write_trace(dir: &Path, trace: &[(u32, u32)]) -> Result<(), CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::runtime(format!("{}: {e}", dir.display())))?;
    let path = dir.join("expert_trace.bin");
    std::fs::write(&path, expert_trace_bytes(trace))
        .map_err(|e| CliError::runtime(format!("{}: {e}", path.display())))?;
    eprintln!(
        "expert trace: {} requests written to {}",
        trace.len(),
        path.display()
    );
    Ok(())
}
