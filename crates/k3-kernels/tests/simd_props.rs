//! Property tests: every SIMD level equals the scalar definition BIT FOR BIT, `matmul` equals
//! per-token `matvec`, and `par_matvec` / `matmul` are the same in pools of 1, 2, 3 and 8
//! threads (numeric contract v2, docs/NUMERICS.md#row-dot-contract-v2).

use half::bf16;
use k3_kernels::dot::{
    dot_bf16, dot_bf16_scalar, dot_f32, dot_f32_scalar, dot_mxfp4, dot_mxfp4_scalar,
};
use k3_kernels::simd::{available_levels, dot_bf16_at, dot_f32_at, dot_mxfp4_at};
use k3_kernels::{matmul, matvec, par_matvec, Matrix};
use proptest::prelude::*;
use std::sync::OnceLock;

/// Finite f32 of every magnitude: random finite bit patterns (subnormal to ~3e38), moderate
/// values, small integers (exact cancellations) and signed zeros.
fn val() -> impl Strategy<Value = f32> {
    prop_oneof![
        3 => any::<u32>().prop_map(|b| {
            let v = f32::from_bits(b);
            if v.is_finite() { v } else { f32::from_bits(b & 0xBF7F_FFFF) }
        }),
        4 => -8.0f32..8.0,
        2 => (-6i32..=6).prop_map(|i| i as f32),
        1 => prop_oneof![Just(0.0f32), Just(-0.0f32), Just(1e-30f32), Just(-1e30f32)],
    ]
}

/// Pairs of equal-length vectors, lengths 0..300.
fn pair() -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (0usize..300).prop_flat_map(|n| {
        (
            prop::collection::vec(val(), n),
            prop::collection::vec(val(), n),
        )
    })
}

/// E8M0 scale bytes with the edges 0 and 255 well represented.
fn scale() -> impl Strategy<Value = u8> {
    prop_oneof![4 => any::<u8>(), 1 => Just(0u8), 1 => Just(255u8), 2 => 110u8..135]
}

/// An MXFP4 row: `(packed, scales, x)` with 0..10 groups.
fn mx_row() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, Vec<f32>)> {
    (0usize..10).prop_flat_map(|g| {
        (
            prop::collection::vec(any::<u8>(), g * 16),
            prop::collection::vec(scale(), g),
            prop::collection::vec(val(), g * 32),
        )
    })
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter()
        .map(|&f| bf16::from_bits((f.to_bits() >> 16) as u16))
        .collect()
}

