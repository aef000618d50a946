//! AVX-512F paths. The 16 f32 lanes of one dot are one `zmm` in natural order; every update
//! is `_mm512_fmadd_ps`, i.e. the scalar `f32::mul_add`. Kernels return the lanes; the caller
//! applies the scalar tree (`dot::reduce16`).
//!
//! bf16: 16 bits zero-extended (`vpmovzxwd`) and shifted into the high half. MXFP4: the
//! group's 16 signed scaled values `E2M1[c] · E8M0[s]` are one `vmulps` of the E2M1 table by
//! the broadcast scale (the scalar `mxfp4::decode`, bit for bit); the codes, unpacked to
//! element order and zero-extended to 32 bits, index it with `vpermps` (`permutexvar`, low
//! 4 bits) — natural order, so activations are read as they are. With VBMI (detected at run
//! time) a cheaper decoder gives the same values in the same order (`decode_vbmi`).
//!
//! The `std::arch` AVX-512 intrinsics are stable since Rust 1.89 (the workspace toolchain is
//! newer; its declared `rust-version` predates them).
#![allow(clippy::incompatible_msrv)]

use super::avx512_mx::{decode, decode_vbmi, e2m1_table, has_vbmi};
use super::gemm::plan::Done;
use crate::mxfp4::GROUP;
use std::arch::x86_64::*;

/// A weight element of a 16-lane row: f32, or bf16 as raw bits.
pub(super) trait Ld16: Copy {
    /// The padding weight of a partial last block (`−0`, see `avx2::Ld16::PAD`).
    const PAD: Self;
    /// The activation padding of a partial last block (see `avx2::Ld16::XPAD`).
    const XPAD: f32 = 0.0;
    /// # Safety
    /// 16 elements readable at `p`; the CPU has AVX-512F, AVX2 and FMA.
    unsafe fn ld16(p: *const Self) -> __m512;
}

impl Ld16 for f32 {
    const PAD: f32 = -0.0;
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn ld16(p: *const f32) -> __m512 {
        // SAFETY: the caller guarantees 16 readable f32 at `p`; unaligned load.
        unsafe { _mm512_loadu_ps(p) }
    }
}

impl Ld16 for u16 {
    const PAD: u16 = 0x8000;
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn ld16(p: *const u16) -> __m512 {
        // SAFETY: the caller guarantees 16 readable u16 (32 bytes) at `p`; unaligned load.
        let v = unsafe { _mm256_loadu_si256(p.cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(v)))
    }
}

impl Ld16 for i8 {
    const PAD: i8 = 0;
    const XPAD: f32 = -0.0;
    /// int8 sign-extended to 32 bits (`vpmovsxbd`) and converted (`vcvtdq2ps`): exact.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn ld16(p: *const i8) -> __m512 {
        // SAFETY: the caller guarantees 16 readable bytes at `p`; unaligned load.
        let v = unsafe { _mm_loadu_si128(p.cast()) };
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
    }
}

/// The 16 lanes of `v`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn store16(v: __m512) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: `out` has room for 16 f32; unaligned store.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// Software prefetch distance of the f32 / bf16 / Q8 mat-vec, in weight elements of each row
/// (one hint per cache line, redirected past a row's end). Measured (`matvec_same_run bf`,
/// Zen 5, alternate runs): with the redirect the short-row 7168 × 1536 bf16 mat-vec went
/// 19.5–20.6 → 26.3–27.1 GB/s on 1 thread and 37.7–39.5 → 41.8–45.3 on 2; 12288 × 7168
/// stayed at 26–27 / 42–51. Distances of 256 / 1024 elements: 21–23 / 28–31 GB/s on 1
/// thread, but 37–41 / 38–40 on 2.
const PREFETCH: usize = 512;

