//! `cargo run --release -p xtask -- bench-compute [--threads N] [--secs S] [--rounds R]
//! [--level L] [--dram-mib M]` (or `--model DIR [--repeats N]`):
//! the machine's compute and memory limits and every hot kernel against them, in one run.
//!
//! * f32 FMA peak per SIMD level (`k3_kernels::probe::fma_loop`: independent vector FMAs,
//!   registers only) on 1 and N threads;
//! * DRAM read bandwidth (`k3_kernels::probe::read_sum`, the probe of the criterion bench)
//!   over a buffer ≫ LLC, on 1 and N threads;
//! * bf16 / f32 / MXFP4 `matmul` (GEMM) at trunk and expert shapes and bf16 / MXFP4
//!   `par_matvec` (decode), on 1 and N threads: GFLOP/s, % of the FMA peak of the level the
//!   kernels run (same thread count), GB/s of weight bytes, % of DRAM (same thread count).
//!
//! Weights are synthetic (the criterion bench's generators), several matrices per case in
//! rotation so the working set exceeds the last-level cache like streamed experts. Each
//! number is the best of the timed calls (a noisy shared machine only ever slows a call),
//! taken in `--rounds` rounds over all cases so that no one stretch of the run decides it. The
//! clock and the memory bandwidth of a shared machine drift, so the FMA peak and DRAM
//! bandwidth are probed before and after all kernels, and the FMA peak again right before and
//! after each case; "% FMA peak" divides by the best of the global and the adjacent probes,
//! "% DRAM" by the better global DRAM probe.
//! docs/NUMERICS.md "Measured" records a run.

use crate::bench_util::{self, machine_facts};
use clap::Args;
use half::bf16;
use k3_kernels::simd::{active_level, available_levels, Level};
use k3_kernels::{matmul_at, probe, Matrix};
use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use k3_testkit::bench_data::{bytes, mx_data, vector};

/// Flags of `bench-compute`.
#[derive(Args, Debug)]
pub struct BenchComputeArgs {
    /// The "all threads" pool size (default: available parallelism).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seconds of timed calls per case and pool (at least 3 calls after one warm-up).
    #[arg(long, default_value_t = 0.6)]
    pub secs: f64,
    /// Run the kernels on this SIMD level (`avx2+fma`, `avx512f`, …) instead of the detected
    /// one; "% FMA peak" is then that level's probe (kernel cases only, not `--model`).
    #[arg(long)]
    pub level: Option<String>,
    /// Rounds over all cases, each timing every case for `secs / rounds` seconds; a case
    /// keeps its best call of all rounds (so no host episode covers all of its calls).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Numeric mode for every bf16/MXFP4 product: `v2` (the default), `fast` (AMX tiles,
    /// docs/NUMERICS.md#numeric-mode-fast), `amx-bf16x2` or `amx-bf16x1` (measurements only).
    #[arg(long, default_value = "v2")]
    pub numerics: String,
    /// Size of the DRAM probe buffer in MiB.
    #[arg(long, default_value_t = 1024)]
    pub dram_mib: usize,
    /// Also time a model end to end (resident): prefill marginal s/token from two prompt
    /// lengths and compute-bound decode s/token (docs/PERFORMANCE.md "Compute").
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Prompt lengths for the prefill marginal, `SHORT,LONG`.
    #[arg(long, value_delimiter = ',', default_value = "16,128")]
    pub prompts: Vec<usize>,
    /// Warm prefills of each prompt length (in turns); the marginal takes the best of each.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Decode steps timed after the long prompt.
    #[arg(long, default_value_t = 6)]
    pub steps: usize,
    /// Cold start per buffer policy (`--cold`, docs/PERFORMANCE.md#cold-start).
    #[command(flatten)]
    pub cold: crate::bench_cold::ColdArgs,
}

