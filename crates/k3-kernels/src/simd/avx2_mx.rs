//! AVX2 + FMA MXFP4 mat-vec kernel: four weight rows against one activation vector that was
//! widened to f64 once per mat-vec in the *pair-swapped* layout [`PERM8`].
//!
//! Per 32-group the scalar definition keeps 8 f64 lanes, element `e` → lane `e % 8`. Here the
//! lanes of one row live in two `ymm`: `A = [l0, l2, l1, l3]`, `B = [l4, l6, l5, l7]`. Pass
//! `p` (elements `8p .. 8p+8`, code bytes `4p .. 4p+4`) updates `A` with elements
//! `8p + [0, 2, 1, 3]` and `B` with `8p + [4, 6, 5, 7]` — exactly the activation layout — so
//! every lane sees its four elements in ascending order, each by one fused multiply-add.
//!
//! Codes become weights without any float conversion: every `(f64)E2M1[c]` has zero low 48
//! bits, so two 16-entry byte tables (`vpshufb`) give its top two bytes and one more `vpshufb`
//! places them in the top of a zeroed 64-bit lane. With the low nibbles in the low 128-bit
//! half and the high nibbles in the high half, one in-lane shuffle yields `[lo(b), lo(b+1),
//! hi(b), hi(b+1)]` = elements `[2b, 2b+2, 2b+1, 2b+3]`, the `A`/`B` order above.
//!
//! Tree: `A + B = [l0+l4, l2+l6, l1+l5, l3+l7]`; low half + high half gives
//! `[(l0+l4)+(l1+l5), (l2+l6)+(l3+l7)]`, and their sum is the scalar `sub` (same operands,
//! same pairings; only `a + b == b + a` commutations). The four rows' trees are evaluated
//! together in vectors and `acc += sub * scale` (multiply, then add) runs lane-wise on a
//! vector holding the four rows' accumulators, groups ascending.

use crate::mxfp4::E2M1;
use std::arch::x86_64::*;

/// Rows per call.
pub(crate) const ROWS: usize = 4;

/// Software prefetch distance in code bytes of each row (the rows are four separate streams).
const PREFETCH: usize = 768;

/// Layout position `k` of every 8-element block of the activation holds element `PERM8[k]`
/// of that block (self-inverse).
pub(crate) const PERM8: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

/// `[low byte, high byte]` of the top 16 bits of `(f64)E2M1[c]`, indexed by code `c`.
const fn e2m1_top_bytes() -> [[u8; 16]; 2] {
    let mut t = [[0u8; 16]; 2];
    let mut c = 0;
    while c < 16 {
        let top = (E2M1[c] as f64).to_bits() >> 48;
        t[0][c] = (top & 0xFF) as u8;
        t[1][c] = (top >> 8) as u8;
        c += 1;
    }
    t
}

/// See [`e2m1_top_bytes`].
pub(crate) const E2M1_TOP: [[u8; 16]; 2] = e2m1_top_bytes();

/// `(f64)e8m0_scale(s)` for every byte: `2^(s-127)` (normal in f64 even for `s = 0`), `0`
/// for 255.
const fn e8m0_f64_table() -> [f64; 256] {
    let mut t = [0f64; 256];
    let mut s = 0;
    while s < 255 {
        t[s] = f64::from_bits((s as u64 + 1023 - 127) << 52);
        s += 1;
    }
    t
}

/// See [`e8m0_f64_table`].
pub(crate) static E8M0_F64: [f64; 256] = e8m0_f64_table();

/// Shuffle controls placing u16 `2j` and `2j+1` of each 128-bit half in the top two bytes of
/// that half's two 64-bit lanes (every other byte zeroed).
const fn place_ctrl(j: u8) -> [u8; 32] {
    let mut c = [0x80u8; 32];
    let mut h = 0;
    while h < 2 {
        c[16 * h + 6] = 4 * j;
        c[16 * h + 7] = 4 * j + 1;
        c[16 * h + 14] = 4 * j + 2;
        c[16 * h + 15] = 4 * j + 3;
        h += 1;
    }
    c
}

const PLACE: [[u8; 32]; 4] = [place_ctrl(0), place_ctrl(1), place_ctrl(2), place_ctrl(3)];

/// Loop-invariant vectors.
#[derive(Clone, Copy)]
struct Consts {
    tlo: __m256i,
    thi: __m256i,
    nib: __m256i,
    shift: __m256i,
    place: [__m256i; 4],
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn consts() -> Consts {
    // SAFETY: every source is a 16- or 32-byte array; the loads are unaligned.
    unsafe {
        let t16 = |t: &[u8; 16]| _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr().cast()));
        let c32 = |c: &[u8; 32]| _mm256_loadu_si256(c.as_ptr().cast());
        Consts {
            tlo: t16(&E2M1_TOP[0]),
            thi: t16(&E2M1_TOP[1]),
            nib: _mm256_set1_epi8(0x0F),
            shift: _mm256_setr_epi64x(0, 0, 4, 4),
            place: [
                c32(&PLACE[0]),
                c32(&PLACE[1]),
                c32(&PLACE[2]),
                c32(&PLACE[3]),
            ],
        }
    }
}

