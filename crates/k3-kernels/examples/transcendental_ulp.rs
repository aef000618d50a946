//! The error of k3's own `tanh` and `exp` (docs/NUMERICS.md#transcendentals) over EVERY finite
//! f32, against the f64 function of the same input, beside the platform libm's `tanhf` and
//! `expf` (`f32::tanh`, `f32::exp`): max error in ulps of the f32 result, how many results
//! are not the f32 nearest to the f64 value, and how many differ from libm's.
//!
//!     cargo run --release -p k3-kernels --example transcendental_ulp
use k3_kernels::act::{exp, tanh};
use rayon::prelude::*;

/// Sweep totals: (max ulps, results not nearest to the f64 value, results unlike `libm`'s).
type Totals = (f64, u64, u64);

/// [`Totals`] of `f` over the patterns `bits` with `sign` (f64 reference `g`); results the
/// f64 puts below the normal range are measured in subnormal steps.
fn sweep(
    bits: std::ops::Range<u32>,
    sign: f32,
    f: impl Fn(f32) -> f32 + Sync,
    g: impl Fn(f64) -> f64 + Sync,
    libm: impl Fn(f32) -> f32 + Sync,
) -> Totals {
    bits.into_par_iter()
        .map(|b| {
            let x = sign * f32::from_bits(b);
            let (got, want) = (f(x), g(x as f64));
            let mag = got.abs().max(f32::MIN_POSITIVE);
            let ulp = f32::from_bits(mag.to_bits() + 1) as f64 - mag as f64;
            let err = if want.is_finite() && got.is_finite() {
                (got as f64 - want).abs() / ulp
            } else {
                0.0
            };
            let near = u64::from(got != want as f32);
            (err, near, u64::from(got.to_bits() != libm(x).to_bits()))
        })
        .reduce(|| (0.0, 0, 0), |a, b| (a.0.max(b.0), a.1 + b.1, a.2 + b.2))
}

fn print(name: &str, (max, off, unlike): Totals, libm: Totals) {
    println!("{name}: k3 max {max:.4} ulp, {off} not nearest, {unlike} unlike libm's bits");
    println!("{name}: libm max {:.4} ulp, {} not nearest", libm.0, libm.1);
}

fn main() {
    // tanh is odd in both (k3: a copysign; libm: by construction), so the positive half
    // decides; 0 .. +inf exclusive = every positive finite f32 and +0
    let all = 0..0x7f80_0000u32;
    println!("inputs: {} per sign", all.len());
    let k3 = sweep(all.clone(), 1.0, tanh, f64::tanh, f32::tanh);
    let libm = sweep(all.clone(), 1.0, f32::tanh, f64::tanh, f32::tanh);
    print("tanh (positive; negatives by symmetry)", k3, libm);
    for sign in [1.0f32, -1.0] {
        let k3 = sweep(all.clone(), sign, exp, f64::exp, f32::exp);
        let libm = sweep(all.clone(), sign, f32::exp, f64::exp, f32::exp);
        print(&format!("exp (sign {sign:+})"), k3, libm);
    }
}