/// MXFP4 mat-vec prefetch distance, in bytes past the block's linear position. The `R` rows
/// of a call are consecutive rows of one matrix, so contiguous (`R · cols / 2` bytes: 7 KB for
/// 4 rows of an expert's w1/w3); the block advances `R · 16` bytes (one cache line at `R` = 4)
/// per group, and one prefetch per group walks this block and the next ones as one stream.
/// A line of row `k` of the block is hinted before it is read when the distance is at least
/// `(R − 1)` rows: 12 KB covers 4-row blocks of rows up to 4 KB (8192 columns). (The same
/// stream for bf16 rows, whose 4-row blocks are 57 KB, hinted rows 1–3 after their use and
/// measured 10 % slower: those keep per-row hints, [`PREFETCH`].)
/// Measured (`matvec_same_run mx`, 3072 × 3584 from DRAM, alternate runs, Zen 5): one prefetch
/// per group in every row 512 B ahead 11.1 / 21.3 GB/s on 1 / 2 threads; one per line 2 KB
/// ahead 12.4 / 23.3; this stream 1 KB / 2 KB / 4 KB / 8 KB / 12 KB / 32 KB ahead
/// 11.8 / 12.7 / 16.1 / 18.2 / 19.4 / 18.7 GB/s on 1 thread (≈ 36 on 2 from 8 KB on).
const MX_PREFETCH: usize = 12 * 1024;

/// Rows per mat-vec call (every storage).
pub(super) const ROWS: usize = 4;

