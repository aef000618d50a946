//! `cargo xtask bench-trunk-pack MODEL_DIR --overlap`: does the piece ring
//! (docs/STREAMING.md#trunk-pieces) hide the trunk's reads behind compute? At the budget of
//! one slot per piece class (nothing pinned, every layer streamed every token, O_DIRECT), in
//! the same run: the O_DIRECT trunk read rate of this drive (whole runs, one read call each,
//! as the trunk store reads), the same model resident (compute alone, pages cached after a
//! warm-up), and the streamed runs — the piece ring, and one whole-layer slot with no
//! read-ahead for reference. Prints s/token against max(read, compute), read = the trunk's
//! bytes per token ÷ the measured rate. Ids must be identical (checked). Results:
//! docs/PERFORMANCE.md#trunk-read-ahead.

use crate::bench_util::{self, gb, median};
use k3_engine::{argmax, Budget, DecodeMode, Engine, EngineOptions};
use std::path::{Path, PathBuf};

/// One timed configuration.
struct Timed {
    s_tok: f64,
    trunk_bytes_tok: f64,
    wait_s_tok: f64,
    ids: Vec<u32>,
}

/// Runs the overlap measurement with `tokens` timed steps per run and `rounds` alternations.
pub fn overlap(
    dir: &Path,
    trunk: Option<&PathBuf>,
    tokens: usize,
    threads: Option<usize>,
    rounds: usize,
) -> Result<(), String> {
    println!("machine: {}", bench_util::machine_facts());
    let m = bench_util::model_info(dir)?;
    let disk = bench_util::measure_disk(&m, &[1], 0.5)?;
    println!(
        "O_DIRECT trunk read rate: {:.2} GB/s (direct I/O: {})",
        gb(disk.trunk),
        disk.direct
    );
    let pieces = k3_engine::planning::piece_ring_budget(dir)
        .map_err(|e| e.to_string())?
        .ok_or("the model's layers cannot be split into pieces")?;
    println!("budget: {pieces:?} (one slot per piece class: every trunk layer streams)");
    let mut resident = Vec::new();
    let mut ring = Vec::new();
    let mut single = Vec::new();
    for _ in 0..rounds.max(1) {
        resident.push(timed(dir, None, None, tokens, threads, true)?);
        ring.push(timed(dir, Some(pieces), trunk, tokens, threads, true)?);
        // The same budget planned in whole layers: one slot, no read-ahead at all.
        single.push(timed(dir, Some(pieces), trunk, tokens, threads, false)?);
    }
    let ids = &resident[0].ids;
    for (name, runs) in [("piece ring", &ring), ("1 whole slot", &single)] {
        if let Some(r) = runs.iter().find(|r| &r.ids != ids) {
            return Err(format!("{name} produced ids {:?}, resident {ids:?}", r.ids));
        }
    }
    println!("greedy ids (identical in every run): {ids:?}");
    let med =
        |runs: &[Timed], f: fn(&Timed) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let compute = med(&resident, |r| r.s_tok);
    println!();
    println!("| run | s/token | trunk GB/token | read s/token | compute s/token | trunk wait s/token | s/token ÷ max(read, compute) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!("| resident (compute) | {compute:.3} | 0 | 0 | {compute:.3} | 0 | 1.000 |");
    for (name, runs) in [
        ("piece ring, read-ahead", &ring),
        ("1 whole slot, no read-ahead", &single),
    ] {
        let (s, bytes, wait) = (
            med(runs, |r| r.s_tok),
            med(runs, |r| r.trunk_bytes_tok),
            med(runs, |r| r.wait_s_tok),
        );
        let read = bytes / disk.trunk;
        println!(
            "| {name} | {s:.3} | {:.3} | {read:.3} | {compute:.3} | {wait:.3} | {:.3} |",
            gb(bytes),
            s / read.max(compute)
        );
    }
    Ok(())
}

/// Opens the model (resident without a budget; streamed from `trunk` or the shards with one)
/// and times `tokens` greedy steps after a 4-id prompt and one untimed step.
fn timed(
    dir: &Path,
    budget: Option<Budget>,
    trunk: Option<&PathBuf>,
    tokens: usize,
    threads: Option<usize>,
    pieces: bool,
) -> Result<Timed, String> {
    let opts = EngineOptions {
        trunk_pieces: pieces,
        threads,
        budget,
        ctx: tokens + 16,
        direct_io: true,
        trunk_dir: budget.and(trunk.cloned()),
        ..EngineOptions::default()
    };
    let engine = Engine::open(dir, opts).map_err(|e| e.to_string())?;
    if budget.is_some() {
        let got = engine.stats().trunk_pieces;
        if got != if pieces { 2 } else { 1 } {
            return Err(format!(
                "asked for pieces {pieces}, the trunk streams in {got}"
            ));
        }
    }
    let vocab = engine.config().vocab_size;
    let prompt = bench_util::prompt_ids(4, vocab, 7);
    let mut s = engine.new_session(tokens + 16).map_err(|e| e.to_string())?;
    s.feed(&prompt).map_err(|e| e.to_string())?;
    // One untimed step: the resident model's pages are then cached, the ring is primed.
    let mut ids = vec![argmax(s.logits())];
    s.step(ids[0], DecodeMode::Incremental)
        .map_err(|e| e.to_string())?;
    let (times, d) = crate::bench_util::timed_greedy_steps(&engine, &mut s, tokens, &mut ids)?;
    let n = times.len() as f64;
    Ok(Timed {
        s_tok: median(&times),
        trunk_bytes_tok: d.trunk_bytes_read as f64 / n,
        wait_s_tok: d.trunk_wait_seconds / n,
        ids,
    })
}
