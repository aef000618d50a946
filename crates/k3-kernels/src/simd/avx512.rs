//! AVX-512F paths. The 16 f64 lanes of the f32/bf16 dot live in two `zmm` accumulators
//! (`acc[0]` = lanes 0..8, `acc[1]` = lanes 8..16); the 8 lanes of an MXFP4 group in one.
//! Every update is `_mm512_fmadd_pd`, i.e. the scalar `f64::mul_add`.
//!
//! Kernels take `N` activation rows (`N` tokens against one weight row, each with its own
//! accumulators and the same per-lane operation sequence); activations are `f32` or
//! pre-widened `f64`.
//!
//! The `std::arch` AVX-512 intrinsics are stable since Rust 1.89 (the workspace toolchain is
//! newer; its declared `rust-version` predates them).
#![allow(clippy::incompatible_msrv)]

use super::{fused_tail, tree4, WElem, XElem};
use crate::mxfp4::{e8m0_scale, E2M1, GROUP};
use std::arch::x86_64::*;

/// Two f64 vectors: 16 consecutive lanes.
type V16 = [__m512d; 2];

/// Loads of eight consecutive elements as f64.
pub(crate) trait Ld8: XElem {
    /// # Safety
    /// 8 elements readable at `p`; the CPU has AVX-512F, AVX2 and FMA.
    unsafe fn ld8(p: *const Self) -> __m512d;
}

impl Ld8 for f32 {
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn ld8(p: *const f32) -> __m512d {
        // SAFETY: the caller guarantees 8 readable f32; the load is unaligned.
        unsafe { _mm512_cvtps_pd(_mm256_loadu_ps(p)) }
    }
}

impl Ld8 for f64 {
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn ld8(p: *const f64) -> __m512d {
        // SAFETY: the caller guarantees 8 readable f64; the load is unaligned.
        unsafe { _mm512_loadu_pd(p) }
    }
}

/// Loads of sixteen consecutive weights as f64 lanes 0..16.
pub(crate) trait Ld16: WElem {
    /// # Safety
    /// 16 elements readable at `p`; the CPU has AVX-512F, AVX2 and FMA.
    unsafe fn ld16(p: *const Self) -> V16;
}

impl Ld16 for f32 {
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn ld16(p: *const f32) -> V16 {
        // SAFETY: the caller guarantees 16 readable f32 at `p`.
        unsafe { [f32::ld8(p), f32::ld8(p.add(8))] }
    }
}

impl Ld16 for u16 {
    /// bf16 bits zero-extended to u32 and shifted into the high half (→ f32), then f64.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn ld16(p: *const u16) -> V16 {
        // SAFETY: the caller guarantees 16 readable u16 (32 bytes) at `p`; unaligned loads.
        let (a, b) = unsafe { (_mm_loadu_si128(p.cast()), _mm_loadu_si128(p.add(8).cast())) };
        [bf16x8_pd(a), bf16x8_pd(b)]
    }
}

/// Eight bf16 bits → f32 (exact shift into the high half) → f64.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn bf16x8_pd(v: __m128i) -> __m512d {
    let bits = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v));
    _mm512_cvtps_pd(_mm256_castsi256_ps(bits))
}

/// The four f64 lanes of a vector.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn lanes4(v: __m256d) -> [f64; 4] {
    let mut out = [0f64; 4];
    // SAFETY: `out` has room for exactly four f64; the store is unaligned.
    unsafe { _mm256_storeu_pd(out.as_mut_ptr(), v) };
    out
}

/// `lo4(v) + hi4(v)`: lane `j` of the result is `v_j + v_{j+4}`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn fold8(v: __m512d) -> __m256d {
    _mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd::<1>(v))
}

/// The 16-lane tree: `b_j = (a_j + a_{j+4}) + (a_{j+8} + a_{j+12})` as
/// `fold8(acc0) + fold8(acc1)`, then `(b0 + b1) + (b2 + b3)`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn reduce16(a: V16) -> f64 {
    tree4(lanes4(_mm256_add_pd(fold8(a[0]), fold8(a[1]))))
}