/// The model half (`--model DIR`): prefill marginal against its compute floor, cold-start
/// cost and compute-bound decode, resident.
fn bench_model(args: &BenchComputeArgs, dir: &std::path::Path) -> Result<(), String> {
    let threads = args.threads.unwrap_or(2).max(1);
    let [short, long] = args.prompts[..] else {
        return Err("--prompts takes two lengths: SHORT,LONG".into());
    };
    let load0 = bench_util::load_average();
    let (level, pool) = (active_level(), bench_util::pool(threads)?);
    let peak0 = fma_peak(level, &pool, args.secs);
    let plan = crate::bench_model_compute::Plan {
        short,
        long,
        steps: args.steps,
        repeats: args.repeats,
    };
    let r = crate::bench_model_compute::measure(dir, threads, plan)?;
    let peak = peak0.max(fma_peak(level, &pool, args.secs));
    let marginal = r.prefill_marginal_s();
    let f = r.flops;
    let floor = f.total() / (peak * 1e9);
    println!("model: {} ({threads} threads, resident)", dir.display());
    println!("| measure | seconds |\n|---|---:|");
    println!("| prefill {long} tokens, first (cold) | {:.3} |", r.first_s);
    let best = format!("best of {}", args.repeats);
    println!(
        "| prefill {short} tokens, warm ({best}) | {:.3} |",
        r.short_s
    );
    println!("| prefill {long} tokens, warm ({best}) | {:.3} |", r.long_s);
    println!("| prefill marginal s/token | {marginal:.4} |");
    println!("| compute floor s/token | {floor:.4} |");
    println!(
        "| decode s/token (median of {}) | {:.4} |",
        args.steps, r.decode_s
    );
    println!(
        "\nprefill marginal / compute floor: {:.2}× ({:.1} GFLOP/s of {peak:.1} GFLOP/s f32 FMA peak, {}, {threads} threads, numerics {})",
        marginal / floor,
        f.total() / marginal / 1e9,
        level.name(),
        k3_kernels::fast::numerics().name()
    );
    println!(
        "one more prompt token: {:.2} GFLOP = trunk {:.2} + experts {:.2} + router {:.3} + KDA recurrence {:.3} + MLA attention {:.3}",
        f.total() / 1e9,
        f.trunk / 1e9,
        f.experts / 1e9,
        f.router / 1e9,
        f.kda / 1e9,
        f.mla / 1e9
    );
    println!(
        "first touches: the cold prefill took {:.3} s more than the warm one",
        r.first_s - r.long_s
    );
    println!("greedy ids: {:?}", r.ids);
    println!("load average: {load0} → {}", bench_util::load_average());
    Ok(())
}

/// Runs the subcommand.
pub fn run(args: &BenchComputeArgs) -> ExitCode {
    if let Err(e) = check_args(args) {
        eprintln!("bench-compute: {e}");
        return ExitCode::from(2);
    }
    if let Some(mode) = k3_kernels::fast::Numerics::parse(&args.numerics) {
        if let Err(e) = k3_kernels::fast::set_numerics(mode) {
            eprintln!("bench-compute: {e}");
            return ExitCode::from(2);
        }
    }
    match bench(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-compute: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The SIMD levels with an FMA probe (the ones `bench-compute` can rate).
fn probed_levels() -> Vec<Level> {
    available_levels()
        .into_iter()
        .filter(|&l| probe::f32_lanes(l).is_some())
        .collect()
}

/// Usage errors (exit code 2), found before anything is measured.
fn check_args(args: &BenchComputeArgs) -> Result<(), String> {
    kernel_level(args.level.as_deref(), &probed_levels())?;
    if args.rounds == 0 {
        return Err("--rounds 0: every case needs at least 1 round".into());
    }
    if args.repeats == 0 {
        return Err("--repeats 0: each prompt length needs at least 1 warm prefill".into());
    }
    if k3_kernels::fast::Numerics::parse(&args.numerics).is_none() {
        let names = "v2, fast, amx-bf16x2, amx-bf16x1";
        return Err(format!(
            "--numerics {}: not a numeric mode ({names})",
            args.numerics
        ));
    }
    Ok(())
}

/// Best seconds of `f` over at least 3 calls and about `secs` seconds, after one warm-up.
fn best_secs(secs: f64, mut f: impl FnMut()) -> f64 {
    f();
    let (start, mut best, mut n) = (Instant::now(), f64::INFINITY, 0);
    while n < 3 || start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        n += 1;
    }
    best
}

/// Weight storage of a case.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Bf16,
    F32,
    Mxfp4,
    /// Per-row int8 + f32 scale (a q8 draft trunk's matrices).
    Q8,
}

/// Owned weights of one matrix.
enum Owned {
    Bf16(Vec<bf16>),
    F32(Vec<f32>),
    Mx(Vec<u8>, Vec<u8>),
    Q8(Vec<i8>, Vec<f32>),
}

