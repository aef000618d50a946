//! `matmul` over T tokens equals `matvec` per token, which equals the scalar row dot, bit for
//! bit, on every level and in rayon pools of 1, 2, 3 and 8 threads; and the v2 dot stays
//! within its stated error bound of an exact (f64) reference.

use super::*;
use crate::simd::available_levels;
use half::bf16;
use proptest::prelude::*;

/// Owned weights of one storage.
#[derive(Debug, Clone)]
enum Owned {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    Mx(Vec<u8>, Vec<u8>),
    Q8(Vec<i8>, Vec<f32>),
}

impl Owned {
    fn view(&self, rows: usize, cols: usize) -> Matrix<'_> {
        let m = match self {
            Owned::F32(d) => Matrix::f32(rows, cols, d),
            Owned::Bf16(d) => Matrix::bf16(rows, cols, d),
            Owned::Mx(p, s) => Matrix::mxfp4(rows, cols, p, s),
            Owned::Q8(v, s) => Matrix::q8(rows, cols, v, s),
        };
        m.unwrap()
    }
}

fn finite(b: u32) -> f32 {
    let v = f32::from_bits(b);
    if v.is_finite() {
        v
    } else {
        0.5
    }
}

/// Values: mostly moderate (so most outputs are finite), some arbitrary finite bit patterns.
fn val() -> impl Strategy<Value = f32> {
    prop_oneof![8 => -4.0f32..4.0, 1 => any::<u32>().prop_map(finite), 1 => Just(-0.0f32)]
}

