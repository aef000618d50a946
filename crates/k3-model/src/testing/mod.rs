//! In-memory weight stores and a deterministic random model (feature `testing`, and unit tests).
//!
//! [`OwnedWeights`] / [`OwnedExperts`] own every tensor and implement the two seams; the
//! expert store can deliver in order, reversed or shuffled, and can be told to fail, so tests
//! can prove arrival order never changes a bit and errors carry the layer and expert.

mod random;

pub use random::{random_model, tiny_config};

use crate::weights::*;
use half::bf16;
use k3_kernels::tmatvec::element;
use k3_kernels::Matrix;
use std::sync::Mutex;

/// splitmix64: a tiny deterministic generator for test weights.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[-a, a)`.
    pub fn uniform(&mut self, a: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * a
    }
    /// `n` values uniform in `[c - a, c + a)`.
    pub fn vec(&mut self, n: usize, c: f32, a: f32) -> Vec<f32> {
        (0..n).map(|_| c + self.uniform(a)).collect()
    }
}

/// An owned matrix in one of the three storages.
#[derive(Clone, Debug)]
pub enum OwnedMatrix {
    /// f32 `[rows][cols]`.
    F32 {
        rows: usize,
        cols: usize,
        data: Vec<f32>,
    },
    /// bf16 `[rows][cols]`.
    Bf16 {
        rows: usize,
        cols: usize,
        data: Vec<bf16>,
    },
    /// MXFP4: packed `[rows][cols/2]`, scales `[rows][cols/32]`.
    Mxfp4 {
        rows: usize,
        cols: usize,
        packed: Vec<u8>,
        scales: Vec<u8>,
    },
}

/// Storage used for randomly generated matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// f32.
    F32,
    /// bf16.
    Bf16,
    /// MXFP4 (`cols % 32 == 0` required).
    Mxfp4,
}

impl OwnedMatrix {
    /// Wraps f32 data (`data.len() == rows·cols`).
    pub fn f32(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * cols, "OwnedMatrix::f32 shape");
        OwnedMatrix::F32 { rows, cols, data }
    }
    /// A random matrix with entries of magnitude about `1/sqrt(cols)`.
    pub fn random(rng: &mut Rng, rows: usize, cols: usize, storage: Storage) -> Self {
        let a = 1.0 / (cols as f32).sqrt();
        match storage {
            Storage::F32 => OwnedMatrix::F32 {
                rows,
                cols,
                data: rng.vec(rows * cols, 0.0, a),
            },
            Storage::Bf16 => {
                let data = (0..rows * cols)
                    .map(|_| bf16::from_f32(rng.uniform(a)))
                    .collect();
                OwnedMatrix::Bf16 { rows, cols, data }
            }
            Storage::Mxfp4 => {
                let packed = (0..rows * cols / 2).map(|_| rng.next_u64() as u8).collect();
                let base = 127 - (2.5 * (cols as f32).sqrt()).log2().round() as i32;
                let scales = (0..rows * cols / 32)
                    .map(|_| (base + (rng.next_u64() % 3) as i32 - 1) as u8)
                    .collect();
                OwnedMatrix::Mxfp4 {
                    rows,
                    cols,
                    packed,
                    scales,
                }
            }
        }
    }
    /// Borrowed view.
    pub fn view(&self) -> Matrix<'_> {
        let m = match self {
            OwnedMatrix::F32 { rows, cols, data } => Matrix::f32(*rows, *cols, data),
            OwnedMatrix::Bf16 { rows, cols, data } => Matrix::bf16(*rows, *cols, data),
            OwnedMatrix::Mxfp4 {
                rows,
                cols,
                packed,
                scales,
            } => Matrix::mxfp4(*rows, *cols, packed, scales),
        };
        m.unwrap_or_else(|| panic!("OwnedMatrix with inconsistent shape"))
    }
    /// Row `r` widened to f32.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        let m = self.view();
        for (c, o) in out.iter_mut().enumerate().take(m.cols) {
            *o = element(&m, r, c);
        }
    }
}

/// Owned KDA weights (fields as in [`KdaWeights`]).
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub struct OwnedKda {
    pub q_proj: OwnedMatrix,
    pub k_proj: OwnedMatrix,
    pub v_proj: OwnedMatrix,
    pub g_proj: OwnedMatrix,
    pub o_proj: OwnedMatrix,
    pub q_conv: Vec<f32>,
    pub k_conv: Vec<f32>,
    pub v_conv: Vec<f32>,
    pub f_a_proj: OwnedMatrix,
    pub f_b_proj: OwnedMatrix,
    pub b_proj: OwnedMatrix,
    pub a_log: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub o_norm: Vec<f32>,
}

