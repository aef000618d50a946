//! The AMX modes against their definition: the emulated tile GEMM equals `def::dot` for
//! every output (tails, odd shapes, MXFP4, 1–3 pieces), whatever the token count and thread
//! count; where AMX runs, the hardware tiles equal the emulation bit for bit, and elsewhere
//! the mode is refused.

use super::def::{self, dot, dot_mxfp4, split, wide, Arith, BLOCK};
use super::*;
use half::bf16;

/// A small deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Mostly moderate values with a spread of exponents; 1 in 32 an extreme or subnormal.
    fn val(&mut self) -> f32 {
        let r = self.next();
        match r % 32 {
            0 => f32::from_bits((r >> 32) as u32 & 0x807F_FFFF), // subnormal or zero
            1 => f32::from_bits(((r >> 32) as u32 & 0x8FFF_FFFF) | 0x3000_0000),
            _ => {
                let m = ((r >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0;
                (m * 2f64.powi((r >> 5) as i32 % 12 - 6)) as f32
            }
        }
    }
}

struct Case {
    rows: usize,
    cols: usize,
    t: usize,
    w: Vec<bf16>,
    packed: Vec<u8>,
    scales: Vec<u8>,
    x: Vec<f32>,
}

fn case(rng: &mut Rng, rows: usize, cols: usize, t: usize) -> Case {
    let w = (0..rows * cols)
        .map(|_| bf16::from_f32(rng.val()))
        .collect();
    let mx_cols = cols / 32 * 32;
    let packed = (0..rows * mx_cols / 2).map(|_| rng.next() as u8).collect();
    // Released scales sit near 127; a few edge scales (0 = subnormal, 255 = zero).
    let scales = (0..rows * mx_cols / 32)
        .map(|_| match rng.next() % 16 {
            0 => [0u8, 255, 1, 250][(rng.next() % 4) as usize],
            _ => 112 + (rng.next() % 24) as u8,
        })
        .collect();
    let x = (0..t * cols).map(|_| rng.val()).collect();
    Case {
        rows,
        cols,
        t,
        w,
        packed,
        scales,
        x,
    }
}

fn defined<const P: usize>(c: &Case, mx: bool) -> Vec<f32> {
    let (rows, cols) = (c.rows, if mx { c.cols / 32 * 32 } else { c.cols });
    let mut y = vec![0.0; c.t * rows];
    for tok in 0..c.t {
        let x = &c.x[tok * c.cols..tok * c.cols + cols];
        for r in 0..rows {
            y[tok * rows + r] = if mx {
                dot_mxfp4::<P>(
                    &c.packed[r * cols / 2..(r + 1) * cols / 2],
                    &c.scales[r * cols / 32..(r + 1) * cols / 32],
                    x,
                )
            } else {
                let bits: &[u16] = bytemuck::cast_slice(&c.w[r * cols..(r + 1) * cols]);
                dot::<P>(bits, x)
            };
        }
    }
    y
}

fn run(backend: Backend, pieces: usize, c: &Case, mx: bool) -> Vec<f32> {
    let cols = if mx { c.cols / 32 * 32 } else { c.cols };
    let x: Vec<f32> = (0..c.t)
        .flat_map(|tok| c.x[tok * c.cols..tok * c.cols + cols].to_vec())
        .collect();
    let w = if mx {
        Matrix::mxfp4(c.rows, cols, &c.packed, &c.scales)
    } else {
        Matrix::bf16(c.rows, cols, &c.w)
    };
    let w = w.unwrap();
    let mut y = vec![f32::NAN; c.t * c.rows];
    matmul_with(backend, pieces, &mut y, &w, &x, c.t);
    y
}

fn same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (p, q)) in a.iter().zip(b).enumerate() {
        assert!(
            p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
            "{what}: output {i}: {p:e} vs {q:e}"
        );
    }
}

const SHAPES: [(usize, usize, usize); 6] = [
    (1, 1, 1),
    (33, 64, 17),
    (32, 96, 32),
    (17, 70, 3),
    (48, 32, 40),
    (5, 200, 1),
];

#[test]
fn emulated_tiles_equal_the_definition() {
    let mut rng = Rng(7);
    for &(rows, cols, t) in &SHAPES {
        let c = case(&mut rng, rows, cols, t);
        for mx in [false, true] {
            let what = format!("{rows}x{cols} T {t} mx {mx}");
            same_bits(&run(Backend::Emu, 1, &c, mx), &defined::<1>(&c, mx), &what);
            same_bits(&run(Backend::Emu, 2, &c, mx), &defined::<2>(&c, mx), &what);
            same_bits(&run(Backend::Emu, 3, &c, mx), &defined::<3>(&c, mx), &what);
        }
    }
}

