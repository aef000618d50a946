//! The resident store: every trunk tensor viewed in place in the memory-mapped shards (copied
//! only when a tensor is unaligned or needs widening), routed experts sliced from the maps.
//! The simplest store, and the one the streaming stores must match bit for bit.

use crate::EngineError;
use half::bf16;
use k3_format::bind::{AttnTensors, FfnTensors, LayerTensors};
use k3_format::{bind_model, Checkpoint, Dtype, ExpertLocation, K3Config, ModelBinding, TensorRef};
use k3_kernels::Matrix;
use k3_model::weights::{
    AttnWeights, DenseWeights, ExpertFetchError, ExpertProvider, ExpertWeights, FfnWeights, HeadWeights, KdaWeights,
    LayerWeights, MlaWeights, MoeWeights, SourceError, WeightProvider,
};
use std::path::Path;

/// A weight matrix: viewed in a shard map, or owned when the bytes could not be viewed.
enum Mat {
    /// bf16 or f32 bytes at `[start, start + len)` of shard `shard`'s map.
    Mapped { shard: usize, start: usize, len: usize, f32: bool, rows: usize, cols: usize },
    /// A copy (unaligned bf16, or F16 widened to f32).
    OwnedBf16 { data: Vec<bf16>, rows: usize, cols: usize },
    OwnedF32 { data: Vec<f32>, rows: usize, cols: usize },
}

/// Owned copies of one layer's small vectors plus handles to its matrices.
struct ResidentLayer {
    vecs: Vec<Vec<f32>>,
    mats: Vec<Mat>,
}

/// Every weight of the model, resident (memory-mapped) — implements both model seams.
pub struct ResidentStore {
    ckpt: Checkpoint,
    binding: ModelBinding,
    layers: Vec<ResidentLayer>,
    head_vecs: Vec<Vec<f32>>,
    lm_head: Mat,
    embed: Mat,
    hidden: usize,
}

fn bad(t: &TensorRef, what: &str) -> EngineError {
    EngineError::Invalid(format!("tensor {}: {what}", t.name))
}

/// Loads a vector tensor (any shape; flattened) widened to f32.
fn load_vec(ck: &Checkpoint, t: &TensorRef) -> Result<Vec<f32>, EngineError> {
    let view = ck.tensor(&t.name)?;
    Ok(view.to_f32_vec()?)
}

/// Maps a 2-D matrix tensor in place when aligned, else copies it.
fn load_mat(ck: &Checkpoint, t: &TensorRef) -> Result<Mat, EngineError> {
    let (rows, cols) = match t.shape.as_slice() {
        [r, c] => (*r, *c),
        _ => return Err(bad(t, &format!("expected a 2-D matrix, found shape {:?}", t.shape))),
    };
    let view = ck.tensor(&t.name)?;
    let start = usize::try_from(t.offset).map_err(|_| bad(t, "offset beyond address space"))?;
    let len = usize::try_from(t.nbytes).map_err(|_| bad(t, "size beyond address space"))?;
    let mapped = |f32| Mat::Mapped { shard: t.shard, start, len, f32, rows, cols };
    match t.dtype {
        Dtype::BF16 if view.as_bf16().is_ok() => Ok(mapped(false)),
        Dtype::BF16 => {
            let data = view.bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]])).collect();
            Ok(Mat::OwnedBf16 { data, rows, cols })
        }
        Dtype::F32 if view.as_f32().is_ok() => Ok(mapped(true)),
        _ => Ok(Mat::OwnedF32 { data: view.to_f32_vec()?, rows, cols }),
    }
}

/// The order in which [`ResidentStore::layer_weights`] reads a layer's vectors and matrices.
fn layer_tensors(lt: &LayerTensors) -> (Vec<&TensorRef>, Vec<&TensorRef>) {
    let mut vecs = vec![
        &lt.input_layernorm,
        &lt.post_attention_layernorm,
        &lt.self_attention_res_norm,
        &lt.self_attention_res_proj,
        &lt.mlp_res_norm,
        &lt.mlp_res_proj,
    ];
    let mut mats = Vec::new();
    match &lt.attn {
        AttnTensors::Kda(k) => {
            mats.extend([&k.q_proj, &k.k_proj, &k.v_proj, &k.g_proj, &k.o_proj, &k.f_a_proj, &k.f_b_proj, &k.b_proj]);
            vecs.extend([&k.q_conv1d, &k.k_conv1d, &k.v_conv1d, &k.a_log, &k.dt_bias, &k.o_norm]);
        }
        AttnTensors::Mla(m) => {
            mats.extend([&m.q_a_proj, &m.q_b_proj, &m.kv_a_proj_with_mqa, &m.kv_b_proj, &m.o_proj]);
            mats.extend(m.g_proj.as_ref());
            vecs.extend([&m.q_a_layernorm, &m.kv_a_layernorm]);
        }
    }
    match &lt.ffn {
        FfnTensors::Dense(d) => mats.extend([&d.gate_proj, &d.up_proj, &d.down_proj]),
        FfnTensors::Moe(m) => {
            mats.extend([
                &m.gate,
                &m.routed_expert_down_proj,
                &m.routed_expert_up_proj,
                &m.shared_gate_proj,
                &m.shared_up_proj,
                &m.shared_down_proj,
            ]);
            vecs.extend([&m.e_score_correction_bias, &m.routed_expert_norm]);
        }
    }
    (vecs, mats)
}

