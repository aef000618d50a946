//! `par_matvec` GB/s of weight bytes from DRAM (≥ 96 MB of matrices in rotation), best call
//! of 0.6 s, on 1 and 2 threads: MXFP4 expert w1/w3 3072 × 3584 and w2 3584 × 3072, bf16
//! 12288 × 7168 and 7168 × 1536. The same file builds against any tree's k3-kernels, so the
//! current kernels and older ones can be timed alternately on one machine
//! (docs/PERFORMANCE.md#mat-vec: the contract-v1 tree, commit 25e0bac, against this one).
//!
//! `cargo run --release -p k3-kernels --example matvec_same_run [mx|bf]`
//!
//! Self-contained on purpose (its own byte generator instead of `benches/common`, which older
//! trees lack), so it can be copied into one.
use half::bf16;
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

/// Matrices of `per` bytes in rotation: enough for 96 MB (3× a 32 MB L3), at least 2.
fn rotation(per: usize) -> u64 {
    96_000_000usize.div_ceil(per).clamp(2, 32) as u64
}

/// Best-call GB/s of `par_matvec` over `mats` on 1 and 2 threads.
fn time(name: &str, mats: &[Matrix], per: usize) {
    let (rows, cols) = (mats[0].rows, mats[0].cols);
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
            "{name} mat-vec {rows}x{cols} threads {threads}: {:6.2} GB/s",
            per as f64 / best / 1e9
        );
    }
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    if which != "bf" {
        for &(rows, cols) in &[(3072usize, 3584usize), (3584, 3072)] {
            let per = rows * cols / 2 + rows * cols / 32;
            let data: Vec<(Vec<u8>, Vec<u8>)> = (0..rotation(per))
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
            time("MXFP4", &mats, per);
        }
    }
    if which != "mx" {
        for &(rows, cols) in &[(12288usize, 7168usize), (7168, 1536)] {
            let per = rows * cols * 2;
            let data: Vec<Vec<bf16>> = (0..rotation(per))
                .map(|e| {
                    bytes(rows * cols, e + 7)
                        .into_iter()
                        .map(|b| bf16::from_f32((b as f32 - 128.0) / 64.0))
                        .collect()
                })
                .collect();
            let mats: Vec<Matrix> = data
                .iter()
                .map(|d| Matrix::bf16(rows, cols, d).unwrap())
                .collect();
            time("bf16", &mats, per);
        }
    }
}
