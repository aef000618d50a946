//! The bytes of each synthetic tensor: a SplitMix64 stream per tensor (seeded by the seed and
//! the tensor's name) and the fillers that turn it into BF16 matrices (table or trained-like
//! Gaussian rows), norm gains, F32 vectors and MXFP4 codes with their E8M0 scale.

use super::spec::{MatrixDist, SynthSpec};
use crate::dtype::Dtype;
use crate::writer::TensorSpec;

/// Root-mean-square of a uniformly random E2M1 code: `sqrt(Σ v² / 16)` over the table of
/// docs/MODEL.md#mxfp4 (`sqrt(137 / 16)`).
const E2M1_RMS: f64 = 2.926_174_978_05;

/// SplitMix64 (Steele, Lea & Flood 2014): a tiny, fast, well-mixed 64-bit generator.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    /// Standard normal (Box–Muller; one of the pair is dropped, which keeps the stream
    /// position-independent of chunking).
    pub(crate) fn gauss(&mut self) -> f64 {
        let u1 = ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// The stream of tensor `name` under `seed`.
    pub(crate) fn for_tensor(seed: u64, name: &str) -> SplitMix {
        // FNV-1a of the name, mixed with the seed.
        let h = name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01B3)
        });
        let mut s = SplitMix(seed ^ h.rotate_left(17));
        s.next();
        s
    }
}

/// How one tensor's bytes are produced.
enum Kind {
    /// Uniform random bytes (MXFP4 nibble pairs).
    Bytes,
    /// Every byte the same (an E8M0 scale).
    Const(u8),
    /// BF16 values drawn from a 256-level table (one random byte per element).
    Bf16(Box<[u16; 256]>),
    /// BF16 Gaussian rows of `cols` elements around a tensor scale `std`, each row's scale
    /// log-normal around it ([`MatrixDist::Trained`]).
    Gauss(GaussRows),
    /// F32 values `center + half_width · U[-1, 1)`.
    F32 { center: f32, half_width: f32 },
    /// F32 `A_log`: `ln(1 + h mod 16)` for the first `heads` values, zero padding after.
    ALog { heads: usize },
}

/// Streams one tensor's bytes, chunk by chunk (chunks are multiples of 16 bytes but the last).
pub(super) struct Filler {
    kind: Kind,
    rng: SplitMix,
    /// Elements produced so far (for position-dependent kinds).
    pos: usize,
}

/// E8M0 byte that makes uniformly random E2M1 codes have standard deviation `std`.
fn e8m0_for(std: f64) -> u8 {
    (127.0 + (std / E2M1_RMS).log2()).round().clamp(1.0, 254.0) as u8
}

impl Filler {
    pub(super) fn new(t: &TensorSpec, spec: &SynthSpec) -> Filler {
        let w = &spec.weights;
        let fan_in = t.shape.last().copied().unwrap_or(1).max(1);
        let inv_sqrt = |fan: usize| w.matrix_gain as f64 / (fan as f64).sqrt();
        let n = t.name.as_str();
        let kind = match t.dtype {
            Dtype::U8 if n.ends_with("weight_scale") => {
                Kind::Const(e8m0_for(inv_sqrt(fan_in * 32)))
            }
            Dtype::U8 => Kind::Bytes,
            Dtype::BF16 if t.shape.len() == 1 => table(1.0, w.norm_jitter),
            Dtype::BF16 if n.ends_with("embed_tokens.weight") => {
                table(0.0, w.embed_std * 3f32.sqrt())
            }
            Dtype::BF16 if w.matrices == MatrixDist::Trained => {
                let mut rng = SplitMix::for_tensor(spec.seed ^ 0x7EA1, n);
                let std = inv_sqrt(fan_in) * (TENSOR_OCTAVES * rng.gauss()).exp2();
                Kind::Gauss(GaussRows::new(std, fan_in))
            }
            Dtype::BF16 => table(0.0, (inv_sqrt(fan_in) * 3f64.sqrt()) as f32),
            _ if n.ends_with("A_log") => Kind::ALog {
                heads: spec.config.kda_num_heads,
            },
            _ if n.ends_with("o_norm.weight") => Kind::F32 {
                center: 1.0,
                half_width: w.norm_jitter,
            },
            _ if n.ends_with("conv1d.weight") => Kind::F32 {
                center: 0.0,
                half_width: (3.0 / fan_in as f32).sqrt() * w.matrix_gain,
            },
            _ if n.ends_with("dt_bias") => Kind::F32 {
                center: 0.0,
                half_width: 0.5,
            },
            _ => Kind::F32 {
                center: 0.0,
                half_width: 0.01,
            },
        };
        Filler {
            kind,
            rng: SplitMix::for_tensor(spec.seed, n),
            pos: 0,
        }
    }

