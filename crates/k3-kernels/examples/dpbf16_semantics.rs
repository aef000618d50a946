//! What AVX512_BF16's `vdpbf16ps` computes on this CPU, against contract v2's per-element
//! fused multiply-adds (docs/NUMERICS.md#avx512_bf16-and-amx). Not a kernel: a measurement
//! that decides whether the instruction could serve the row dot.
//!
//! `cargo run --release -p k3-kernels --example dpbf16_semantics [SAMPLES]`
//!
//! Each sample is one lane: an f32 accumulator `c` and two bf16 pairs `(a0, a1)`, `(b0, b1)`
//! (element 0 in the low half of the dword). The instruction's result is compared bit for
//! bit with candidate models built from `f32::mul_add` (one rounding each):
//! `even_then_odd` = `fma(a1, b1, fma(a0, b0, c))` — what contract v2 does to a lane that
//! takes two elements in ascending order; `odd_then_even` = `fma(a0, b0, fma(a1, b1, c))`;
//! and `one_rounding` = `c + a0·b0 + a1·b1` rounded once (f64 sum, exact for these
//! operands unless it underflows). Each model is also tried with subnormal inputs and every
//! subnormal step result flushed to ±0 (DAZ + FTZ).

#[cfg(target_arch = "x86_64")]
fn main() {
    if !std::arch::is_x86_feature_detected!("avx512bf16") {
        eprintln!("this CPU has no AVX512_BF16: nothing to measure");
        std::process::exit(2);
    }
    let samples: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1 << 20);
    x86::run(samples);
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("vdpbf16ps is an x86-64 instruction");
    std::process::exit(2);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// xorshift64*: reproducible bit patterns without a dependency.
    struct Bits(u64);

    impl Bits {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        /// A finite bf16 whose exponent is drawn from `lo ..= hi` (biased), or a subnormal
        /// one in 1 of 16 draws.
        fn bf16(&mut self, lo: u16, hi: u16) -> u16 {
            let r = self.next();
            let sign = ((r >> 63) as u16) << 15;
            let mant = (r & 0x7f) as u16;
            if r >> 8 & 15 == 0 {
                return sign | mant.max(1);
            }
            let exp = lo + ((r >> 16) as u16) % (hi - lo + 1);
            sign | exp << 7 | mant
        }
    }

    fn wide(b: u16) -> f32 {
        f32::from_bits((b as u32) << 16)
    }

    fn daz(v: f32) -> f32 {
        if v.is_subnormal() {
            0.0f32.copysign(v)
        } else {
            v
        }
    }

    /// One lane of `vdpbf16ps` over 16 lanes of samples.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn dpbf16(c: &[f32; 16], a: &[u32; 16], b: &[u32; 16]) -> [f32; 16] {
        let mut out = [0f32; 16];
        // SAFETY: 16 elements each; the caller checked the CPU.
        unsafe {
            let acc = _mm512_loadu_ps(c.as_ptr());
            let av: __m512bh = std::mem::transmute(_mm512_loadu_si512(a.as_ptr().cast()));
            let bv: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.as_ptr().cast()));
            _mm512_storeu_ps(out.as_mut_ptr(), _mm512_dpbf16_ps(acc, av, bv));
        }
        out
    }

    /// What happens to subnormal operands and step results.
    type Flush = fn(f32) -> f32;

    /// A model of one lane: `(c, a, b, flush)`, `flush` applied to every rounded step.
    type Model = fn(f32, [f32; 2], [f32; 2], Flush) -> f32;

    const MODELS: [(&str, Model); 3] = [
        ("even_then_odd", |c, a, b, f| {
            f(a[1].mul_add(b[1], f(a[0].mul_add(b[0], c))))
        }),
        ("odd_then_even", |c, a, b, f| {
            f(a[0].mul_add(b[0], f(a[1].mul_add(b[1], c))))
        }),
        ("one_rounding", |c, a, b, f| {
            f((c as f64 + a[0] as f64 * b[0] as f64 + a[1] as f64 * b[1] as f64) as f32)
        }),
    ];

    /// How subnormals are treated: not at all; inputs and every step's result flushed to ±0.
    const FLUSH: [(&str, Flush); 2] = [("plain", |v| v), ("DAZ+FTZ", daz)];

    pub fn run(samples: usize) {
        let mut rng = Bits(0x9E37_79B9_7F4A_7C15);
        // [model][plain, DAZ+FTZ]
        let mut hits = [[0usize; 2]; 3];
        let mut first_miss: [[Option<String>; 2]; 3] = Default::default();
        let mut n = 0;
        while n < samples {
            // Exponents near each other so the two products and `c` overlap and round;
            // the wide draws (1 ..= 254) reach underflow and overflow.
            let (lo, hi) = if n % 4 == 0 { (1, 254) } else { (120, 134) };
            let a: [u32; 16] =
                std::array::from_fn(|_| rng.bf16(lo, hi) as u32 | (rng.bf16(lo, hi) as u32) << 16);
            let b: [u32; 16] =
                std::array::from_fn(|_| rng.bf16(lo, hi) as u32 | (rng.bf16(lo, hi) as u32) << 16);
            let c: [f32; 16] = std::array::from_fn(|_| {
                let h = rng.bf16(lo.max(100), hi.min(160)) as u32;
                f32::from_bits(h << 16 | (rng.next() as u32 & 0xffff))
            });
            // SAFETY: `main` checked AVX512_BF16 (which implies AVX-512F).
            let got = unsafe { dpbf16(&c, &a, &b) };
            for l in 0..16 {
                let pa = [wide(a[l] as u16), wide((a[l] >> 16) as u16)];
                let pb = [wide(b[l] as u16), wide((b[l] >> 16) as u16)];
                for (m, (_, model)) in MODELS.iter().enumerate() {
                    for (k, (_, fl)) in FLUSH.iter().enumerate() {
                        let want = model(fl(c[l]), pa.map(fl), pb.map(fl), *fl);
                        let same = want.to_bits() == got[l].to_bits()
                            || (want.is_nan() && got[l].is_nan());
                        if same {
                            hits[m][k] += 1;
                        } else if first_miss[m][k].is_none() {
                            first_miss[m][k] = Some(format!(
                                "c {:e} a {:e},{:e} b {:e},{:e}: got {:e}, model {:e}",
                                c[l], pa[0], pa[1], pb[0], pb[1], got[l], want
                            ));
                        }
                    }
                }
            }
            n += 16;
        }
        println!("vdpbf16ps on {n} lanes, bit-identical results per model:");
        for (m, (name, _)) in MODELS.iter().enumerate() {
            for (k, (how, _)) in FLUSH.iter().enumerate() {
                println!(
                    "  {name:14} {how:8} {:7.3} % {}",
                    100.0 * hits[m][k] as f64 / n as f64,
                    first_miss[m][k]
                        .as_deref()
                        .map_or(String::new(), |s| format!("(first miss: {s})"))
                );
            }
        }
    }
}
