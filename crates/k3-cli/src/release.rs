//! Kimi K3 as released, sized before it is downloaded (docs/MODELS.md#sizing-the-release):
//! the disk the checkpoint, the packed trunk and a q8 draft trunk take, computed from the
//! released tensor shapes (`k3_format::released::layout`, the same layout the released-
//! geometry tests plan), and `k3 doctor`'s section comparing them with the free disk and
//! predicting each preset's s/token from a read test on that disk.

use crate::CliError;
use k3_engine::io_probe::{scratch_read_test, SCRATCH_BYTES};
use k3_engine::release_sizes::{release_disk, released_sizes};
use k3_engine::{Budget, Preset};
use k3_plan::plan::{fmt_bytes, plan as make_plan};
use k3_plan::recommend::bytes_per_token;
use k3_plan::PlanRequest;
use k3_store::probe::{free_disk, Bandwidth};
use std::path::{Path, PathBuf};

/// The directory `k3 pull` would fill, or its nearest existing ancestor (for statvfs).
fn existing_ancestor(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|a| a.is_dir())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// `k3 doctor`'s section without a model: the release's disk needs against the free space
/// where `k3 pull` puts it (or `disk`), and each preset's I/O floor over a read test there.
pub fn doctor_release(disk: Option<&Path>, ctx: usize, io_secs: f64) -> Result<(), CliError> {
    let target = match disk {
        Some(d) => d.to_path_buf(),
        None => k3_hub::store::models_root()?,
    };
    let at = existing_ancestor(&target);
    let need = release_disk()?;
    let free = free_disk(&at);
    println!(
        "\nKimi K3 as released, before downloading (sizes from its tensor shapes; disk: {})",
        target.display()
    );
    let mut running = 0;
    for (what, bytes) in [
        ("checkpoint", need.checkpoint),
        ("packed trunk", need.packed_trunk),
        ("q8 draft trunk", need.draft_q8),
    ] {
        running += bytes;
        let verdict = match free {
            Some(f) if running <= f => "fits".to_string(),
            Some(f) => format!("short by {}", fmt_bytes(running - f)),
            None => "free space unknown".into(),
        };
        println!(
            "  {what:<16} {:>10}   with the above {:>10}: {verdict}",
            fmt_bytes(bytes),
            fmt_bytes(running)
        );
    }
    if let Some(f) = free {
        println!(
            "  free disk        {:>10} at {}",
            fmt_bytes(f),
            at.display()
        );
    }
    let bw = scratch_bandwidth(&at, io_secs);
    presets_on_disk(ctx, &bw)
}

/// Every preset's RAM and I/O floor for the release over the measured bandwidth.
fn presets_on_disk(ctx: usize, bw: &Bandwidth) -> Result<(), CliError> {
    let (sizes, moe_layers) = released_sizes();
    println!(
        "  {:<12} {:>10} {:>7} {:>11} {:>10}",
        "preset", "RAM", "hit", "read/token", "s/token"
    );
    for p in Preset::ALL {
        let plan = make_plan(&sizes, &PlanRequest::new(Budget::Preset(p), ctx as u64))
            .map_err(|e| CliError::usage(e.to_string()))?;
        let hit = k3_plan::forecast::hit_rate(p, &plan, &sizes);
        let (trunk, experts) = bytes_per_token(&plan, hit, &sizes, moe_layers);
        let secs = bw.floor_secs(trunk, experts);
        println!(
            "  {:<12} {:>10} {:>6.1}% {:>11} {:>10}",
            p.name(),
            fmt_bytes(plan.total_bytes()),
            hit * 100.0,
            fmt_bytes((trunk + experts) as u64),
            secs.map_or("?".to_string(), |s| format!("≥ {s:.2}"))
        );
    }
    println!("  s/token: the I/O floor on this disk (compute not included; hit rates: docs/PERFORMANCE.md decode view)");
    Ok(())
}

/// Measures reads of one expert's size at 1 and 16 outstanding reads over a scratch file in
/// `dir` (`k3_engine::io_probe`) and prints the rates.
fn scratch_bandwidth(dir: &Path, secs: f64) -> Bandwidth {
    let result = scratch_read_test(dir, secs).map(|(bw, direct)| (bw.levels, direct));
    match result {
        Ok((levels, direct)) => {
            println!(
                "  read test        {} reads of 17.55 MB over a {} scratch file in {} (optimistic: a small file sits in the drive's cache; `k3 doctor MODEL` measures the real files)",
                if direct { "O_DIRECT" } else { "buffered" },
                fmt_bytes(SCRATCH_BYTES),
                dir.display()
            );
            for (qd, bps) in &levels {
                println!("  {qd:>2} outstanding   {}/s", fmt_bytes(*bps as u64));
            }
            Bandwidth { levels }
        }
        Err(e) => {
            println!("  read test        skipped: {e}");
            Bandwidth { levels: Vec::new() }
        }
    }
}