impl Owned {
    fn new(kind: Kind, rows: usize, cols: usize, seed: u64) -> Result<Self, String> {
        let vals = |n| {
            bytes(n, seed)
                .into_iter()
                .map(|b| (b as f32 - 128.0) / 64.0)
        };
        Ok(match kind {
            Kind::Bf16 => Owned::Bf16(vals(rows * cols).map(bf16::from_f32).collect()),
            Kind::F32 => Owned::F32(vals(rows * cols).collect()),
            Kind::Mxfp4 => {
                let (p, s) = mx_data(rows, cols, seed);
                Owned::Mx(p, s)
            }
            Kind::Q8 => {
                let src: Vec<f32> = vals(rows * cols).collect();
                let (mut q, mut s) = (vec![0i8; rows * cols], vec![0f32; rows]);
                k3_kernels::quant::quantize_q8_rows(&src, rows, cols, &mut q, &mut s)
                    .map_err(|e| e.to_string())?;
                Owned::Q8(q, s)
            }
        })
    }

    fn view(&self, rows: usize, cols: usize) -> Option<Matrix<'_>> {
        match self {
            Owned::Bf16(d) => Matrix::bf16(rows, cols, d),
            Owned::F32(d) => Matrix::f32(rows, cols, d),
            Owned::Mx(p, s) => Matrix::mxfp4(rows, cols, p, s),
            Owned::Q8(q, s) => Matrix::q8(rows, cols, q, s),
        }
    }
}

/// One kernel measurement: `t` tokens through `rows × cols` (`t == 1`: `par_matvec`).
struct Case {
    name: &'static str,
    kind: Kind,
    rows: usize,
    cols: usize,
    t: usize,
}

const fn case(name: &'static str, kind: Kind, rows: usize, cols: usize, t: usize) -> Case {
    Case {
        name,
        kind,
        rows,
        cols,
        t,
    }
}

/// Released shapes: q_a_proj-like [1536 × 7168] and its converse, the routed expert's
/// w1/w3 [3072 × 3584] (T 4 ≈ a released prompt's tokens per expert: 16 of 896) and w2
/// [3584 × 3072], a KDA projection [12288 × 7168]; Q8 rows are a
/// q8 draft trunk's matrices of the same shapes (docs/PERFORMANCE.md#hybrid-drafting).
const CASES: [Case; 19] = [
    case("bf16 GEMM", Kind::Bf16, 1536, 7168, 32),
    case("bf16 GEMM", Kind::Bf16, 1536, 7168, 64),
    case("bf16 GEMM", Kind::Bf16, 7168, 1536, 32),
    case("bf16 GEMM", Kind::Bf16, 7168, 1536, 64),
    case("f32 GEMM", Kind::F32, 1536, 7168, 32),
    case("f32 GEMM", Kind::F32, 7168, 1536, 64),
    case("MXFP4 GEMM (expert w1/w3)", Kind::Mxfp4, 3072, 3584, 4),
    case("MXFP4 GEMM (expert w1/w3)", Kind::Mxfp4, 3072, 3584, 8),
    case("MXFP4 GEMM (expert w1/w3)", Kind::Mxfp4, 3072, 3584, 16),
    case("MXFP4 GEMM (expert w1/w3)", Kind::Mxfp4, 3072, 3584, 32),
    case("MXFP4 GEMM (expert w2)", Kind::Mxfp4, 3584, 3072, 16),
    case("MXFP4 mat-vec (expert w1/w3)", Kind::Mxfp4, 3072, 3584, 1),
    case("MXFP4 mat-vec (expert w2)", Kind::Mxfp4, 3584, 3072, 1),
    case("bf16 mat-vec", Kind::Bf16, 12288, 7168, 1),
    case("bf16 mat-vec", Kind::Bf16, 7168, 1536, 1),
    case("Q8 GEMM", Kind::Q8, 1536, 7168, 32),
    case("Q8 GEMM", Kind::Q8, 7168, 1536, 64),
    case("Q8 mat-vec", Kind::Q8, 12288, 7168, 1),
    case("Q8 mat-vec", Kind::Q8, 7168, 1536, 1),
];

/// Matrices of a case in rotation: enough for ≥ 96 MB of weights (3× a 32 MB L3), at least 2.
fn rotation(c: &Case) -> usize {
    let per = match c.kind {
        Kind::Bf16 => c.rows * c.cols * 2,
        Kind::F32 => c.rows * c.cols * 4,
        Kind::Mxfp4 => c.rows * c.cols / 2 + c.rows * c.cols / 32,
        Kind::Q8 => c.rows * c.cols + c.rows * 4,
    };
    (96_000_000usize).div_ceil(per).clamp(2, 32)
}

/// Best seconds per call of case `c` on `pool`.
fn time_case(c: &Case, level: Level, mats: &[Matrix], pool: &rayon::ThreadPool, secs: f64) -> f64 {
    let x = vector(c.t * c.cols);
    let mut y = vec![0f32; c.t * c.rows];
    let mut k = 0;
    pool.install(|| {
        best_secs(secs, || {
            k = (k + 1) % mats.len();
            // `t == 1`: the pool's `par_matvec` on `level`.
            matmul_at(level, &mut y, &mats[k], black_box(&x), c.t);
        })
    })
}

