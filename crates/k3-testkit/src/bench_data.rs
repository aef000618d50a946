//! Synthetic weights and activations shared by `benches/kernels.rs`, the `examples/` and
//! `xtask bench-compute` (no weights ship with any), and the examples' on-CPU clock.

use half::bf16;

/// Deterministic pseudo-random bytes (xorshift).
pub fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// An activation vector of `n` values in about [−1, 1].
pub fn vector(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 997.0)
        .collect()
}

/// MXFP4 `[rows × cols]` (packed codes, scale bytes) with scales in the real-checkpoint range
/// (112..128, i.e. 2^-15..2^0).
pub fn mx_data(rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let scales = bytes(rows * cols / 32, seed + 1)
        .into_iter()
        .map(|v| 112 + v % 16)
        .collect();
    (bytes(rows * cols / 2, seed), scales)
}

/// `n` bf16 weights in about [−2, 2].
pub fn bf16_data(n: usize) -> Vec<bf16> {
    bytes(n, 3)
        .into_iter()
        .map(|b| bf16::from_f32((b as f32 - 128.0) / 64.0))
        .collect()
}

/// Nanoseconds this thread has spent on a CPU (Linux `/proc/thread-self/schedstat`).
pub fn cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("Linux schedstat");
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .expect("schedstat format")
}

/// Best seconds of `f` over `trials` runs: on-CPU seconds of the calling thread unless `WALL`
/// is set in the environment (the on-CPU clock may advance in scheduler ticks; short trials
/// then need the wall clock, which an idle machine makes equal; `THREADS` > 1 needs it too).
pub fn best_seconds(trials: usize, mut f: impl FnMut()) -> f64 {
    let wall = std::env::var_os("WALL").is_some();
    (0..trials)
        .map(|_| {
            let (c0, t0) = (cpu_ns(), std::time::Instant::now());
            f();
            if wall {
                t0.elapsed().as_secs_f64()
            } else {
                (cpu_ns() - c0) as f64 / 1e9
            }
        })
        .fold(f64::INFINITY, f64::min)
}

/// Max over sampled outputs (every 97th row) of `|y − y_f64| / Σ|w·x|`, for `y = W·x` over
/// `[T][cols]` activations; `w` as f32 (bf16 and decoded MXFP4 weights widen exactly).
pub fn max_rel_err(y: &[f32], w: &[f32], x: &[f32], rows: usize, cols: usize) -> f64 {
    let mut worst = 0f64;
    for (tok, xt) in x.chunks(cols).enumerate() {
        for r in (0..rows).step_by(97) {
            let (mut s, mut a) = (0f64, 0f64);
            for (wi, xi) in w[r * cols..(r + 1) * cols].iter().zip(xt) {
                let p = *wi as f64 * *xi as f64;
                s += p;
                a += p.abs();
            }
            worst = worst.max((y[tok * rows + r] as f64 - s).abs() / a);
        }
    }
    worst
}
