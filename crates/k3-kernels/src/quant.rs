//! Quantizers for the draft trunk (docs/NUMERICS.md#quantizers): f32 (or bf16) rows → Q8
//! (per-row int8 + one f32 scale, [`crate::MatrixData::Q8`]) or MXFP4 (E2M1 codes + one E8M0
//! scale per 32 elements, [`crate::MatrixData::Mxfp4`]). Pure and deterministic: the same
//! input gives the same bytes on every machine (no threads, no randomness, no SIMD).
//!
//! Measured on rows of i.i.d. standard normal values (`quant::tests`, 64 rows × 4096, RMS
//! relative error `sqrt(Σ(x − x̂)² / Σx²)`): Q8 0.87 % (a row's max is ≈ 3.7σ, so the step
//! `max/127` is ≈ 0.029σ and its RMS `step/√12` ≈ 0.0085σ), MXFP4 11.49 % with the OCP
//! exponent rule used here (the "fit" rule gives 11.54 %, see [`quantize_mxfp4_row`]).

use crate::mxfp4::{decode, E8M0, GROUP};
use half::bf16;

/// Why a row could not be quantized.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// `src[index]` (index into the whole source) is NaN or infinite.
    #[error("non-finite value at index {index}")]
    NonFinite { index: usize },
    /// A slice length disagrees with the shape.
    #[error("{what}: expected length {expected}, got {got}")]
    Shape {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

/// `Err(Shape)` unless `got == expected`.
fn shape(what: &'static str, expected: usize, got: usize) -> Result<(), QuantError> {
    if got == expected {
        Ok(())
    } else {
        Err(QuantError::Shape {
            what,
            expected,
            got,
        })
    }
}

/// `max |src[i]|`, or the first non-finite index (offset by `base`).
fn max_abs(src: &[f32], base: usize) -> Result<f32, QuantError> {
    src.iter().enumerate().try_fold(0f32, |m, (i, &v)| {
        if v.is_finite() {
            Ok(m.max(v.abs()))
        } else {
            Err(QuantError::NonFinite { index: base + i })
        }
    })
}

/// Quantizes one row to Q8 and returns its scale.
///
/// `scale = max|src| / 127` (one f32 division); `values[i] = round(src[i] / scale)` (f32
/// division, rounded half away from zero, clamped to `[-127, 127]`; −128 is never used, so
/// the range is symmetric). When `127 · scale` would overflow (`max|src|` within an ulp or
/// so of `f32::MAX`) the scale is stepped down to the largest f32 for which every decode is
/// finite. A row of zeros — or one so tiny that `max|src| / 127` underflows
/// to 0 (`max|src| < 127·2^-150`) — gives scale 0 and zeros. The row decodes as
/// `values[i] as f32 · scale` ([`crate::tmatvec::q8_element`]); `−0` becomes `+0`.
/// If `src[i] = q_i·s` with integers `|q_i| ≤ 127`, `max |q_i| = 127` and `s` of at most 17
/// significant bits, the scale is exactly `s` and the row round-trips bit for bit.
///
/// Errors: `values.len() != src.len()`, or a NaN / infinite element (nothing useful is
/// written then).
pub fn quantize_q8_row(src: &[f32], values: &mut [i8]) -> Result<f32, QuantError> {
    q8_row(src, values, 0)
}

fn q8_row(src: &[f32], values: &mut [i8], base: usize) -> Result<f32, QuantError> {
    shape("q8 values", src.len(), values.len())?;
    let mut scale = max_abs(src, base)? / 127.0;
    if scale == 0.0 {
        values.fill(0);
        return Ok(0.0);
    }
    // Near f32::MAX, `127 · scale` may round to inf: step the scale down until it decodes.
    while (127.0 * scale).is_infinite() {
        scale = f32::from_bits(scale.to_bits() - 1);
    }
    for (q, &v) in values.iter_mut().zip(src) {
        *q = (v / scale).round().clamp(-127.0, 127.0) as i8;
    }
    Ok(scale)
}

/// How the E8M0 exponent of an MXFP4 group is chosen from the group's max magnitude `m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExpRule {
    /// OCP MX v1.0: `e = floor(log2 m) − 2`, so `m / 2^e ∈ [4, 8)`; magnitudes above 6
    /// saturate.
    Ocp,
    /// The smallest `e` with `m / 2^e ≤ 6`: `m / 2^e ∈ (3, 6]`, nothing saturates.
    Fit,
}

