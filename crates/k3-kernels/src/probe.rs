//! Machine-limit probes for the compute benchmarks (`cargo xtask bench-compute`, the
//! criterion benches): the f32 FMA peak of a SIMD level from a register-only loop, and DRAM
//! read bandwidth from a parallel sum. Not used by the model.

use crate::simd::Level;
use rayon::prelude::*;

/// Independent accumulator vectors of the FMA loop on `level`: enough to cover FMA latency
/// × FMA ports (2 × 4 cycles on x86, 4 × 4 on large Arm cores) while every accumulator and
/// both constants stay in registers (16 `ymm` on AVX2, 32 on AVX-512 and NEON).
pub fn fma_chains(level: Level) -> usize {
    match level {
        Level::Avx2 => AVX2_CHAINS,
        _ => WIDE_CHAINS,
    }
}

const AVX2_CHAINS: usize = 12;
const WIDE_CHAINS: usize = 16;

/// f32 lanes per vector of `level` (`None` for the scalar level, which has no probe).
pub fn f32_lanes(level: Level) -> Option<usize> {
    match level {
        Level::Avx512 => Some(16),
        Level::Avx2 => Some(8),
        Level::Neon => Some(4),
        Level::Scalar => None,
    }
}

/// Floating-point operations (multiply + add = 2) one [`fma_loop`] call performs.
pub fn fma_loop_flops(level: Level, iters: usize) -> u64 {
    f32_lanes(level).map_or(0, |l| (iters * fma_chains(level) * l * 2) as u64)
}

/// Runs `iters` rounds of [`fma_chains`] independent vector FMAs (`acc = acc·b + a`, all in
/// registers) on `level` and returns a value derived from the accumulators (so the loop is
/// not optimised away). `None` when the level has no probe or the CPU lacks it.
pub fn fma_loop(level: Level, iters: usize) -> Option<f32> {
    if !level.is_supported() {
        return None;
    }
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_supported` confirmed AVX2 and FMA.
        Level::Avx2 => Some(unsafe { x86::fma_avx2(iters) }),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_supported` confirmed AVX-512F (and AVX2, FMA).
        Level::Avx512 => Some(unsafe { x86::fma_avx512(iters) }),
        #[cfg(target_arch = "aarch64")]
        // SAFETY: NEON is baseline on aarch64.
        Level::Neon => Some(unsafe { arm::fma_neon(iters) }),
        _ => None,
    }
}

/// Wrapping sum of `buf`, split over the current rayon pool in 1 MiB chunks: the DRAM read
/// probe (pass a buffer much larger than the last-level cache). Each chunk is read as
/// [`STREAMS`] interleaved sequential streams with a software prefetch 1 KiB ahead in each
/// (x86-64) — the access pattern of the 4-row mat-vec kernels; one stream alone leaves a
/// core's share of DRAM bandwidth unused.
pub fn read_sum(buf: &[u64]) -> u64 {
    buf.par_chunks(1 << 17)
        .map(sum_chunk)
        .reduce(|| 0, u64::wrapping_add)
}

/// Sequential streams per chunk of [`read_sum`].
pub const STREAMS: usize = 4;

/// u64 per cache line.
const LINE: usize = 8;

fn sum_chunk(ch: &[u64]) -> u64 {
    let lines = ch.len() / LINE;
    let per = lines / STREAMS;
    let mut acc = [0u64; LINE];
    for i in 0..per {
        for s in 0..STREAMS {
            let at = (s * per + i) * LINE;
            prefetch(ch.as_ptr().wrapping_add(at + 128));
            for (a, &v) in acc.iter_mut().zip(&ch[at..at + LINE]) {
                *a = a.wrapping_add(v);
            }
        }
    }
    let tail = ch[per * STREAMS * LINE..]
        .iter()
        .fold(0u64, |a, &v| a.wrapping_add(v));
    acc.iter().fold(tail, |a, &v| a.wrapping_add(v))
}