/// Seconds of the FMA probes taken next to every kernel case.
const PEAK_SECS: f64 = 0.15;

/// GFLOP/s of the FMA loop on `level` in every thread of `pool` at once.
fn fma_peak(level: Level, pool: &rayon::ThreadPool, secs: f64) -> f64 {
    let n = pool.current_num_threads();
    let iters = 4_000_000;
    let s = best_secs(secs, || {
        pool.broadcast(|_| black_box(probe::fma_loop(level, iters)));
    });
    (probe::fma_loop_flops(level, iters) * n as u64) as f64 / s / 1e9
}

/// GB/s of the DRAM read probe over `buf` on `pool`.
fn dram(buf: &[u64], pool: &rayon::ThreadPool, secs: f64) -> f64 {
    let s = best_secs(secs.max(1.0), || {
        black_box(pool.install(|| probe::read_sum(black_box(buf))));
    });
    (buf.len() * 8) as f64 / s / 1e9
}

/// One case's best on one pool.
struct Timed {
    /// Index into [`CASES`].
    case: usize,
    /// Index into the pools (1 thread, then all).
    pool: usize,
    /// Best seconds per call over all rounds.
    secs: f64,
    /// Best FMA probe taken right before or after the case (GFLOP/s).
    near_peak: f64,
    /// Weight bytes one call reads.
    weight_bytes: f64,
}

/// Times every case on every pool in `args.rounds` rounds, round-robin over the cases, and
/// keeps each case's best call. A case timed in one stretch can fall wholly inside an episode
/// of the host's other tenants: on the shared 2-vCPU development VM the 2-thread FMA probe
/// read under 70 % of its peak in 9 % of 21 ms samples, in 91 runs over two minutes of up to
/// 3.6 s (no steal time shows), and three of five `bench-compute` runs read the 2-thread bf16
/// T 64 GEMM at 41–42 % where the kernel runs at 83 %
/// (docs/PERFORMANCE.md#measuring-on-a-shared-host). Spread over the run, a case's calls are
/// no longer all in one episode. Matrices of one kind and shape are shared by the cases that
/// use them (~1.4 GB in all).
fn time_cases(
    args: &BenchComputeArgs,
    level: Level,
    pools: &[rayon::ThreadPool],
) -> Result<Vec<Timed>, String> {
    // Weights per distinct (kind, rows, cols), and which of them each case uses.
    let (mut weights, mut slot) = (Vec::<((Kind, usize, usize), Vec<Owned>)>::new(), Vec::new());
    for c in &CASES {
        let key = (c.kind, c.rows, c.cols);
        slot.push(match weights.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let owned = (0..rotation(c) as u64)
                    .map(|s| Owned::new(c.kind, c.rows, c.cols, 17 + 31 * s))
                    .collect::<Result<_, _>>()?;
                weights.push((key, owned));
                weights.len() - 1
            }
        });
    }
    let mats: Vec<Vec<Matrix>> = CASES
        .iter()
        .zip(&slot)
        .map(|(c, &w)| {
            weights[w]
                .1
                .iter()
                .map(|o| o.view(c.rows, c.cols).ok_or("matrix shape"))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let mut rows: Vec<Timed> = mats
        .iter()
        .enumerate()
        .flat_map(|(case, m)| {
            let weight_bytes = m[0].weight_bytes() as f64;
            (0..pools.len()).map(move |pool| Timed {
                case,
                pool,
                secs: f64::INFINITY,
                near_peak: 0.0,
                weight_bytes,
            })
        })
        .collect();
    let secs = args.secs / args.rounds as f64;
    for _ in 0..args.rounds {
        for row in &mut rows {
            let (c, pool, m) = (&CASES[row.case], &pools[row.pool], &mats[row.case]);
            // A short FMA probe right before and after the case: the clock drifts.
            let p0 = fma_peak(level, pool, PEAK_SECS);
            row.secs = row.secs.min(time_case(c, level, m, pool, secs));
            let near = p0.max(fma_peak(level, pool, PEAK_SECS));
            row.near_peak = row.near_peak.max(near);
        }
    }
    Ok(rows)
}

/// The level `--level` names among `levels` (those with an FMA probe), else the detected one.
fn kernel_level(name: Option<&str>, levels: &[Level]) -> Result<Level, String> {
    let Some(name) = name else {
        return Ok(active_level());
    };
    levels
        .iter()
        .copied()
        .find(|l| l.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = levels.iter().map(|l| l.name()).collect();
            format!(
                "--level {name}: not a SIMD level of this CPU (it has {}; see `k3 doctor`)",
                names.join(", ")
            )
        })
}