/// `(weights, rows, cols, t, x)`: cols 0..80 or 500..560 (crossing a GEMM column chunk),
/// MXFP4 cols whole groups; rows 0..40 (not multiples of any block size); t 1..=20.
fn case() -> impl Strategy<Value = (Owned, usize, usize, usize, Vec<f32>)> {
    (
        0usize..4,
        0usize..40,
        prop_oneof![0usize..80, 500usize..560],
        1usize..=20,
    )
        .prop_flat_map(|(k, rows, cols, t)| {
            let cols = if k == 2 { cols / 32 * 32 } else { cols };
            let n = rows * cols;
            let w = match k {
                0 => prop::collection::vec(val(), n).prop_map(Owned::F32).boxed(),
                1 => prop::collection::vec(val().prop_map(bf16::from_f32), n)
                    .prop_map(Owned::Bf16)
                    .boxed(),
                3 => (
                    prop::collection::vec(any::<i8>(), n),
                    prop::collection::vec(val(), rows),
                )
                    .prop_map(|(v, s)| Owned::Q8(v, s))
                    .boxed(),
                _ => (
                    prop::collection::vec(any::<u8>(), n / 2),
                    prop::collection::vec(prop_oneof![110u8..135, Just(0u8), Just(255u8)], n / 32),
                )
                    .prop_map(|(p, s)| Owned::Mx(p, s))
                    .boxed(),
            };
            (
                w,
                Just(rows),
                Just(cols),
                Just(t),
                prop::collection::vec(val(), t * cols),
            )
        })
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// The scalar definition's bits of `Y[t] = W·X[t]`, row by row (`[t][rows]`).
fn scalar_bits(m: &Matrix, x: &[f32], t: usize) -> Vec<u32> {
    let (rows, cols) = (m.rows, m.cols);
    (0..t * rows)
        .map(|i| {
            let (tok, r) = (i / rows, i % rows);
            let xt = &x[tok * cols..(tok + 1) * cols];
            let d = crate::dot::reduce16(
                &crate::simd::rows_lanes::<1>(Level::Scalar, [m.row(r)], xt)[0],
            );
            m.finish(r, d).to_bits()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn matmul_equals_per_token_matvec_and_scalar((w, rows, cols, t, x) in case()) {
        let m = w.view(rows, cols);
        let want = scalar_bits(&m, &x, t);
        for level in available_levels() {
            let mut y = vec![f32::NAN; t * rows];
            matmul_at(level, &mut y, &m, &x, t);
            prop_assert_eq!(bits(&y), want.clone(), "matmul, level {:?}", level);
            for tok in 0..t {
                let xt = &x[tok * cols..(tok + 1) * cols];
                let mut yv = vec![f32::NAN; rows];
                matvec_at(level, &mut yv, &m, xt, false);
                prop_assert_eq!(bits(&yv), want[tok * rows..(tok + 1) * rows].to_vec());
                matvec_at(level, &mut yv, &m, xt, true);
                prop_assert_eq!(bits(&yv), want[tok * rows..(tok + 1) * rows].to_vec());
            }
        }
    }
}

/// A deterministic matrix of each storage: `[rows × cols]`, values from a xorshift stream.
fn fixed(kind: usize, rows: usize, cols: usize) -> Owned {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ kind as u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let v = |n: usize, next: &mut dyn FnMut() -> u64| -> Vec<f32> {
        (0..n)
            .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0)
            .collect()
    };
    match kind {
        0 => Owned::F32(v(rows * cols, &mut next)),
        1 => Owned::Bf16(
            v(rows * cols, &mut next)
                .into_iter()
                .map(bf16::from_f32)
                .collect(),
        ),
        3 => Owned::Q8(
            (0..rows * cols).map(|_| next() as i8).collect(),
            v(rows, &mut next).into_iter().map(|s| s * 0.01).collect(),
        ),
        _ => Owned::Mx(
            (0..rows * cols / 2).map(|_| next() as u8).collect(),
            (0..rows * cols / 32)
                .map(|_| 112 + (next() % 16) as u8)
                .collect(),
        ),
    }
}

/// Every pool size splits the rows differently (tasks of 1 to 4 row blocks, a partial last
/// task and block); the second shape also has two token groups and three column chunks, the
/// third takes the small-T MXFP4 tile (no panel) where the level has one.
#[test]
fn results_are_the_same_in_every_pool_size() {
    for (rows, cols, t) in [(203, 544, 13), (100, 1056, 70), (77, 1056, 7)] {
        same_in_every_pool_size(rows, cols, t);
    }
}

fn same_in_every_pool_size(rows: usize, cols: usize, t: usize) {
    let x: Vec<f32> = (0..t * cols)
        .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 997.0)
        .collect();
    for kind in 0..4 {
        let w = fixed(kind, rows, cols);
        let m = w.view(rows, cols);
        let mut want = vec![0f32; t * rows];
        for tok in 0..t {
            matvec(
                &mut want[tok * rows..(tok + 1) * rows],
                &m,
                &x[tok * cols..(tok + 1) * cols],
            );
        }
        for n in [1, 2, 3, 8] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap();
            let mut y = vec![0f32; t * rows];
            pool.install(|| matmul(&mut y, &m, &x, t));
            assert_eq!(bits(&y), bits(&want), "matmul, kind {kind}, {n} threads");
            let mut yv = vec![0f32; rows];
            pool.install(|| par_matvec(&mut yv, &m, &x[..cols]));
            assert_eq!(
                bits(&yv),
                bits(&want[..rows]),
                "par_matvec, kind {kind}, {n} threads"
            );
        }
    }
}

/// The GEMM panels pad with `−0` weights and `+0` activations: lanes that underflowed to `−0`
/// keep it, so every output is `−0` (as the scalar definition gives).
#[test]
fn gemm_padding_keeps_negative_zero_lanes() {
    for cols in [17usize, 31, 530] {
        let w = vec![-1.0e-30f32; 5 * cols];
        let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        let x = vec![1.0e-30f32; 3 * cols];
        for m in [
            Matrix::f32(5, cols, &w).unwrap(),
            Matrix::bf16(5, cols, &wb).unwrap(),
        ] {
            for level in available_levels() {
                let mut y = vec![1f32; 15];
                matmul_at(level, &mut y, &m, &x, 3);
                assert_eq!(bits(&y), bits(&[-0.0; 15]), "{level:?} cols {cols}");
            }
        }
    }
}