    pub(super) fn fill(&mut self, out: &mut [u8]) {
        match &self.kind {
            Kind::Bytes => {
                for c in out.chunks_mut(8) {
                    let r = self.rng.next().to_le_bytes();
                    c.copy_from_slice(&r[..c.len()]);
                }
            }
            Kind::Const(b) => out.fill(*b),
            Kind::Bf16(tab) => {
                for c in out.chunks_mut(16) {
                    let r = self.rng.next().to_le_bytes();
                    for (pair, &k) in c.chunks_exact_mut(2).zip(&r) {
                        pair.copy_from_slice(&tab[k as usize].to_le_bytes());
                    }
                }
            }
            Kind::Gauss(_) => self.fill_gauss(out),
            Kind::F32 { center, half_width } => {
                for c in out.chunks_exact_mut(4) {
                    let v = center + half_width * self.rng.unit();
                    c.copy_from_slice(&v.to_le_bytes());
                }
            }
            Kind::ALog { heads } => {
                for (i, c) in out.chunks_exact_mut(4).enumerate() {
                    let h = self.pos + i;
                    let v = if h < *heads {
                        (1.0 + (h % 16) as f32).ln()
                    } else {
                        0.0
                    };
                    c.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        self.pos += out.len() / 4;
    }
}

/// Spread of a trained-like tensor's scale around the nominal one, in octaves (σ of log2).
const TENSOR_OCTAVES: f64 = 0.25;
/// Spread of a trained-like row's scale around its tensor's, in octaves (σ of log2).
const ROW_OCTAVES: f64 = 0.35;

/// State of a [`Kind::Gauss`] tensor: its scale, row width, the current row's scale and how
/// far into the row the stream is.
struct GaussRows {
    std: f64,
    cols: usize,
    row_std: f32,
    col: usize,
}

impl GaussRows {
    fn new(std: f64, cols: usize) -> GaussRows {
        GaussRows {
            std,
            cols: cols.max(1),
            row_std: 0.0,
            col: 0,
        }
    }
}

impl Filler {
    /// Trained-like BF16 elements: a new row scale at each row start, then Gaussian values.
    fn fill_gauss(&mut self, out: &mut [u8]) {
        let Kind::Gauss(g) = &mut self.kind else {
            return;
        };
        for pair in out.chunks_exact_mut(2) {
            if g.col == 0 {
                g.row_std = (g.std * (ROW_OCTAVES * self.rng.gauss()).exp2()) as f32;
            }
            g.col = (g.col + 1) % g.cols;
            let v = g.row_std * self.rng.gauss() as f32;
            pair.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
        }
    }
}

/// A 256-level BF16 table, uniform over `center ± half_width` (symmetric, mean `center`).
fn table(center: f32, half_width: f32) -> Kind {
    let mut tab = [0u16; 256];
    for (k, v) in tab.iter_mut().enumerate() {
        let u = (k as f32 + 0.5) / 128.0 - 1.0;
        *v = half::bf16::from_f32(center + half_width * u).to_bits();
    }
    Kind::Bf16(Box::new(tab))
}
