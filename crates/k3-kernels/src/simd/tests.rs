//! Multi-token kernels (`row_dots`, `N` = 1, 2, 3, 4; f32 and pre-widened f64 activations) on
//! every available SIMD level equal the scalar dot of each token bit for bit; switch API.

use super::*;
use crate::dot::{dot_bf16_scalar, dot_f32_scalar, dot_mxfp4_scalar};
use proptest::prelude::*;

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

/// `(kind, weight bytes/values, 4 activation rows)` with row length `len`.
fn case() -> impl Strategy<Value = (usize, Vec<f32>, Vec<u8>, Vec<Vec<f32>>)> {
    (0usize..3, 0usize..300).prop_flat_map(|(kind, n)| {
        let n = if kind == 2 { n / 32 * 32 } else { n };
        (
            Just(kind),
            prop::collection::vec(val(), n),
            prop::collection::vec(any::<u8>(), n / 2 + n / 32),
            prop::collection::vec(prop::collection::vec(val(), n), 4),
        )
    })
}

fn check_n<const N: usize>(
    kind: usize,
    wf: &[f32],
    wb: &[u16],
    mx: &[u8],
    xs: &[Vec<f32>],
) -> Result<(), TestCaseError> {
    let n = wf.len();
    let (p, s) = mx.split_at(n / 2);
    let row = match kind {
        0 => Row::F32(wf),
        1 => Row::Bf16(wb),
        _ => Row::Mxfp4(p, s),
    };
    let want: Vec<u64> = xs[..N]
        .iter()
        .map(|x| {
            match kind {
                0 => dot_f32_scalar(wf, x),
                1 => dot_bf16_scalar(bytemuck::cast_slice(wb), x),
                _ => dot_mxfp4_scalar(p, s, x),
            }
            .to_bits()
        })
        .collect();
    let x64: Vec<Vec<f64>> = xs
        .iter()
        .map(|x| x.iter().map(|&v| v as f64).collect())
        .collect();
    for level in available_levels()
        .into_iter()
        .filter(|&l| l != Level::Scalar)
    {
        let a = row_dots(level, row, std::array::from_fn::<&[f32], N, _>(|k| &xs[k]));
        let b = row_dots(level, row, std::array::from_fn::<&[f64], N, _>(|k| &x64[k]));
        prop_assert_eq!(
            a.map(f64::to_bits).to_vec(),
            want.clone(),
            "f32 x, level {:?}",
            level
        );
        prop_assert_eq!(
            b.map(f64::to_bits).to_vec(),
            want.clone(),
            "f64 x, level {:?}",
            level
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn multi_token_kernels_are_bit_identical((kind, wf, mx, xs) in case()) {
        let wb: Vec<u16> = wf.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        check_n::<1>(kind, &wf, &wb, &mx, &xs)?;
        check_n::<2>(kind, &wf, &wb, &mx, &xs)?;
        check_n::<3>(kind, &wf, &wb, &mx, &xs)?;
        check_n::<4>(kind, &wf, &wb, &mx, &xs)?;
    }
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

#[cfg(target_arch = "aarch64")]
#[test]
fn e2m1_bf16_bytes_rebuild_the_table() {
    for (c, &v) in crate::mxfp4::E2M1.iter().enumerate() {
        assert_eq!(v.to_bits() & 0xFFFF, 0);
        let t = neon::E2M1_BF16_BYTES;
        let hi16 = (t[1][c] as u32) << 8 | t[0][c] as u32;
        assert_eq!(f32::from_bits(hi16 << 16).to_bits(), v.to_bits());
    }
}

/// E8M0 bytes with the edges 0 and 255 well represented.
fn scale_byte() -> impl Strategy<Value = u8> {
    prop_oneof![4 => any::<u8>(), 1 => Just(0u8), 1 => Just(255u8), 2 => 110u8..135]
}

/// Activation values including signed zeros and the extremes of f32.
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
        ],
    ]
}

/// `(kind, 4 f32 rows, 4 MXFP4 code rows, their scales, x)`.
type RowsCase = (usize, Vec<Vec<f32>>, Vec<Vec<u8>>, Vec<u8>, Vec<f32>);