#[test]
fn tokens_and_threads_change_no_bit() {
    let mut rng = Rng(11);
    let c = case(&mut rng, 40, 100, 37);
    let all = run(Backend::Emu, 3, &c, false);
    for tok in [0, 15, 16, 36] {
        let one = Case {
            t: 1,
            x: c.x[tok * 100..(tok + 1) * 100].to_vec(),
            w: c.w.clone(),
            packed: vec![],
            scales: vec![],
            ..c
        };
        same_bits(
            &run(Backend::Emu, 3, &one, false),
            &all[tok * 40..(tok + 1) * 40],
            "T 1 vs T 37",
        );
    }
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        same_bits(
            &pool.install(|| run(Backend::Emu, 3, &c, false)),
            &all,
            "threads",
        );
    }
}

#[test]
fn three_pieces_are_exact_for_normal_values() {
    let mut rng = Rng(3);
    for _ in 0..100_000 {
        let x = rng.val();
        let p = split::<3>(x);
        if x.is_normal() && p.iter().all(|&b| wide(b) == 0.0 || wide(b).is_normal()) {
            let sum = wide(p[0]) as f64 + wide(p[1]) as f64 + wide(p[2]) as f64;
            assert_eq!(sum, x as f64, "{x:e} -> {p:?}");
        }
        let two = split::<2>(x);
        assert_eq!(two, [p[0], p[1]], "pieces are prefixes");
    }
    assert_eq!(split::<3>(f32::INFINITY), [0x7F80, 0, 0]);
    assert_eq!(
        split::<3>(f32::MAX)[0],
        0x7F7F,
        "truncation never rounds up to inf"
    );
    assert!(wide(split::<3>(f32::NAN)[0]).is_nan());
}

/// `|dot − Σ w·x| ≤ γ(⌈n/32⌉·P + 18)·Σ|w·x|`: each product reaches the result through at
/// most 16 chain roundings, the pair sum and one accumulator update per later instruction.
#[test]
fn three_pieces_stay_within_the_error_bound() {
    let mut rng = Rng(5);
    for cols in [32usize, 512, 7168] {
        for _ in 0..20 {
            let w: Vec<u16> = (0..cols)
                .map(|_| bf16::from_f32((rng.val() * 4.0).clamp(-8.0, 8.0)).to_bits())
                .collect();
            let x: Vec<f32> = (0..cols).map(|_| rng.val()).collect();
            let got = dot::<3>(&w, &x) as f64;
            let terms = w
                .iter()
                .zip(&x)
                .map(|(&a, &b)| def::flush(wide(a)) as f64 * b as f64);
            let (exact, abs) = terms.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()));
            let k = (cols.div_ceil(BLOCK) * 3 + 18) as f64;
            let u = 2f64.powi(-24);
            let bound = k * u / (1.0 - k * u) * abs + cols as f64 * 2f64.powi(-126);
            assert!(
                (got - exact).abs() <= bound,
                "cols {cols}: {got:e} vs {exact:e} (bound {bound:e})"
            );
        }
    }
}

#[test]
fn the_arithmetic_models_differ_where_the_probe_needs_them_to() {
    // c = 1, products 2^-24 (even) and 2^-24 (odd): Sdm sums them first (2^-23, kept),
    // a single FMA chain loses each half-ulp to round-to-even.
    let one = bf16::from_f32(1.0).to_bits();
    let tiny = bf16::from_f32(2f32.powi(-24)).to_bits();
    let (mut a, mut b) = ([0u16; BLOCK], [0u16; BLOCK]);
    (a[0], b[0], a[1], b[1]) = (tiny, one, tiny, one);
    assert_eq!(def::instr(Arith::Sdm, 1.0, &a, &b), 1.0 + 2f32.powi(-23));
    assert_eq!(def::instr(Arith::EvenFirst, 1.0, &a, &b), 1.0);
    assert_eq!(def::instr(Arith::Fused, 1.0, &a, &b), 1.0 + 2f32.powi(-23));
}

#[test]
fn amx_tiles_equal_the_emulation_or_the_mode_is_refused() {
    if !amx_usable() {
        let err = set_numerics(Numerics::FAST).unwrap_err();
        assert!(
            matches!(
                err,
                NumericsError::NoAmx { .. } | NumericsError::Refused { .. }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("run without --numerics"), "{err}");
        assert_eq!(numerics(), Numerics::V2);
        return;
    }
    let mut rng = Rng(13);
    for &(rows, cols, t) in SHAPES.iter().chain(&[(64, 1024, 64), (96, 7168, 33)]) {
        let c = case(&mut rng, rows, cols, t);
        for mx in [false, true] {
            for pieces in 1..=3 {
                let what = format!("AMX {rows}x{cols} T {t} mx {mx} P {pieces}");
                same_bits(
                    &run(Backend::Amx, pieces, &c, mx),
                    &run(Backend::Emu, pieces, &c, mx),
                    &what,
                );
            }
        }
    }
}