/// The 32 weights of one group as `(f64)E2M1[code]`, in pass order `[A0, B0, A1, B1, ..]`.
///
/// # Safety
/// 16 bytes readable at `codes`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode(codes: *const u8, k: &Consts) -> [__m256d; 8] {
    // SAFETY: the caller guarantees 16 readable bytes; the load is unaligned.
    let v = unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(codes.cast())) };
    // Low half: low nibbles (even elements); high half: high nibbles (odd elements).
    let c = _mm256_and_si256(_mm256_srlv_epi64(v, k.shift), k.nib);
    let (tl, th) = (_mm256_shuffle_epi8(k.tlo, c), _mm256_shuffle_epi8(k.thi, c));
    // u16 top bits per code: bytes 0..8 of the group, then bytes 8..16.
    let s = [_mm256_unpacklo_epi8(tl, th), _mm256_unpackhi_epi8(tl, th)];
    let mut w = [_mm256_setzero_pd(); 8];
    for (i, wi) in w.iter_mut().enumerate() {
        *wi = _mm256_castsi256_pd(_mm256_shuffle_epi8(s[i / 4], k.place[i % 4]));
    }
    w
}

/// `[sub_0, sub_2, sub_1, sub_3]` of the four rows' lane pairs `a[r] = [A, B]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce4(a: &[[__m256d; 2]; ROWS]) -> __m256d {
    // t[r] = [l0+l4, l2+l6, l1+l5, l3+l7] of row r.
    let t = a.map(|ar| _mm256_add_pd(ar[0], ar[1]));
    // u01 = [(l0+l4)+(l1+l5), (l2+l6)+(l3+l7)] of row 0, then of row 1; u23 likewise.
    let u01 = _mm256_add_pd(
        _mm256_permute2f128_pd::<0x20>(t[0], t[1]),
        _mm256_permute2f128_pd::<0x31>(t[0], t[1]),
    );
    let u23 = _mm256_add_pd(
        _mm256_permute2f128_pd::<0x20>(t[2], t[3]),
        _mm256_permute2f128_pd::<0x31>(t[2], t[3]),
    );
    _mm256_add_pd(_mm256_unpacklo_pd(u01, u23), _mm256_unpackhi_pd(u01, u23))
}

/// Dots of four MXFP4 rows with `x` in the [`PERM8`] layout. Every row has `x.len() / 32`
/// groups: `packed[r]` holds 16 bytes and `scales[r]` one byte per group (checked by the
/// dispatcher; violating it only shortens the loop).
#[target_feature(enable = "avx2,fma")]
pub(super) fn dot_rows(packed: [&[u8]; ROWS], scales: [&[u8]; ROWS], x: &[f64]) -> [f64; ROWS] {
    let groups = (0..ROWS).fold(x.len() / 32, |m, r| {
        m.min(scales[r].len()).min(packed[r].len() / 16)
    });
    let k = consts();
    // Lane order of `acc` (and of `reduce4`): rows 0, 2, 1, 3.
    let mut acc = _mm256_setzero_pd();
    for g in 0..groups {
        // SAFETY: `g < groups`: elements `32g .. 32g+32` of `x` are in bounds.
        let xg = unsafe { x.as_ptr().add(32 * g) };
        let mut a = [[_mm256_setzero_pd(); 2]; ROWS];
        for (ar, p) in a.iter_mut().zip(&packed) {
            // A hint only: the address may lie past the row (never dereferenced).
            _mm_prefetch::<_MM_HINT_T0>(p.as_ptr().wrapping_add(16 * g + PREFETCH).cast());
            // SAFETY: `g < groups`: bytes `16g .. 16g+16` of `p` are in bounds.
            let w = unsafe { decode(p.as_ptr().add(16 * g), &k) };
            for (i, wi) in w.iter().enumerate() {
                // SAFETY: `4i + 4 <= 32`: inside this group's elements.
                let xv = unsafe { _mm256_loadu_pd(xg.add(4 * i)) };
                ar[i % 2] = _mm256_fmadd_pd(*wi, xv, ar[i % 2]);
            }
        }
        let sc = _mm256_setr_pd(
            E8M0_F64[scales[0][g] as usize],
            E8M0_F64[scales[2][g] as usize],
            E8M0_F64[scales[1][g] as usize],
            E8M0_F64[scales[3][g] as usize],
        );
        acc = _mm256_add_pd(acc, _mm256_mul_pd(reduce4(&a), sc));
    }
    let mut out = [0f64; ROWS];
    // SAFETY: `out` has room for four f64; the store is unaligned.
    unsafe { _mm256_storeu_pd(out.as_mut_ptr(), acc) };
    [out[0], out[2], out[1], out[3]]
}