impl ResidentStore {
    /// Indexes the shards in `dir` and binds every tensor `cfg` requires.
    pub fn open(dir: &Path, cfg: &K3Config) -> Result<ResidentStore, EngineError> {
        let ckpt = Checkpoint::open(dir)?;
        let binding = bind_model(&ckpt, cfg)?;
        let mut layers = Vec::with_capacity(binding.layers.len());
        for lt in &binding.layers {
            let (vecs, mats) = layer_tensors(lt);
            layers.push(ResidentLayer {
                vecs: vecs.into_iter().map(|t| load_vec(&ckpt, t)).collect::<Result<_, _>>()?,
                mats: mats.into_iter().map(|t| load_mat(&ckpt, t)).collect::<Result<_, _>>()?,
            });
        }
        let g = &binding.globals;
        let head_vecs = [&g.norm, &g.output_attn_res_norm, &g.output_attn_res_proj]
            .into_iter()
            .map(|t| load_vec(&ckpt, t))
            .collect::<Result<_, _>>()?;
        let lm_head = load_mat(&ckpt, &g.lm_head)?;
        let embed = load_mat(&ckpt, &g.embed_tokens)?;
        Ok(ResidentStore { ckpt, binding, layers, head_vecs, lm_head, embed, hidden: cfg.hidden_size })
    }

    /// The tensor binding (names, shards, offsets) this store was built from.
    pub fn binding(&self) -> &ModelBinding {
        &self.binding
    }

    fn matrix<'a>(&'a self, m: &'a Mat) -> Matrix<'a> {
        let built = match m {
            Mat::Mapped { shard, start, len, f32, rows, cols } => {
                let bytes = &self.ckpt.shards()[*shard].bytes()[*start..*start + *len];
                if *f32 {
                    Matrix::f32(*rows, *cols, bytemuck::cast_slice(bytes))
                } else {
                    Matrix::bf16(*rows, *cols, bytemuck::cast_slice(bytes))
                }
            }
            Mat::OwnedBf16 { data, rows, cols } => Matrix::bf16(*rows, *cols, data),
            Mat::OwnedF32 { data, rows, cols } => Matrix::f32(*rows, *cols, data),
        };
        // Lengths were checked against the shape when the tensor was bound.
        built.expect("bound tensor length matches its shape")
    }

