//! MXFP4 (OCP MX FP4, spec §3): E2M1 nibbles with one E8M0 scale per 32 elements.
//! Low nibble = EVEN element; scale byte 255 (NaN in the OCP spec) contributes 0.

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
            out.push(E2M1[code as usize] * e8m0_scale(scales[r * cols / GROUP + c / GROUP]));
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