/// 16-lane dots of one weight row with `N` activation rows (see [`crate::dot::dot_f32`]).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) fn dot16<W: Ld16, X: Ld8, const N: usize>(w: &[W], xs: [&[X]; N]) -> [f64; N] {
    let n = xs.iter().fold(w.len(), |m, x| m.min(x.len()));
    let full = n / 16 * 16;
    let mut acc = [[_mm512_setzero_pd(); 2]; N];
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 16 <= full <= n <= w.len()`.
        let wv = unsafe { W::ld16(w.as_ptr().add(i)) };
        for (a, x) in acc.iter_mut().zip(&xs) {
            for (k, ak) in a.iter_mut().enumerate() {
                // SAFETY: `i + 8k + 8 <= full <= n <= x.len()`.
                let xv = unsafe { X::ld8(x.as_ptr().add(i + 8 * k)) };
                *ak = _mm512_fmadd_pd(wv[k], xv, *ak);
            }
        }
        i += 16;
    }
    let mut out = [0f64; N];
    for ((o, a), x) in out.iter_mut().zip(acc).zip(&xs) {
        *o = fused_tail(reduce16(a), w[full..n].iter().map(|v| v.f32()), &x[full..n]);
    }
    out
}

/// The E2M1 table as f64, split by the sign bit (code bit 3) for `permutex2var`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn e2m1_tables() -> (__m512d, __m512d) {
    // SAFETY: `E2M1` has 16 readable f32; loads are unaligned.
    let (p, n) = unsafe {
        (
            _mm256_loadu_ps(E2M1.as_ptr()),
            _mm256_loadu_ps(E2M1.as_ptr().add(8)),
        )
    };
    (_mm512_cvtps_pd(p), _mm512_cvtps_pd(n))
}

/// One 32-group against `N` activation rows: the tree-reduced sub-sums (before the scale).
/// Codes are looked up straight to f64 (`permutex2var_pd`: index bits 0..3 pick the entry,
/// bit 3 the table), which equals `E2M1[code] as f64` exactly.
///
/// # Safety
/// `codes` must be readable for 16 bytes and every `x[t]` at `off..off + 32`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn group<X: Ld8, const N: usize>(
    codes: *const u8,
    xs: &[&[X]; N],
    off: usize,
    t: (__m512d, __m512d),
) -> [f64; N] {
    // SAFETY: the caller guarantees 16 readable bytes at `codes`.
    let v = unsafe { _mm_loadu_si128(codes.cast()) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(v, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m);
    // Element order: even element = low nibble.
    let e = [_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)];
    let mut l = [_mm512_setzero_pd(); N];
    for (h, &codes16) in e.iter().enumerate() {
        for q in 0..2 {
            let c = if q == 0 {
                codes16
            } else {
                _mm_unpackhi_epi64(codes16, codes16)
            };
            let wv = _mm512_permutex2var_pd(t.0, _mm512_cvtepu8_epi64(c), t.1);
            for (lt, x) in l.iter_mut().zip(xs) {
                // SAFETY: `h*16 + q*8 + 8 <= 32`, readable per the caller.
                let xv = unsafe { X::ld8(x.as_ptr().add(off + h * 16 + q * 8)) };
                *lt = _mm512_fmadd_pd(wv, xv, *lt);
            }
        }
    }
    // ((s0+s4)+(s1+s5)) + ((s2+s6)+(s3+s7)).
    let mut out = [0f64; N];
    for (o, lt) in out.iter_mut().zip(l) {
        *o = tree4(lanes4(fold8(lt)));
    }
    out
}

/// MXFP4 row dots against `N` activation rows (see [`crate::dot::dot_mxfp4`]).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) fn dot_mxfp4<X: Ld8, const N: usize>(
    packed: &[u8],
    scales: &[u8],
    xs: [&[X]; N],
) -> [f64; N] {
    let xl = xs.iter().fold(usize::MAX, |m, x| m.min(x.len()));
    let groups = scales.len().min(packed.len() / 16).min(xl / GROUP);
    let t = e2m1_tables();
    let mut acc = [0f64; N];
    for (g, &s) in scales[..groups].iter().enumerate() {
        // SAFETY: `g < groups`, so bytes `16g..16g+16` of `packed` and elements
        // `32g..32g+32` of every `xs[t]` are in bounds.
        let sub = unsafe { group(packed.as_ptr().add(g * 16), &xs, g * GROUP, t) };
        let sc = e8m0_scale(s) as f64;
        for (a, sb) in acc.iter_mut().zip(sub) {
            *a += sb * sc;
        }
    }
    acc
}