/// `floor(log2 m)` of a finite `m > 0` (subnormals included), from the bits.
fn floor_log2(m: f32) -> i32 {
    let b = m.to_bits() & 0x7FFF_FFFF;
    let exp = (b >> 23) as i32;
    if exp != 0 {
        exp - 127
    } else {
        (31 - b.leading_zeros() as i32) - 149
    }
}

/// The E8M0 byte for a group of max magnitude `m > 0` under `rule`, clamped to `0 ..= 254`.
fn group_exponent(m: f32, rule: ExpRule) -> u8 {
    let mut e = floor_log2(m) - 2;
    if rule == ExpRule::Fit && m as f64 > 6.0 * 2f64.powi(e) {
        e += 1;
    }
    (e + 127).clamp(0, 254) as u8
}

/// Midpoints between consecutive E2M1 magnitudes `0, .5, 1, 1.5, 2, 3, 4, 6`.
const MID: [f64; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];

/// The E2M1 code of `v` under scale byte `s`: `|v| / 2^(s−127)` rounded to the nearest E2M1
/// magnitude, ties to the even code (= even mantissa), saturating at the largest magnitude
/// whose decode is finite (6, or less for `s ≥ 253`); bit 3 = the sign of `v` (`−0` kept).
fn e2m1_code(v: f32, s: u8) -> u8 {
    // Exact: an f32 over a power of two, in f64.
    let y = v.abs() as f64 / E8M0[s as usize] as f64;
    let mut code = MID
        .iter()
        .enumerate()
        .filter(|&(k, &t)| y > t || (y == t && (k + 1) % 2 == 0))
        .count() as u8;
    while code > 0 && !decode(code, s).is_finite() {
        code -= 1;
    }
    code | if v.is_sign_negative() { 8 } else { 0 }
}

/// One group of 32: the scale byte, codes into `packed` (16 bytes). Elements are finite.
fn mxfp4_group(src: &[f32], packed: &mut [u8], rule: ExpRule) -> u8 {
    let m = src.iter().fold(0f32, |m, v| m.max(v.abs()));
    // An all-zero group: any scale decodes its ±0 codes exactly; 127 (2^0) is neutral.
    let s = if m == 0.0 {
        127
    } else {
        group_exponent(m, rule)
    };
    for (b, pair) in packed.iter_mut().zip(src.chunks_exact(2)) {
        // Low nibble = even element (`mxfp4::unpack`).
        *b = e2m1_code(pair[0], s) | e2m1_code(pair[1], s) << 4;
    }
    s
}

/// Quantizes one row to MXFP4 in the layout [`crate::mxfp4::decode`] / `dot_mxfp4` read:
/// `packed[j]` low nibble = element `2j`, high nibble = element `2j + 1`; one E8M0 byte per
/// 32 elements.
///
/// Per group of 32 with max magnitude `m`: the exponent is the OCP MX rule
/// `e = floor(log2 m) − 2` (E2M1's largest binade is 2^2), byte `e + 127` clamped to
/// `0 ..= 254`. Each element is `|x| / 2^e` rounded to the nearest E2M1 magnitude (ties to
/// even mantissa), saturating at ±6 (for byte 253/254 at the largest magnitude whose decode
/// is finite), with the sign of `x` (`−0` kept). An all-zero group gets byte 127 and decodes
/// to its zeros exactly.
///
/// Why the OCP rule and not "the smallest `e` with `m / 2^e ≤ 6`" (which never clips): the
/// OCP rule maps `m` into `[4, 8)` and clips the largest elements to 6 when `m / 2^e > 6`,
/// but keeps the finer grid for the other 31 elements whenever it does; on normal data the
/// two are within 0.05 % of each other and OCP is the lower (11.49 % vs 11.54 % RMS relative
/// error, `quant::tests::mxfp4_exponent_rule_choice`), and it is the interchange standard.
/// Every value of the form `E2M1 × 2^k` (a group sharing one `k`) round-trips bit for bit
/// under either rule.
///
/// Errors: `src.len()` not a multiple of 32, `packed.len() != src.len() / 2`,
/// `scales.len() != src.len() / 32`, or a NaN / infinite element.
pub fn quantize_mxfp4_row(
    src: &[f32],
    packed: &mut [u8],
    scales: &mut [u8],
) -> Result<(), QuantError> {
    mxfp4_row(src, packed, scales, 0, ExpRule::Ocp)
}

