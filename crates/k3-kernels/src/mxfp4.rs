//! MXFP4 (OCP MX FP4, docs/NUMERICS.md#mxfp4-decode): E2M1 nibbles with one E8M0 scale per
//! 32 elements. Low nibble = EVEN element; scale byte 255 (NaN in the OCP spec) decodes as a
//! zero scale. A weight is `E2M1[code] · 2^(s−127)` computed in f32 ([`decode`]): exact,
//! except that for `s ≥ 253` the largest magnitudes exceed `f32::MAX` and become `±inf`.

/// Elements per E8M0 scale.
pub const GROUP: usize = 32;

/// E2M1 code (bit 3 = sign) → value.
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// E8M0 scale byte → multiplier `2^(s−127)`, built from bits; 255 ⇒ 0, 0 ⇒ 2^-127 (subnormal).
#[inline(always)]
pub fn e8m0_scale(s: u8) -> f32 {
    match s {
        255 => 0.0,
        0 => f32::from_bits(0x0040_0000),
        s => f32::from_bits((s as u32) << 23),
    }
}

/// `e8m0_scale(s)` for every byte (a table the SIMD paths broadcast from).
pub static E8M0: [f32; 256] = e8m0_table();

const fn e8m0_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    t[0] = f32::from_bits(0x0040_0000);
    let mut s = 1;
    while s < 255 {
        t[s] = f32::from_bits((s as u32) << 23);
        s += 1;
    }
    t
}

/// One weight: `E2M1[code & 15] · e8m0_scale(s)`, one f32 multiply. Exact whenever the
/// result is finite (every E2M1 value has ≤ 2 significant bits and the scale is a power of
/// two; results down to `0.5 · 2^-127` are exact subnormals); `±inf` when it exceeds
/// `f32::MAX` (`s = 253`: |E2M1| ∈ {4, 6}; `s = 254`: {2, 3, 4, 6}); `±0` for scale byte 255.
#[inline(always)]
pub fn decode(code: u8, s: u8) -> f32 {
    E2M1[(code & 0x0F) as usize] * E8M0[s as usize]
}

/// Byte `k` (0 = low) of the high 16 bits of `E2M1[code]` for every code. Every E2M1 value
/// has zero low 16 bits, so `E2M1[c] == f32::from_bits(((T[1][c] << 8 | T[0][c]) as u32) << 16)`
/// — the byte tables the SIMD decoders look codes up in.
pub const E2M1_BF16_BYTES: [[u8; 16]; 2] = e2m1_bf16_bytes();

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

/// For every scale byte `s`: bytes `0..16` are the low and bytes `16..32` the high byte of
/// the top 16 bits of [`decode`]`(c, s)` for code `c`. Every decoded weight (exact values,
/// subnormals down to `2^-128`, `±inf`, `±0`) has zero low 16 bits, so
/// `decode(c, s) == f32::from_bits(((T[s][16 + c] as u32) << 8 | T[s][c] as u32) << 16)`: the
/// SIMD decoders look the codes of a group up in its scale's row and need no multiply.
pub static E2M1_SCALED_BYTES: ScaledBytes = ScaledBytes(scaled_bytes());

/// [`E2M1_SCALED_BYTES`]: one 32-byte row per scale byte, 32-byte aligned.
#[repr(C, align(32))]
pub struct ScaledBytes(pub [[u8; 32]; 256]);

const fn scaled_bytes() -> [[u8; 32]; 256] {
    let scale = e8m0_table();
    let mut t = [[0u8; 32]; 256];
    let mut s = 0;
    while s < 256 {
        let mut c = 0;
        while c < 16 {
            let hi16 = (E2M1[c] * scale[s]).to_bits() >> 16;
            t[s][c] = (hi16 & 0xFF) as u8;
            t[s][16 + c] = (hi16 >> 8) as u8;
            c += 1;
        }
        s += 1;
    }
    t
}

/// [`decode`]`(c, s)` for every scale byte `s` and code `c` as f32 (one 64-byte row per
/// scale, 64-byte aligned): the AVX-512 VBMI decoder indexes its scale's row with `vpermps`
/// instead of multiplying the E2M1 table per group (the same multiply, done once here).
pub static E2M1_SCALED_F32: ScaledF32 = ScaledF32(scaled_f32());

/// [`E2M1_SCALED_F32`]: one 16-f32 row per scale byte, 64-byte aligned.
#[repr(C, align(64))]
pub struct ScaledF32(pub [[f32; 16]; 256]);

