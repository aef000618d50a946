//! Bulk conversions of the AMX modes (docs/NUMERICS.md#numeric-mode-fast), each equal bit
//! for bit to its scalar definition in [`super::def`]: activation rows cut into bf16 pieces
//! and MXFP4 rows decoded to bf16.

use super::def::{mxfp4_row_bf16, top};
#[cfg(target_arch = "x86_64")]
use crate::mxfp4::{decode, GROUP};

/// `out[p][i]` = piece `p` of `x[i]` ([`super::def::split`]), for `P = out.len()` ≤ 3;
/// `out[p]` may be longer than `x` (the rest is left as it is).
pub(crate) fn split_row(x: &[f32], out: &mut [Vec<u16>]) {
    match out {
        [a] => split1_best(x, a),
        [a, b] => split2_best(x, a, b),
        [a, b, c] => split3_best(x, a, b, c),
        _ => panic!("1 to 3 bf16 pieces"),
    }
}

/// One element's three pieces, branch-free (the loops below vectorise it); the same bits as
/// `def::split::<3>`: non-finite `x` keeps only its first piece.
#[inline(always)]
fn pieces3(x: f32) -> [u16; 3] {
    const HI: u32 = 0xFFFF_0000;
    let finite = x.is_finite();
    let b0 = x.to_bits() & HI;
    let r1 = x - f32::from_bits(b0);
    let b1 = r1.to_bits() & HI;
    let r2 = r1 - f32::from_bits(b1);
    let b2 = r2.to_bits() & HI;
    let keep = if finite { u32::MAX } else { 0 };
    [
        (b0 >> 16) as u16,
        ((b1 & keep) >> 16) as u16,
        ((b2 & keep) >> 16) as u16,
    ]
}

#[inline(always)]
fn split1(x: &[f32], a: &mut [u16]) {
    for (v, o) in x.iter().zip(a.iter_mut()) {
        *o = top(*v);
    }
}

#[inline(always)]
fn split2(x: &[f32], a: &mut [u16], b: &mut [u16]) {
    for ((v, oa), ob) in x.iter().zip(a.iter_mut()).zip(b.iter_mut()) {
        let p = pieces3(*v);
        (*oa, *ob) = (p[0], p[1]);
    }
}

#[inline(always)]
fn split3(x: &[f32], a: &mut [u16], b: &mut [u16], c: &mut [u16]) {
    for (((v, oa), ob), oc) in x
        .iter()
        .zip(a.iter_mut())
        .zip(b.iter_mut())
        .zip(c.iter_mut())
    {
        [*oa, *ob, *oc] = pieces3(*v);
    }
}

crate::simd::per_level! {
    fn split1_best(x: &[f32], a: &mut [u16]) = split1;
}
crate::simd::per_level! {
    fn split2_best(x: &[f32], a: &mut [u16], b: &mut [u16]) = split2;
}
crate::simd::per_level! {
    fn split3_best(x: &[f32], a: &mut [u16], b: &mut [u16], c: &mut [u16]) = split3;
}

/// `top(decode(code, s))` for every scale byte and code: 8 KB, built once.
#[cfg(target_arch = "x86_64")]
fn bf16_table() -> &'static [[u16; 16]; 256] {
    static TABLE: std::sync::OnceLock<Box<[[u16; 16]; 256]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([[0u16; 16]; 256]);
        for (s, row) in t.iter_mut().enumerate() {
            for (c, v) in row.iter_mut().enumerate() {
                *v = top(decode(c as u8, s as u8));
            }
        }
        t
    })
}

/// [`mxfp4_row_bf16`], with AVX-512BW where the CPU has it: per group, each code byte
/// zero-extended to a dword whose low word is its low nibble and high word its high nibble
/// (element order), then one `vpermw` into the scale's row of [`bf16_table`].
pub(crate) fn mxfp4_row_bf16_fast(packed: &[u8], scales: &[u8], out: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bw") && !crate::simd::force_scalar() {
        assert_eq!(out.len(), packed.len() * 2, "mxfp4_row_bf16 lengths");
        assert_eq!(
            packed.len(),
            scales.len() * GROUP / 2,
            "mxfp4_row_bf16 scales"
        );
        // SAFETY: AVX-512BW (and F) detected; the lengths were checked for every group.
        unsafe { avx512::row(packed, scales, out, bf16_table()) };
        return;
    }
    mxfp4_row_bf16(packed, scales, out);
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::GROUP;
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512F/BW; `packed.len() == scales.len() · 16`, `out.len() == packed.len() · 2`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn row(
        packed: &[u8],
        scales: &[u8],
        out: &mut [u16],
        table: &[[u16; 16]; 256],
    ) {
        let low = _mm512_set1_epi32(0x0F);
        for (g, &s) in scales.iter().enumerate() {
            let bytes = _mm_loadu_si128(packed.as_ptr().add(g * GROUP / 2) as *const __m128i);
            let d = _mm512_cvtepu8_epi32(bytes);
            let idx = _mm512_or_si512(
                _mm512_and_si512(d, low),
                _mm512_slli_epi32::<16>(_mm512_srli_epi32::<4>(d)),
            );
            let t = _mm512_castsi256_si512(_mm256_loadu_si256(
                table[s as usize].as_ptr() as *const __m256i
            ));
            let w = _mm512_permutexvar_epi16(idx, t);
            _mm512_storeu_si512(out.as_mut_ptr().add(g * GROUP) as *mut __m512i, w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::def::split;

    #[test]
    fn the_bulk_split_equals_the_definition() {
        let specials = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            -3.5e-39,
        ];
        let mut x: Vec<f32> = (0..5000u32)
            .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761)))
            .collect();
        x.extend(specials);
        for p in 1..=3 {
            let mut out = vec![vec![0u16; x.len()]; p];
            split_row(&x, &mut out);
            for (i, &v) in x.iter().enumerate() {
                let want = split::<3>(v);
                for (q, o) in out.iter().enumerate() {
                    assert_eq!(
                        o[i],
                        want[q],
                        "x {v:e} ({:#x}) piece {q} of {p}",
                        v.to_bits()
                    );
                }
            }
        }
    }

    #[test]
    fn the_simd_mxfp4_decode_equals_the_definition() {
        // Every code byte under every scale byte: 256 groups of 16 bytes cover 256 × 256.
        let packed: Vec<u8> = (0..256 * 16 * 16).map(|i| (i % 256) as u8).collect();
        let scales: Vec<u8> = (0..256 * 16).map(|g| (g / 16) as u8).collect();
        let (mut fast, mut def) = (vec![0u16; packed.len() * 2], vec![1u16; packed.len() * 2]);
        mxfp4_row_bf16_fast(&packed, &scales, &mut fast);
        mxfp4_row_bf16(&packed, &scales, &mut def);
        assert_eq!(fast, def);
    }
}