/// The GEMM's per-thread scratch (packed activations, panels, lane states) is reused without
/// clearing: a call after one that left NaN everywhere in it (NaN activations, a larger
/// shape) still equals the per-token mat-vec, on every level, at small and large T and a
/// column count that leaves padding in the last chunk.
#[test]
fn gemm_never_reads_stale_scratch() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for kind in 0..4 {
        let (big_rows, big_cols, big_t) = (64, 1088, 70);
        let big = fixed(kind, big_rows, big_cols);
        let nan = vec![f32::NAN; big_t * big_cols];
        let (rows, cols) = (13, if kind == 2 { 544 } else { 530 });
        let w = fixed(kind, rows, cols);
        let m = w.view(rows, cols);
        for t in [3, 20] {
            let x: Vec<f32> = (0..t * cols).map(|i| (i % 13) as f32 - 6.0).collect();
            let mut want = vec![0f32; t * rows];
            for tok in 0..t {
                matvec(
                    &mut want[tok * rows..][..rows],
                    &m,
                    &x[tok * cols..][..cols],
                );
            }
            for level in available_levels() {
                let mut y = vec![0f32; big_t * big_rows];
                pool.install(|| {
                    matmul_at(level, &mut y, &big.view(big_rows, big_cols), &nan, big_t)
                });
                assert!(
                    y.iter().all(|v| v.is_nan()),
                    "the poisoning call, {level:?}"
                );
                let mut y = vec![0f32; t * rows];
                pool.install(|| matmul_at(level, &mut y, &m, &x, t));
                assert_eq!(bits(&y), bits(&want), "kind {kind}, T {t}, {level:?}");
            }
        }
    }
}

#[test]
fn matmul_of_empty_rows_is_zero() {
    let m = Matrix::f32(3, 0, &[]).unwrap();
    let mut y = vec![1f32; 6];
    matmul(&mut y, &m, &[], 2);
    assert_eq!(bits(&y), bits(&[0.0; 6]));
}

/// `|dot − Σ w·x| ≤ γ(⌈n/16⌉ + 4) · Σ|w·x|` with `γ(k) = k·u / (1 − k·u)`, `u = 2^-24`
/// (plus `n · 2^-149` for underflow): each lane rounds once per element, the tree four times.
#[test]
fn v2_dot_error_is_within_its_bound() {
    for (kind, cols) in [
        (0usize, 7168usize),
        (0, 1000),
        (0, 37),
        (1, 7168),
        (1, 3),
        (2, 3584),
    ] {
        let w = fixed(kind, 4, cols);
        let m = w.view(4, cols);
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 997.0)
            .collect();
        for r in 0..4 {
            let (mut exact, mut mag) = (0f64, 0f64);
            for (c, &xc) in x.iter().enumerate() {
                let p = crate::tmatvec::element(&m, r, c) as f64 * xc as f64;
                exact += p;
                mag += p.abs();
            }
            let k = (cols.div_ceil(16) + 4) as f64;
            let u = 2f64.powi(-24);
            let bound = k * u / (1.0 - k * u) * mag + cols as f64 * 2f64.powi(-149);
            let got = m.row_dot(r, &x) as f64;
            assert!(
                (got - exact).abs() <= bound,
                "kind {kind} cols {cols} row {r}: |{got} - {exact}| > {bound}"
            );
        }
    }
}

/// Q8: `|dot − scale·Σ v·x| ≤ γ(⌈n/16⌉ + 5)·|scale|·Σ|v·x|` (the lanes and tree as above over
/// the exact int8 values, plus the one rounding of the scale multiply).
#[test]
fn q8_dot_error_is_within_its_bound() {
    for cols in [7168usize, 1000, 37, 3] {
        let Owned::Q8(v, s) = fixed(3, 4, cols) else {
            unreachable!()
        };
        let m = Matrix::q8(4, cols, &v, &s).unwrap();
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 997.0)
            .collect();
        for r in 0..4 {
            let (mut exact, mut mag) = (0f64, 0f64);
            for (c, &xc) in x.iter().enumerate() {
                let p = v[r * cols + c] as f64 * s[r] as f64 * xc as f64;
                exact += p;
                mag += p.abs();
            }
            let k = (cols.div_ceil(16) + 5) as f64;
            let u = 2f64.powi(-24);
            let bound = k * u / (1.0 - k * u) * mag + 2f64.powi(-149);
            let got = m.row_dot(r, &x) as f64;
            assert!((got - exact).abs() <= bound, "cols {cols} row {r}");
        }
    }
}

