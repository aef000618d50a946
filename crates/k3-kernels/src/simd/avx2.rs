//! AVX2 + FMA paths. The 16 f64 lanes of the f32/bf16 dot live in four `ymm` accumulators
//! (`acc[k]` = lanes `4k..4k+4`); the 8 lanes of an MXFP4 group in two (`l0` = lanes 0..4,
//! `l1` = lanes 4..8). Every update is `_mm256_fmadd_pd`, i.e. the scalar `f64::mul_add`.
//!
//! Kernels take `N` activation rows (`N` tokens against one weight row, each with its own
//! accumulators and the same per-lane operation sequence) so the weight is loaded and widened
//! once per block; activations are `f32` or pre-widened `f64`.

use super::{fused_tail, tree4, WElem, XElem};
use crate::mxfp4::{e8m0_scale, E2M1, GROUP};
use std::arch::x86_64::*;

/// Four f64 vectors: 16 consecutive lanes.
type V16 = [__m256d; 4];

/// Loads of four consecutive elements as f64.
pub(crate) trait Ld4: XElem {
    /// # Safety
    /// 4 elements readable at `p`; the CPU has AVX2 and FMA.
    unsafe fn ld4(p: *const Self) -> __m256d;
}

impl Ld4 for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ld4(p: *const f32) -> __m256d {
        // SAFETY: the caller guarantees 4 readable f32; the load is unaligned.
        unsafe { _mm256_cvtps_pd(_mm_loadu_ps(p)) }
    }
}

impl Ld4 for f64 {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ld4(p: *const f64) -> __m256d {
        // SAFETY: the caller guarantees 4 readable f64; the load is unaligned.
        unsafe { _mm256_loadu_pd(p) }
    }
}

/// Loads of sixteen consecutive weights as f64 lanes 0..16.
pub(crate) trait Ld16: WElem {
    /// # Safety
    /// 16 elements readable at `p`; the CPU has AVX2 and FMA.
    unsafe fn ld16(p: *const Self) -> V16;
}

impl Ld16 for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ld16(p: *const f32) -> V16 {
        // SAFETY: the caller guarantees 16 readable f32 at `p`.
        unsafe {
            [
                f32::ld4(p),
                f32::ld4(p.add(4)),
                f32::ld4(p.add(8)),
                f32::ld4(p.add(12)),
            ]
        }
    }
}

impl Ld16 for u16 {
    /// bf16 bits: each becomes the high half of an f32 (interleaving zero below it), then
    /// f32 → f64 — both steps exact.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ld16(p: *const u16) -> V16 {
        // SAFETY: the caller guarantees 16 readable u16 (32 bytes) at `p`; unaligned loads.
        let (a, b) = unsafe { (_mm_loadu_si128(p.cast()), _mm_loadu_si128(p.add(8).cast())) };
        let z = _mm_setzero_si128();
        [
            bits_pd(_mm_unpacklo_epi16(z, a)),
            bits_pd(_mm_unpackhi_epi16(z, a)),
            bits_pd(_mm_unpacklo_epi16(z, b)),
            bits_pd(_mm_unpackhi_epi16(z, b)),
        ]
    }
}

/// Four f32 given as bits → four f64.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn bits_pd(v: __m128i) -> __m256d {
    _mm256_cvtps_pd(_mm_castsi128_ps(v))
}

/// The four f64 lanes of a vector.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lanes4(v: __m256d) -> [f64; 4] {
    let mut out = [0f64; 4];
    // SAFETY: `out` has room for exactly four f64; the store is unaligned.
    unsafe { _mm256_storeu_pd(out.as_mut_ptr(), v) };
    out
}

/// The 16-lane tree: `b = (A0 + A1) + (A2 + A3)` gives `b_j = (a_j + a_{j+4}) +
/// (a_{j+8} + a_{j+12})` lane-wise, then `(b0 + b1) + (b2 + b3)`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce16(a: V16) -> f64 {
    let b = _mm256_add_pd(_mm256_add_pd(a[0], a[1]), _mm256_add_pd(a[2], a[3]));
    tree4(lanes4(b))
}

