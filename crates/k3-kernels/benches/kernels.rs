//! Mat-vec throughput (GB/s of weight bytes) at 1 thread and all threads, scalar vs the
//! detected SIMD path, next to a DRAM read-bandwidth probe in the same harness.
//!
//! `cargo bench -p k3-kernels --bench kernels` (see docs/PERFORMANCE.md, "Kernels").

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::bf16;
use k3_kernels::simd::{detected_level, set_force_scalar};
use k3_kernels::{matmul, par_matvec, Matrix};
use std::hint::black_box;
use std::time::Duration;

use common::{bf16_data, bytes, mx_data, vector};
use k3_testkit::bench_data as common;

/// Pools of 1 thread and of every available core.
fn pools() -> Vec<(usize, rayon::ThreadPool)> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut counts = vec![1];
    if all > 1 {
        counts.push(all);
    }
    counts
        .into_iter()
        .map(|n| {
            (
                n,
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .unwrap(),
            )
        })
        .collect()
}

/// The paths to compare: the scalar baseline and the detected SIMD level.
fn levels() -> Vec<(&'static str, bool)> {
    let mut v = vec![("scalar", true)];
    if detected_level().name() != "scalar" {
        v.push((detected_level().name(), false));
    }
    v
}

/// Runs `par_matvec` over `mats` in rotation (so the working set exceeds the last-level
/// cache) for every level × pool.
fn bench_matvec(c: &mut Criterion, name: &str, mats: &[Matrix]) {
    let (rows, cols) = (mats[0].rows, mats[0].cols);
    let x = vector(cols);
    let mut y = vec![0f32; rows];
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::BytesDecimal(mats[0].weight_bytes() as u64));
    for (lvl, force) in levels() {
        for (threads, pool) in pools() {
            let mut k = 0;
            g.bench_function(BenchmarkId::new(lvl, format!("{threads}t")), |b| {
                set_force_scalar(force);
                b.iter(|| {
                    k = (k + 1) % mats.len();
                    pool.install(|| par_matvec(&mut y, &mats[k], black_box(&x)));
                })
            });
        }
    }
    set_force_scalar(false);
    g.finish();
}

fn mxfp4(c: &mut Criterion) {
    for (rows, cols) in [(3072usize, 3584usize), (3584, 3072)] {
        // 24 experts' worth (~140 MB) rotate through, like streamed experts.
        let data: Vec<(Vec<u8>, Vec<u8>)> = (0..24).map(|e| mx_data(rows, cols, 7 + e)).collect();
        let mats: Vec<Matrix> = data
            .iter()
            .map(|(p, s)| Matrix::mxfp4(rows, cols, p, s).unwrap())
            .collect();
        bench_matvec(c, &format!("mxfp4_matvec_{rows}x{cols}"), &mats);
    }
}

fn bf16_(c: &mut Criterion) {
    for (rows, cols) in [(12288usize, 7168usize), (7168, 12288)] {
        let w = bf16_data(rows * cols);
        let mats = [Matrix::bf16(rows, cols, &w).unwrap()];
        bench_matvec(c, &format!("bf16_matvec_{rows}x{cols}"), &mats);
    }
}

/// Mat-mat (prefill / several tokens per expert): bf16 [2048×7168] and MXFP4 [3072×3584]
/// with 16 tokens, all threads; throughput in multiply-adds.
fn mat_mat(c: &mut Criterion) {
    let t = 16;
    let (br, bc) = (2048usize, 7168usize);
    let wb: Vec<bf16> = bytes(br * bc, 5)
        .into_iter()
        .map(|b| bf16::from_f32((b as f32 - 128.0) / 64.0))
        .collect();
    let (mr, mc) = (3072usize, 3584usize);
    let mp = bytes(mr * mc / 2, 11);
    let ms: Vec<u8> = bytes(mr * mc / 32, 13)
        .into_iter()
        .map(|s| 112 + s % 16)
        .collect();
    let cases = [
        ("bf16_2048x7168", Matrix::bf16(br, bc, &wb).unwrap()),
        ("mxfp4_3072x3584", Matrix::mxfp4(mr, mc, &mp, &ms).unwrap()),
    ];
    let (threads, pool) = pools().pop().unwrap();
    let mut g = c.benchmark_group(format!("matmul_t{t}_{threads}t"));
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (name, w) in &cases {
        let x = vector(t * w.cols);
        let mut y = vec![0f32; t * w.rows];
        g.throughput(Throughput::Elements((t * w.rows * w.cols) as u64));
        for (lvl, force) in levels() {
            g.bench_function(BenchmarkId::new(*name, lvl), |b| {
                set_force_scalar(force);
                b.iter(|| pool.install(|| matmul(&mut y, w, black_box(&x), t)))
            });
        }
    }
    set_force_scalar(false);
    g.finish();
}

/// DRAM read bandwidth: `k3_kernels::probe::read_sum` over a 1 GiB buffer of u64 (wide
/// auto-vectorised loads, split over the pool's threads in 1 MiB chunks).
fn dram(c: &mut Criterion) {
    let n = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..n as u64).collect();
    let mut g = c.benchmark_group("dram_read_1GiB");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::BytesDecimal((n * 8) as u64));
    for (threads, pool) in pools() {
        g.bench_function(BenchmarkId::new("sum_u64", format!("{threads}t")), |b| {
            b.iter(|| pool.install(|| k3_kernels::probe::read_sum(black_box(&buf))))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default();
    targets = dram, mxfp4, bf16_, mat_mat
}
criterion_main!(benches);
