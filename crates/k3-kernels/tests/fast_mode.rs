//! The numeric mode switch (docs/NUMERICS.md#numeric-mode-fast), in a test binary of its own
//! because the mode is process-wide. Where AMX runs: with the mode on, `matvec`,
//! `par_matvec` and `matmul` over bf16 and MXFP4 weights all equal the AMX tile GEMM
//! (`fast::matmul_with`) bit for bit, for every T and thread count, while f32 weights keep
//! contract v2; switching back restores v2's bits. Elsewhere the switch is refused and
//! nothing changes.

use half::bf16;
use k3_kernels::fast::{amx_usable, matmul_with, numerics, set_numerics, Backend, Numerics};
use k3_kernels::{matmul, matvec, par_matvec, Matrix};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            ((i.wrapping_mul(2654435761).wrapping_add(seed) >> 9) as f32 / 4194304.0 - 1.0) * 1.7
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn the_mode_switch_routes_every_product_or_is_refused() {
    let (rows, cols, t) = (70, 96, 21);
    let w: Vec<bf16> = data(rows * cols, 1)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let wf = data(rows * cols, 2);
    let packed: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 37 % 251) as u8).collect();
    let scales: Vec<u8> = (0..rows * cols / 32).map(|i| 118 + (i % 9) as u8).collect();
    let x = data(t * cols, 3);
    let mats = [
        Matrix::bf16(rows, cols, &w).unwrap(),
        Matrix::mxfp4(rows, cols, &packed, &scales).unwrap(),
    ];
    let f32m = Matrix::f32(rows, cols, &wf).unwrap();
    let v2: Vec<Vec<f32>> = mats
        .iter()
        .chain([&f32m])
        .map(|m| {
            let mut y = vec![0.0; t * rows];
            matmul(&mut y, m, &x, t);
            y
        })
        .collect();

    if !amx_usable() {
        assert!(set_numerics(Numerics::FAST).is_err());
        assert_eq!(numerics(), Numerics::V2, "a refused switch changes nothing");
        let mut y = vec![0.0; t * rows];
        matmul(&mut y, &mats[0], &x, t);
        assert_eq!(bits(&y), bits(&v2[0]));
        return;
    }
    set_numerics(Numerics::FAST).unwrap();
    assert_eq!(numerics(), Numerics::FAST);
    for (m, v2y) in mats.iter().zip(&v2) {
        let mut want = vec![0.0; t * rows];
        matmul_with(Backend::Amx, 3, &mut want, m, &x, t);
        assert_ne!(bits(&want), bits(v2y), "the mode's bits are not v2's");
        let mut y = vec![0.0; t * rows];
        matmul(&mut y, m, &x, t);
        assert_eq!(bits(&y), bits(&want), "matmul");
        for threads in [1, 2, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut y = vec![0.0; t * rows];
            pool.install(|| matmul(&mut y, m, &x, t));
            assert_eq!(bits(&y), bits(&want), "matmul, {threads} threads");
        }
        for tok in [0, 7, 20] {
            let xt = &x[tok * cols..(tok + 1) * cols];
            let (mut a, mut b) = (vec![0.0; rows], vec![0.0; rows]);
            matvec(&mut a, m, xt);
            par_matvec(&mut b, m, xt);
            assert_eq!(
                bits(&a),
                bits(&want[tok * rows..(tok + 1) * rows]),
                "matvec token {tok}"
            );
            assert_eq!(bits(&b), bits(&a), "par_matvec token {tok}");
        }
    }
    let mut y = vec![0.0; t * rows];
    matmul(&mut y, &f32m, &x, t);
    assert_eq!(bits(&y), bits(&v2[2]), "f32 weights keep contract v2");
    set_numerics(Numerics::V2).unwrap();
    matmul(&mut y, &mats[0], &x, t);
    assert_eq!(bits(&y), bits(&v2[0]), "back to v2");
}
