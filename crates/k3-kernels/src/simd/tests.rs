//! Every SIMD level equals the scalar definition bit for bit: single-row dots (natural
//! activations) and the mat-vec row-block kernels (activations in the level's layout), for
//! all four storages, every tail length, extreme values and the E8M0 edge bytes.

use super::layout::{copy_in_layout, Q16};
use super::*;
use crate::dot::{dot_bf16_scalar, dot_f32_scalar, dot_mxfp4_scalar, dot_q8_scalar, q8_finish};
use proptest::prelude::*;

/// Finite f32 from any bit pattern (subnormal to 3e38), moderate reals, small integers.
fn val() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<u32>().prop_map(|b| {
            let v = f32::from_bits(b);
            if v.is_finite() {
                v
            } else {
                1.5
            }
        }),
        -8.0f32..8.0,
        (-6i32..=6).prop_map(|i| i as f32),
    ]
}

/// Values including signed zeros, the extremes of f32 and tiny subnormals.
fn xval() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => val(),
        1 => prop_oneof![
            Just(0.0f32),
            Just(-0.0f32),
            Just(f32::MAX),
            Just(f32::MIN),
            Just(f32::from_bits(1)),
            Just(-f32::from_bits(1)),
            Just(f32::MIN_POSITIVE),
            Just(-1.0e-30f32),
        ],
    ]
}

/// E8M0 bytes with the edges well represented.
fn scale_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        4 => any::<u8>(),
        1 => Just(0u8),
        1 => Just(127u8),
        1 => Just(200u8),
        1 => Just(254u8),
        1 => Just(255u8),
        3 => 110u8..135,
    ]
}

/// Weights and activations of `rows` rows of one storage.
#[derive(Debug, Clone)]
pub(crate) struct Rows {
    pub kind: Kind,
    pub n: usize,
    pub f: Vec<Vec<f32>>,
    pub b: Vec<Vec<u16>>,
    pub p: Vec<Vec<u8>>,
    pub s: Vec<Vec<u8>>,
    pub q: Vec<Vec<i8>>,
    pub qs: Vec<f32>,
}

impl Rows {
    pub fn row(&self, r: usize) -> Row<'_> {
        match self.kind {
            Kind::F32 => Row::F32(&self.f[r]),
            Kind::Bf16 => Row::Bf16(&self.b[r]),
            Kind::Mxfp4 => Row::Mxfp4(&self.p[r], &self.s[r]),
            Kind::Q8 => Row::Q8(&self.q[r]),
        }
    }

    /// Row `r`'s output from the tree's result (the Q8 scale applied).
    pub fn finish(&self, r: usize, d: f32) -> f32 {
        match self.kind {
            Kind::Q8 => q8_finish(self.qs[r], d),
            _ => d,
        }
    }

    pub fn scalar(&self, r: usize, x: &[f32]) -> f32 {
        match self.kind {
            Kind::F32 => dot_f32_scalar(&self.f[r], x),
            Kind::Bf16 => dot_bf16_scalar(bytemuck::cast_slice(&self.b[r]), x),
            Kind::Mxfp4 => dot_mxfp4_scalar(&self.p[r], &self.s[r], x),
            Kind::Q8 => dot_q8_scalar(&self.q[r], self.qs[r], x),
        }
    }
}

/// `rows` rows of `kind` with `n` elements (rounded down to whole groups for MXFP4).
pub(crate) fn rows_of(kind: Kind, n: usize, rows: usize) -> impl Strategy<Value = Rows> {
    let n = if kind == Kind::Mxfp4 { n / 32 * 32 } else { n };
    (
        prop::collection::vec(prop::collection::vec(xval(), n), rows),
        prop::collection::vec(prop::collection::vec(any::<u8>(), n / 2), rows),
        prop::collection::vec(prop::collection::vec(scale_byte(), n / 32), rows),
        prop::collection::vec(prop::collection::vec(any::<i8>(), n), rows),
        prop::collection::vec(xval(), rows),
    )
        .prop_map(move |(f, p, s, q, qs)| {
            let b = f
                .iter()
                .map(|r| r.iter().map(|v| (v.to_bits() >> 16) as u16).collect())
                .collect();
            Rows {
                kind,
                n,
                f,
                b,
                p,
                s,
                q,
                qs,
            }
        })
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::F32),
        Just(Kind::Bf16),
        Just(Kind::Mxfp4),
        Just(Kind::Q8)
    ]
}

