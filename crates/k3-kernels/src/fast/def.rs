//! The scalar definition of the AMX numeric modes (docs/NUMERICS.md#numeric-mode-fast). Every
//! output of the tile GEMM equals [`dot`] (bf16 weights) or [`dot_mxfp4`] bit for bit.
//!
//! For a weight row `w` (bf16) and an activation row `x` (f32) with `P` pieces:
//! 1. `x` is zero-padded to a multiple of 32 columns and each element is cut into `P` bf16
//!    pieces ([`split`]); `w` is zero-padded the same way.
//! 2. The accumulator `c` starts at `+0`. For every block of 32 columns, in ascending order,
//!    and for every piece `p = 0 .. P` in turn, `c = instr(c, w[block], x_p[block])`: one
//!    `TDPBF16PS` on this output ([`instr`], the instruction's documented arithmetic).
//! 3. The result is `c`.

use crate::mxfp4::{decode, unpack, GROUP};

/// Columns per tile instruction (16 bf16 pairs).
pub const BLOCK: usize = 32;

/// A bf16 (its bits) as f32: exact.
#[inline(always)]
pub fn wide(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// A subnormal becomes a zero of its sign (the instruction's DAZ on inputs, FTZ on results).
#[inline(always)]
pub fn flush(v: f32) -> f32 {
    if v.is_subnormal() {
        0.0f32.copysign(v)
    } else {
        v
    }
}

/// The top half of `v`'s bits: `v` truncated to bf16 (exact where `v` has ≤ 8 significant
/// bits; never rounds up, so never overflows to inf).
#[inline(always)]
pub(crate) fn top(v: f32) -> u16 {
    (v.to_bits() >> 16) as u16
}

/// `x` cut into `P` bf16 pieces by truncation: `p_0 = top(x)`, `p_k = top(x − p_0 − … −
/// p_{k−1})` (every difference exact). For finite `x` whose pieces stay normal, `P = 3`
/// gives `x` exactly (3 × 8 significant bits); `P < 3` drops the lowest bits. An inf or NaN
/// `x` is its own first piece, the others `+0`.
#[inline]
pub fn split<const P: usize>(x: f32) -> [u16; P] {
    let mut out = [0u16; P];
    if !x.is_finite() {
        out[0] = top(x);
        return out;
    }
    let mut rest = x;
    for piece in out.iter_mut() {
        *piece = top(rest);
        rest -= wide(*piece);
    }
    out
}

/// How one `TDPBF16PS` could combine an output's 32 products with its accumulator; the
/// probe (`examples/amx_semantics.rs`) tells which one the hardware does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arith {
    /// Intel SDM: even elements and odd elements each in their own f32 FMA chain from `+0`
    /// (pairs ascending), then `c + (even + odd)`; DAZ on inputs, FTZ on every result.
    Sdm,
    /// One FMA chain from `c`: element `2k`, then `2k + 1`, pairs ascending.
    EvenFirst,
    /// One FMA chain from `c`: element `2k + 1`, then `2k` (what AVX512_BF16's `vdpbf16ps`
    /// does on Zen 4, docs/NUMERICS.md#avx512_bf16-and-amx).
    OddFirst,
    /// `c` plus all 32 products, rounded once (summed in f64: exact for operands of
    /// overlapping range).
    Fused,
}

/// Every [`Arith`], for the probe.
pub const ARITHS: [Arith; 4] = [Arith::Sdm, Arith::EvenFirst, Arith::OddFirst, Arith::Fused];

/// The arithmetic this definition uses: the one the probe matched on an AMX machine
/// (docs/NUMERICS.md#numeric-mode-fast).
pub const ARITH: Arith = Arith::Sdm;

/// One `TDPBF16PS` on one output: `c` and the 32 products `a[i] · b[i]` combined by `arith`.
pub fn instr(arith: Arith, c: f32, a: &[u16; BLOCK], b: &[u16; BLOCK]) -> f32 {
    let a: [f32; BLOCK] = std::array::from_fn(|i| flush(wide(a[i])));
    let b: [f32; BLOCK] = std::array::from_fn(|i| flush(wide(b[i])));
    instr_wide(arith, c, &a, &b)
}

/// [`instr`] on operands already widened and flushed (`flush(wide(·))`, idempotent): what the
/// emulated tiles call, converting each tile element once instead of once per output.
#[inline]
pub(crate) fn instr_wide(arith: Arith, c: f32, a: &[f32; BLOCK], b: &[f32; BLOCK]) -> f32 {
    // One fused multiply-add of the instruction: inputs DAZ (done), result FTZ.
    let fma = |x: f32, y: f32, acc: f32| flush(x.mul_add(y, acc));
    let c = flush(c);
    match arith {
        Arith::Sdm => {
            let (mut even, mut odd) = (0.0f32, 0.0f32);
            for k in 0..BLOCK / 2 {
                even = fma(a[2 * k], b[2 * k], even);
                odd = fma(a[2 * k + 1], b[2 * k + 1], odd);
            }
            flush(c + flush(even + odd))
        }
        Arith::EvenFirst | Arith::OddFirst => {
            let first = usize::from(arith == Arith::OddFirst);
            let mut acc = c;
            for k in 0..BLOCK / 2 {
                acc = fma(a[2 * k + first], b[2 * k + first], acc);
                acc = fma(a[2 * k + 1 - first], b[2 * k + 1 - first], acc);
            }
            acc
        }
        Arith::Fused => {
            let sum = (0..BLOCK).fold(c as f64, |s, i| s + a[i] as f64 * b[i] as f64);
            flush(sum as f32)
        }
    }
}

/// One output with `P` pieces: the definition above, for a bf16 weight row `w` (bits) and an
/// f32 activation row `x` of the same length. An empty row gives `+0`.
pub fn dot<const P: usize>(w: &[u16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "fast::def::dot lengths");
    let mut c = 0.0f32;
    for (wb, xb) in w.chunks(BLOCK).zip(x.chunks(BLOCK)) {
        let mut a = [0u16; BLOCK];
        a[..wb.len()].copy_from_slice(wb);
        let mut pieces = [[0u16; BLOCK]; P];
        for (i, &v) in xb.iter().enumerate() {
            for (p, bits) in split::<P>(v).into_iter().enumerate() {
                pieces[p][i] = bits;
            }
        }
        for b in &pieces {
            c = instr(ARITH, c, &a, b);
        }
    }
    c
}

/// An MXFP4 row as bf16 bits: every decoded weight `E2M1 · 2^(s−127)` has ≤ 2 significant
/// bits, so its f32 value's top half is exact (subnormals down to 2^-128 and ±inf included).
pub fn mxfp4_row_bf16(packed: &[u8], scales: &[u8], out: &mut [u16]) {
    assert_eq!(out.len(), packed.len() * 2, "mxfp4_row_bf16 lengths");
    for (g, (codes, &s)) in packed.chunks(GROUP / 2).zip(scales).enumerate() {
        for (j, &byte) in codes.iter().enumerate() {
            let (lo, hi) = unpack(byte);
            out[g * GROUP + 2 * j] = top(decode(lo, s));
            out[g * GROUP + 2 * j + 1] = top(decode(hi, s));
        }
    }
}

/// [`dot`] of an MXFP4 row: the row as bf16 ([`mxfp4_row_bf16`]), then the bf16 definition.
pub fn dot_mxfp4<const P: usize>(packed: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    let mut w = vec![0u16; packed.len() * 2];
    mxfp4_row_bf16(packed, scales, &mut w);
    dot::<P>(&w, x)
}