/// A prefetch hint for the line at `p` (never dereferenced; x86-64 only).
#[inline(always)]
fn prefetch(p: *const u64) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is baseline on x86-64; a prefetch is a hint only, the address may lie
        // past the chunk (it is never dereferenced).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #![allow(clippy::incompatible_msrv)] // AVX-512 intrinsics: stable since 1.89
    use super::{AVX2_CHAINS, WIDE_CHAINS};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn fma_avx2(iters: usize) -> f32 {
        let (a, b) = (_mm256_set1_ps(0.5), _mm256_set1_ps(0.999));
        let mut acc = [_mm256_set1_ps(1.0); AVX2_CHAINS];
        for _ in 0..std::hint::black_box(iters) {
            for v in acc.iter_mut() {
                *v = _mm256_fmadd_ps(*v, b, a);
            }
        }
        let s = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, &v| _mm256_add_ps(s, v));
        _mm_cvtss_f32(_mm256_castps256_ps128(s))
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) fn fma_avx512(iters: usize) -> f32 {
        let (a, b) = (_mm512_set1_ps(0.5), _mm512_set1_ps(0.999));
        let mut acc = [_mm512_set1_ps(1.0); WIDE_CHAINS];
        for _ in 0..std::hint::black_box(iters) {
            for v in acc.iter_mut() {
                *v = _mm512_fmadd_ps(*v, b, a);
            }
        }
        let s = acc
            .iter()
            .fold(_mm512_setzero_ps(), |s, &v| _mm512_add_ps(s, v));
        _mm512_reduce_add_ps(s)
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::WIDE_CHAINS;
    use std::arch::aarch64::*;

    #[target_feature(enable = "neon")]
    pub(super) fn fma_neon(iters: usize) -> f32 {
        let (a, b) = (vdupq_n_f32(0.5), vdupq_n_f32(0.999));
        let mut acc = [vdupq_n_f32(1.0); WIDE_CHAINS];
        for _ in 0..std::hint::black_box(iters) {
            for v in acc.iter_mut() {
                *v = vfmaq_f32(a, *v, b);
            }
        }
        let s = acc.iter().fold(vdupq_n_f32(0.0), |s, &v| vaddq_f32(s, v));
        vaddvq_f32(s)
    }
}

/// AMX bf16 tiles on this machine (docs/NUMERICS.md#avx512_bf16-and-amx): no k3 kernel uses
/// them yet; benchmarks report it so a table says which machine could.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amx {
    /// CPUID reports no AMX-BF16 or no AMX-TILE (or not an x86-64 CPU).
    NotOnCpu,
    /// The CPU has them but the OS has not enabled the tile state in XCR0.
    NotEnabledByOs,
    /// CPU and OS support them (on Linux a process must still ask for the tile data state
    /// with `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` before its first tile
    /// instruction).
    Available,
}

impl Amx {
    /// A short label for reports.
    pub fn label(self) -> &'static str {
        match self {
            Amx::NotOnCpu => "no (not on this CPU)",
            Amx::NotEnabledByOs => "no (CPU has it, OS has not enabled the tile state)",
            Amx::Available => "yes",
        }
    }
}

/// [`Amx`] from CPUID leaf 7 (EDX bit 22 AMX-BF16, bit 24 AMX-TILE) and XCR0 (bits 17–18,
/// XTILECFG and XTILEDATA).
pub fn amx_bf16() -> Amx {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        // (CPUID is safe on every x86-64 CPU; an absent leaf 7 reads as zeros or is ignored)
        let (max_leaf, leaf7, leaf1) = (__cpuid(0).eax, __cpuid_count(7, 0), __cpuid(1));
        let cpu = max_leaf >= 7 && leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0;
        if !cpu {
            return Amx::NotOnCpu;
        }
        let osxsave = leaf1.ecx & (1 << 27) != 0;
        // SAFETY: XGETBV is available when CPUID.1:ECX.OSXSAVE is set (checked first).
        let xcr0 = if osxsave { unsafe { xcr0() } } else { 0 };
        if xcr0 & (0b11 << 17) == 0b11 << 17 {
            Amx::Available
        } else {
            Amx::NotEnabledByOs
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Amx::NotOnCpu
    }
}

/// XCR0 (the OS-enabled state components).
///
/// # Safety
/// The CPU must report OSXSAVE (CPUID.1:ECX bit 27).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    std::arch::x86_64::_xgetbv(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amx_detection_agrees_with_proc_cpuinfo() {
        // Linux lists `amx_bf16` and `amx_tile` among the flags exactly when CPUID has them
        // (and the kernel supports them); elsewhere only check that it answers
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            let _ = amx_bf16();
            return;
        };
        let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
        let listed = flags.split_whitespace().any(|f| f == "amx_bf16")
            && flags.split_whitespace().any(|f| f == "amx_tile");
        assert_eq!(amx_bf16() == Amx::Available, listed, "{:?}", amx_bf16());
    }

    #[test]
    fn probes_run_and_converge() {
        for level in crate::simd::available_levels() {
            match fma_loop(level, 10_000) {
                // acc → a / (1 − b) = 500 per lane.
                Some(v) => assert!(v.is_finite() && v > 0.0, "{level:?}: {v}"),
                None => assert_eq!(level, Level::Scalar),
            }
            assert_eq!(fma_loop_flops(Level::Scalar, 10), 0);
        }
        let buf: Vec<u64> = (0..300_000).collect();
        assert_eq!(read_sum(&buf), 299_999 * 300_000 / 2);
    }
}