/// The 16 lanes of `R` weight rows dotted with one activation row `x` (see `avx2::rows16`).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) fn rows16<W: Ld16, const R: usize>(ws: [&[W]; R], x: &[f32]) -> [[f32; 16]; R] {
    let n = ws.iter().fold(x.len(), |m, w| m.min(w.len()));
    let full = n / 16 * 16;
    let mut acc = [_mm512_setzero_ps(); R];
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 16 <= full <= n <= x.len()`.
        let xv = unsafe { f32::ld16(x.as_ptr().add(i)) };
        // One hint per cache line of each row; past the row's end it points into the same
        // row of the next block of `R` (a matrix's rows are contiguous; `avx2::rows16`).
        let ahead = i + PREFETCH;
        let skip = if ahead < n { 0 } else { (R - 1) * n };
        let line = (i * size_of::<W>()).is_multiple_of(64);
        for (a, w) in acc.iter_mut().zip(&ws) {
            if line {
                // A hint only: the address may lie past the matrix (never dereferenced).
                _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(ahead + skip).cast());
            }
            // SAFETY: `i + 16 <= full <= n <= w.len()`.
            *a = _mm512_fmadd_ps(unsafe { W::ld16(w.as_ptr().add(i)) }, xv, *a);
        }
        i += 16;
    }
    if full < n {
        let mut xb = [W::XPAD; 16];
        xb[..n - full].copy_from_slice(&x[full..n]);
        // SAFETY: `xb` holds 16 f32.
        let xv = unsafe { f32::ld16(xb.as_ptr()) };
        for (a, w) in acc.iter_mut().zip(&ws) {
            let mut wb = [W::PAD; 16];
            wb[..n - full].copy_from_slice(&w[full..n]);
            // SAFETY: `wb` holds 16 elements.
            *a = _mm512_fmadd_ps(unsafe { W::ld16(wb.as_ptr()) }, xv, *a);
        }
    }
    acc.map(|v| store16(v))
}

/// The MXFP4 mat-vec and panel kernels for one decoder and its target features.
macro_rules! mx_kernels {
    ($rows:ident, $panel:ident, $feat:literal, $decode:ident) => {
        /// The 16 lanes of `R` MXFP4 rows dotted with `x` (natural order; lengths as
        /// `avx2_mx::rows`).
        #[target_feature(enable = $feat)]
        fn $rows<const R: usize>(
            packed: [&[u8]; R],
            scales: [&[u8]; R],
            x: &[f32],
        ) -> [[f32; 16]; R] {
            let groups = super::layout::mx_groups(&packed, &scales, x.len());
            let table = e2m1_table();
            let mut acc = [_mm512_setzero_ps(); R];
            for g in 0..groups {
                // SAFETY: `g < groups`: elements `32g .. 32g+32` of `x` are in bounds.
                let xv = unsafe {
                    [
                        _mm512_loadu_ps(x.as_ptr().add(GROUP * g)),
                        _mm512_loadu_ps(x.as_ptr().add(GROUP * g + 16)),
                    ]
                };
                // A hint only: the address may lie past the matrix (never dereferenced).
                let ahead = packed[0].as_ptr().wrapping_add(R * 16 * g + MX_PREFETCH);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                for ((a, p), s) in acc.iter_mut().zip(&packed).zip(&scales) {
                    // SAFETY: `g < groups`: bytes `16g .. 16g+16` of `p` are in bounds.
                    let w = unsafe { $decode(p.as_ptr().add(16 * g), s[g], table) };
                    *a = _mm512_fmadd_ps(w[0], xv[0], *a);
                    *a = _mm512_fmadd_ps(w[1], xv[1], *a);
                }
            }
            acc.map(|v| store16(v))
        }

        /// Decodes every group of one row into `dst` (natural order, 32 f32 per group;
        /// lengths as `avx2_mx::panel`).
        #[target_feature(enable = $feat)]
        fn $panel(packed: &[u8], scales: &[u8], dst: &mut [f32]) {
            let groups = scales.len().min(packed.len() / 16).min(dst.len() / GROUP);
            let table = e2m1_table();
            for (g, &s) in scales[..groups].iter().enumerate() {
                // SAFETY: `g < groups`: bytes `16g .. 16g+16` of `packed` and f32
                // `32g .. 32g+32` of `dst` are in bounds.
                unsafe {
                    let w = $decode(packed.as_ptr().add(16 * g), s, table);
                    _mm512_storeu_ps(dst.as_mut_ptr().add(GROUP * g), w[0]);
                    _mm512_storeu_ps(dst.as_mut_ptr().add(GROUP * g + 16), w[1]);
                }
            }
        }
    };
}

mx_kernels!(rows_mx_f, panel_mx_f, "avx512f,avx2,fma", decode);
mx_kernels!(
    rows_mx_vbmi,
    panel_mx_vbmi,
    "avx512f,avx512vbmi,avx2,fma",
    decode_vbmi
);

/// The 16 lanes of `R` MXFP4 rows dotted with `x`: the VBMI decoder where the CPU has it,
/// else the AVX-512F one (the same bits; `vbmi_and_f_decoders_agree` tests it).
/// Measured: docs/PERFORMANCE.md#mat-vec.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) fn rows_mx<const R: usize>(
    packed: [&[u8]; R],
    scales: [&[u8]; R],
    x: &[f32],
) -> [[f32; 16]; R] {
    if has_vbmi() {
        // SAFETY: VBMI detected; AVX-512F, AVX2 and FMA are this function's features.
        unsafe { rows_mx_vbmi(packed, scales, x) }
    } else {
        rows_mx_f(packed, scales, x)
    }
}

/// Decodes every group of one row into `dst` ([`rows_mx`]'s decoder choice).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) fn panel_mx(packed: &[u8], scales: &[u8], dst: &mut [f32]) {
    if has_vbmi() {
        // SAFETY: as in `rows_mx`.
        unsafe { panel_mx_vbmi(packed, scales, dst) }
    } else {
        panel_mx_f(packed, scales, dst)
    }
}

/// The 16 lanes of each of `R` rows.
#[cfg(test)]
type Lanes<const R: usize> = [[f32; 16]; R];

/// Both AVX-512 decoders on the same rows, for the test that they agree: `(f, vbmi)`, or
/// `None` without VBMI.
#[cfg(test)]
pub(super) fn rows_mx_both<const R: usize>(
    packed: [&[u8]; R],
    scales: [&[u8]; R],
    x: &[f32],
) -> Option<(Lanes<R>, Lanes<R>)> {
    let avx2_fma = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    if !(has_vbmi() && avx2_fma && is_x86_feature_detected!("avx512f")) {
        return None;
    }
    // SAFETY: every feature of both kernels was detected above.
    unsafe {
        Some((
            rows_mx_f(packed, scales, x),
            rows_mx_vbmi(packed, scales, x),
        ))
    }
}

/// Widens bf16 bits into `dst` (lengths as `avx2::widen_bf16`).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    widen(src, dst)
}

/// Widens int8 values into `dst` (lengths as `avx2::widen_bf16`).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) fn widen_q8(src: &[i8], dst: &mut [f32]) {
    widen(src, dst)
}

/// [`widen_bf16`] / [`widen_q8`].
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn widen<W: Ld16>(src: &[W], dst: &mut [f32]) {
    let n = src.len().min(dst.len()) / 16 * 16;
    let mut i = 0;
    while i < n {
        // SAFETY: `i + 16 <= n` elements of both slices are in bounds.
        unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(i), W::ld16(src.as_ptr().add(i))) };
        i += 16;
    }
}

/// [`crate::dot::reduce16`] of 16 lane sets at once: set `i` (16 natural-order f32 in
/// `v[i]`) → lane `i` of the result. The same additions as the scalar tree (`a[j] + a[j + 8]`,
/// then `+ 4`, `+ 2`, `+ 1`), four levels of `zmm` adds on shuffled pairs of sets: ~3 vector
/// ops per set instead of ~40 scalar ones (the GEMM's outputs, `simd::gemm`).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn reduce16_sets(v: &[__m512; 16]) -> __m512 {
    // Level 1, sets (2i, 2i+1): [a[j] + a[j+8] | b[j] + b[j+8]], j < 8.
    let l1: [__m512; 8] = std::array::from_fn(|i| {
        let (a, b) = (v[2 * i], v[2 * i + 1]);
        let lo = _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b);
        let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b);
        _mm512_add_ps(lo, hi)
    });
    // Level 2: quarter q of l2[k] is set 4k + q's c[j] = b[j] + b[j + 4], j < 4.
    let l2: [__m512; 4] = std::array::from_fn(|k| {
        let (e, f) = (l1[2 * k], l1[2 * k + 1]);
        let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(e, f);
        let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(e, f);
        _mm512_add_ps(lo, hi)
    });
    // Level 3: quarter q of l3[h] is [d0, d1] of set 8h + q, then of set 8h + 4 + q
    // (d = [c0 + c2, c1 + c3]).
    let l3: [__m512; 2] = std::array::from_fn(|h| {
        let (x, y) = (l2[2 * h], l2[2 * h + 1]);
        let lo = _mm512_shuffle_ps::<0b01_00_01_00>(x, y);
        let hi = _mm512_shuffle_ps::<0b11_10_11_10>(x, y);
        _mm512_add_ps(lo, hi)
    });
    // Level 4: d0 + d1; position 4q + m holds set q + 4m.
    let lo = _mm512_shuffle_ps::<0b10_00_10_00>(l3[0], l3[1]);
    let hi = _mm512_shuffle_ps::<0b11_01_11_01>(l3[0], l3[1]);
    let sums = _mm512_add_ps(lo, hi);
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(idx, sums)
}

/// [`reduce16_sets`] of the 16 lane sets at `p` (set `i` at `p + 16·i`) into `out` (the
/// emit's tree for the lanes the tiles left in the state: the fused MXFP4 tiles').
///
/// # Safety
/// The CPU has AVX-512F; `16 · 16` f32 readable at `p`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn reduce16x16(p: *const f32, out: &mut [f32; 16]) {
    // SAFETY: 256 readable f32 at `p` (caller).
    let v: [__m512; 16] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(p.add(16 * i)) });
    // SAFETY: `out` holds 16 f32.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), reduce16_sets(&v)) };
}

/// Leaves the lanes of `M` rows × `N` tokens (`M · N ≤ 16`) after a chunk: in their state
/// slots ([`load_state`]'s layout) while more chunks follow, or, after the row's last chunk
/// (`done`), reduced in registers (one [`reduce16_sets`] tree) straight to
/// the outputs, so the lanes are never stored and read back for the tree (the GEMM's
/// emit then only scales and copies; docs/NUMERICS.md#gemm).
///
/// # Safety
/// The CPU has AVX-512F; without `done`, 16 writable f32 at every slot, not aliased; with it,
/// the output of (row `r`, token `t`) writable at `done.at(r, t)`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn leave<const M: usize, const N: usize>(
    acc: &[[__m512; N]; M],
    st: *mut f32,
    ss: usize,
    done: Option<Done>,
) {
    let Some(done) = done else {
        // SAFETY: the state slots are the caller's.
        return unsafe { store_state(acc, st, ss) };
    };
    const { assert!(M * N <= 16, "one tree per tile") };
    // Set `i` is (row `i / N`, token `i % N`); zero sets pad the tree.
    let flat = acc.as_flattened();
    let sets: [__m512; 16] =
        std::array::from_fn(|i| flat.get(i).copied().unwrap_or(_mm512_setzero_ps()));
    let mut sums = [0f32; 16];
    // SAFETY: 16 writable f32.
    unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), reduce16_sets(&sets)) };
    for (i, &v) in sums.iter().enumerate().take(M * N) {
        // SAFETY: the output slots are the caller's.
        unsafe { done.at(i / N, i % N).write(v) };
    }
}

/// Rows per GEMM microkernel call.
pub(super) const MR: usize = 4;
/// Most tokens per GEMM microkernel call (16 accumulators + 4 weight vectors of 32 `zmm`).
pub(super) const TB: usize = 4;

/// The lanes of `M` rows × `N` tokens from the GEMM state (slot of (row `r`, token `t`) at
/// `st + r·ss + 16t`); a `fresh` state (the first chunk) starts at +0, the lanes' initial
/// value, and is not read.
///
/// # Safety
/// The CPU has AVX-512F; unless `fresh`, 16 readable f32 at every slot.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn load_state<const M: usize, const N: usize>(
    st: *const f32,
    ss: usize,
    fresh: bool,
) -> [[__m512; N]; M] {
    let mut acc = [[_mm512_setzero_ps(); N]; M];
    if !fresh {
        for (r, ar) in acc.iter_mut().enumerate() {
            for (t, a) in ar.iter_mut().enumerate() {
                // SAFETY: 16 readable f32 at the slot (caller).
                *a = unsafe { _mm512_loadu_ps(st.wrapping_add(r * ss + 16 * t)) };
            }
        }
    }
    acc
}

/// Stores the lanes back to their slots ([`load_state`]'s layout).
///
/// # Safety
/// The CPU has AVX-512F; 16 writable f32 at every slot, not aliased.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn store_state<const M: usize, const N: usize>(
    acc: &[[__m512; N]; M],
    st: *mut f32,
    ss: usize,
) {
    for (r, ar) in acc.iter().enumerate() {
        for (t, &a) in ar.iter().enumerate() {
            // SAFETY: 16 writable f32 at the slot (caller).
            unsafe { _mm512_storeu_ps(st.wrapping_add(r * ss + 16 * t), a) };
        }
    }
}

/// The GEMM microkernel (contract and safety as `avx2::micro`, with AVX-512F).
///
/// # Safety
/// As `avx2::micro`, and the CPU has AVX-512F.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn micro<const M: usize, const N: usize>(
    w: [*const f32; M],
    x: *const f32,
    xs: usize,
    kc: usize,
    st: *mut f32,
    ss: usize,
    fresh: bool,
    mut pf: super::gemm::plan::Spread<'_>,
    done: Option<Done>,
) {
    // SAFETY: the state slots are the caller's.
    let mut acc = unsafe { load_state::<M, N>(st, ss, fresh) };
    let mut k = 0;
    while k < kc {
        pf.tick();
        let mut wv = [_mm512_setzero_ps(); M];
        for (v, &wr) in wv.iter_mut().zip(&w) {
            // SAFETY: `k + 16 <= kc` f32 are readable at every `w[r]` and `x[t]` (caller).
            *v = unsafe { f32::ld16(wr.add(k)) };
        }
        for t in 0..N {
            let xt = x.wrapping_add(t * xs);
            // SAFETY: as above.
            let xv = unsafe { _mm512_loadu_ps(xt.add(k)) };
            for (ar, &wr) in acc.iter_mut().zip(&wv) {
                ar[t] = _mm512_fmadd_ps(wr, xv, ar[t]);
            }
        }
        k += 16;
    }
    pf.finish();
    // SAFETY: the state slots or outputs are the caller's.
    unsafe { leave(&acc, st, ss, done) };
}

/// [`micro`] that also fills the panel: the `M` rows are read as bf16 at `src[r]`, widened
/// in registers (exactly, as [`widen_bf16`]) and stored at `w[r]` for the sweep's later token
/// blocks, while their lanes take the same FMAs as [`micro`] on the stored panel would give.
/// The widen's loads then overlap the FMAs instead of waiting in a pass of their own
/// (docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why).
///
/// # Safety
/// As [`micro`], and `kc` bf16 readable at every `src[r]` and `kc` f32 writable at every
/// `w[r]` (equal pointers are allowed for equal `src`), overlapping no other operand.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn micro_widen<const M: usize, const N: usize>(
    src: [*const u16; M],
    w: [*mut f32; M],
    x: *const f32,
    xs: usize,
    kc: usize,
    st: *mut f32,
    ss: usize,
    fresh: bool,
    mut pf: super::gemm::plan::Spread<'_>,
    done: Option<Done>,
) {
    // SAFETY: the state slots are the caller's.
    let mut acc = unsafe { load_state::<M, N>(st, ss, fresh) };
    let mut k = 0;
    while k < kc {
        pf.tick();
        let mut wv = [_mm512_setzero_ps(); M];
        for ((v, &sr), &wr) in wv.iter_mut().zip(&src).zip(&w) {
            // SAFETY: `k + 16 <= kc` elements readable at `src[r]`, writable at `w[r]`.
            unsafe {
                *v = u16::ld16(sr.add(k));
                _mm512_storeu_ps(wr.add(k), *v);
            }
        }
        for t in 0..N {
            let xt = x.wrapping_add(t * xs);
            // SAFETY: `k + 16 <= kc` f32 readable at every `x + t·xs` (caller).
            let xv = unsafe { _mm512_loadu_ps(xt.add(k)) };
            for (ar, &wr) in acc.iter_mut().zip(&wv) {
                ar[t] = _mm512_fmadd_ps(wr, xv, ar[t]);
            }
        }
        k += 16;
    }
    pf.finish();
    // SAFETY: the state slots or outputs are the caller's.
    unsafe { leave(&acc, st, ss, done) };
}

/// The fused MXFP4 GEMM tile: `M` rows decoded in registers by the VBMI decoder (no panel)
/// and added to the lanes of `N` tokens, as [`micro`] adds panel rows: lane `l` of (row `r`,
/// token `t`) takes element `32g + l`, then `32g + 16 + l`, group after group, so the same
/// FMAs in the same order. Each row's group is decoded once per call (4 rows × ≤ 4 tokens or
/// 2 rows × ≤ 8, `M · N ≤ 16` accumulators); the panel's stores and reloads are gone.
///
/// # Safety
/// The CPU has AVX-512F and VBMI; `16 · groups` bytes readable at every `packed[r]` and
/// `groups` at every `scales[r]`; `32 · groups` f32 readable at every `x + t·xs`; the state
/// slots as in `avx2::micro` (not read when `fresh`). `pf`: next-panel hints spread over
/// the groups (as in [`micro`]).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512vbmi,avx2,fma")]
pub(super) unsafe fn micro_mx<const M: usize, const N: usize>(
    packed: [*const u8; M],
    scales: [*const u8; M],
    groups: usize,
    x: *const f32,
    xs: usize,
    st: *mut f32,
    ss: usize,
    fresh: bool,
    mut pf: super::gemm::plan::Spread<'_>,
) {
    // SAFETY: the state slots are the caller's.
    let mut acc = unsafe { load_state::<M, N>(st, ss, fresh) };
    let unused = _mm512_setzero_ps();
    for g in 0..groups {
        pf.tick();
        // SAFETY: `g < groups`: 16 code bytes and one scale byte of group `g` (caller).
        let wv: [[__m512; 2]; M] = std::array::from_fn(|r| unsafe {
            decode_vbmi(packed[r].add(16 * g), *scales[r].add(g), unused)
        });
        for t in 0..N {
            let xt = x.wrapping_add(t * xs + GROUP * g);
            // SAFETY: `32g + 32 <= 32 · groups` f32 readable at `x + t·xs` (caller).
            let xv = unsafe { [_mm512_loadu_ps(xt), _mm512_loadu_ps(xt.add(16))] };
            for (ar, w) in acc.iter_mut().zip(&wv) {
                ar[t] = _mm512_fmadd_ps(w[0], xv[0], ar[t]);
                ar[t] = _mm512_fmadd_ps(w[1], xv[1], ar[t]);
            }
        }
    }
    pf.finish();
    // SAFETY: the state slots are the caller's.
    unsafe { store_state(&acc, st, ss) };
}