fn bench(args: &BenchComputeArgs) -> Result<(), String> {
    if let Some(dir) = &args.model {
        if args.cold.cold {
            let threads = args.threads.unwrap_or(2).max(1);
            return crate::bench_cold::bench_cold(
                &args.cold,
                dir,
                threads,
                &args.prompts,
                args.steps,
            );
        }
        return bench_model(args, dir);
    }
    let levels = probed_levels();
    let level = kernel_level(args.level.as_deref(), &levels)?;
    let all = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let load0 = bench_util::load_average();
    println!("machine: {}", machine_facts());
    let mut counts = vec![1];
    if all > 1 {
        counts.push(all);
    }
    let pools: Vec<rayon::ThreadPool> = counts
        .iter()
        .map(|&n| bench_util::pool(n))
        .collect::<Result<_, _>>()?;
    // The FMA peak and DRAM bandwidth are probed before and after the kernels (on a shared
    // machine both drift); the better probe is the reference.
    let probe_peaks = || -> Vec<(Level, Vec<f64>)> {
        levels
            .iter()
            .map(|&l| (l, pools.iter().map(|p| fma_peak(l, p, args.secs)).collect()))
            .collect()
    };
    let mut peaks = probe_peaks();
    let buf: Vec<u64> = (0..(args.dram_mib << 17) as u64).collect();
    let mut drams: Vec<f64> = pools.iter().map(|p| dram(&buf, p, args.secs)).collect();

    let rows = time_cases(args, level, &pools)?;
    for ((_, a), (_, b)) in peaks.iter_mut().zip(probe_peaks()) {
        for (x, y) in a.iter_mut().zip(b) {
            *x = x.max(y);
        }
    }
    for (d, p) in drams.iter_mut().zip(&pools) {
        *d = d.max(dram(&buf, p, args.secs));
    }
    drop(buf);
    let peak_of = |ti: usize| {
        peaks
            .iter()
            .find(|(l, _)| *l == level)
            .map_or(f64::NAN, |(_, v)| v[ti])
    };

    let tcols: Vec<String> = counts.iter().map(|n| format!("{n} thread(s)")).collect();
    println!("\n| probe | {} |", tcols.join(" | "));
    println!("|---|{}", "---:|".repeat(counts.len()));
    for (l, v) in &peaks {
        let cells: Vec<String> = v.iter().map(|g| format!("{g:.1} GFLOP/s")).collect();
        println!("| f32 FMA peak, {} | {} |", l.name(), cells.join(" | "));
    }
    let cells: Vec<String> = drams.iter().map(|g| format!("{g:.1} GB/s")).collect();
    println!(
        "| DRAM read ({} MiB, `probe::read_sum`) | {} |",
        args.dram_mib,
        cells.join(" | ")
    );
    println!(
        "\n| kernel | rows × cols | T | threads | ms/call | GFLOP/s | % FMA peak ({}) | weight GB/s | % DRAM |",
        level.name()
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let (c, ti, s) = (&CASES[r.case], r.pool, r.secs);
        let (gflops, gbs) = (
            2.0 * (c.t * c.rows * c.cols) as f64 / s / 1e9,
            r.weight_bytes / s / 1e9,
        );
        println!(
            "| {} | {} × {} | {} | {} | {:.3} | {:.1} | {:.0} % | {:.2} | {:.0} % |",
            c.name,
            c.rows,
            c.cols,
            c.t,
            counts[ti],
            s * 1e3,
            gflops,
            100.0 * gflops / peak_of(ti).max(r.near_peak),
            gbs,
            100.0 * gbs / drams[ti],
        );
    }
    println!(
        "\nload average (1 min): {load0} before the run, {} after",
        bench_util::load_average()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_names_the_detected_level_or_one_of_the_cpus() {
        let levels = probed_levels();
        assert_eq!(kernel_level(None, &levels), Ok(active_level()));
        for &l in &levels {
            assert_eq!(kernel_level(Some(l.name()), &levels), Ok(l));
        }
        let e = kernel_level(Some("avx9000"), &levels).unwrap_err();
        assert!(
            e.starts_with("--level avx9000: not a SIMD level of this CPU"),
            "{e}"
        );
        for l in &levels {
            assert!(e.contains(l.name()), "{e} names {}", l.name());
        }
    }
}
