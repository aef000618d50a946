//! The AVX-512 MXFP4 group decoders: 32 weights of one group into two `zmm` in element
//! order, bit for bit the scalar `mxfp4::decode` — by a multiply of the E2M1 table (AVX-512F)
//! or by a lookup in the pre-scaled table (VBMI). The mat-vec, panel and fused GEMM kernels
//! in `avx512.rs` call them.
#![allow(clippy::incompatible_msrv)] // AVX-512 intrinsics: stable since 1.89

use crate::mxfp4::{E2M1, E2M1_SCALED_F32, E8M0};
use std::arch::x86_64::*;

/// The 32 weights of one group: elements 0..16 and 16..32.
///
/// # Safety
/// 16 bytes readable at `codes`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn decode(codes: *const u8, s: u8, table: __m512) -> [__m512; 2] {
    // SAFETY: the caller guarantees 16 readable bytes at `codes`; unaligned load.
    let v = unsafe { _mm_loadu_si128(codes.cast()) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(v, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m);
    let t = _mm512_mul_ps(table, _mm512_set1_ps(E8M0[s as usize]));
    // Element order: even element = low nibble.
    let e = [_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)];
    e.map(|c| _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(c), t))
}

/// The E2M1 table (16 f32).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) fn e2m1_table() -> __m512 {
    // SAFETY: `E2M1` holds 16 readable f32; unaligned load.
    unsafe { _mm512_loadu_ps(E2M1.as_ptr()) }
}

/// `vpermb` indices of [`decode_vbmi`]: byte 0 of 32-bit lane `k` of half `h` takes code
/// byte `8h + k / 2` (the byte holding element `16h + k`); the other bytes are don't-cares
/// (byte 0 of the code vector).
const SPREAD: [[u8; 64]; 2] = {
    let mut c = [[0u8; 64]; 2];
    let mut h = 0;
    while h < 2 {
        let mut k = 0;
        while k < 16 {
            c[h][4 * k] = (8 * h + k / 2) as u8;
            k += 1;
        }
        h += 1;
    }
    c
};

/// [`decode`] with AVX-512 VBMI: the same 32 weights in the same order, bit for bit. The 16
/// code bytes are loaded once; per half, one `vpermb` puts the byte holding element `k` into
/// byte 0 of 32-bit lane `k`, `vpsrlvd` shifts odd lanes right by 4 (their high nibble), and
/// `vpermps` looks the low 4 bits up in the scale's row of [`E2M1_SCALED_F32`] (the scalar
/// `decode`'s values; no multiply). `table` is unused. On Zen 4 `vpermb`, `vpsrlvd` and
/// `vpermps` issue beside the `zmm` FMAs while the `vpmultishiftqb` of the earlier form took
/// an FMA cycle each (docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why).
///
/// # Safety
/// 16 bytes readable at `codes`; the CPU has AVX-512 VBMI.
#[inline]
#[target_feature(enable = "avx512f,avx512vbmi,avx2,fma")]
pub(super) unsafe fn decode_vbmi(codes: *const u8, s: u8, _table: __m512) -> [__m512; 2] {
    // SAFETY: the caller guarantees 16 readable bytes at `codes` (unaligned load); every row
    // of the table is 64 readable, 64-byte aligned bytes; each `SPREAD` row is 64 bytes.
    unsafe {
        let t = _mm512_load_ps(E2M1_SCALED_F32.0[s as usize].as_ptr());
        // Bytes 16.. are never indexed (every `SPREAD` index is < 16).
        let v = _mm512_castsi128_si512(_mm_loadu_si128(codes.cast()));
        let odd_nibble = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
        let half = |h: usize| {
            let idx = _mm512_loadu_si512(SPREAD[h].as_ptr().cast());
            let b = _mm512_srlv_epi32(_mm512_permutexvar_epi8(idx, v), odd_nibble);
            _mm512_permutexvar_ps(b, t)
        };
        [half(0), half(1)]
    }
}

/// Whether the CPU has AVX-512 VBMI (cached by `std`).
#[inline]
pub(super) fn has_vbmi() -> bool {
    is_x86_feature_detected!("avx512vbmi")
}
