//! AVX2 + FMA MXFP4 paths: the decoder, the mat-vec kernel and the GEMM panel decoder.
//!
//! Decode of one 32-group (16 code bytes, scale byte `s`), all in registers and without a
//! multiply:
//! 1. the bytes go to both 128-bit halves; the low half keeps the low nibbles (even
//!    elements), the high half the high nibbles (odd elements);
//! 2. two `vpshufb` on the scale's row of [`E2M1_SCALED_BYTES`] give the low and high byte of
//!    the top 16 bits of `decode(code, s)` (its low 16 bits are zero), interleaved into
//!    16-bit words (`vpunpck[lh]bw`); each 32-bit lane then holds two words, and `<< 16` /
//!    `& 0xFFFF0000` turn the low / high word into an f32: exactly the scalar
//!    `mxfp4::decode`, `−0`, subnormals and `±inf` included.
//!
//! That leaves every 16-element block in the order [`Q16`] (register position `p` holds block
//! element `Q16[p]`): vector 0 holds positions 0..8 of elements 0..16, vector 1 positions
//! 8..16, vectors 2 and 3 the same of elements 16..32. So vectors 0 and 2 feed the accumulator
//! of register lanes 0..8 and vectors 1 and 3 that of 8..16 — each lane still sees its
//! elements in ascending order, one fused multiply-add each — provided the activation is read
//! in the same order: pre-permuted ([`super::Layout::Q16`]) or permuted per group on the stack
//! (`NAT = true`, single rows only).

use super::avx2::{store16, V16};
use crate::mxfp4::{E2M1_SCALED_BYTES, GROUP};
use std::arch::x86_64::*;

/// Register position `p` of every 16-element block holds block element `Q16[p]`.
pub(crate) const Q16: [usize; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// Rows per mat-vec call (see [`rows`]).
pub(super) const ROWS: usize = 2;

/// Software prefetch distance in code bytes of each row.
const PREFETCH: usize = 1024;

/// Loop-invariant vectors.
#[derive(Clone, Copy)]
struct Consts {
    nib: __m256i,
    shift: __m256i,
    hi16: __m256i,
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn consts() -> Consts {
    Consts {
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
    let t = E2M1_SCALED_BYTES.0[s as usize].as_ptr();
    // SAFETY: the caller guarantees 16 readable bytes at `codes`; `t` is a 32-byte row of the
    // table (bytes `0..16` and `16..32` in bounds). Unaligned loads.
    let (v, tlo, thi) = unsafe {
        (
            _mm256_broadcastsi128_si256(_mm_loadu_si128(codes.cast())),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(t.cast())),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(t.add(16).cast())),
        )
    };
    let c = _mm256_and_si256(_mm256_srlv_epi64(v, k.shift), k.nib);
    let (tl, th) = (_mm256_shuffle_epi8(tlo, c), _mm256_shuffle_epi8(thi, c));
    let (w0, w1) = (_mm256_unpacklo_epi8(tl, th), _mm256_unpackhi_epi8(tl, th));
    let f = _mm256_castsi256_ps;
    [
        f(_mm256_slli_epi32::<16>(w0)),
        f(_mm256_and_si256(w0, k.hi16)),
        f(_mm256_slli_epi32::<16>(w1)),
        f(_mm256_and_si256(w1, k.hi16)),
    ]
}

/// A prefetch hint `ahead` bytes past `at` in a row of `len` bytes: past the row's end it
/// points into the same row of the next block of `r` rows (the rows of a matrix are
/// contiguous), so a block's rows are fetched before it starts. Never dereferenced.
#[inline(always)]
fn hint(p: *const u8, at: usize, ahead: usize, len: usize, r: usize) -> *const i8 {
    let off = at + ahead;
    let skip = if off < len { 0 } else { (r - 1) * len };
    p.wrapping_add(off + skip).cast()
}

/// The 16 lanes (register order: [`Q16`]) of `R` MXFP4 rows dotted with `x`, which is
/// pre-permuted ([`super::Layout::Q16`]) unless `NAT`. Every row has `x.len() / 32` groups:
/// `packed[r]` 16 bytes and `scales[r]` one byte per group (checked by the dispatcher; a
/// violation only shortens the loop).
///
/// Each lane is one dependent chain of FMAs (two per group, 8 cycles of latency on Zen 3),
/// so the mat-vec runs [`ROWS`] = 2 rows per call: their chains are independent and
/// overlap, while each row's lanes keep the contract's order. Two rows, 4 accumulators, 4
/// activation vectors and the decode fit the 16 `ymm`; 4 rows spill accumulators and
/// measured no faster, 1 row is latency-bound (~25 % slower).
#[target_feature(enable = "avx2,fma")]
pub(super) fn rows<const R: usize, const NAT: bool>(
    packed: [&[u8]; R],
    scales: [&[u8]; R],
    x: &[f32],
) -> [[f32; 16]; R] {
    let groups = super::layout::mx_groups(&packed, &scales, x.len());
    let k = consts();
    let mut acc: [V16; R] = [[_mm256_setzero_ps(); 2]; R];
    for g in 0..groups {
        for p in &packed {
            _mm_prefetch::<_MM_HINT_T0>(hint(p.as_ptr(), 16 * g, PREFETCH, 16 * groups, R));
        }
        // SAFETY: `g < groups` (the bound of every row and of `x`).
        unsafe { group::<R, NAT>(&mut acc, &packed, &scales, x, g, &k) };
    }
    acc.map(|v| store16(v))
}

/// Adds group `g` of every row to its lanes (see [`rows`]).
///
/// # Safety
/// Every row has more than `g` groups (`16g + 16` code bytes, `g + 1` scale bytes) and
/// `x.len() >= 32 (g + 1)`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn group<const R: usize, const NAT: bool>(
    acc: &mut [V16; R],
    packed: &[&[u8]; R],
    scales: &[&[u8]; R],
    x: &[f32],
    g: usize,
    k: &Consts,
) {
    let mut xl = [0f32; GROUP];
    // SAFETY: `32g + 32 <= x.len()` (caller).
    let xg = unsafe { x.get_unchecked(GROUP * g..GROUP * (g + 1)) };
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
    for ((a, p), s) in acc.iter_mut().zip(packed).zip(scales) {
        // SAFETY: byte `g` of `s` and bytes `16g .. 16g+16` of `p` are in bounds (caller);
        // `xg` holds 32 activations.
        unsafe {
            let w = decode(p.as_ptr().add(16 * g), *s.get_unchecked(g), k);
            for (q, wq) in w.iter().enumerate() {
                let xv = _mm256_loadu_ps(xg.as_ptr().add(8 * q));
                a[q % 2] = _mm256_fmadd_ps(*wq, xv, a[q % 2]);
            }
        }
    }
}

