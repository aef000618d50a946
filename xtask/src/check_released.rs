//! `cargo xtask check-released [--dir DIR [--reuse]] [--keep] [--ids 1,2] [-n N] [--threads T]
//! [--k3 PATH]`: the
//! headline at full size (docs/PERFORMANCE.md#released-geometry). Writes the released geometry
//! as a sparse checkpoint (`crate::gen_released`), plans every preset and `--mem-gb 8/16/32`
//! against this machine, then runs `k3 run --preset laptop` under a cgroup v2 `memory.max` of
//! the budget when a delegated one is writable, else under `RLIMIT_DATA` of the budget (its
//! heap and anonymous memory capped), measuring the child's peak RSS (VmHWM from its `--json`
//! and `getrusage(RUSAGE_CHILDREN)`), and asserts peak RSS ≤ 8 GiB and the plan's TOTAL
//! within 5 % of the measured peak.
//!
//! Not in `cargo test`: one forward pass at full size streams ~109 GB of trunk (holes, read at
//! memory speed) and takes minutes on 2 cores.

use clap::Args;
use k3_engine::{Budget, Preset};
use k3_plan::plan::GB;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The laptop preset's promise: peak RSS within 8 GiB.
const LAPTOP_LIMIT: u64 = 8 << 30;
/// Largest allowed |forecast − peak| ÷ peak.
const FORECAST_TOLERANCE: f64 = 0.05;

/// Flags of `check-released`.
#[derive(Args, Debug)]
pub struct CheckReleasedArgs {
    /// Write the sparse checkpoint here (default: a temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the checkpoint afterwards (it is removed by default).
    #[arg(long)]
    pub keep: bool,
    /// Reuse a checkpoint already in --dir instead of writing it again.
    #[arg(long, requires = "dir")]
    pub reuse: bool,
    /// Prompt ids (below 16,384: rows with random embeddings).
    #[arg(long, default_value = "1,2")]
    pub ids: String,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 1)]
    pub gen: usize,
    /// Compute threads of the run (default: k3's).
    #[arg(long)]
    pub threads: Option<usize>,
    /// A built k3 binary to run (default: `cargo build --release -p k3-cli` first).
    #[arg(long)]
    pub k3: Option<PathBuf>,
}

/// Runs the check.
pub fn run(args: &CheckReleasedArgs) -> ExitCode {
    let (dir, temp) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("k3-released-{}", std::process::id())),
            true,
        ),
    };
    let result = check(args, &dir);
    if !args.keep && (temp || !args.reuse) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("check-released: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check(args: &CheckReleasedArgs, dir: &Path) -> Result<(), String> {
    if !args.reuse {
        let w = crate::gen_released::write(dir, 0)?;
        crate::gen_released::print(dir, &w);
    }
    // The run's context: the plan then counts the latent KV and prefill scratch it can use.
    plan_all(dir, 16)?;
    let k3 = match &args.k3 {
        Some(k3) => k3.clone(),
        None => crate::serve_process::build_k3(&crate::fuzz::workspace_root())?,
    };
    let json = dir.join("check-released.json");
    let mut cmd = Command::new(&k3);
    cmd.arg("run")
        .arg(dir)
        .args(["--ids", &args.ids, "-n", &args.gen.to_string(), "-c", "16"])
        .args(["--preset", "laptop", "--print-ids", "-v", "--json"])
        .arg(&json);
    if let Some(t) = args.threads {
        cmd.args(["--threads", &t.to_string()]);
    }
    let mechanism = cap(&mut cmd, LAPTOP_LIMIT);
    println!("running (memory cap: {mechanism}): {cmd:?}");
    let status = cmd.status().map_err(|e| format!("{}: {e}", k3.display()))?;
    let rusage_peak = children_max_rss();
    if !status.success() {
        return Err(format!("k3 run --preset laptop failed: {status}"));
    }
    let text = std::fs::read_to_string(&json).map_err(|e| format!("{}: {e}", json.display()))?;
    let report: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))?;
    verdict(&report, rusage_peak)
}

/// Prints the plan of every preset and `--mem-gb 8/16/32` and whether it fits here.
fn plan_all(dir: &Path, ctx: usize) -> Result<(), String> {
    let mut budgets: Vec<(String, Budget)> = Preset::ALL
        .iter()
        .map(|&p| (format!("--preset {p}"), Budget::Preset(p)))
        .collect();
    budgets.extend([8, 16, 32].map(|g| (format!("--mem-gb {g}"), Budget::Total(g * GB))));
    println!("\n| budget | plan TOTAL | pinned / ring / expert slots | fits this machine |");
    println!("|---|---|---|---|");
    for (name, budget) in budgets {
        match k3_engine::planning::forecast(dir, budget, ctx, 1, 0) {
            Ok((plan, avail, fits)) => println!(
                "| {name} | {:.3} GB | {} / {} / {} | {} |",
                plan.total_bytes() as f64 / 1e9,
                plan.trunk.pinned.len(),
                plan.trunk.ring_slots,
                plan.expert_slots,
                match fits {
                    Ok(()) => format!(
                        "yes ({:.1} GB available)",
                        avail.bytes().unwrap_or(0) as f64 / 1e9
                    ),
                    Err(e) => format!("refused: {}", e.to_string().lines().next().unwrap_or("")),
                }
            ),
            Err(e) => println!("| {name} | refused by the planner: {e} | | |"),
        }
    }
    println!();
    Ok(())
}

