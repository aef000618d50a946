//! aarch64 NEON paths. The 16 f32 lanes of one dot are four `float32x4_t` in natural order
//! (`[k]` = lanes `4k .. 4k+4`); every update is `vfmaq_f32(acc, w, x)` = `acc + w·x` fused,
//! i.e. the scalar `f32::mul_add`. Kernels return the lanes; the caller applies the scalar
//! tree (`dot::reduce16`).
//!
//! bf16: `shll #16` (exact). MXFP4: codes unpacked to element order (`zip` of the low and high
//! nibbles), two `tbl` byte lookups ([`E2M1_BF16_BYTES`]) give the top 16 bits of
//! `E2M1[code]`, `shll #16` makes the f32, and one `fmul` by the broadcast `E8M0[s]` gives
//! exactly the scalar `mxfp4::decode` — natural order.

use crate::mxfp4::{E2M1_BF16_BYTES, E8M0, GROUP};
use std::arch::aarch64::*;

/// Four vectors: 16 consecutive lanes.
type V16 = [float32x4_t; 4];

/// A weight element of a 16-lane row: f32, or bf16 as raw bits.
pub(super) trait Ld16: Copy {
    /// The padding weight of a partial last block (`−0`, see `dot`).
    const PAD: Self;
    /// The activation padding of a partial last block (see `avx2::Ld16::XPAD`).
    const XPAD: f32 = 0.0;
    /// # Safety
    /// 16 elements readable at `p`.
    unsafe fn ld16(p: *const Self) -> V16;
}

impl Ld16 for f32 {
    const PAD: f32 = -0.0;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn ld16(p: *const f32) -> V16 {
        // SAFETY: the caller guarantees 16 readable f32 at `p`.
        unsafe {
            [
                vld1q_f32(p),
                vld1q_f32(p.add(4)),
                vld1q_f32(p.add(8)),
                vld1q_f32(p.add(12)),
            ]
        }
    }
}

impl Ld16 for u16 {
    const PAD: u16 = 0x8000;
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn ld16(p: *const u16) -> V16 {
        // SAFETY: the caller guarantees 16 readable u16 at `p`.
        let (a, b) = unsafe { (vld1q_u16(p), vld1q_u16(p.add(8))) };
        let [a0, a1] = bf16x8(a);
        let [b0, b1] = bf16x8(b);
        [a0, a1, b0, b1]
    }
}

impl Ld16 for i8 {
    const PAD: i8 = 0;
    const XPAD: f32 = -0.0;
    /// int8 → int16 → int32 (`sxtl`) → f32 (`scvtf`): exact.
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn ld16(p: *const i8) -> V16 {
        // SAFETY: the caller guarantees 16 readable bytes at `p`.
        let v = unsafe { vld1q_s8(p) };
        let (lo, hi) = (vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v));
        [
            vmovl_s16(vget_low_s16(lo)),
            vmovl_high_s16(lo),
            vmovl_s16(vget_low_s16(hi)),
            vmovl_high_s16(hi),
        ]
        .map(|v| vcvtq_f32_s32(v))
    }
}

/// Eight bf16 bits → two f32x4 (`bits << 16`, exact).
#[inline]
#[target_feature(enable = "neon")]
fn bf16x8(v: uint16x8_t) -> [float32x4_t; 2] {
    [
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v))),
        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(v)),
    ]
}

/// The 16 lanes of `v`.
#[inline]
#[target_feature(enable = "neon")]
fn store16(v: V16) -> [f32; 16] {
    let mut out = [0f32; 16];
    for (k, &q) in v.iter().enumerate() {
        // SAFETY: `4k + 4 <= 16` f32 of `out` are writable.
        unsafe { vst1q_f32(out.as_mut_ptr().add(4 * k), q) };
    }
    out
}

/// `acc[k] += w[k]·x[k]` for the four vectors.
#[inline]
#[target_feature(enable = "neon")]
fn fma16(acc: &mut V16, w: &V16, x: &V16) {
    for k in 0..4 {
        acc[k] = vfmaq_f32(acc[k], w[k], x[k]);
    }
}

/// Rows per mat-vec call (every storage).
pub(super) const ROWS: usize = 2;

