//! Single-thread `matvec` throughput per **on-CPU second** (GB/s of weight bytes), next to
//! wall-clock GB/s. On a shared machine, where criterion's wall-clock numbers mostly measure
//! the other tenants, the on-CPU rate (Linux `/proc/thread-self/schedstat`) still compares
//! kernels. Cases: MXFP4 hot (L2-resident) / L1-resident / streamed from DRAM (12 distinct
//! [3072×3584] matrices), bf16 hot / streamed ([12288×7168]). Best of 7 trials each.
//!
//! `[SCALE=n] cargo run --release -p k3-kernels --example matvec_cpu_time [mx|bf]`

use k3_kernels::{matvec, Matrix};
use std::time::Instant;

use common::{bf16_data, cpu_ns, mx_data, vector};
use k3_testkit::bench_data as common;

/// Best on-CPU and wall GB/s over 7 trials of `iters` products rotating over `mats`.
fn run(name: &str, mats: &[Matrix], iters: usize) {
    let iters = iters * scale();
    let x = vector(mats[0].cols);
    let mut y = vec![0f32; mats[0].rows];
    let bytes = (mats[0].weight_bytes() * iters) as f64;
    let (mut cpu, mut wall) = (0f64, 0f64);
    for _ in 0..7 {
        let (c0, t0) = (cpu_ns(), Instant::now());
        for i in 0..iters {
            matvec(&mut y, &mats[i % mats.len()], &x);
        }
        let (c1, t1) = (cpu_ns(), Instant::now());
        cpu = cpu.max(bytes / (c1 - c0).max(1) as f64);
        wall = wall.max(bytes / t1.duration_since(t0).as_nanos().max(1) as f64);
    }
    println!("{name:24} on-CPU {cpu:6.2} GB/s   wall {wall:6.2} GB/s");
}

/// `SCALE=n` runs every trial `n` times longer (steadier numbers on a noisy machine).
fn scale() -> usize {
    std::env::var("SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

fn mxfp4() {
    let (p, s) = mx_data(64, 3584, 7);
    run(
        "mxfp4 hot 64x3584",
        &[Matrix::mxfp4(64, 3584, &p, &s).unwrap()],
        800,
    );
    let (p, s) = mx_data(16, 1024, 7);
    run(
        "mxfp4 L1 16x1024",
        &[Matrix::mxfp4(16, 1024, &p, &s).unwrap()],
        20000,
    );
    let data: Vec<_> = (0..12).map(|e| mx_data(3072, 3584, 11 + 2 * e)).collect();
    let mats: Vec<Matrix> = data
        .iter()
        .map(|(p, s)| Matrix::mxfp4(3072, 3584, p, s).unwrap())
        .collect();
    run("mxfp4 stream 3072x3584", &mats, 24);
}

fn bf16s() {
    let w = bf16_data(32 * 7168);
    run(
        "bf16 hot 32x7168",
        &[Matrix::bf16(32, 7168, &w).unwrap()],
        800,
    );
    let w = bf16_data(12288 * 7168);
    run(
        "bf16 stream 12288x7168",
        &[Matrix::bf16(12288, 7168, &w).unwrap()],
        4,
    );
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_default();
    if which != "bf" {
        mxfp4();
    }
    if which != "mx" {
        bf16s();
    }
}
