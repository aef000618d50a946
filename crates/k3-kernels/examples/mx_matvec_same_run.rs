//! MXFP4 `par_matvec` GB/s of packed weights (expert w1/w3 3072 × 3584, w2 3584 × 3072),
//! rotating ≥ 96 MB of matrices so the weights come from DRAM, best of 0.6 s, on 1 and 2
//! threads. The same file builds against any tree's k3-kernels, so the current kernel and an
//! older one can be timed alternately on one machine (docs/PERFORMANCE.md, session 8: the
//! contract-v1 tree, commit 25e0bac, against this one).
//!
//! `cargo run --release -p k3-kernels --example mx_matvec_same_run`
//!
//! Self-contained on purpose (its own byte generator instead of `benches/common`, which older
//! trees lack), so it can be copied into one.
use k3_kernels::{par_matvec, Matrix};
use std::hint::black_box;
use std::time::Instant;

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

fn main() {
    for &(rows, cols) in &[(3072usize, 3584usize), (3584, 3072)] {
        let per = rows * cols / 2 + rows * cols / 32;
        let n = 96_000_000usize.div_ceil(per).clamp(2, 32);
        let data: Vec<(Vec<u8>, Vec<u8>)> = (0..n as u64)
            .map(|e| {
                let p = bytes(rows * cols / 2, 2 * e + 1);
                let s = bytes(rows * cols / 32, 2 * e + 2)
                    .into_iter()
                    .map(|b| 118 + b % 16)
                    .collect();
                (p, s)
            })
            .collect();
        let mats: Vec<Matrix> = data
            .iter()
            .map(|(p, s)| Matrix::mxfp4(rows, cols, p, s).unwrap())
            .collect();
        let x: Vec<f32> = (0..cols).map(|i| ((i % 17) as f32 - 8.0) * 0.125).collect();
        let mut y = vec![0f32; rows];
        for threads in [1usize, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut best = f64::INFINITY;
            let mut k = 0;
            pool.install(|| {
                let t0 = Instant::now();
                let mut calls = 0;
                while calls < 4 || t0.elapsed().as_secs_f64() < 0.6 {
                    k = (k + 1) % mats.len();
                    let t = Instant::now();
                    par_matvec(&mut y, &mats[k], black_box(&x));
                    best = best.min(t.elapsed().as_secs_f64());
                    calls += 1;
                }
            });
            println!(
                "MXFP4 mat-vec {rows}x{cols} threads {threads}: {:6.2} GB/s",
                per as f64 / best / 1e9
            );
        }
    }
}
