//! What AMX's `TDPBF16PS` computes on this CPU, against the candidate arithmetics of
//! `k3_kernels::fast::def::Arith` (docs/NUMERICS.md#numeric-mode-fast). The numeric mode
//! `fast` is defined by one of them (`def::ARITH`); this probe is how it was chosen, and how
//! a new CPU is checked.
//!
//! `cargo run --release -p k3-kernels --example amx_semantics [INSTRUCTIONS]`
//!
//! Each instruction multiplies a random 16 × 32 bf16 tile by a random 16 × 16-pair tile into
//! a random f32 accumulator tile; all 256 outputs are compared bit for bit with every model,
//! in three regimes: exponents overlapping (products within 2^±8 of each other), exponents
//! over the whole range, and cancelling (each odd product near the negated even one).
//! Exit code 0 when the definition's arithmetic matched every output, 1 otherwise, 2 when
//! this machine cannot run AMX.

use k3_kernels::fast::def::{instr, ARITH, ARITHS};
use k3_kernels::fast::one_instruction;

/// xorshift64*: reproducible bit patterns without a dependency.
struct Bits(u64);

impl Bits {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A bf16 with biased exponent in `lo ..= hi`, or (1 in 32) a subnormal or zero.
    fn bf16(&mut self, lo: u16, hi: u16) -> u16 {
        let r = self.next();
        let sign = ((r >> 63) as u16) << 15;
        let mant = (r & 0x7f) as u16;
        if (r >> 8) & 31 == 0 {
            return sign | mant;
        }
        sign | (lo + ((r >> 16) as u16) % (hi - lo + 1)) << 7 | mant
    }
}

#[derive(Clone, Copy, Debug)]
enum Regime {
    Overlapping,
    WholeRange,
    Cancelling,
}

fn tiles(bits: &mut Bits, regime: Regime) -> ([f32; 256], [u16; 512], [u16; 512]) {
    let (lo, hi) = match regime {
        Regime::WholeRange => (1, 254),
        _ => (120, 134),
    };
    let mut a: [u16; 512] = std::array::from_fn(|_| bits.bf16(lo, hi));
    let b: [u16; 512] = std::array::from_fn(|_| bits.bf16(lo, hi));
    if let Regime::Cancelling = regime {
        // Row m's odd element = −(even element) with its last bit flipped: with b's pairs
        // equal, the pair's products nearly cancel.
        for m in 0..16 {
            for k in 0..16 {
                a[m * 32 + 2 * k + 1] = (a[m * 32 + 2 * k] ^ 0x8000) ^ (bits.next() & 1) as u16;
            }
        }
    }
    let b = if let Regime::Cancelling = regime {
        std::array::from_fn(|i| b[i & !1])
    } else {
        b
    };
    let c = std::array::from_fn(|_| {
        let h = bits.bf16(lo.max(100), hi.min(150)) as u32;
        f32::from_bits(h << 16 | (bits.next() as u32 & 0xFFFF))
    });
    (c, a, b)
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(4000);
    let mut bits = Bits(0x9E37_79B9_7F4A_7C15);
    let mut all_matched = true;
    for regime in [Regime::Overlapping, Regime::WholeRange, Regime::Cancelling] {
        let mut hits = [0usize; ARITHS.len()];
        let mut total = 0usize;
        let mut example = None;
        for _ in 0..n {
            let (c0, a, b) = tiles(&mut bits, regime);
            let mut c = c0;
            if let Err(e) = one_instruction(&mut c, &a, &b) {
                eprintln!("{e}");
                std::process::exit(2);
            }
            for m in 0..16 {
                let arow: [u16; 32] = std::array::from_fn(|i| a[m * 32 + i]);
                for col in 0..16 {
                    let bcol: [u16; 32] =
                        std::array::from_fn(|i| b[(i / 2) * 32 + col * 2 + i % 2]);
                    let got = c[m * 16 + col];
                    total += 1;
                    for (h, &arith) in hits.iter_mut().zip(&ARITHS) {
                        let want = instr(arith, c0[m * 16 + col], &arow, &bcol);
                        if want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()) {
                            *h += 1;
                        } else if arith == ARITH && example.is_none() {
                            example = Some((c0[m * 16 + col], got, want));
                        }
                    }
                }
            }
        }
        println!("{regime:?}: {total} outputs");
        for (h, arith) in hits.iter().zip(ARITHS) {
            let mark = if arith == ARITH {
                "  <- the definition (def::ARITH)"
            } else {
                ""
            };
            println!(
                "  {:10} {:8.4} % ({h}){mark}",
                format!("{arith:?}"),
                100.0 * *h as f64 / total as f64
            );
        }
        let def_hits = hits[ARITHS.iter().position(|&a| a == ARITH).unwrap_or(0)];
        if def_hits != total {
            all_matched = false;
            if let Some((c0, got, want)) = example {
                println!(
                    "  first mismatch of {ARITH:?}: c {c0:e}, hardware {got:e}, model {want:e}"
                );
            }
        }
    }
    std::process::exit(if all_matched { 0 } else { 1 });
}
