//! aarch64 NEON paths. The 16 f64 lanes of the f32/bf16 dot live in eight `float64x2_t`
//! (`acc[k]` = lanes `2k, 2k+1`); the 8 lanes of an MXFP4 group in four. Every update is
//! `vfmaq_f64(acc, w, x)` = `acc + w·x` fused, i.e. the scalar `f64::mul_add`.
//!
//! Kernels take `N` activation rows (`N` tokens against one weight row, each with its own
//! accumulators and the same per-lane operation sequence); activations are `f32` or
//! pre-widened `f64`.

use super::{fused_tail, tree4, WElem, XElem};
use crate::mxfp4::{e8m0_scale, E2M1, GROUP};
use std::arch::aarch64::*;

/// Eight f64x2 vectors: 16 consecutive lanes.
type V16 = [float64x2_t; 8];

/// Four f32 → two f64x2 (lanes 0,1 and 2,3).
#[inline]
#[target_feature(enable = "neon")]
fn widen(v: float32x4_t) -> [float64x2_t; 2] {
    [vcvt_f64_f32(vget_low_f32(v)), vcvt_high_f64_f32(v)]
}

/// Loads of four consecutive elements as two f64x2.
pub(crate) trait Ld4: XElem {
    /// # Safety
    /// 4 elements readable at `p`.
    unsafe fn ld4(p: *const Self) -> [float64x2_t; 2];
}

impl Ld4 for f32 {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn ld4(p: *const f32) -> [float64x2_t; 2] {
        // SAFETY: the caller guarantees 4 readable f32.
        widen(unsafe { vld1q_f32(p) })
    }
}

impl Ld4 for f64 {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn ld4(p: *const f64) -> [float64x2_t; 2] {
        // SAFETY: the caller guarantees 4 readable f64.
        unsafe { [vld1q_f64(p), vld1q_f64(p.add(2))] }
    }
}

/// Loads of sixteen consecutive weights as f64 lanes 0..16.
pub(crate) trait Ld16: WElem {
    /// # Safety
    /// 16 elements readable at `p`.
    unsafe fn ld16(p: *const Self) -> V16;
}

impl Ld16 for f32 {
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn ld16(p: *const f32) -> V16 {
        let mut out = [vdupq_n_f64(0.0); 8];
        for k in 0..4 {
            // SAFETY: `4k + 4 <= 16` f32 are readable at `p` (caller's guarantee).
            let [a, b] = unsafe { f32::ld4(p.add(4 * k)) };
            out[2 * k] = a;
            out[2 * k + 1] = b;
        }
        out
    }
}

impl Ld16 for u16 {
    /// bf16 bits shifted into the high half of a u32 (→ f32, exact), then f64.
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn ld16(p: *const u16) -> V16 {
        let mut out = [vdupq_n_f64(0.0); 8];
        for h in 0..2 {
            // SAFETY: `8h + 8 <= 16` u16 are readable at `p` (caller's guarantee).
            let f = bf16x8(unsafe { vld1q_u16(p.add(8 * h)) });
            for (q, &fq) in f.iter().enumerate() {
                let [a, b] = widen(fq);
                out[4 * h + 2 * q] = a;
                out[4 * h + 2 * q + 1] = b;
            }
        }
        out
    }
}

/// Eight bf16 bits → two f32x4 (each bf16 shifted into the high half of a u32; exact).
#[inline]
#[target_feature(enable = "neon")]
fn bf16x8(v: uint16x8_t) -> [float32x4_t; 2] {
    [
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v))),
        vreinterpretq_f32_u32(vshll_high_n_u16::<16>(v)),
    ]
}

/// The two f64 lanes of a vector.
#[inline]
#[target_feature(enable = "neon")]
fn lanes2(v: float64x2_t) -> [f64; 2] {
    [vgetq_lane_f64::<0>(v), vgetq_lane_f64::<1>(v)]
}

/// The 16-lane tree. Lanes `j` and `j+4` sit in vectors `k` and `k+2` at the same position,
/// so `b01 = (acc0 + acc2) + (acc4 + acc6)` = `[b0, b1]` and `b23` from the odd vectors;
/// then `(b0 + b1) + (b2 + b3)`.
#[inline]
#[target_feature(enable = "neon")]
fn reduce16(a: &V16) -> f64 {
    let b01 = vaddq_f64(vaddq_f64(a[0], a[2]), vaddq_f64(a[4], a[6]));
    let b23 = vaddq_f64(vaddq_f64(a[1], a[3]), vaddq_f64(a[5], a[7]));
    let [b0, b1] = lanes2(b01);
    let [b2, b3] = lanes2(b23);
    tree4([b0, b1, b2, b3])
}

