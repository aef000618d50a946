//! `gemm_cpu_time calls`: single `matmul` calls timed as `xtask bench-compute` times them
//! (wall clock per call, weights rotated past the last-level cache), with the median beside
//! the best: on 2 threads a call's fixed costs (fork-joins, a worker waking, the tail) show
//! in the spread between the two. The FMA probes right before and after each case are printed
//! apart: one that reads one core's worth marks a case the host's other tenants shared
//! (docs/PERFORMANCE.md#measuring-on-a-shared-host).

use super::common::{bf16_data, bytes, mx_data, vector};
use k3_kernels::simd::active_level;
use k3_kernels::{matmul, probe, Matrix};
use std::hint::black_box;
use std::time::Instant;

/// Seconds of timed calls per case (`SECS`, default 0.6 as `bench-compute`).
fn secs() -> f64 {
    std::env::var("SECS").map_or(0.6, |v| v.parse().expect("SECS: seconds"))
}

/// Per-call wall seconds of `f` for about `secs` seconds (≥ 5 calls) after one warm-up, sorted.
fn call_times(secs: f64, mut f: impl FnMut()) -> Vec<f64> {
    f();
    let (start, mut v) = (Instant::now(), Vec::new());
    while v.len() < 5 || start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        f();
        v.push(t.elapsed().as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    v
}

/// The wall-clock FMA peak of the pool (GFLOP/s), best of 0.15 s of probes.
fn peak() -> f64 {
    let (level, n, iters) = (active_level(), rayon::current_num_threads(), 4_000_000);
    let s = call_times(0.15, || {
        rayon::broadcast(|_| black_box(probe::fma_loop(level, iters)));
    })[0];
    (probe::fma_loop_flops(level, iters) * n as u64) as f64 / s / 1e9
}

/// Times `t`-token calls over `mats` in rotation and prints best / median against the better
/// of the peaks probed right before and after (both printed).
fn case(name: &str, mats: &[Matrix], t: usize) {
    let (rows, cols) = (mats[0].rows, mats[0].cols);
    let x = vector(t * cols);
    let mut y = vec![0f32; t * rows];
    let p0 = peak();
    let mut k = 0;
    let v = call_times(secs(), || {
        k = (k + 1) % mats.len();
        matmul(&mut y, &mats[k], black_box(&x), t);
    });
    let p1 = peak();
    let pk = p0.max(p1);
    let gf = |s: f64| 2.0 * (t * rows * cols) as f64 / s / 1e9;
    let (best, med) = (gf(v[0]), gf(v[v.len() / 2]));
    println!(
        "{name:5} {rows:5}x{cols:<5} T {t:3}: best {:6.3} ms {:5.1} %  median {:6.3} ms {:5.1} %  ({} calls, peak {p0:.1} before, {p1:.1} after)",
        v[0] * 1e3,
        100.0 * best / pk,
        v[v.len() / 2] * 1e3,
        100.0 * med / pk,
        v.len()
    );
}

/// The MXFP4 token counts: `TS` (comma-separated), else `default`.
fn token_counts(default: &[usize]) -> Vec<usize> {
    std::env::var("TS").map_or(default.to_vec(), |v| {
        v.split(',')
            .map(|t| t.trim().parse().expect("TS"))
            .collect()
    })
}

/// Matrices per case: ≥ 96 MB of weights (3× a 32 MB L3), as `bench-compute`.
fn rotation(bytes_per: usize) -> usize {
    96_000_000usize.div_ceil(bytes_per).clamp(2, 32)
}

pub fn main() {
    let threads = std::env::var("THREADS").map_or(2, |v| v.parse().expect("THREADS"));
    let only = std::env::var("ONLY").unwrap_or_else(|_| "bf,mx,q8".into());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    pool.install(|| {
        println!(
            "{threads} threads, {}, wall clock per call",
            active_level().name()
        );
        if only.contains("bf") {
            let w: Vec<_> = (0..rotation(1536 * 7168 * 2))
                .map(|_| bf16_data(1536 * 7168))
                .collect();
            for (r, c) in [(1536, 7168), (7168, 1536)] {
                let m: Vec<_> = w.iter().map(|w| Matrix::bf16(r, c, w).unwrap()).collect();
                case("bf16", &m, 32);
                case("bf16", &m, 64);
            }
        }
        if only.contains("f32") {
            let w: Vec<Vec<f32>> = (0..rotation(1536 * 7168 * 4) as u64)
                .map(|s| {
                    vector(1536 * 7168)
                        .iter()
                        .map(|v| v * (1.0 + s as f32))
                        .collect()
                })
                .collect();
            for (r, c, t) in [(1536, 7168, 32), (7168, 1536, 64)] {
                let m: Vec<_> = w.iter().map(|w| Matrix::f32(r, c, w).unwrap()).collect();
                case("f32", &m, t);
            }
        }
        if only.contains("mx") {
            let per = 3072 * 3584 / 2 + 3072 * 3584 / 32;
            let d: Vec<_> = (0..rotation(per) as u64)
                .map(|e| mx_data(3072, 3584, 11 + e))
                .collect();
            let m: Vec<_> = d
                .iter()
                .map(|(p, s)| Matrix::mxfp4(3072, 3584, p, s).unwrap())
                .collect();
            for &t in &token_counts(&[8, 16, 32]) {
                case("mxfp4", &m, t);
            }
            let m: Vec<_> = d
                .iter()
                .map(|(p, s)| Matrix::mxfp4(3584, 3072, p, s).unwrap())
                .collect();
            case("mx-w2", &m, 16);
        }
        if only.contains("q8") {
            let v: Vec<Vec<i8>> = (0..rotation(1536 * 7168) as u64)
                .map(|s| {
                    bytes(1536 * 7168, 5 + s)
                        .into_iter()
                        .map(|b| b as i8)
                        .collect()
                })
                .collect();
            let sc = vec![0.01f32; 7168];
            for (r, c, t) in [(1536, 7168, 32), (7168, 1536, 64)] {
                let m: Vec<_> = v
                    .iter()
                    .map(|v| Matrix::q8(r, c, v, &sc[..r]).unwrap())
                    .collect();
                case("q8", &m, t);
            }
        }
    });
}
