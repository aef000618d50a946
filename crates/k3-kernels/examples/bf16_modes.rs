//! Speed and accuracy of a bf16 GEMM on AVX512_BF16's `vdpbf16ps` beside contract v2's
//! (docs/NUMERICS.md#avx512_bf16-and-amx). A measurement, not a kernel k3 uses: it answers
//! what a bf16-activation numeric mode (the one AMX's `TDPBF16PS` also implies) would buy on
//! this CPU.
//!
//! `[THREADS=N WALL=1] cargo run --release -p k3-kernels --example bf16_modes [T…]`
//!
//! Modes, for bf16 weights `W` and f32 activations `x`:
//! - `v2`: `k3_kernels::matmul` on AVX-512 (contract v2, the default);
//! - `bf16 xP` (P = 1, 2, 3): `x` cut into P bf16 pieces (`x1 = bf16(x)`, `x2 = bf16(x - x1)`,
//!   …), each product `vdpbf16ps(acc, w, x_p)` — 32 products per instruction, so P = 1 does
//!   half of v2's instructions, P = 2 the same, P = 3 one and a half.
//!
//! GFLOP/s counts `2 · rows · cols · T` for every mode (the product's FLOPs, not the
//! instructions'), against the f32 FMA probe of the same pool. Accuracy: per output,
//! `|y − y_f64| / Σ|w·x|` (f64 reference of the same bf16 weights and f32 activations), the
//! maximum over all outputs. Timing is best of 15 trials of ≈ 2 GFLOP each, on-CPU seconds of the calling thread
//! (1 thread) or wall seconds with `WALL=1` (needed for `THREADS` > 1).

use k3_testkit::bench_data as common;