const fn scaled_f32() -> [[f32; 16]; 256] {
    let scale = e8m0_table();
    let mut t = [[0f32; 16]; 256];
    let mut s = 0;
    while s < 256 {
        let mut c = 0;
        while c < 16 {
            t[s][c] = E2M1[c] * scale[s];
            c += 1;
        }
        s += 1;
    }
    t
}

/// The two codes of one packed byte, in element order (even element from the low nibble).
#[inline(always)]
pub fn unpack(byte: u8) -> (u8, u8) {
    (byte & 0x0F, byte >> 4)
}

/// Dequantises a `[rows][cols]` MXFP4 matrix (`packed` `[rows][cols/2]`, `scales`
/// `[rows][cols/32]`) to f32. For tests and tools; the engine multiplies from packed form.
///
/// Panics if the slice lengths do not match `rows`/`cols` (callers validate shapes first).
pub fn dequantize(packed: &[u8], scales: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(packed.len(), rows * cols / 2, "packed length");
    assert_eq!(scales.len(), rows * cols / GROUP, "scales length");
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let byte = packed[r * cols / 2 + c / 2];
            let code = if c % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            out.push(decode(code, scales[r * cols / GROUP + c / GROUP]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_edges() {
        assert_eq!(e8m0_scale(127), 1.0);
        assert_eq!(e8m0_scale(128), 2.0);
        assert_eq!(e8m0_scale(120), 2f32.powi(-7));
        assert_eq!(e8m0_scale(255), 0.0);
        assert_eq!(e8m0_scale(0), 2f32.powi(-127));
        for s in 0..=255u8 {
            assert_eq!(
                E8M0[s as usize].to_bits(),
                e8m0_scale(s).to_bits(),
                "scale {s}"
            );
        }
    }

    #[test]
    fn decode_is_exact_or_overflows() {
        for s in 0..=255u8 {
            for c in 0..16u8 {
                let want = E2M1[c as usize] as f64 * e8m0_scale(s) as f64;
                let got = decode(c, s);
                if want.abs() > f32::MAX as f64 {
                    assert!(got.is_infinite() && s >= 253, "code {c} scale {s}");
                    assert_eq!(got.is_sign_negative(), c >= 8);
                } else {
                    assert_eq!(got as f64, want, "code {c} scale {s}");
                    assert_eq!(got.is_sign_negative(), c >= 8, "sign of code {c}");
                }
            }
        }
        assert_eq!(decode(8, 127).to_bits(), (-0f32).to_bits());
        assert_eq!(decode(9, 255).to_bits(), (-0f32).to_bits());
    }

    #[test]
    fn bf16_bytes_rebuild_the_table() {
        for (c, &v) in E2M1.iter().enumerate() {
            assert_eq!(v.to_bits() & 0xFFFF, 0);
            let t = E2M1_BF16_BYTES;
            let hi16 = (t[1][c] as u32) << 8 | t[0][c] as u32;
            assert_eq!(f32::from_bits(hi16 << 16).to_bits(), v.to_bits());
        }
    }

    #[test]
    fn scaled_bytes_rebuild_every_decode() {
        for s in 0..=255u8 {
            let row = &E2M1_SCALED_BYTES.0[s as usize];
            for c in 0..16u8 {
                let d = decode(c, s).to_bits();
                assert_eq!(d & 0xFFFF, 0, "code {c} scale {s}");
                let hi16 = (row[16 + c as usize] as u32) << 8 | row[c as usize] as u32;
                assert_eq!(hi16 << 16, d, "code {c} scale {s}");
            }
        }
        assert_eq!(std::mem::align_of::<ScaledBytes>(), 32);
    }

    #[test]
    fn scaled_f32_is_every_decode() {
        for s in 0..=255u8 {
            for c in 0..16u8 {
                let row = &E2M1_SCALED_F32.0[s as usize];
                assert_eq!(row[c as usize].to_bits(), decode(c, s).to_bits(), "{c} {s}");
            }
        }
        assert_eq!(std::mem::align_of::<ScaledF32>(), 64);
    }

    #[test]
    fn low_nibble_is_even_element() {
        // byte 0x71: low nibble 1 (0.5) is element 0, high nibble 7 (6.0) is element 1.
        let packed = [0x71u8; 16];
        let scales = [127u8];
        let v = dequantize(&packed, &scales, 1, 32);
        assert_eq!(v[0], 0.5);
        assert_eq!(v[1], 6.0);
    }
}
