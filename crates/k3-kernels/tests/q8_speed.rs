//! Q8 vs bf16 throughput (ignored; run by hand):
//! `cargo test --release -p k3-kernels --test q8_speed -- --ignored --nocapture`.
//! Mat-vec: weight GB/s (best call); GEMM: GFLOP/s. Several matrices in rotation so the
//! mat-vec working set exceeds the last-level cache.

use half::bf16;
use k3_kernels::quant::quantize_q8_rows;
use k3_kernels::{matmul, par_matvec, Matrix};
use std::hint::black_box;
use std::time::Instant;

fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn best(calls: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..calls)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

struct Owned {
    b: Vec<bf16>,
    q: Vec<i8>,
    s: Vec<f32>,
}

fn make(rows: usize, cols: usize, seed: u64) -> Owned {
    let f = vals(rows * cols, seed);
    let (mut q, mut s) = (vec![0i8; rows * cols], vec![0f32; rows]);
    quantize_q8_rows(&f, rows, cols, &mut q, &mut s).unwrap();
    Owned {
        b: f.iter().map(|&v| bf16::from_f32(v)).collect(),
        q,
        s,
    }
}

fn case(rows: usize, cols: usize, t: usize, copies: usize, threads: usize) {
    let ws: Vec<Owned> = (0..copies)
        .map(|k| make(rows, cols, 7 + k as u64))
        .collect();
    let x = vals(t * cols, 3);
    let mut y = vec![0f32; t * rows];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    for (name, pick) in [("bf16", 0), ("q8", 1)] {
        let mats: Vec<Matrix> = ws
            .iter()
            .map(|w| match pick {
                0 => Matrix::bf16(rows, cols, &w.b).unwrap(),
                _ => Matrix::q8(rows, cols, &w.q, &w.s).unwrap(),
            })
            .collect();
        let mut k = 0;
        let secs = pool.install(|| {
            best(24, || {
                let m = &mats[k % mats.len()];
                k += 1;
                if t == 1 {
                    par_matvec(&mut y, m, black_box(&x));
                } else {
                    matmul(&mut y, m, black_box(&x), t);
                }
            })
        });
        let gbs = mats[0].weight_bytes() as f64 / secs / 1e9;
        let gflops = 2.0 * (rows * cols * t) as f64 / secs / 1e9;
        println!(
            "{name:5} {rows:6} x {cols:5} T {t:3} threads {threads}: {gbs:6.2} GB/s weights, {gflops:6.1} GFLOP/s"
        );
    }
}

#[test]
#[ignore]
fn q8_vs_bf16_throughput() {
    for threads in [1, 2] {
        case(128, 2048, 1, 1, threads);
        case(12288, 7168, 1, 2, threads);
        case(7168, 1536, 1, 8, threads);
        case(1536, 7168, 32, 1, threads);
        case(7168, 1536, 64, 1, threads);
    }
}