/// Four rows and an activation of a random storage and length (0..300; MXFP4 0..=9 groups).
fn case() -> impl Strategy<Value = (Rows, Vec<f32>)> {
    (kind(), 0usize..300).prop_flat_map(|(k, n)| {
        rows_of(k, n, 4).prop_flat_map(|r| {
            let n = r.n;
            (Just(r), prop::collection::vec(xval(), n))
        })
    })
}

fn simd_levels() -> Vec<Level> {
    available_levels()
        .into_iter()
        .filter(|&l| l != Level::Scalar)
        .collect()
}

fn check_blocks<const R: usize>(rows: &Rows, x: &[f32], want: &[u32]) -> Result<(), TestCaseError> {
    for level in available_levels() {
        let mut xl = vec![0f32; x.len()];
        copy_in_layout(layout(level, rows.kind), x, &mut xl);
        let got = rows_lanes::<R>(level, std::array::from_fn(|r| rows.row(r)), &xl);
        let got: Vec<u32> = (got.iter().enumerate())
            .map(|(r, l)| rows.finish(r, crate::dot::reduce16(l)).to_bits())
            .collect();
        prop_assert_eq!(&got[..], &want[..R], "{} rows, level {:?}", R, level);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Single-row dots and the 1/2/4-row mat-vec kernels on every level equal the scalar dot.
    #[test]
    fn every_level_is_bit_identical((rows, x) in case()) {
        let want: Vec<u32> = (0..4).map(|r| rows.scalar(r, &x).to_bits()).collect();
        for level in simd_levels() {
            let got: Vec<u32> = (0..4)
                .map(|r| match rows.kind {
                    Kind::F32 => dot_f32_at(level, &rows.f[r], &x),
                    Kind::Bf16 => dot_bf16_at(level, bytemuck::cast_slice(&rows.b[r]), &x),
                    Kind::Mxfp4 => dot_mxfp4_at(level, &rows.p[r], &rows.s[r], &x),
                    Kind::Q8 => dot_q8_at(level, &rows.q[r], rows.qs[r], &x),
                }
                .to_bits())
                .collect();
            prop_assert_eq!(&got, &want, "single rows, level {:?}", level);
        }
        check_blocks::<1>(&rows, &x, &want)?;
        check_blocks::<2>(&rows, &x, &want)?;
        check_blocks::<4>(&rows, &x, &want)?;
    }
}

#[test]
fn scale_edges_on_every_level() {
    // One group per scale byte of interest, every code, x = ±1, ±tiny, ±huge.
    let packed: Vec<u8> = (0..16)
        .map(|j| (2 * j) as u8 | ((2 * j + 1) as u8) << 4)
        .collect();
    for s in [0u8, 1, 127, 200, 252, 253, 254, 255] {
        for xv in [1.0f32, -1.0, 1.0e-30, -3.0e38, 0.0] {
            let x: Vec<f32> = (0..32).map(|i| if i % 3 == 0 { xv } else { -xv }).collect();
            let want = dot_mxfp4_scalar(&packed[..16], &[s], &x).to_bits();
            for level in simd_levels() {
                let got = dot_mxfp4_at(level, &packed[..16], &[s], &x).to_bits();
                assert_eq!(got, want, "scale {s}, x {xv}, level {level:?}");
            }
        }
    }
}

/// Q8 lanes with huge and tiny activations, every tail length: the int8 padding (`w = 0`,
/// `x = −0`) keeps the lanes' bits (±inf, NaN, ±0 included).
#[test]
fn q8_tails_and_extremes_on_every_level() {
    for n in 0..=49usize {
        let v: Vec<i8> = (0..n).map(|i| [127i8, -128, -1, 0, 3][i % 5]).collect();
        for xv in [3.0e38f32, -1.0e-45, 0.0, -0.0, f32::INFINITY] {
            let x: Vec<f32> = (0..n).map(|i| if i % 3 == 0 { xv } else { -xv }).collect();
            for scale in [1.0f32, -0.0, 2.5e-3] {
                let want = dot_q8_scalar(&v, scale, &x).to_bits();
                for level in simd_levels() {
                    let got = dot_q8_at(level, &v, scale, &x).to_bits();
                    assert_eq!(got, want, "n {n}, x {xv}, scale {scale}, level {level:?}");
                }
            }
        }
    }
}

/// Every lane underflows to `−0`; the padding of a partial last block must keep it (`−0`
/// product), so the dot is `−0` on every level, for every tail length.
#[test]
fn padding_keeps_negative_zero_lanes() {
    for n in 16..=47 {
        let w = vec![-1.0e-30f32; n];
        let x = vec![1.0e-30f32; n];
        let wb = vec![half::bf16::from_f32(-1.0e-30); n];
        assert_eq!(dot_f32_scalar(&w, &x).to_bits(), (-0f32).to_bits());
        for level in available_levels() {
            assert_eq!(
                dot_f32_at(level, &w, &x).to_bits(),
                (-0f32).to_bits(),
                "{level:?} {n}"
            );
            assert_eq!(
                dot_bf16_at(level, &wb, &x).to_bits(),
                (-0f32).to_bits(),
                "{level:?} {n}"
            );
        }
    }
}

#[test]
fn q16_layout_round_trips() {
    let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let mut xl = vec![0f32; 16];
    copy_in_layout(Layout::Q16, &x, &mut xl);
    assert_eq!(&xl[..8], &[0.0, 4.0, 8.0, 12.0, 1.0, 5.0, 9.0, 13.0]);
    let reg: [f32; 16] = std::array::from_fn(|q| xl[q]);
    assert_eq!(to_lanes(Layout::Q16, reg).to_vec(), x);
    assert_eq!(to_lanes(Layout::Natural, reg).to_vec(), xl);
    #[cfg(target_arch = "x86_64")]
    assert_eq!(Q16, avx2_mx::Q16);
}

#[test]
fn force_scalar_switch_and_names() {
    assert!(available_levels().contains(&detected_level()));
    assert!(available_levels().iter().all(|l| l.is_supported()));
    set_force_scalar(true);
    assert_eq!(simd_level(), "scalar");
    assert!(force_scalar());
    set_force_scalar(false);
    assert_eq!(simd_level(), detected_level().name());
}

#[test]
fn matvec_row_blocks_divide_the_task_size() {
    for level in [Level::Scalar, Level::Avx2, Level::Avx512, Level::Neon] {
        for kind in [Kind::F32, Kind::Bf16, Kind::Mxfp4, Kind::Q8] {
            assert_eq!(32 % matvec_rows(level, kind), 0);
            assert_eq!(gemm::plan::RB % matvec_rows(level, kind), 0);
        }
    }
}

/// The AVX-512F and AVX-512 VBMI MXFP4 decoders give the same lanes, bit for bit: every scale
/// byte, random codes, 4 rows of 7 groups (skipped without VBMI, and says so).
#[cfg(target_arch = "x86_64")]
#[test]
fn vbmi_and_f_decoders_agree() {
    let groups = 7;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let x: Vec<f32> = (0..32 * groups)
        .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    for s0 in (0..=255u8).step_by(4) {
        let packed: Vec<Vec<u8>> = (0..4)
            .map(|_| (0..16 * groups).map(|_| next() as u8).collect())
            .collect();
        let scales: Vec<Vec<u8>> = (0..4)
            .map(|r| {
                (0..groups)
                    .map(|g| s0.wrapping_add((r + g) as u8))
                    .collect()
            })
            .collect();
        let p: [&[u8]; 4] = std::array::from_fn(|r| &packed[r][..]);
        let s: [&[u8]; 4] = std::array::from_fn(|r| &scales[r][..]);
        let Some((f, vbmi)) = super::avx512::rows_mx_both(p, s, &x) else {
            eprintln!("vbmi_and_f_decoders_agree: no AVX-512 VBMI on this CPU, nothing compared");
            return;
        };
        let bits = |l: &[[f32; 16]; 4]| l.map(|r| r.map(f32::to_bits));
        assert_eq!(bits(&f), bits(&vbmi), "scales from {s0}");
    }
}
