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
