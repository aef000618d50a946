//! Speed and accuracy of the AMX numeric modes beside contract v2 on this CPU
//! (docs/NUMERICS.md#numeric-mode-fast): `k3_kernels::matmul` (v2, the detected level) and
//! the AMX tile GEMM with 1, 2 and 3 bf16 pieces per activation (`fast::matmul_with`; 3 is
//! the mode `fast`), for bf16 trunk and MXFP4 expert shapes.
//!
//! `[THREADS=N] [WALL=1] cargo run --release -p k3-kernels --example amx_modes [T…]`
//!
//! GFLOP/s count the product's `2·rows·cols·T` in every mode, against the f32 FMA probe of
//! the same pool (the v2 kernels' ceiling; AMX's is up to 16× higher). Accuracy per output:
//! `|y − y_f64| / Σ|w·x|` against an f64 sum over the same (bf16 or decoded MXFP4) weights
//! and f32 activations, the maximum over sampled outputs. Timing: best of 9 trials of
//! ≈ 2 GFLOP, wall seconds (`WALL=1` is implied for `THREADS` > 1). Exit code 2 where AMX
//! is not usable.

use k3_testkit::bench_data as common;

use common::{best_seconds, bf16_data, max_rel_err, mx_data, vector};
use half::bf16;
use k3_kernels::fast::{amx_usable, matmul_with, Backend};
use k3_kernels::simd::detected_level;
use k3_kernels::{matmul, mxfp4, probe, Matrix};
use std::hint::black_box;

/// Matrices per case, used in rotation so that the weights come from DRAM, not L3.
const ROT: usize = 3;

fn case(kind: &str, ms: &[Matrix], wf: &[f32], t: usize, peak: f64) {
    let (rows, cols) = (ms[0].rows, ms[0].cols);
    let x = vector(t * cols);
    let reps = (2e9 / (2.0 * (t * rows * cols) as f64)).ceil() as usize;
    let flops = 2.0 * (reps * rows * cols * t) as f64;
    let mut y = vec![0f32; t * rows];
    // The accuracy check reads the last rep's matrix: make it matrix 0.
    let order = |i: usize| (reps - 1 - i) % ROT;
    let mut report = |name: &str, run: &mut dyn FnMut(&mut [f32], &Matrix)| {
        let s = best_seconds(9, || (0..reps).for_each(|i| run(&mut y, &ms[order(i)])));
        let gf = flops / s / 1e9;
        println!(
            "{kind:5} {rows:5}x{cols:<5} T {t:4} {name:10}: {gf:8.1} GFLOP/s {:7.1} % of the f32 FMA peak   max err {:.2e}",
            100.0 * gf / peak,
            max_rel_err(&y, wf, &x, rows, cols)
        );
    };
    report("v2", &mut |y, m| matmul(y, m, black_box(&x), t));
    for pieces in 1..=3 {
        let name = ["amx bf16", "amx bf16x2", "amx bf16x3"][pieces - 1];
        report(name, &mut |y, m| {
            matmul_with(Backend::Amx, pieces, y, m, black_box(&x), t)
        });
    }
}

fn main() {
    if !amx_usable() {
        eprintln!(
            "AMX is not usable here ({}): nothing to measure",
            probe::amx_bf16().label()
        );
        std::process::exit(2);
    }
    let threads: usize = std::env::var("THREADS").map_or(1, |v| v.parse().unwrap_or(1));
    if threads > 1 {
        std::env::set_var("WALL", "1");
    }
    let ts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ts = if ts.is_empty() {
        vec![16, 32, 64, 256]
    } else {
        ts
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    pool.install(|| {
        let level = detected_level();
        let iters = 10_000_000;
        let s = best_seconds(9, || {
            rayon::broadcast(|_| black_box(probe::fma_loop(level, iters)));
        });
        let peak = (threads as u64 * probe::fma_loop_flops(level, iters)) as f64 / s / 1e9;
        println!(
            "{threads} thread(s): f32 FMA peak ({}) {peak:.1} GFLOP/s",
            level.name()
        );
        for (rows, cols) in [(1536, 7168), (7168, 1536)] {
            let ws: Vec<Vec<bf16>> = (0..ROT).map(|_| bf16_data(rows * cols)).collect();
            let ms: Vec<Matrix> = ws
                .iter()
                .map(|w| Matrix::bf16(rows, cols, w).unwrap_or_else(|| panic!("shape")))
                .collect();
            let wf: Vec<f32> = ws[0].iter().map(|v| v.to_f32()).collect();
            for &t in &ts {
                case("bf16", &ms, &wf, t, peak);
            }
        }
        for (rows, cols) in [(3072, 3584), (3584, 3072)] {
            let mx: Vec<(Vec<u8>, Vec<u8>)> = (0..ROT as u64)
                .map(|s| mx_data(rows, cols, 7 + s))
                .collect();
            let ms: Vec<Matrix> = mx
                .iter()
                .map(|(p, s)| Matrix::mxfp4(rows, cols, p, s).unwrap_or_else(|| panic!("shape")))
                .collect();
            let wf = mxfp4::dequantize(&mx[0].0, &mx[0].1, rows, cols);
            // Expert groups: a released prompt's average ~5 tokens per routed expert.
            for t in [8, 16, 32] {
                case("mxfp4", &ms, &wf, t, peak);
            }
        }
    });
}