/// 16-lane dots of one weight row with `N` activation rows (see [`crate::dot::dot_f32`]).
/// Every `xs[t]` must have `w.len()` elements (checked by the dispatcher).
#[target_feature(enable = "avx2,fma")]
pub(super) fn dot16<W: Ld16, X: Ld4, const N: usize>(w: &[W], xs: [&[X]; N]) -> [f64; N] {
    let n = xs.iter().fold(w.len(), |m, x| m.min(x.len()));
    let full = n / 16 * 16;
    let mut acc = [[_mm256_setzero_pd(); 4]; N];
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 16 <= full <= n <= w.len()`.
        let wv = unsafe { W::ld16(w.as_ptr().add(i)) };
        for (a, x) in acc.iter_mut().zip(&xs) {
            for (k, ak) in a.iter_mut().enumerate() {
                // SAFETY: `i + 4k + 4 <= full <= n <= x.len()`.
                let xv = unsafe { X::ld4(x.as_ptr().add(i + 4 * k)) };
                *ak = _mm256_fmadd_pd(wv[k], xv, *ak);
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

/// Software prefetch distance of [`dot16_rows`], in weight elements of each row.
const PREFETCH: usize = 512;

/// 16-lane dots of `R` weight rows with one pre-widened activation row (mat-vec): the
/// activation vectors are loaded once per 16 elements and shared by the rows, whose
/// independent accumulator chains overlap. Every `ws[r]` must have `x.len()` elements
/// (checked by the dispatcher).
#[target_feature(enable = "avx2,fma")]
pub(super) fn dot16_rows<W: Ld16, const R: usize>(ws: [&[W]; R], x: &[f64]) -> [f64; R] {
    let n = ws.iter().fold(x.len(), |m, w| m.min(w.len()));
    let full = n / 16 * 16;
    let mut acc = [[_mm256_setzero_pd(); 4]; R];
    let mut i = 0;
    while i < full {
        let mut xv: V16 = [_mm256_setzero_pd(); 4];
        for (k, xk) in xv.iter_mut().enumerate() {
            // SAFETY: `i + 4k + 4 <= full <= n <= x.len()`.
            *xk = unsafe { f64::ld4(x.as_ptr().add(i + 4 * k)) };
        }
        for (a, w) in acc.iter_mut().zip(&ws) {
            // A hint only: the address may lie past the row (never dereferenced).
            _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(i + PREFETCH).cast());
            // SAFETY: `i + 16 <= full <= n <= w.len()`.
            let wv = unsafe { W::ld16(w.as_ptr().add(i)) };
            for k in 0..4 {
                a[k] = _mm256_fmadd_pd(wv[k], xv[k], a[k]);
            }
        }
        i += 16;
    }
    let mut out = [0f64; R];
    for ((o, a), w) in out.iter_mut().zip(acc).zip(&ws) {
        *o = fused_tail(reduce16(a), w[full..n].iter().map(|v| v.f32()), &x[full..n]);
    }
    out
}

/// Expands 8 E2M1 codes (one per byte, low 8 bytes of `c`) to 8 f32: magnitude by table
/// (code bits 0..3), sign from code bit 3 — exactly the entries of [`E2M1`] (incl. `-0`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn e2m1x8(c: __m128i, lut: __m256) -> __m256 {
    let idx = _mm256_cvtepu8_epi32(c);
    let mag = _mm256_permutevar8x32_ps(lut, idx);
    let sign = _mm256_and_si256(_mm256_slli_epi32::<28>(idx), _mm256_set1_epi32(i32::MIN));
    _mm256_xor_ps(mag, _mm256_castsi256_ps(sign))
}

/// One 32-group against `N` activation rows: the tree-reduced sub-sums (before the scale).
///
/// # Safety
/// `codes` must be readable for 16 bytes and every `x[t] .. x[t] + off + 32` for `X`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn group<X: Ld4, const N: usize>(
    codes: *const u8,
    xs: &[&[X]; N],
    off: usize,
    lut: __m256,
) -> [f64; N] {
    // SAFETY: the caller guarantees 16 readable bytes at `codes`.
    let v = unsafe { _mm_loadu_si128(codes.cast()) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(v, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m);
    // Element order: even element = low nibble.
    let e = [_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)];
    let mut l = [[_mm256_setzero_pd(); 2]; N];
    for (h, &codes16) in e.iter().enumerate() {
        for q in 0..2 {
            let c = if q == 0 {
                codes16
            } else {
                _mm_unpackhi_epi64(codes16, codes16)
            };
            let wv = e2m1x8(c, lut);
            let wd = [
                _mm256_cvtps_pd(_mm256_castps256_ps128(wv)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(wv)),
            ];
            let base = off + h * 16 + q * 8;
            for (lt, x) in l.iter_mut().zip(xs) {
                for (k, lk) in lt.iter_mut().enumerate() {
                    // SAFETY: `base + 4k + 4 <= off + 32`, readable per the caller.
                    let xv = unsafe { X::ld4(x.as_ptr().add(base + 4 * k)) };
                    *lk = _mm256_fmadd_pd(wd[k], xv, *lk);
                }
            }
        }
    }
    // ((s0+s4)+(s1+s5)) + ((s2+s6)+(s3+s7)): l0 + l1 pairs lane j with lane j+4.
    let mut out = [0f64; N];
    for (o, lt) in out.iter_mut().zip(l) {
        *o = tree4(lanes4(_mm256_add_pd(lt[0], lt[1])));
    }
    out
}

/// MXFP4 row dots against `N` activation rows (see [`crate::dot::dot_mxfp4`]); lengths are
/// checked by the dispatcher.
#[target_feature(enable = "avx2,fma")]
pub(super) fn dot_mxfp4<X: Ld4, const N: usize>(
    packed: &[u8],
    scales: &[u8],
    xs: [&[X]; N],
) -> [f64; N] {
    let xl = xs.iter().fold(usize::MAX, |m, x| m.min(x.len()));
    let groups = scales.len().min(packed.len() / 16).min(xl / GROUP);
    // SAFETY: `E2M1[..8]` is 8 readable f32; the load is unaligned.
    let lut = unsafe { _mm256_loadu_ps(E2M1.as_ptr()) };
    let mut acc = [0f64; N];
    for (g, &s) in scales[..groups].iter().enumerate() {
        // SAFETY: `g < groups`, so bytes `16g..16g+16` of `packed` and elements
        // `32g..32g+32` of every `xs[t]` are in bounds.
        let sub = unsafe { group(packed.as_ptr().add(g * 16), &xs, g * GROUP, lut) };
        let sc = e8m0_scale(s) as f64;
        for (a, sb) in acc.iter_mut().zip(sub) {
            *a += sb * sc;
        }
    }
    acc
}