/// Four weight rows of one storage (`kind`: f32, bf16, MXFP4) and an activation row.
fn rows_case() -> impl Strategy<Value = RowsCase> {
    (0usize..3, 0usize..200, 0usize..=12).prop_flat_map(|(kind, n16, groups)| {
        let n = if kind == 2 { groups * 32 } else { n16 };
        (
            Just(kind),
            prop::collection::vec(prop::collection::vec(val(), n), 4),
            prop::collection::vec(prop::collection::vec(any::<u8>(), n / 2), 4),
            prop::collection::vec(scale_byte(), 4 * (n / 32)),
            prop::collection::vec(xval(), n),
        )
    })
}

fn check_rows<const R: usize>(
    kind: usize,
    wf: &[Vec<f32>],
    wb: &[Vec<u16>],
    mx: &[Vec<u8>],
    sc: &[u8],
    x: &[f32],
) -> Result<(), TestCaseError> {
    let g = x.len() / 32;
    let row = |r: usize| match kind {
        0 => Row::F32(&wf[r]),
        1 => Row::Bf16(&wb[r]),
        _ => Row::Mxfp4(&mx[r], &sc[r * g..(r + 1) * g]),
    };
    let want: Vec<u64> = (0..R)
        .map(|r| {
            match kind {
                0 => dot_f32_scalar(&wf[r], x),
                1 => dot_bf16_scalar(bytemuck::cast_slice(&wb[r]), x),
                _ => dot_mxfp4_scalar(&mx[r], &sc[r * g..(r + 1) * g], x),
            }
            .to_bits()
        })
        .collect();
    for level in available_levels()
        .into_iter()
        .filter(|&l| l != Level::Scalar)
    {
        let wx = WideX::new(level, kind == 2, x);
        let got = rows_dots::<R>(level, std::array::from_fn(row), &wx);
        prop_assert_eq!(
            got.map(f64::to_bits).to_vec(),
            want.clone(),
            "level {:?}",
            level
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// The mat-vec row-block kernels (1..=4 rows, the widened/permuted activation layouts,
    /// 0..=12 MXFP4 groups, scale bytes 0/255, signed zeros, f32 extremes) equal the scalar
    /// dot of every row bit for bit.
    #[test]
    fn row_block_kernels_are_bit_identical((kind, wf, mx, sc, x) in rows_case()) {
        let wb: Vec<Vec<u16>> = wf
            .iter()
            .map(|r| r.iter().map(|v| (v.to_bits() >> 16) as u16).collect())
            .collect();
        check_rows::<1>(kind, &wf, &wb, &mx, &sc, &x)?;
        check_rows::<2>(kind, &wf, &wb, &mx, &sc, &x)?;
        check_rows::<3>(kind, &wf, &wb, &mx, &sc, &x)?;
        check_rows::<4>(kind, &wf, &wb, &mx, &sc, &x)?;
    }
}

#[test]
fn row_block_sizes_divide_the_task_size() {
    for level in [Level::Scalar, Level::Avx2, Level::Avx512, Level::Neon] {
        for mx in [false, true] {
            assert_eq!(32 % row_block(level, mx), 0);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_mx_tables_rebuild_the_values() {
    use crate::mxfp4::{e8m0_scale, E2M1};
    for (c, &v) in E2M1.iter().enumerate() {
        let bits = (v as f64).to_bits();
        assert_eq!(bits & ((1 << 48) - 1), 0, "code {c}");
        let t = avx2_mx::E2M1_TOP;
        let top = (t[1][c] as u64) << 8 | t[0][c] as u64;
        assert_eq!(top << 48, bits, "code {c}");
    }
    for s in 0..=255u8 {
        let want = e8m0_scale(s) as f64;
        assert_eq!(
            avx2_mx::E8M0_F64[s as usize].to_bits(),
            want.to_bits(),
            "scale {s}"
        );
    }
    for (k, &p) in avx2_mx::PERM8.iter().enumerate() {
        assert_eq!(avx2_mx::PERM8[p], k, "PERM8 is self-inverse");
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_mx_rejects_an_unpermuted_activation() {
    if !Level::Avx2.is_supported() {
        return;
    }
    let (p, s, x) = ([0u8; 16], [127u8], [1f32; 32]);
    let plain = WideX::new(Level::Avx2, false, &x);
    let r = std::panic::catch_unwind(|| rows_dots::<1>(Level::Avx2, [Row::Mxfp4(&p, &s)], &plain));
    assert!(r.is_err());
    let perm = WideX::new(Level::Avx2, true, &x);
    let got = rows_dots::<1>(Level::Avx2, [Row::Mxfp4(&p, &s)], &perm);
    assert_eq!(got, [0.0]);
}
