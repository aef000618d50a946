//! Quantizers: exact round trips of representable values, measured error on normal data
//! (through the real decoders and the real kernels), rounding rules and refused shapes.

use super::*;
use crate::mxfp4::{dequantize, E2M1};
use crate::Matrix;

/// A xorshift stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in (0, 1).
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit(), self.unit());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

fn normal_rows(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..rows * cols).map(|_| rng.normal()).collect()
}

/// `sqrt(Σ(x − x̂)² / Σx²)`.
fn rms_rel(x: &[f32], xh: &[f32]) -> f64 {
    let (mut e, mut s) = (0f64, 0f64);
    for (&a, &b) in x.iter().zip(xh) {
        e += (a as f64 - b as f64).powi(2);
        s += (a as f64).powi(2);
    }
    (e / s).sqrt()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

const ROWS: usize = 64;
const COLS: usize = 4096;

#[test]
fn q8_error_on_normal_rows() {
    let x = normal_rows(ROWS, COLS, 0x1234_5678_9ABC_DEF1);
    let (mut v, mut s) = (vec![0i8; ROWS * COLS], vec![0f32; ROWS]);
    quantize_q8_rows(&x, ROWS, COLS, &mut v, &mut s).unwrap();
    let err = rms_rel(&x, &dequantize_q8(&v, &s, ROWS, COLS));
    eprintln!(
        "q8 RMS relative error on N(0,1) rows of {COLS}: {:.4} %",
        err * 100.0
    );
    // Measured 0.87 % (step max/127 with max ≈ 3.7σ: step/√12 ≈ 0.0085σ).
    assert!(err < 0.0095, "q8 error {err}");
    // The kernel sees the same weights: row dot with a basis vector = the decoded element.
    let m = Matrix::q8(ROWS, COLS, &v, &s).unwrap();
    let mut e = vec![0f32; COLS];
    for c in [0, 17, 4095] {
        e[c] = 1.0;
        for r in [0, 63] {
            let want = crate::tmatvec::q8_element(v[r * COLS + c], s[r]);
            assert_eq!(m.row_dot(r, &e).to_bits(), want.to_bits());
        }
        e[c] = 0.0;
    }
}

/// RMS relative error of MXFP4 under `rule` on the normal rows.
fn mxfp4_error(x: &[f32], rule: ExpRule) -> f64 {
    let (mut p, mut s) = (vec![0u8; x.len() / 2], vec![0u8; x.len() / GROUP]);
    for r in 0..ROWS {
        let (a, b) = (r * COLS, (r + 1) * COLS);
        let (pr, sr) = (&mut p[a / 2..b / 2], &mut s[a / GROUP..b / GROUP]);
        mxfp4_row(&x[a..b], pr, sr, a, rule).unwrap();
    }
    rms_rel(x, &dequantize(&p, &s, ROWS, COLS))
}

#[test]
fn mxfp4_exponent_rule_choice() {
    let x = normal_rows(ROWS, COLS, 0x0DDB_A11C_AFE5_EED5);
    let (ocp, fit) = (mxfp4_error(&x, ExpRule::Ocp), mxfp4_error(&x, ExpRule::Fit));
    eprintln!(
        "mxfp4 RMS relative error on N(0,1): OCP rule {:.2} %, fit rule {:.2} %",
        ocp * 100.0,
        fit * 100.0
    );
    // Measured: OCP 11.49 %, fit 11.54 %. The public quantizer uses the OCP rule.
    assert!(ocp <= fit);
    assert!(ocp < 0.125, "mxfp4 error {ocp}");
    let (mut p, mut s) = (vec![0u8; COLS * ROWS / 2], vec![0u8; COLS * ROWS / GROUP]);
    quantize_mxfp4_rows(&x, ROWS, COLS, &mut p, &mut s).unwrap();
    assert_eq!(rms_rel(&x, &dequantize(&p, &s, ROWS, COLS)), ocp);
}

#[test]
fn q8_representable_rows_round_trip() {
    let mut rng = Rng(77);
    for _ in 0..200 {
        let cols = 1 + (rng.next() % 300) as usize;
        // A scale of 16 significant bits at a random binary exponent.
        let mant = ((1u64 << 15) | (rng.next() % (1 << 15))) as f32;
        // 2^-110 ..= 2^89: a normal scale whose 127 multiples are finite.
        let sc = mant * 2f32.powi((rng.next() % 200) as i32 - 125);
        let mut q: Vec<i8> = (0..cols).map(|_| (rng.next() % 255) as i8).collect();
        q.iter_mut().for_each(|v| *v = (*v).max(-127));
        q[(rng.next() as usize) % cols] = if rng.next().is_multiple_of(2) {
            127
        } else {
            -127
        };
        let x: Vec<f32> = q.iter().map(|&v| v as f32 * sc).collect();
        let mut v = vec![0i8; cols];
        let got = quantize_q8_row(&x, &mut v).unwrap();
        assert_eq!(got.to_bits(), sc.to_bits());
        assert_eq!(v, q);
        assert_eq!(bits(&dequantize_q8(&v, &[got], 1, cols)), bits(&x));
    }
}

#[test]
fn q8_rounding_and_edges() {
    let mut v = [9i8; 5];
    // scale 1: half away from zero, clamped.
    let x = [127.0f32, 0.5, -0.5, -1.5, 2.49];
    assert_eq!(quantize_q8_row(&x, &mut v), Ok(1.0));
    assert_eq!(v, [127, 1, -1, -2, 2]);
    assert_eq!(
        quantize_q8_row(&[0.0, -0.0, 0.0, 0.0, 0.0], &mut v),
        Ok(0.0)
    );
    assert_eq!(v, [0; 5]);
    let tiny = [f32::from_bits(1), 0.0, 0.0, 0.0, 0.0];
    assert_eq!(quantize_q8_row(&tiny, &mut v), Ok(0.0));
    assert_eq!(v, [0; 5]);
    let huge = [f32::MAX, -f32::MAX, 1.0, 0.0, 0.0];
    let s = quantize_q8_row(&huge, &mut v).unwrap();
    assert_eq!(&v[..2], &[127, -127]);
    assert!(dequantize_q8(&v, &[s], 1, 5).iter().all(|w| w.is_finite()));
    let bad = [1.0, f32::NAN, 0.0, 0.0, 0.0];
    assert_eq!(
        quantize_q8_row(&bad, &mut v),
        Err(QuantError::NonFinite { index: 1 })
    );
    assert!(matches!(
        quantize_q8_row(&x, &mut [0i8; 4]),
        Err(QuantError::Shape { .. })
    ));
}

/// Groups `E2M1[c_i] · 2^k` (one `k` per group, every code, `k` over the whole E8M0 range
/// that decodes finitely) round-trip bit for bit through the real decoder, under both rules.
#[test]
fn mxfp4_representable_groups_round_trip() {
    let mut rng = Rng(99);
    for k in -127i32..=125 {
        let codes: Vec<u8> = (0..64).map(|_| (rng.next() % 16) as u8).collect();
        let x: Vec<f32> = codes
            .iter()
            .map(|&c| (E2M1[c as usize] as f64 * 2f64.powi(k)) as f32)
            .collect();
        for rule in [ExpRule::Ocp, ExpRule::Fit] {
            let (mut p, mut s) = ([0u8; 32], [0u8; 2]);
            mxfp4_row(&x, &mut p, &mut s, 0, rule).unwrap();
            assert_eq!(bits(&dequantize(&p, &s, 1, 64)), bits(&x), "k {k} {rule:?}");
        }
    }
}

#[test]
fn mxfp4_rounding_ties_to_even_and_saturation() {
    // Scale 2^0 (max 6): every midpoint goes to the even code.
    let mut x = [0f32; 32];
    let mids = [
        6.0f32, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 0.3, -0.1,
    ];
    x[..mids.len()].copy_from_slice(&mids);
    let (mut p, mut s) = ([0u8; 16], [0u8; 1]);
    quantize_mxfp4_row(&x, &mut p, &mut s).unwrap();
    assert_eq!(s[0], 127);
    let got = dequantize(&p, &s, 1, 32);
    let want = [6.0f32, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 0.5, -0.0];
    assert_eq!(bits(&got[..want.len()]), bits(&want));
    // OCP rule on max 7.5: exponent 0, 7.5 saturates to 6; the fit rule takes exponent 1.
    x[0] = 7.5;
    quantize_mxfp4_row(&x, &mut p, &mut s).unwrap();
    assert_eq!((s[0], dequantize(&p, &s, 1, 32)[0]), (127, 6.0));
    mxfp4_row(&x, &mut p, &mut s, 0, ExpRule::Fit).unwrap();
    assert_eq!((s[0], dequantize(&p, &s, 1, 32)[0]), (128, 8.0));
    // The largest magnitudes: OCP byte 252 saturates at 6 · 2^125; the fit rule's byte 253
    // at the largest finite decode (3 · 2^126).
    x.fill(0.0);
    x[3] = f32::MAX;
    quantize_mxfp4_row(&x, &mut p, &mut s).unwrap();
    assert_eq!(
        (s[0], dequantize(&p, &s, 1, 32)[3]),
        (252, 6.0 * 2f32.powi(125))
    );
    mxfp4_row(&x, &mut p, &mut s, 0, ExpRule::Fit).unwrap();
    assert_eq!(s[0], 253);
    assert_eq!(dequantize(&p, &s, 1, 32)[3], 3.0 * 2f32.powi(126));
    // All zeros: byte 127, signs kept.
    x.fill(-0.0);
    quantize_mxfp4_row(&x, &mut p, &mut s).unwrap();
    assert_eq!(s[0], 127);
    assert_eq!(bits(&dequantize(&p, &s, 1, 32)), bits(&x));
}

#[test]
fn mxfp4_layout_matches_the_decoder_and_the_kernel() {
    // Element 0 → 0.5 (code 1, low nibble), element 1 → 6 (code 7, high nibble).
    let mut x = [0f32; 64];
    x[0] = 0.5;
    x[1] = 6.0;
    x[33] = -3.0;
    let (mut p, mut s) = ([0u8; 32], [0u8; 2]);
    quantize_mxfp4_row(&x, &mut p, &mut s).unwrap();
    assert_eq!(p[0], 0x71);
    let m = Matrix::mxfp4(1, 64, &p, &s).unwrap();
    let e: Vec<f32> = (0..64).map(|i| [1.0, 2.0, 0.0][i % 3]).collect();
    let want: f32 = x.iter().zip(&e).map(|(a, b)| a * b).sum();
    assert_eq!(m.row_dot(0, &e), want);
}

#[test]
fn bf16_sources_widen_exactly() {
    let x = normal_rows(3, 64, 5);
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let xw: Vec<f32> = xb.iter().map(|&v| crate::bf16_to_f32(v)).collect();
    let (mut v1, mut s1, mut v2, mut s2) = (vec![0i8; 192], [0f32; 3], vec![0i8; 192], [0f32; 3]);
    quantize_q8_rows(&xb, 3, 64, &mut v1, &mut s1).unwrap();
    quantize_q8_rows(&xw, 3, 64, &mut v2, &mut s2).unwrap();
    assert_eq!((v1, bits(&s1)), (v2, bits(&s2)));
    let (mut p1, mut c1, mut p2, mut c2) = ([0u8; 96], [0u8; 6], [0u8; 96], [0u8; 6]);
    quantize_mxfp4_rows(&xb, 3, 64, &mut p1, &mut c1).unwrap();
    quantize_mxfp4_rows(&xw, 3, 64, &mut p2, &mut c2).unwrap();
    assert_eq!((p1, c1), (p2, c2));
}

#[test]
fn shapes_and_non_finite_values_are_refused() {
    let x = vec![1f32; 64];
    let (mut p, mut s) = ([0u8; 32], [0u8; 2]);
    let shape_err = |r: Result<(), QuantError>| matches!(r, Err(QuantError::Shape { .. }));
    assert!(shape_err(quantize_mxfp4_row(
        &x[..48],
        &mut p[..24],
        &mut s[..1]
    )));
    assert!(shape_err(quantize_mxfp4_row(&x, &mut p[..31], &mut s)));
    assert!(shape_err(quantize_mxfp4_row(&x, &mut p, &mut s[..1])));
    assert!(shape_err(quantize_mxfp4_rows(
        &x,
        2,
        32,
        &mut p,
        &mut s[..1]
    )));
    assert!(shape_err(quantize_mxfp4_rows(&x, 4, 16, &mut p, &mut s)));
    let (mut v, mut sc) = ([0i8; 64], [0f32; 2]);
    assert!(shape_err(quantize_q8_rows(&x, 2, 31, &mut v, &mut sc)));
    assert!(shape_err(quantize_q8_rows(&x, 2, 32, &mut v, &mut sc[..1])));
    let mut y = x.clone();
    y[40] = f32::INFINITY;
    let nf = Err(QuantError::NonFinite { index: 40 });
    assert_eq!(quantize_mxfp4_rows(&y, 2, 32, &mut p, &mut s), nf);
    assert_eq!(quantize_q8_rows(&y, 2, 32, &mut v, &mut sc), nf);
    let e = QuantError::NonFinite { index: 3 };
    assert_eq!(e.to_string(), "non-finite value at index 3");
}