/// The 16 lanes of `R` weight rows dotted with one activation row `x` (see `avx2::rows16`).
#[target_feature(enable = "neon")]
pub(super) fn rows16<W: Ld16, const R: usize>(ws: [&[W]; R], x: &[f32]) -> [[f32; 16]; R] {
    let n = ws.iter().fold(x.len(), |m, w| m.min(w.len()));
    let full = n / 16 * 16;
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 16 <= full <= n <= x.len()`.
        let xv = unsafe { f32::ld16(x.as_ptr().add(i)) };
        for (a, w) in acc.iter_mut().zip(&ws) {
            // SAFETY: `i + 16 <= full <= n <= w.len()`.
            let wv = unsafe { W::ld16(w.as_ptr().add(i)) };
            fma16(a, &wv, &xv);
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
            let wv = unsafe { W::ld16(wb.as_ptr()) };
            fma16(a, &wv, &xv);
        }
    }
    acc.map(|v| store16(v))
}

/// The 32 weights of one group in element order (lanes 0..16 twice).
///
/// # Safety
/// 16 bytes readable at `codes`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn decode(codes: *const u8, s: u8, tlo: uint8x16_t, thi: uint8x16_t) -> [V16; 2] {
    // SAFETY: the caller guarantees 16 readable bytes at `codes`.
    let v = unsafe { vld1q_u8(codes) };
    let lo = vandq_u8(v, vdupq_n_u8(0x0F));
    let hi = vshrq_n_u8::<4>(v);
    let sc = vdupq_n_f32(E8M0[s as usize]);
    // Element order: even element = low nibble.
    [vzip1q_u8(lo, hi), vzip2q_u8(lo, hi)].map(|c| {
        let (bl, bh) = (vqtbl1q_u8(tlo, c), vqtbl1q_u8(thi, c));
        // Little endian: (low byte, high byte) pairs form the u16 in element order.
        let [a0, a1] = bf16x8(vreinterpretq_u16_u8(vzip1q_u8(bl, bh)));
        let [b0, b1] = bf16x8(vreinterpretq_u16_u8(vzip2q_u8(bl, bh)));
        [a0, a1, b0, b1].map(|w| vmulq_f32(w, sc))
    })
}

/// The two byte tables.
#[inline]
#[target_feature(enable = "neon")]
fn tables() -> (uint8x16_t, uint8x16_t) {
    // SAFETY: each table row is 16 readable bytes.
    unsafe {
        (
            vld1q_u8(E2M1_BF16_BYTES[0].as_ptr()),
            vld1q_u8(E2M1_BF16_BYTES[1].as_ptr()),
        )
    }
}

/// The 16 lanes of `R` MXFP4 rows dotted with `x` (natural order; lengths as
/// `avx2_mx::rows`).
#[target_feature(enable = "neon")]
pub(super) fn rows_mx<const R: usize>(
    packed: [&[u8]; R],
    scales: [&[u8]; R],
    x: &[f32],
) -> [[f32; 16]; R] {
    let groups = super::layout::mx_groups(&packed, &scales, x.len());
    let (tlo, thi) = tables();
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    for g in 0..groups {
        // SAFETY: `g < groups`: elements `32g .. 32g+32` of `x` are in bounds.
        let xv = unsafe {
            [
                f32::ld16(x.as_ptr().add(GROUP * g)),
                f32::ld16(x.as_ptr().add(GROUP * g + 16)),
            ]
        };
        for ((a, p), s) in acc.iter_mut().zip(&packed).zip(&scales) {
            // SAFETY: `g < groups`: bytes `16g .. 16g+16` of `p` are in bounds.
            let w = unsafe { decode(p.as_ptr().add(16 * g), s[g], tlo, thi) };
            fma16(a, &w[0], &xv[0]);
            fma16(a, &w[1], &xv[1]);
        }
    }
    acc.map(|v| store16(v))
}

/// Decodes every group of one row into `dst` (natural order; lengths as `avx2_mx::panel`).
#[target_feature(enable = "neon")]
pub(super) fn panel_mx(packed: &[u8], scales: &[u8], dst: &mut [f32]) {
    let groups = scales.len().min(packed.len() / 16).min(dst.len() / GROUP);
    let (tlo, thi) = tables();
    for (g, &s) in scales[..groups].iter().enumerate() {
        // SAFETY: `g < groups`: bytes `16g .. 16g+16` of `packed` and f32 `32g .. 32g+32` of
        // `dst` are in bounds.
        unsafe {
            let w = decode(packed.as_ptr().add(16 * g), s, tlo, thi);
            for (h, wh) in w.iter().enumerate() {
                for (k, &q) in wh.iter().enumerate() {
                    vst1q_f32(dst.as_mut_ptr().add(GROUP * g + 16 * h + 4 * k), q);
                }
            }
        }
    }
}

/// Widens bf16 bits into `dst` (lengths as `avx2::widen_bf16`).
#[target_feature(enable = "neon")]
pub(super) fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    widen(src, dst)
}

/// Widens int8 values into `dst` (lengths as `avx2::widen_bf16`).
#[target_feature(enable = "neon")]
pub(super) fn widen_q8(src: &[i8], dst: &mut [f32]) {
    widen(src, dst)
}

/// [`widen_bf16`] / [`widen_q8`].
#[inline]
#[target_feature(enable = "neon")]
fn widen<W: Ld16>(src: &[W], dst: &mut [f32]) {
    let n = src.len().min(dst.len()) / 16 * 16;
    let mut i = 0;
    while i < n {
        // SAFETY: `i + 16 <= n` elements of both slices are in bounds.
        unsafe {
            let v = W::ld16(src.as_ptr().add(i));
            for (k, &q) in v.iter().enumerate() {
                vst1q_f32(dst.as_mut_ptr().add(i + 4 * k), q);
            }
        }
        i += 16;
    }
}

/// Rows per GEMM microkernel call.
pub(super) const MR: usize = 2;
/// Most tokens per GEMM microkernel call (16 accumulators + 8 weight + 4 activation
/// vectors of 32).
pub(super) const TB: usize = 2;

/// The GEMM microkernel (contract and safety as `avx2::micro`).
///
/// # Safety
/// As `avx2::micro` (NEON is baseline on aarch64).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn micro<const M: usize, const N: usize>(
    w: [*const f32; M],
    x: *const f32,
    xs: usize,
    kc: usize,
    st: *mut f32,
    ss: usize,
    fresh: bool,
    mut pf: super::gemm::plan::Spread<'_>,
    done: Option<super::gemm::plan::Done>,
) {
    // This level leaves its lanes in the state; the GEMM's emit reduces them.
    debug_assert!(done.is_none(), "lanes reduced in the tile on this level");
    let mut acc = [[[vdupq_n_f32(0.0); 4]; N]; M];
    // A fresh state (the first chunk) starts at +0, the lanes' initial value.
    if !fresh {
        for (r, ar) in acc.iter_mut().enumerate() {
            for (t, a) in ar.iter_mut().enumerate() {
                let s = st.wrapping_add(r * ss + 16 * t);
                // SAFETY: 16 readable f32 at `s` (caller).
                *a = unsafe { f32::ld16(s) };
            }
        }
    }
    let mut k = 0;
    while k < kc {
        pf.tick();
        let mut wv = [[vdupq_n_f32(0.0); 4]; M];
        for (v, &wr) in wv.iter_mut().zip(&w) {
            // SAFETY: `k + 16 <= kc` f32 are readable at every `w[r]` and `x[t]` (caller).
            *v = unsafe { f32::ld16(wr.add(k)) };
        }
        for t in 0..N {
            let xt = x.wrapping_add(t * xs);
            // SAFETY: as above.
            let xv = unsafe { f32::ld16(xt.add(k)) };
            for (ar, wr) in acc.iter_mut().zip(&wv) {
                fma16(&mut ar[t], wr, &xv);
            }
        }
        k += 16;
    }
    pf.finish();
    for (r, ar) in acc.iter().enumerate() {
        for (t, a) in ar.iter().enumerate() {
            let s = st.wrapping_add(r * ss + 16 * t);
            for (k, &q) in a.iter().enumerate() {
                // SAFETY: 16 writable f32 at `s`, not aliased (caller).
                unsafe { vst1q_f32(s.add(4 * k), q) };
            }
        }
    }
}