/// 16-lane dots of one weight row with `N` activation rows (see [`crate::dot::dot_f32`]).
#[target_feature(enable = "neon")]
pub(super) fn dot16<W: Ld16, X: Ld4, const N: usize>(w: &[W], xs: [&[X]; N]) -> [f64; N] {
    let n = xs.iter().fold(w.len(), |m, x| m.min(x.len()));
    let full = n / 16 * 16;
    let mut acc = [[vdupq_n_f64(0.0); 8]; N];
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 16 <= full <= n <= w.len()`.
        let wv = unsafe { W::ld16(w.as_ptr().add(i)) };
        for (a, x) in acc.iter_mut().zip(&xs) {
            for k in 0..4 {
                // SAFETY: `i + 4k + 4 <= full <= n <= x.len()`.
                let [x0, x1] = unsafe { X::ld4(x.as_ptr().add(i + 4 * k)) };
                a[2 * k] = vfmaq_f64(a[2 * k], wv[2 * k], x0);
                a[2 * k + 1] = vfmaq_f64(a[2 * k + 1], wv[2 * k + 1], x1);
            }
        }
        i += 16;
    }
    let mut out = [0f64; N];
    for ((o, a), x) in out.iter_mut().zip(acc).zip(&xs) {
        *o = fused_tail(
            reduce16(&a),
            w[full..n].iter().map(|v| v.f32()),
            &x[full..n],
        );
    }
    out
}

/// Byte `k` of the high 16 bits of `E2M1[code]` for every code. Every E2M1 value has zero low
/// 16 bits, so `E2M1[c] == f32::from_bits(((TAB[1][c] << 8 | TAB[0][c]) as u32) << 16)`.
const fn e2m1_bf16_bytes() -> [[u8; 16]; 2] {
    let mut t = [[0u8; 16]; 2];
    let mut c = 0;
    while c < 16 {
        let hi16 = E2M1[c].to_bits() >> 16;
        t[0][c] = (hi16 & 0xFF) as u8;
        t[1][c] = (hi16 >> 8) as u8;
        c += 1;
    }
    t
}

/// See [`e2m1_bf16_bytes`].
pub(crate) const E2M1_BF16_BYTES: [[u8; 16]; 2] = e2m1_bf16_bytes();

/// One 32-group against `N` activation rows: the tree-reduced sub-sums (before the scale).
/// Codes → bf16 bits by two byte-table lookups (exactly `E2M1[code]`), then widened like a
/// bf16 row.
///
/// # Safety
/// `codes` must be readable for 16 bytes and every `x[t]` at `off..off + 32`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn group<X: Ld4, const N: usize>(
    codes: *const u8,
    xs: &[&[X]; N],
    off: usize,
    tlo: uint8x16_t,
    thi: uint8x16_t,
) -> [f64; N] {
    // SAFETY: the caller guarantees 16 readable bytes at `codes`.
    let v = unsafe { vld1q_u8(codes) };
    let lo = vandq_u8(v, vdupq_n_u8(0x0F));
    let hi = vshrq_n_u8::<4>(v);
    // Element order: even element = low nibble.
    let e = [vzip1q_u8(lo, hi), vzip2q_u8(lo, hi)];
    let mut l = [[vdupq_n_f64(0.0); 4]; N];
    for (h, &c) in e.iter().enumerate() {
        let (bl, bh) = (vqtbl1q_u8(tlo, c), vqtbl1q_u8(thi, c));
        // Little endian: (low byte, high byte) pairs form the u16 bf16 bits in element order.
        let halves = [
            vreinterpretq_u16_u8(vzip1q_u8(bl, bh)),
            vreinterpretq_u16_u8(vzip2q_u8(bl, bh)),
        ];
        for (q, &bits) in halves.iter().enumerate() {
            for (r, &wf) in bf16x8(bits).iter().enumerate() {
                let base = off + h * 16 + q * 8 + r * 4;
                let wv = widen(wf);
                for (lt, x) in l.iter_mut().zip(xs) {
                    // SAFETY: `base + 4 <= off + 32`, readable per the caller.
                    let [x0, x1] = unsafe { X::ld4(x.as_ptr().add(base)) };
                    // Elements base..base+4 are lanes 4r..4r+4, i.e. vectors 2r, 2r+1.
                    lt[2 * r] = vfmaq_f64(lt[2 * r], wv[0], x0);
                    lt[2 * r + 1] = vfmaq_f64(lt[2 * r + 1], wv[1], x1);
                }
            }
        }
    }
    // ((s0+s4)+(s1+s5)) + ((s2+s6)+(s3+s7)): l0 + l2 = [s0+s4, s1+s5], l1 + l3 likewise.
    let mut out = [0f64; N];
    for (o, lt) in out.iter_mut().zip(l) {
        let [t0, t1] = lanes2(vaddq_f64(lt[0], lt[2]));
        let [t2, t3] = lanes2(vaddq_f64(lt[1], lt[3]));
        *o = tree4([t0, t1, t2, t3]);
    }
    out
}

/// MXFP4 row dots against `N` activation rows (see [`crate::dot::dot_mxfp4`]).
#[target_feature(enable = "neon")]
pub(super) fn dot_mxfp4<X: Ld4, const N: usize>(
    packed: &[u8],
    scales: &[u8],
    xs: [&[X]; N],
) -> [f64; N] {
    let xl = xs.iter().fold(usize::MAX, |m, x| m.min(x.len()));
    let groups = scales.len().min(packed.len() / 16).min(xl / GROUP);
    // SAFETY: each table row is 16 readable bytes.
    let (tlo, thi) = unsafe {
        (
            vld1q_u8(E2M1_BF16_BYTES[0].as_ptr()),
            vld1q_u8(E2M1_BF16_BYTES[1].as_ptr()),
        )
    };
    let mut acc = [0f64; N];
    for (g, &s) in scales[..groups].iter().enumerate() {
        // SAFETY: `g < groups`, so bytes `16g..16g+16` of `packed` and elements
        // `32g..32g+32` of every `xs[t]` are in bounds.
        let sub = unsafe { group(packed.as_ptr().add(g * 16), &xs, g * GROUP, tlo, thi) };
        let sc = e8m0_scale(s) as f64;
        for (a, sb) in acc.iter_mut().zip(sub) {
            *a += sb * sc;
        }
    }
    acc
}
