//! `matmul` GFLOP/s next to the register-only FMA peak of the same level and pool, for
//! iterating on the GEMM tiles (`bench-compute` is the reference measurement). Best of 31
//! trials per case, per on-CPU second of the calling thread (ignores other tenants' time
//! slices) or, with `WALL=1` (needed for `THREADS` > 1), per wall-clock second.
//!
//! `[THREADS=N] [WALL=1] cargo run --release -p k3-kernels --example gemm_cpu_time [bf|bfs|mx|mx8|mx16|mxs|mxhot|q8|hot|all|calls]`
//! (`calls`: single calls as `bench-compute` times them — wall clock, weights rotated past the
//! last-level cache, ~`SECS` (0.6) s per case — best and median per call, `THREADS` threads
//! (default 2), the GEMM shapes of `ONLY=bf,mx,q8` (the default; `f32` adds the f32 ones);
//! (`bfs`: only the short-row bf16 shape, 7168 × 1536; `TS=9,12`: the MXFP4 token counts;
//! `LEVEL=avx2+fma`: a level below the
//! detected one; `ROT=1`: one matrix per case instead of
//! a rotation past the last-level cache)

use k3_kernels::simd::{active_level, available_levels, Level};
use k3_kernels::{matmul_at, probe, Matrix};
use std::hint::black_box;

use common::{best_seconds, bf16_data, bytes, mx_data, vector};
use k3_testkit::bench_data as common;

#[path = "gemm_cpu_time/calls.rs"]
mod calls;

/// Best seconds of `f` over 31 trials (on-CPU, or wall with `WALL`).
fn best(f: impl FnMut()) -> f64 {
    best_seconds(31, f)
}

/// Matrices per case: `default` (past the last-level cache), or `ROT=n` (1: one matrix, whose
/// weights stay in L3 between calls when it fits).
fn rotation(default: usize) -> usize {
    std::env::var("ROT")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(default, |n: usize| n.max(1))
}

fn case(level: Level, name: &str, mats: &[Matrix], t: usize, peak: f64) {
    let (rows, cols) = (mats[0].rows, mats[0].cols);
    let x = vector(t * cols);
    let mut y = vec![0f32; t * rows];
    // ≈ 2 GFLOP per trial (~30 ms on one thread).
    let reps = (2e9 / (2.0 * (t * rows * cols) as f64)).ceil() as usize;
    let s = best(|| {
        for i in 0..reps {
            matmul_at(level, &mut y, &mats[i % mats.len()], black_box(&x), t);
        }
    });
    let gf = 2.0 * (reps * t * rows * cols) as f64 / s / 1e9;
    println!(
        "{name:6} {rows:5}x{cols:<5} T {t:3}: {gf:6.1} GFLOP/s  {:5.1} % of peak",
        100.0 * gf / peak
    );
}

/// The detected level, or the one `LEVEL` names (`avx2+fma`, `avx512f`, `neon`).
fn level() -> Level {
    match std::env::var("LEVEL") {
        Ok(name) => available_levels()
            .into_iter()
            .find(|l| l.name() == name)
            .unwrap_or_else(|| panic!("LEVEL={name}: not a level this CPU has")),
        Err(_) => active_level(),
    }
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    if which == "calls" {
        return calls::main();
    }
    let threads = std::env::var("THREADS").map_or(1, |v| v.parse().unwrap());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let level = level();
        let iters = 10_000_000;
        let s = best(|| {
            rayon::broadcast(|_| black_box(probe::fma_loop(level, iters)));
        });
        let peak = (threads as u64 * probe::fma_loop_flops(level, iters)) as f64 / s / 1e9;
        let clock = if std::env::var_os("WALL").is_some() {
            "wall"
        } else {
            "on-CPU"
        };
        println!(
            "level {}: FMA peak {peak:.1} GFLOP/s ({clock})",
            level.name()
        );
        if which == "hot" {
            // Weights that stay in L2 (256 KB per thread at 2 threads): the tiles without DRAM.
            let w = [bf16_data(128 * 2048)];
            let m: Vec<_> = w
                .iter()
                .map(|w| Matrix::bf16(128, 2048, w).unwrap())
                .collect();
            case(level, "bf16", &m, 48, peak);
        }
        if which == "mxhot" {
            // MXFP4 weights that stay in L2 (512 KB + scales): the fused tile without DRAM.
            let (p, s) = mx_data(256, 4096, 7);
            let m = [Matrix::mxfp4(256, 4096, &p, &s).unwrap()];
            for t in [8, 16] {
                case(level, "mxfp4", &m, t, peak);
            }
        }
        if which.starts_with("bf") || which == "all" {
            let w: Vec<_> = (0..rotation(3)).map(|_| bf16_data(1536 * 7168)).collect();
            if which != "bfs" {
                let m: Vec<_> = w
                    .iter()
                    .map(|w| Matrix::bf16(1536, 7168, w).unwrap())
                    .collect();
                case(level, "bf16", &m, 32, peak);
                case(level, "bf16", &m, 64, peak);
            }
            let m: Vec<_> = w
                .iter()
                .map(|w| Matrix::bf16(7168, 1536, w).unwrap())
                .collect();
            case(level, "bf16", &m, 32, peak);
            case(level, "bf16", &m, 64, peak);
        }
        if which.starts_with("mx") || which == "all" {
            let d: Vec<_> = (0..rotation(6) as u64)
                .map(|e| mx_data(3072, 3584, 11 + e))
                .collect();
            let m: Vec<_> = d
                .iter()
                .map(|(p, s)| Matrix::mxfp4(3072, 3584, p, s).unwrap())
                .collect();
            let ts: Vec<usize> = match (std::env::var("TS"), which.as_str()) {
                (Ok(list), _) => list.split(',').map(|v| v.parse().unwrap()).collect(),
                (_, "mx8") => vec![8],
                (_, "mx16") => vec![16],
                (_, "mxs") => vec![2, 3, 4, 6, 8],
                _ => vec![8, 16, 32],
            };
            for t in ts {
                case(level, "mxfp4", &m, t, peak);
            }
        }
        if which == "q8" || which == "all" {
            let v: Vec<i8> = bytes(1536 * 7168, 5).into_iter().map(|b| b as i8).collect();
            let sc = vec![0.01f32; 1536];
            let m = [Matrix::q8(1536, 7168, &v, &sc).unwrap()];
            case(level, "q8", &m, 32, peak);
        }
    });
}