#[test]
fn q8_constructor_checks_the_shape() {
    let (v, s) = (vec![1i8; 6], vec![0.5f32; 2]);
    let m = Matrix::q8(2, 3, &v, &s).unwrap();
    assert_eq!(m.weight_bytes(), 6 + 8);
    assert!(Matrix::q8(3, 2, &v, &s).is_none());
    assert!(Matrix::q8(2, 2, &v, &s).is_none());
    assert!(Matrix::q8(usize::MAX, 2, &v, &s).is_none());
    let mut y = [0f32; 2];
    matvec(&mut y, &m, &[1.0, 2.0, -1.0]);
    assert_eq!(y, [1.0, 1.0]);
}

/// MXFP4 at every token count 1..=40 — the fused tiles (AVX2 T ≤ 8, AVX-512 VBMI T ≤ 24, in
/// near-equal token blocks) and the panel path past them — on ragged rows (not a multiple of
/// any row block) and columns crossing a chunk, equals the scalar definition bit for bit on
/// every level, with scales that include the edges (0, 255 = NaN, overflowing products).
#[test]
fn mxfp4_gemm_equals_scalar_at_every_token_count() {
    let (rows, cols) = (13, 544);
    let Owned::Mx(p, mut s) = fixed(2, rows, cols) else {
        unreachable!("kind 2 is MXFP4")
    };
    for (i, v) in s.iter_mut().enumerate().step_by(23) {
        *v = [0u8, 255, 254, 1][i % 4];
    }
    let m = Matrix::mxfp4(rows, cols, &p, &s).unwrap();
    for t in 1..=40 {
        let x: Vec<f32> = (0..t * cols)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 997.0)
            .collect();
        let want = scalar_bits(&m, &x, t);
        for level in available_levels() {
            let mut y = vec![f32::NAN; t * rows];
            matmul_at(level, &mut y, &m, &x, t);
            assert_eq!(bits(&y), want, "MXFP4 matmul, T {t}, level {level:?}");
        }
    }
}

/// A row view's products are the original rows' row dots, in every storage.
#[test]
fn row_views_keep_their_rows() {
    let (rows, cols) = (11, 64);
    let f: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let b: Vec<bf16> = f.iter().map(|&v| bf16::from_f32(v)).collect();
    let packed: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 37 % 251) as u8).collect();
    let scales: Vec<u8> = (0..rows * cols / GROUP)
        .map(|i| 120 + (i % 9) as u8)
        .collect();
    let q: Vec<i8> = (0..rows * cols).map(|i| (i * 13 % 255) as i8).collect();
    let qs: Vec<f32> = (0..rows).map(|r| 0.01 * (r + 1) as f32).collect();
    let owned = [
        Owned::F32(f.clone()),
        Owned::Bf16(b),
        Owned::Mx(packed, scales),
        Owned::Q8(q, qs),
    ];
    let mats: Vec<Matrix> = owned.iter().map(|o| o.view(rows, cols)).collect();
    let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.11).cos()).collect();
    for m in &mats {
        let view = m.rows(3, 6);
        assert_eq!((view.rows, view.cols), (6, cols));
        let mut y = vec![0f32; 6];
        matvec(&mut y, &view, &x);
        for (i, yi) in y.iter().enumerate() {
            assert_eq!(
                yi.to_bits(),
                m.row_dot(3 + i, &x).to_bits(),
                "{:?} row {i}",
                m.data
            );
        }
    }
}