    fn layer_weights(&self, l: usize) -> LayerWeights<'_> {
        let rl = &self.layers[l];
        let lt = &self.binding.layers[l];
        let v = |i: usize| rl.vecs[i].as_slice();
        let m = |i: usize| self.matrix(&rl.mats[i]);
        let attn = match &lt.attn {
            AttnTensors::Kda(_) => AttnWeights::Kda(KdaWeights {
                q_proj: m(0),
                k_proj: m(1),
                v_proj: m(2),
                g_proj: m(3),
                o_proj: m(4),
                f_a_proj: m(5),
                f_b_proj: m(6),
                b_proj: m(7),
                q_conv: v(6),
                k_conv: v(7),
                v_conv: v(8),
                a_log: v(9),
                dt_bias: v(10),
                o_norm: v(11),
            }),
            AttnTensors::Mla(t) => AttnWeights::Mla(MlaWeights {
                q_a_proj: m(0),
                q_b_proj: m(1),
                kv_a_proj: m(2),
                kv_b_proj: m(3),
                o_proj: m(4),
                g_proj: t.g_proj.as_ref().map(|_| m(5)),
                q_a_norm: v(6),
                kv_a_norm: v(7),
            }),
        };
        let na = match &lt.attn {
            AttnTensors::Kda(_) => 8,
            AttnTensors::Mla(t) => 5 + usize::from(t.g_proj.is_some()),
        };
        let nv = match &lt.attn {
            AttnTensors::Kda(_) => 12,
            AttnTensors::Mla(_) => 8,
        };
        let ffn = match &lt.ffn {
            FfnTensors::Dense(_) => FfnWeights::Dense(DenseWeights {
                gate_proj: m(na),
                up_proj: m(na + 1),
                down_proj: m(na + 2),
            }),
            FfnTensors::Moe(_) => FfnWeights::Moe(MoeWeights {
                router: m(na),
                down_proj: m(na + 1),
                up_proj: m(na + 2),
                shared_gate: m(na + 3),
                shared_up: m(na + 4),
                shared_down: m(na + 5),
                router_bias: v(nv),
                latent_norm: v(nv + 1),
            }),
        };
        LayerWeights {
            input_norm: v(0),
            post_attn_norm: v(1),
            attn_res_norm: v(2),
            attn_res_proj: v(3),
            mlp_res_norm: v(4),
            mlp_res_proj: v(5),
            attn,
            ffn,
        }
    }

    /// Slices one expert's six tensors out of the shard map.
    fn expert_weights(&self, loc: &ExpertLocation) -> Result<ExpertWeights<'_>, SourceError> {
        let map = self.ckpt.shards()[loc.shard].bytes();
        let part = |i: usize| -> Result<&[u8], SourceError> {
            let (buf_off, len) = loc.parts[i];
            let file_off = buffer_to_file_offset(&loc.reads, buf_off)
                .ok_or_else(|| format!("expert part {i} at buffer offset {buf_off} is outside its reads"))?;
            let (s, e) = (file_off as usize, (file_off + len) as usize);
            map.get(s..e).ok_or_else(|| format!("expert bytes {s}..{e} beyond the shard").into())
        };
        let mat = |p: usize, s: usize| -> Result<Matrix<'_>, SourceError> {
            let [rows, half_cols] = loc.shapes[p];
            Matrix::mxfp4(rows, half_cols * 2, part(p)?, part(s)?)
                .ok_or_else(|| format!("expert {} of layer {}: MXFP4 shape mismatch", loc.expert, loc.layer).into())
        };
        Ok(ExpertWeights { w1: mat(0, 1)?, w2: mat(2, 3)?, w3: mat(4, 5)? })
    }
}

/// Maps an offset in the concatenation of `reads` back to an absolute file offset.
fn buffer_to_file_offset(reads: &[(u64, u64)], buf_off: u64) -> Option<u64> {
    let mut base = 0u64;
    for &(file_off, len) in reads {
        if buf_off < base + len {
            return Some(file_off + (buf_off - base));
        }
        base += len;
    }
    None
}

impl WeightProvider for ResidentStore {
    fn embed_row(&self, id: u32, out: &mut [f32]) -> Result<(), SourceError> {
        let e = self.matrix(&self.embed);
        let id = id as usize;
        if id >= e.rows || out.len() != self.hidden {
            return Err(format!("embedding row {id} of {} (width {})", e.rows, e.cols).into());
        }
        let c = e.cols;
        match e.data {
            k3_kernels::MatrixData::Bf16(d) => {
                for (o, w) in out.iter_mut().zip(&d[id * c..(id + 1) * c]) {
                    *o = k3_kernels::bf16_to_f32(*w);
                }
            }
            k3_kernels::MatrixData::F32(d) => out.copy_from_slice(&d[id * c..(id + 1) * c]),
            k3_kernels::MatrixData::Mxfp4 { .. } => return Err("MXFP4 embedding is not supported".into()),
        }
        Ok(())
    }

    fn with_layer(&self, l: usize, f: &mut dyn FnMut(&LayerWeights<'_>)) -> Result<(), SourceError> {
        if l >= self.layers.len() {
            return Err(format!("layer {l} does not exist ({} layers)", self.layers.len()).into());
        }
        f(&self.layer_weights(l));
        Ok(())
    }

    fn with_head(&self, f: &mut dyn FnMut(&HeadWeights<'_>)) -> Result<(), SourceError> {
        f(&HeadWeights {
            norm: &self.head_vecs[0],
            out_res_norm: &self.head_vecs[1],
            out_res_proj: &self.head_vecs[2],
            lm_head: self.matrix(&self.lm_head),
        });
        Ok(())
    }
}

impl ExpertProvider for ResidentStore {
    fn fetch(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &ExpertWeights<'_>),
    ) -> Result<(), ExpertFetchError> {
        for (i, &e) in experts.iter().enumerate() {
            let fail = |source: SourceError| ExpertFetchError { expert: e, source };
            let loc = self.binding.expert(layer, e as usize).map_err(|err| fail(err.into()))?;
            on_ready(i, &self.expert_weights(&loc).map_err(fail)?);
        }
        Ok(())
    }
}