fn pools() -> &'static [rayon::ThreadPool] {
    static P: OnceLock<Vec<rayon::ThreadPool>> = OnceLock::new();
    P.get_or_init(|| {
        [1, 2, 3, 8]
            .into_iter()
            .map(|n| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .unwrap()
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn f32_every_level_is_bit_identical((w, x) in pair()) {
        let want = dot_f32_scalar(&w, &x).to_bits();
        for lvl in available_levels() {
            prop_assert_eq!(dot_f32_at(lvl, &w, &x).to_bits(), want, "level {:?}", lvl);
        }
        prop_assert_eq!(dot_f32(&w, &x).to_bits(), want);
    }

    #[test]
    fn bf16_every_level_is_bit_identical((w, x) in pair()) {
        let w = to_bf16(&w);
        let want = dot_bf16_scalar(&w, &x).to_bits();
        for lvl in available_levels() {
            prop_assert_eq!(dot_bf16_at(lvl, &w, &x).to_bits(), want, "level {:?}", lvl);
        }
        prop_assert_eq!(dot_bf16(&w, &x).to_bits(), want);
    }

    #[test]
    fn mxfp4_every_level_is_bit_identical((p, s, x) in mx_row()) {
        let want = dot_mxfp4_scalar(&p, &s, &x).to_bits();
        for lvl in available_levels() {
            prop_assert_eq!(dot_mxfp4_at(lvl, &p, &s, &x).to_bits(), want, "level {:?}", lvl);
        }
        prop_assert_eq!(dot_mxfp4(&p, &s, &x).to_bits(), want);
    }
}

/// A random matrix of one storage kind with its scalar per-row reference.
#[derive(Debug, Clone)]
enum Mat {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    Mx(Vec<u8>, Vec<u8>),
}

impl Mat {
    fn view(&self, rows: usize, cols: usize) -> Matrix<'_> {
        match self {
            Mat::F32(d) => Matrix::f32(rows, cols, d).unwrap(),
            Mat::Bf16(d) => Matrix::bf16(rows, cols, d).unwrap(),
            Mat::Mx(p, s) => Matrix::mxfp4(rows, cols, p, s).unwrap(),
        }
    }

    fn scalar_row(&self, r: usize, cols: usize, x: &[f32]) -> f32 {
        let acc = match self {
            Mat::F32(d) => dot_f32_scalar(&d[r * cols..(r + 1) * cols], x),
            Mat::Bf16(d) => dot_bf16_scalar(&d[r * cols..(r + 1) * cols], x),
            Mat::Mx(p, s) => dot_mxfp4_scalar(
                &p[r * cols / 2..(r + 1) * cols / 2],
                &s[r * cols / 32..(r + 1) * cols / 32],
                x,
            ),
        };
        acc as f32
    }
}

/// `(rows, cols, t, matrix, x[t][cols])` over the three storages; rows span several tiles.
fn mat_case() -> impl Strategy<Value = (usize, usize, usize, Mat, Vec<f32>)> {
    (0usize..3, 0usize..80, 0usize..7, 0usize..100).prop_flat_map(|(kind, c, t, rows)| {
        let cols = if kind == 2 { (c / 32 + 1) * 32 } else { c };
        let n = rows * cols;
        let m = match kind {
            0 => prop::collection::vec(val(), n).prop_map(Mat::F32).boxed(),
            1 => prop::collection::vec(val(), n)
                .prop_map(|v| Mat::Bf16(to_bf16(&v)))
                .boxed(),
            _ => (
                prop::collection::vec(any::<u8>(), n / 2),
                prop::collection::vec(scale(), n / 32),
            )
                .prop_map(|(p, s)| Mat::Mx(p, s))
                .boxed(),
        };
        (
            Just(rows),
            Just(cols),
            Just(t),
            m,
            prop::collection::vec(val(), t * cols),
        )
    })
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    #[test]
    fn matmul_equals_per_token_matvec_and_scalar((rows, cols, t, m, x) in mat_case()) {
        let w = m.view(rows, cols);
        let mut y = vec![f32::NAN; t * rows];
        matmul(&mut y, &w, &x, t);
        for tok in 0..t {
            let xt = &x[tok * cols..(tok + 1) * cols];
            let mut yv = vec![f32::NAN; rows];
            matvec(&mut yv, &w, xt);
            prop_assert_eq!(bits(&y[tok * rows..(tok + 1) * rows]), bits(&yv));
            let want: Vec<f32> = (0..rows).map(|r| m.scalar_row(r, cols, xt)).collect();
            prop_assert_eq!(bits(&yv), bits(&want));
        }
    }

    #[test]
    fn par_matvec_is_thread_count_free((rows, cols, t, m, x) in mat_case()) {
        prop_assume!(t > 0);
        let w = m.view(rows, cols);
        let xt = &x[..cols];
        let mut want = vec![f32::NAN; rows];
        matvec(&mut want, &w, xt);
        for pool in pools() {
            let mut y = vec![f32::NAN; rows];
            pool.install(|| par_matvec(&mut y, &w, xt));
            prop_assert_eq!(bits(&y), bits(&want), "threads {}", pool.current_num_threads());
            let mut ym = vec![f32::NAN; t * rows];
            pool.install(|| matmul(&mut ym, &w, &x, t));
            prop_assert_eq!(bits(&ym[..rows]), bits(&want));
        }
    }
}
