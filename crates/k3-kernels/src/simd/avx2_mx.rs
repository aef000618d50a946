//! AVX2 + FMA MXFP4 paths: the decoder, the mat-vec kernel and the GEMM panel decoder.
//!
//! Decode of one 32-group (16 code bytes, scale byte `s`), all in registers:
//! 1. the bytes go to both 128-bit halves; the low half keeps the low nibbles (even
//!    elements), the high half the high nibbles (odd elements);
//! 2. two `vpshufb` byte tables ([`E2M1_BF16_BYTES`]) give the low and high byte of the top
//!    16 bits of `E2M1[code]` (its low 16 bits are zero), interleaved into 16-bit words
//!    (`vpunpck[lh]bw`); each 32-bit lane then holds two words, and `<< 16` / `& 0xFFFF0000`
//!    turn the low / high word into an f32: exactly `E2M1[code]`, `−0` included;
//! 3. one `vmulps` by the broadcast `E8M0[s]`: exactly the scalar `mxfp4::decode`.
//!
//! That leaves every 16-element block in the order [`Q16`] (register position `p` holds block
//! element `Q16[p]`): vector 0 holds positions 0..8 of elements 0..16, vector 1 positions
//! 8..16, vectors 2 and 3 the same of elements 16..32. So vectors 0 and 2 feed the accumulator
//! of register lanes 0..8 and vectors 1 and 3 that of 8..16 — each lane still sees its
//! elements in ascending order, one fused multiply-add each — provided the activation is read
//! in the same order: pre-permuted ([`super::Layout::Q16`]) or permuted per group on the stack
//! (`NAT = true`, single rows only).

use super::avx2::{store16, V16};
use crate::mxfp4::{E2M1_BF16_BYTES, E8M0, GROUP};
use std::arch::x86_64::*;

/// Register position `p` of every 16-element block holds block element `Q16[p]`.
pub(crate) const Q16: [usize; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// Rows per mat-vec call (see [`rows`]).
pub(super) const ROWS: usize = 1;

/// Software prefetch distance in code bytes of each row.
const PREFETCH: usize = 1024;

/// Loop-invariant vectors.
#[derive(Clone, Copy)]
struct Consts {
    tlo: __m256i,
    thi: __m256i,
    nib: __m256i,
    shift: __m256i,
    hi16: __m256i,
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn consts() -> Consts {
    // SAFETY: both sources are 16-byte arrays; unaligned loads.
    let t16 =
        |t: &[u8; 16]| unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr().cast())) };
    Consts {
        tlo: t16(&E2M1_BF16_BYTES[0]),
        thi: t16(&E2M1_BF16_BYTES[1]),
        nib: _mm256_set1_epi8(0x0F),
        shift: _mm256_setr_epi64x(0, 0, 4, 4),
        hi16: _mm256_set1_epi32(0xFFFF_0000u32 as i32),
    }
}

/// The 32 weights of one group in [`Q16`] order (see the module docs).
///
/// # Safety
/// 16 bytes readable at `codes`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode(codes: *const u8, s: u8, k: &Consts) -> [__m256; 4] {
    // SAFETY: the caller guarantees 16 readable bytes; the load is unaligned.
    let v = unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(codes.cast())) };
    let c = _mm256_and_si256(_mm256_srlv_epi64(v, k.shift), k.nib);
    let (tl, th) = (_mm256_shuffle_epi8(k.tlo, c), _mm256_shuffle_epi8(k.thi, c));
    let (w0, w1) = (_mm256_unpacklo_epi8(tl, th), _mm256_unpackhi_epi8(tl, th));
    let sc = _mm256_set1_ps(E8M0[s as usize]);
    let f = |v: __m256i| _mm256_mul_ps(_mm256_castsi256_ps(v), sc);
    [
        f(_mm256_slli_epi32::<16>(w0)),
        f(_mm256_and_si256(w0, k.hi16)),
        f(_mm256_slli_epi32::<16>(w1)),
        f(_mm256_and_si256(w1, k.hi16)),
    ]
}

/// The 16 lanes (register order: [`Q16`]) of `R` MXFP4 rows dotted with `x`, which is
/// pre-permuted ([`super::Layout::Q16`]) unless `NAT`. Every row has `x.len() / 32` groups:
/// `packed[r]` 16 bytes and `scales[r]` one byte per group (checked by the dispatcher; a
/// violation only shortens the loop).
///
/// Each lane is one dependent chain of FMAs (two per group), so a single row is bounded by
/// FMA latency (8 cycles per group on Zen 3); the mat-vec still runs one row per call
/// ([`ROWS`]): two interleaved rows measured slower (the decode needs most of the 16 `ymm`).
#[target_feature(enable = "avx2,fma")]
pub(super) fn rows<const R: usize, const NAT: bool>(
    packed: [&[u8]; R],
    scales: [&[u8]; R],
    x: &[f32],
) -> [[f32; 16]; R] {
    let groups = (0..R).fold(x.len() / GROUP, |m, r| {
        m.min(scales[r].len()).min(packed[r].len() / 16)
    });
    let k = consts();
    let mut acc: [V16; R] = [[_mm256_setzero_ps(); 2]; R];
    let mut xl = [0f32; GROUP];
    for g in 0..groups {
        let xg = &x[GROUP * g..GROUP * (g + 1)];
        let xg = if NAT {
            for (d, s) in xl.chunks_exact_mut(16).zip(xg.chunks_exact(16)) {
                for (o, &q) in d.iter_mut().zip(&Q16) {
                    *o = s[q];
                }
            }
            &xl[..]
        } else {
            xg
        };
        for ((a, p), s) in acc.iter_mut().zip(&packed).zip(&scales) {
            // A hint only: the address may lie past the row (never dereferenced).
            _mm_prefetch::<_MM_HINT_T0>(p.as_ptr().wrapping_add(16 * g + PREFETCH).cast());
            // SAFETY: `g < groups`: byte `g` of `s` and bytes `16g .. 16g+16` of `p` are in
            // bounds; `xg` holds 32 activations.
            unsafe {
                let w = decode(p.as_ptr().add(16 * g), *s.get_unchecked(g), &k);
                for (q, wq) in w.iter().enumerate() {
                    let xv = _mm256_loadu_ps(xg.as_ptr().add(8 * q));
                    a[q % 2] = _mm256_fmadd_ps(*wq, xv, a[q % 2]);
                }
            }
        }
    }
    acc.map(|v| store16(v))
}

/// Decodes every group of one row (`packed` 16 bytes and `scales` one byte per group) into
/// `dst` in [`Q16`] order, 32 f32 per group (`dst.len() >= 32 · groups`, checked by the
/// caller; a violation only shortens the decode).
#[target_feature(enable = "avx2,fma")]
pub(super) fn panel(packed: &[u8], scales: &[u8], dst: &mut [f32]) {
    let groups = scales.len().min(packed.len() / 16).min(dst.len() / GROUP);
    let k = consts();
    for (g, &s) in scales[..groups].iter().enumerate() {
        // SAFETY: `g < groups`: bytes `16g .. 16g+16` of `packed` and f32 `32g .. 32g+32` of
        // `dst` are in bounds.
        unsafe {
            let w = decode(packed.as_ptr().add(16 * g), s, &k);
            let d = dst.as_mut_ptr().add(GROUP * g);
            for (q, v) in w.iter().enumerate() {
                _mm256_storeu_ps(d.add(8 * q), *v);
            }
        }
    }
}