#[cfg(target_arch = "x86_64")]
fn main() {
    if !std::arch::is_x86_feature_detected!("avx512bf16") {
        eprintln!("this CPU has no AVX512_BF16: nothing to measure");
        std::process::exit(2);
    }
    x86::run();
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("vdpbf16ps is an x86-64 instruction");
    std::process::exit(2);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::common::{best_seconds, bf16_data, max_rel_err, vector};
    use half::bf16;
    use k3_kernels::simd::Level;
    use k3_kernels::{matmul_at, probe, Matrix};
    use rayon::prelude::*;
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// Columns per chunk: a 4-row tile's chunk of weights (4 KB) stays in L1 while every
    /// token tile passes over it.
    const KC: usize = 512;
    /// Rows per rayon task.
    const RB: usize = 32;

    /// `x` `[T][cols]` as `P` bf16 pieces, `[T][P][cols]` (bf16 bits).
    fn pieces<const P: usize>(x: &[f32], cols: usize) -> Vec<u16> {
        let mut out = Vec::with_capacity(x.len() * P);
        for xt in x.chunks(cols) {
            let mut rest: Vec<f32> = xt.to_vec();
            for _ in 0..P {
                for r in rest.iter_mut() {
                    let p = bf16::from_f32(*r);
                    out.push(p.to_bits());
                    *r -= p.to_f32();
                }
            }
        }
        out
    }

    /// One 4-row × 4-token tile over columns `k0 .. k0 + KC`: `acc[4r + u]` accumulates
    /// row `r`, token `u`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn tile<const P: usize>(
        w: &[u16],
        x: &[u16],
        cols: usize,
        (r0, t0, k0): (usize, usize, usize),
        acc: &mut [__m512; 16],
    ) {
        for k in (k0..k0 + KC).step_by(32) {
            // SAFETY: rows r0..r0+4 and tokens t0..t0+4 exist and k + 32 <= cols (asserted
            // by the caller); unaligned loads.
            unsafe {
                let wv: [__m512bh; 4] = std::array::from_fn(|r| {
                    std::mem::transmute(_mm512_loadu_si512(
                        w.as_ptr().add((r0 + r) * cols + k).cast(),
                    ))
                });
                for u in 0..4 {
                    for p in 0..P {
                        let xv: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                            x.as_ptr().add(((t0 + u) * P + p) * cols + k).cast(),
                        ));
                        for r in 0..4 {
                            acc[4 * r + u] = _mm512_dpbf16_ps(acc[4 * r + u], wv[r], xv);
                        }
                    }
                }
            }
        }
    }

    /// Rows `r0 .. r0 + RB` of `Y = W·X` (`y` is the task's `[RB][T]` block, row-major).
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn rows_block<const P: usize>(
        w: &[u16],
        x: &[u16],
        cols: usize,
        t: usize,
        r0: usize,
    ) -> Vec<f32> {
        let zero = _mm512_setzero_ps();
        // Lane state of every (row, token) of the task across column chunks.
        let mut state = vec![zero; RB * t];
        for k0 in (0..cols).step_by(KC) {
            for rt in (0..RB).step_by(4) {
                for t0 in (0..t).step_by(4) {
                    let mut acc: [__m512; 16] =
                        std::array::from_fn(|i| state[(rt + i / 4) * t + t0 + i % 4]);
                    // SAFETY: shapes asserted by `gemm`; the CPU was checked in `main`.
                    unsafe { tile::<P>(w, x, cols, (r0 + rt, t0, k0), &mut acc) };
                    for (i, a) in acc.iter().enumerate() {
                        state[(rt + i / 4) * t + t0 + i % 4] = *a;
                    }
                }
            }
        }
        state.iter().map(|&a| _mm512_reduce_add_ps(a)).collect()
    }

    /// `Y[t][r]` of the bf16 mode with `P` pieces, rows split across the rayon pool.
    fn gemm<const P: usize>(
        y: &mut [f32],
        w: &[u16],
        xp: &[u16],
        rows: usize,
        cols: usize,
        t: usize,
    ) {
        assert!(
            rows.is_multiple_of(RB) && cols.is_multiple_of(KC) && t.is_multiple_of(4),
            "bench shapes only"
        );
        let blocks: Vec<Vec<f32>> = (0..rows / RB)
            .into_par_iter()
            // SAFETY: the CPU has AVX512_BF16 (checked in `main`).
            .map(|b| unsafe { rows_block::<P>(w, xp, cols, t, b * RB) })
            .collect();
        for (b, blk) in blocks.iter().enumerate() {
            for (i, v) in blk.iter().enumerate() {
                y[(i % t) * rows + b * RB + i / t] = *v;
            }
        }
    }

    fn best(f: impl FnMut()) -> f64 {
        best_seconds(15, f)
    }

    /// Matrices per case, used in rotation so that the weights come from DRAM, not L3
    /// (3 × 22 MB), as `gemm_cpu_time` does.
    const ROT: usize = 3;

    fn case(rows: usize, cols: usize, t: usize, peak: f64) {
        let ws: Vec<Vec<bf16>> = (0..ROT).map(|_| bf16_data(rows * cols)).collect();
        let wbits: Vec<&[u16]> = ws.iter().map(|w| bytemuck::cast_slice(w)).collect();
        let ms: Vec<Matrix> = ws
            .iter()
            .map(|w| Matrix::bf16(rows, cols, w).expect("shape"))
            .collect();
        let x = vector(t * cols);
        // ≈ 2 GFLOP per trial (~15 ms on one thread): the on-CPU clock advances in ticks.
        let reps = (2e9 / (2.0 * (t * rows * cols) as f64)).ceil() as usize;
        let flops = 2.0 * (reps * rows * cols * t) as f64;
        let mut y = vec![0f32; t * rows];
        // The last rep used matrix `(reps - 1) % ROT`: the accuracy check reads that one.
        let last: Vec<f32> = ws[(reps - 1) % ROT].iter().map(|v| v.to_f32()).collect();
        let report = |name: &str, s: f64, y: &[f32]| {
            let gf = flops / s / 1e9;
            println!(
                "bf16 {rows:5}x{cols:<5} T {t:3} {name:8}: {gf:7.1} GFLOP/s {:6.1} % of peak   max err {:.2e}",
                100.0 * gf / peak,
                max_rel_err(y, &last, &x, rows, cols)
            );
        };
        let s = best(|| {
            (0..reps).for_each(|i| matmul_at(Level::Avx512, &mut y, &ms[i % ROT], black_box(&x), t))
        });
        report("v2", s, &y);
        let x1 = pieces::<1>(&x, cols);
        let s = best(|| {
            (0..reps).for_each(|i| gemm::<1>(&mut y, wbits[i % ROT], black_box(&x1), rows, cols, t))
        });
        report("bf16 x1", s, &y);
        let x2 = pieces::<2>(&x, cols);
        let s = best(|| {
            (0..reps).for_each(|i| gemm::<2>(&mut y, wbits[i % ROT], black_box(&x2), rows, cols, t))
        });
        report("bf16 x2", s, &y);
        let x3 = pieces::<3>(&x, cols);
        let s = best(|| {
            (0..reps).for_each(|i| gemm::<3>(&mut y, wbits[i % ROT], black_box(&x3), rows, cols, t))
        });
        report("bf16 x3", s, &y);
    }

    pub fn run() {
        let threads = std::env::var("THREADS").map_or(1, |v| v.parse().expect("THREADS"));
        let ts: Vec<usize> = std::env::args()
            .skip(1)
            .map(|a| a.parse().expect("T"))
            .collect();
        let ts = if ts.is_empty() { vec![32, 64] } else { ts };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        pool.install(|| {
            let iters = 10_000_000;
            let s = best(|| {
                rayon::broadcast(|_| black_box(probe::fma_loop(Level::Avx512, iters)));
            });
            let peak =
                (threads as u64 * probe::fma_loop_flops(Level::Avx512, iters)) as f64 / s / 1e9;
            println!("{threads} thread(s): f32 FMA peak (avx512f) {peak:.1} GFLOP/s");
            for &t in &ts {
                case(1536, 7168, t, peak);
                case(7168, 1536, t, peak);
            }
        });
    }
}