impl OwnedKda {
    /// Borrowed view.
    pub fn view(&self) -> KdaWeights<'_> {
        KdaWeights {
            q_proj: self.q_proj.view(),
            k_proj: self.k_proj.view(),
            v_proj: self.v_proj.view(),
            g_proj: self.g_proj.view(),
            o_proj: self.o_proj.view(),
            q_conv: &self.q_conv,
            k_conv: &self.k_conv,
            v_conv: &self.v_conv,
            f_a_proj: self.f_a_proj.view(),
            f_b_proj: self.f_b_proj.view(),
            b_proj: self.b_proj.view(),
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            o_norm: &self.o_norm,
        }
    }
}

/// Owned MLA weights (fields as in [`MlaWeights`]).
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub struct OwnedMla {
    pub q_a_proj: OwnedMatrix,
    pub q_a_norm: Vec<f32>,
    pub q_b_proj: OwnedMatrix,
    pub kv_a_proj: OwnedMatrix,
    pub kv_a_norm: Vec<f32>,
    pub kv_b_proj: OwnedMatrix,
    pub o_proj: OwnedMatrix,
    pub g_proj: Option<OwnedMatrix>,
}

impl OwnedMla {
    /// Borrowed view.
    pub fn view(&self) -> MlaWeights<'_> {
        MlaWeights {
            q_a_proj: self.q_a_proj.view(),
            q_a_norm: &self.q_a_norm,
            q_b_proj: self.q_b_proj.view(),
            kv_a_proj: self.kv_a_proj.view(),
            kv_a_norm: &self.kv_a_norm,
            kv_b_proj: self.kv_b_proj.view(),
            o_proj: self.o_proj.view(),
            g_proj: self.g_proj.as_ref().map(OwnedMatrix::view),
        }
    }
}

/// Owned dense MLP.
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub struct OwnedDense {
    pub gate_proj: OwnedMatrix,
    pub up_proj: OwnedMatrix,
    pub down_proj: OwnedMatrix,
}

/// Owned MoE trunk part.
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub struct OwnedMoe {
    pub router: OwnedMatrix,
    pub router_bias: Vec<f32>,
    pub down_proj: OwnedMatrix,
    pub latent_norm: Vec<f32>,
    pub up_proj: OwnedMatrix,
    pub shared_gate: OwnedMatrix,
    pub shared_up: OwnedMatrix,
    pub shared_down: OwnedMatrix,
}

impl OwnedMoe {
    /// Borrowed view.
    pub fn view(&self) -> MoeWeights<'_> {
        MoeWeights {
            router: self.router.view(),
            router_bias: &self.router_bias,
            down_proj: self.down_proj.view(),
            latent_norm: &self.latent_norm,
            up_proj: self.up_proj.view(),
            shared_gate: self.shared_gate.view(),
            shared_up: self.shared_up.view(),
            shared_down: self.shared_down.view(),
        }
    }
}

/// Owned token mixer.
#[allow(missing_docs)]
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // one per layer, test support
pub enum OwnedAttn {
    Kda(OwnedKda),
    Mla(OwnedMla),
}

/// Owned channel mixer.
#[allow(missing_docs)]
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // one per layer, test support
pub enum OwnedFfn {
    Dense(OwnedDense),
    Moe(OwnedMoe),
}

/// Owned decoder layer (fields as in [`LayerWeights`]).
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub struct OwnedLayer {
    pub input_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub attn_res_norm: Vec<f32>,
    pub attn_res_proj: Vec<f32>,
    pub mlp_res_norm: Vec<f32>,
    pub mlp_res_proj: Vec<f32>,
    pub attn: OwnedAttn,
    pub ffn: OwnedFfn,
}

impl WholeLayer for &OwnedLayer {
    fn view(&self) -> LayerWeights<'_> {
        OwnedLayer::view(self)
    }
}

impl OwnedLayer {
    /// Borrowed view.
    pub fn view(&self) -> LayerWeights<'_> {
        LayerWeights {
            input_norm: &self.input_norm,
            post_attn_norm: &self.post_attn_norm,
            attn_res_norm: &self.attn_res_norm,
            attn_res_proj: &self.attn_res_proj,
            mlp_res_norm: &self.mlp_res_norm,
            mlp_res_proj: &self.mlp_res_proj,
            attn: match &self.attn {
                OwnedAttn::Kda(k) => AttnWeights::Kda(k.view()),
                OwnedAttn::Mla(m) => AttnWeights::Mla(m.view()),
            },
            ffn: match &self.ffn {
                OwnedFfn::Dense(dn) => FfnWeights::Dense(DenseWeights {
                    gate_proj: dn.gate_proj.view(),
                    up_proj: dn.up_proj.view(),
                    down_proj: dn.down_proj.view(),
                }),
                OwnedFfn::Moe(m) => FfnWeights::Moe(m.view()),
            },
        }
    }
}