pub(crate) fn mxfp4_row(
    src: &[f32],
    packed: &mut [u8],
    scales: &mut [u8],
    base: usize,
    rule: ExpRule,
) -> Result<(), QuantError> {
    let n = src.len();
    shape("mxfp4 row (a multiple of 32)", n.next_multiple_of(GROUP), n)?;
    shape("mxfp4 packed", n / 2, packed.len())?;
    shape("mxfp4 scales", n / GROUP, scales.len())?;
    max_abs(src, base)?;
    let groups = src
        .chunks_exact(GROUP)
        .zip(packed.chunks_exact_mut(GROUP / 2));
    for ((g, p), s) in groups.zip(scales.iter_mut()) {
        *s = mxfp4_group(g, p, rule);
    }
    Ok(())
}

/// A source element the row quantizers accept: f32, or bf16 (widened exactly).
pub trait QuantSource: Copy {
    fn widen(self) -> f32;
}

impl QuantSource for f32 {
    #[inline]
    fn widen(self) -> f32 {
        self
    }
}

impl QuantSource for bf16 {
    #[inline]
    fn widen(self) -> f32 {
        crate::widen::bf16_to_f32(self)
    }
}

/// Row `r` of `src` (`[rows][cols]`) widened to f32 into `buf`.
fn widen_row<'b, T: QuantSource>(
    src: &[T],
    r: usize,
    cols: usize,
    buf: &'b mut Vec<f32>,
) -> &'b [f32] {
    buf.clear();
    buf.extend(src[r * cols..(r + 1) * cols].iter().map(|v| v.widen()));
    buf
}

/// [`quantize_q8_row`] over every row of a `[rows][cols]` source: `values` `[rows][cols]`,
/// `scales` `[rows]` — ready for [`crate::Matrix::q8`]. A non-finite index is into `src`.
pub fn quantize_q8_rows<T: QuantSource>(
    src: &[T],
    rows: usize,
    cols: usize,
    values: &mut [i8],
    scales: &mut [f32],
) -> Result<(), QuantError> {
    let n = rows.saturating_mul(cols);
    shape("q8 source", n, src.len())?;
    shape("q8 values", n, values.len())?;
    shape("q8 scales", rows, scales.len())?;
    let mut buf = Vec::with_capacity(cols);
    for (r, s) in scales.iter_mut().enumerate() {
        let row = widen_row(src, r, cols, &mut buf);
        *s = q8_row(row, &mut values[r * cols..(r + 1) * cols], r * cols)?;
    }
    Ok(())
}

/// [`quantize_mxfp4_row`] over every row of a `[rows][cols]` source (`cols % 32 == 0`):
/// `packed` `[rows][cols/2]`, `scales` `[rows][cols/32]` — ready for [`crate::Matrix::mxfp4`].
pub fn quantize_mxfp4_rows<T: QuantSource>(
    src: &[T],
    rows: usize,
    cols: usize,
    packed: &mut [u8],
    scales: &mut [u8],
) -> Result<(), QuantError> {
    let n = rows.saturating_mul(cols);
    shape("mxfp4 source", n, src.len())?;
    shape(
        "mxfp4 columns (a multiple of 32)",
        cols.next_multiple_of(GROUP),
        cols,
    )?;
    shape("mxfp4 packed", n / 2, packed.len())?;
    shape("mxfp4 scales", n / GROUP, scales.len())?;
    let (pc, sc) = (cols / 2, cols / GROUP);
    let mut buf = Vec::with_capacity(cols);
    for r in 0..rows {
        let row = widen_row(src, r, cols, &mut buf);
        let (p, s) = (
            &mut packed[r * pc..(r + 1) * pc],
            &mut scales[r * sc..(r + 1) * sc],
        );
        mxfp4_row(row, p, s, r * cols, ExpRule::Ocp)?;
    }
    Ok(())
}

/// Dequantizes a `[rows][cols]` Q8 matrix to f32 (`values[r][c] as f32 · scales[r]`, the
/// [`crate::tmatvec::q8_element`] of every weight). For tests and tools.
///
/// Panics if the slice lengths do not match `rows`/`cols`.
pub fn dequantize_q8(values: &[i8], scales: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(values.len(), rows * cols, "q8 values length");
    assert_eq!(scales.len(), rows, "q8 scales length");
    let w = values.chunks(cols.max(1)).zip(scales);
    w.flat_map(|(row, &s)| row.iter().map(move |&v| crate::tmatvec::q8_element(v, s)))
        .collect()
}

#[cfg(test)]
mod tests;