/// Decodes every group of one row (`packed` 16 bytes and `scales` one byte per group) into
/// `dst`, one GEMM panel chunk of `n = dst.len() = 32 · groups` f32, in [`Q16`] order and the
/// chunk's halves order (`super::avx2::widen`): vectors 0 and 2 of group `g` (register
/// positions 0..8 of its two 16-element steps) at `dst[16g ..]`, vectors 1 and 3 at
/// `dst[n/2 + 16g ..]`. (`dst.len() != 32 · scales.len()` or too few code bytes only shorten
/// the decode.)
#[target_feature(enable = "avx2,fma")]
pub(super) fn panel(packed: &[u8], scales: &[u8], dst: &mut [f32]) {
    let groups = scales.len().min(packed.len() / 16).min(dst.len() / GROUP);
    let half = groups * GROUP / 2;
    let k = consts();
    for (g, &s) in scales[..groups].iter().enumerate() {
        // SAFETY: `g < groups`: bytes `16g .. 16g+16` of `packed` and f32 `16g .. 16g+16`
        // and `half + 16g .. half + 16g + 16` of `dst` (`2·half <= dst.len()`) are in bounds.
        unsafe {
            let w = decode(packed.as_ptr().add(16 * g), s, &k);
            let d = dst.as_mut_ptr().add(16 * g);
            for (q, v) in w.iter().enumerate() {
                _mm256_storeu_ps(d.add((q % 2) * half + 8 * (q / 2)), *v);
            }
        }
    }
}

/// Most tokens of the fused GEMM tile ([`fused`]).
pub(super) const FUSED_TB: usize = 4;

/// The small-T MXFP4 GEMM tile: one weight row's groups decoded in registers (no f32 panel)
/// and added to the lanes of `N ≤ 4` tokens: token `t`'s activations (in [`Q16`] layout, the
/// steps in order: not the panel's halves order) at `x + t·xs`, its 16 lanes at `st + 16t`.
/// Each lane takes its elements in the order of the mat-vec ([`group`]): `w[0]`, `w[2]` into
/// lanes 0..8 of the register order, `w[1]`, `w[3]` into 8..16, one FMA each — so the bits
/// of the panel path and of the mat-vec.
///
/// # Safety
/// The CPU has AVX2 and FMA; `packed` has `16 · groups` and `scales` `groups` bytes (checked:
/// a violation only shortens the loop); `32 · groups` f32 are readable at every `x + t·xs`;
/// 16 f32 readable and writable at every `st + 16t`, overlapping no input.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn fused<const N: usize>(
    packed: &[u8],
    scales: &[u8],
    x: *const f32,
    xs: usize,
    st: *mut f32,
    fresh: bool,
) {
    let groups = scales.len().min(packed.len() / 16);
    let k = consts();
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    // A fresh state (the first chunk) starts at +0, the lanes' initial value.
    if !fresh {
        for (t, a) in acc.iter_mut().enumerate() {
            // SAFETY: 16 readable f32 at `st + 16t` (caller).
            unsafe {
                *a = [
                    _mm256_loadu_ps(st.add(16 * t)),
                    _mm256_loadu_ps(st.add(16 * t + 8)),
                ]
            };
        }
    }
    for (g, &s) in scales[..groups].iter().enumerate() {
        // SAFETY: `g < groups`: 16 code bytes at `16g` (checked above).
        let w = unsafe { decode(packed.as_ptr().add(16 * g), s, &k) };
        for (t, a) in acc.iter_mut().enumerate() {
            let xt = x.wrapping_add(t * xs + GROUP * g);
            for (q, wq) in w.iter().enumerate() {
                // SAFETY: `32g + 32 <= 32 · groups` f32 readable at `x + t·xs` (caller).
                let xv = unsafe { _mm256_loadu_ps(xt.add(8 * q)) };
                a[q % 2] = _mm256_fmadd_ps(*wq, xv, a[q % 2]);
            }
        }
    }
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: 16 writable f32 at `st + 16t`, not aliased (caller).
        unsafe {
            _mm256_storeu_ps(st.add(16 * t), a[0]);
            _mm256_storeu_ps(st.add(16 * t + 8), a[1]);
        }
    }
}