/// Owned model-level weights.
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub struct OwnedHead {
    pub norm: Vec<f32>,
    pub out_res_norm: Vec<f32>,
    pub out_res_proj: Vec<f32>,
    pub lm_head: OwnedMatrix,
}

/// Every trunk weight in memory; implements [`WeightProvider`].
#[derive(Clone, Debug)]
pub struct OwnedWeights {
    /// `[V][E]` embedding.
    pub embed: OwnedMatrix,
    /// Decoder layers.
    pub layers: Vec<OwnedLayer>,
    /// Model-level weights.
    pub head: OwnedHead,
}

impl WeightProvider for OwnedWeights {
    fn embed_row(&self, id: u32, out: &mut [f32]) -> Result<(), SourceError> {
        if id as usize >= self.embed.view().rows {
            return Err(format!("no embedding row {id}").into());
        }
        self.embed.row_f32(id as usize, out);
        Ok(())
    }
    fn layer(&self, l: usize) -> Result<Box<dyn LayerHold + '_>, SourceError> {
        let layer = self.layers.get(l).ok_or_else(|| format!("no layer {l}"))?;
        Ok(Box::new(Whole(layer)))
    }
    fn head(&self) -> Result<HeadWeights<'_>, SourceError> {
        let h = &self.head;
        Ok(HeadWeights {
            norm: &h.norm,
            out_res_norm: &h.out_res_norm,
            out_res_proj: &h.out_res_proj,
            lm_head: h.lm_head.view(),
        })
    }
}

/// One owned routed expert.
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub struct OwnedExpert {
    pub w1: OwnedMatrix,
    pub w2: OwnedMatrix,
    pub w3: OwnedMatrix,
}

impl OwnedExpert {
    /// The model's view of this expert.
    pub fn view(&self) -> ExpertWeights<'_> {
        ExpertWeights {
            w1: self.w1.view(),
            w2: self.w2.view(),
            w3: self.w3.view(),
        }
    }
}

/// Order in which [`OwnedExperts`] delivers a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// As requested.
    InOrder,
    /// Last requested first.
    Reverse,
    /// A seeded shuffle.
    Shuffled(u64),
}

/// Routed experts in memory; implements [`ExpertProvider`] and logs every fetch.
#[derive(Debug)]
pub struct OwnedExperts {
    /// `experts[layer][e]` (empty for dense layers).
    pub experts: Vec<Vec<OwnedExpert>>,
    /// Delivery order.
    pub arrival: Arrival,
    /// Fail this `(layer, expert)` when it is requested.
    pub fail: Option<(usize, u32)>,
    /// Every fetch: `(layer, requested experts)`.
    pub log: Mutex<Vec<(usize, Vec<u32>)>>,
}

impl OwnedExperts {
    /// A store over `experts` delivering in order.
    pub fn new(experts: Vec<Vec<OwnedExpert>>) -> Self {
        OwnedExperts {
            experts,
            arrival: Arrival::InOrder,
            fail: None,
            log: Mutex::new(Vec::new()),
        }
    }
    /// Clears and returns the fetch log.
    pub fn take_log(&self) -> Vec<(usize, Vec<u32>)> {
        self.log
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }
}

impl ExpertProvider for OwnedExperts {
    fn fetch(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &ExpertWeights<'_>),
    ) -> Result<(), ExpertFetchError> {
        if let Ok(mut log) = self.log.lock() {
            log.push((layer, experts.to_vec()));
        }
        let mut order: Vec<usize> = (0..experts.len()).collect();
        match self.arrival {
            Arrival::InOrder => {}
            Arrival::Reverse => order.reverse(),
            Arrival::Shuffled(seed) => {
                let mut rng = Rng::new(seed ^ layer as u64);
                for i in (1..order.len()).rev() {
                    order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
                }
            }
        }
        for i in order {
            let e = experts[i];
            if self.fail == Some((layer, e)) {
                return Err(ExpertFetchError {
                    expert: e,
                    source: "injected read failure".into(),
                });
            }
            let x = self
                .experts
                .get(layer)
                .and_then(|l| l.get(e as usize))
                .ok_or_else(|| ExpertFetchError {
                    expert: e,
                    source: format!("no expert {e} in layer {layer}").into(),
                })?;
            on_ready(i, &x.view());
        }
        Ok(())
    }
}
