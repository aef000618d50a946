//! The error of k3's own `tanh` (docs/NUMERICS.md#transcendentals) over EVERY finite f32,
//! against the f64 `tanh` of the same input, beside the platform libm's `tanhf`
//! (`f32::tanh`): max error in ulps of the f32 result, and how many results are not the
//! f32 nearest to the f64 value.
//!
//!     cargo run --release -p k3-kernels --example tanh_ulp
use k3_kernels::act::tanh;
use rayon::prelude::*;

/// (max ulps, inputs not rounded to nearest) over the positive patterns `bits`.
fn sweep(bits: std::ops::Range<u32>, f: impl Fn(f32) -> f32 + Sync) -> (f64, u64) {
    bits.into_par_iter()
        .map(|b| {
            let x = f32::from_bits(b);
            let (got, want) = (f(x), (x as f64).tanh());
            let ulp = f32::from_bits(got.to_bits() + 1) as f64 - got as f64;
            let err = (got as f64 - want).abs() / ulp;
            (err, u64::from(got != want as f32))
        })
        .reduce(|| (0.0, 0), |a, b| (a.0.max(b.0), a.1 + b.1))
}

fn main() {
    // tanh is odd in both (k3: a copysign; libm: by construction), so the positive half
    // decides; 0 .. +inf exclusive = every positive finite f32 and +0
    let all = 0..0x7f80_0000u32;
    let (k3_max, k3_off) = sweep(all.clone(), tanh);
    let (libm_max, libm_off) = sweep(all.clone(), f32::tanh);
    let n = all.len();
    println!("inputs: {n} (every positive finite f32; negatives by symmetry)");
    println!("k3 act::tanh: max {k3_max:.4} ulp, {k3_off} not nearest");
    println!("libm tanhf:   max {libm_max:.4} ulp, {libm_off} not nearest");
}