/// Puts `cmd` under a cgroup v2 `memory.max` of `limit` when a delegated one is writable;
/// returns the mechanism's name.
fn cap(cmd: &mut Command, limit: u64) -> String {
    let Some(cg) = cgroup_v2(limit) else {
        return cap_data(cmd, limit);
    };
    let procs = cg.join("cgroup.procs");
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(format!("echo $$ > '{}' && exec \"$@\"", procs.display()))
        .arg("sh")
        .arg(program)
        .args(args);
    *cmd = sh;
    format!("cgroup v2 memory.max = {limit} in {}", cg.display())
}

/// Without a cgroup: `RLIMIT_DATA` = `limit` on the child, which caps its private writable
/// memory (heap and anonymous mappings, Linux ≥ 4.7) — every buffer the plan budgets — so an
/// overshoot fails the run with an allocation error instead of passing; file-backed pages
/// are not capped by it and are covered by the measured peak RSS.
fn cap_data(cmd: &mut Command, limit: u64) -> String {
    use std::os::unix::process::CommandExt;
    let rl = libc::rlimit {
        rlim_cur: limit as libc::rlim_t,
        rlim_max: limit as libc::rlim_t,
    };
    // SAFETY: the closure runs in the forked child before exec and only calls setrlimit,
    // which is async-signal-safe, on a value copied into the closure.
    unsafe {
        cmd.pre_exec(move || {
            // SAFETY: `rl` is a valid rlimit; RLIMIT_DATA is a valid resource.
            if libc::setrlimit(libc::RLIMIT_DATA, &rl) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    format!("RLIMIT_DATA = {limit} B (no writable cgroup v2): anonymous memory capped, peak RSS measured")
}

/// A writable delegated cgroup v2 directory with `memory.max` set, if any.
fn cgroup_v2(limit: u64) -> Option<PathBuf> {
    let name = format!("k3-check-released-{}", std::process::id());
    k3_store::memory_cgroup(&name, limit)
}

/// Peak RSS of the largest waited-for child, bytes (`ru_maxrss` is in KiB on Linux).
fn children_max_rss() -> u64 {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage`; RUSAGE_CHILDREN is a valid `who`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    if rc == 0 {
        ru.ru_maxrss.max(0) as u64 * 1024
    } else {
        0
    }
}

/// Prints the measured row and checks the two promises.
fn verdict(report: &serde_json::Value, rusage_peak: u64) -> Result<(), String> {
    let hwm = report["peak_rss_bytes"].as_u64().unwrap_or(0);
    let peak = hwm.max(rusage_peak);
    let forecast = report["plan"]["total_bytes"].as_u64().unwrap_or(0);
    let err = (forecast as f64 - peak as f64) / peak.max(1) as f64;
    let d = &report["decode"];
    let p = &report["prefill"];
    println!("\n| metric | value |\n|---|---|");
    println!("| generated ids | {} |", report["generated_ids"]);
    println!(
        "| peak RSS (VmHWM / ru_maxrss) | {:.3} GiB ({hwm} / {rusage_peak} B) |",
        peak as f64 / (1u64 << 30) as f64
    );
    println!(
        "| plan TOTAL (forecast) | {:.3} GiB ({:+.2} % of the peak) |",
        forecast as f64 / (1u64 << 30) as f64,
        100.0 * err
    );
    for (name, ph) in [("prompt pass", p), ("decode", d)] {
        println!(
            "| {name}: passes, s/pass, trunk / expert GB per pass, compute / trunk wait / expert wait s | {} , {:.1}, {:.2} / {:.2}, {:.1} / {:.1} / {:.1} |",
            ph["forward_passes"],
            ph["seconds_per_pass"].as_f64().unwrap_or(0.0),
            ph["bytes_read_trunk_per_pass"].as_f64().unwrap_or(0.0) / 1e9,
            ph["bytes_read_experts_per_pass"].as_f64().unwrap_or(0.0) / 1e9,
            ph["compute_seconds"].as_f64().unwrap_or(0.0),
            ph["trunk_wait_seconds"].as_f64().unwrap_or(0.0),
            ph["expert_wait_seconds"].as_f64().unwrap_or(0.0),
        );
    }
    if peak > LAPTOP_LIMIT {
        return Err(format!(
            "peak RSS {peak} B is over the laptop preset's 8 GiB ({LAPTOP_LIMIT} B)"
        ));
    }
    if err.abs() > FORECAST_TOLERANCE {
        return Err(format!(
            "the plan's TOTAL {forecast} B is {:+.2} % off the measured peak {peak} B (allowed ±5 %)",
            100.0 * err
        ));
    }
    println!("\ncheck-released: OK (peak ≤ 8 GiB, forecast within 5 %)");
    Ok(())
}
