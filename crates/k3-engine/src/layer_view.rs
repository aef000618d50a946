//! Turning a layer's bound tensors plus "where its bytes are" into the model's
//! [`LayerWeights`]. Every store (resident maps, pinned buffers, ring slots) goes through this
//! one path, so they cannot disagree on how bytes become weights.
//!
//! Matrices are viewed in place when their bytes are aligned for their dtype (bf16: 2, f32: 4)
//! and copied otherwise; vectors are always widened to f32 (they are small).

use crate::EngineError;
use half::bf16;
use k3_format::bind::{AttnTensors, FfnTensors, LayerTensors};
use k3_format::{Dtype, TensorRef};
use k3_kernels::Matrix;
use k3_model::weights::{
    AttnWeights, DenseWeights, ExpertWeights, FfnWeights, KdaWeights, LayerWeights, MlaWeights,
    MoeWeights, SourceError,
};

/// A matrix either viewed in the caller's bytes or held as a copy.
pub(crate) enum Mat {
    /// View `bytes_of(tensor)` in place.
    View { f32: bool, rows: usize, cols: usize },
    OwnedBf16 {
        data: Vec<bf16>,
        rows: usize,
        cols: usize,
    },
    OwnedF32 {
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    },
    /// A draft trunk's per-row int8 matrix (docs/FORMATS.md#draft-trunk), de-interleaved.
    OwnedQ8 {
        values: Vec<i8>,
        scales: Vec<f32>,
        rows: usize,
        cols: usize,
    },
    /// A draft trunk's MXFP4 matrix.
    OwnedMxfp4 {
        packed: Vec<u8>,
        scales: Vec<u8>,
        rows: usize,
        cols: usize,
    },
}

/// The parts of a layer that cannot be viewed in place: widened vectors and copied matrices.
pub(crate) struct PreparedLayer {
    vecs: Vec<Vec<f32>>,
    mats: Vec<Mat>,
}

fn bad(t: &TensorRef, what: impl std::fmt::Display) -> EngineError {
    EngineError::Invalid(format!("tensor {}: {what}", t.name))
}

/// Widens a vector tensor's bytes (BF16, F16, F32, any shape) to f32.
pub(crate) fn widen(t: &TensorRef, bytes: &[u8]) -> Result<Vec<f32>, EngineError> {
    let out: Vec<f32> = match t.dtype {
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        other => {
            return Err(bad(
                t,
                format_args!("dtype {other:?} cannot be widened to f32"),
            ))
        }
    };
    if out.len() != t.numel() {
        return Err(bad(
            t,
            format_args!(
                "{} bytes hold {} values, shape needs {}",
                bytes.len(),
                out.len(),
                t.numel()
            ),
        ));
    }
    Ok(out)
}

/// Decides how a 2-D matrix is accessed given its bytes.
pub(crate) fn prepare_mat(t: &TensorRef, bytes: &[u8]) -> Result<Mat, EngineError> {
    let (rows, cols) = match t.shape.as_slice() {
        [r, c] => (*r, *c),
        _ => {
            return Err(bad(
                t,
                format_args!("expected a 2-D matrix, found shape {:?}", t.shape),
            ))
        }
    };
    let aligned = |a: usize| (bytes.as_ptr() as usize).is_multiple_of(a);
    match t.dtype {
        Dtype::BF16 if aligned(2) => Ok(Mat::View {
            f32: false,
            rows,
            cols,
        }),
        Dtype::BF16 => {
            let data = bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                .collect();
            Ok(Mat::OwnedBf16 { data, rows, cols })
        }
        Dtype::F32 if aligned(4) => Ok(Mat::View {
            f32: true,
            rows,
            cols,
        }),
        _ => Ok(Mat::OwnedF32 {
            data: widen(t, bytes)?,
            rows,
            cols,
        }),
    }
}

/// A layer's vector tensors and matrix tensors, in the order [`view_layer`] consumes them.
pub(crate) fn layer_tensors(lt: &LayerTensors) -> (Vec<&TensorRef>, Vec<&TensorRef>) {
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
            mats.extend([
                &k.q_proj,
                &k.k_proj,
                &k.v_proj,
                &k.g_proj,
                &k.o_proj,
                &k.f_a_proj,
                &k.f_b_proj,
                &k.b_proj,
            ]);
            vecs.extend([
                &k.q_conv1d,
                &k.k_conv1d,
                &k.v_conv1d,
                &k.a_log,
                &k.dt_bias,
                &k.o_norm,
            ]);
        }
        AttnTensors::Mla(m) => {
            mats.extend([
                &m.q_a_proj,
                &m.q_b_proj,
                &m.kv_a_proj_with_mqa,
                &m.kv_b_proj,
                &m.o_proj,
            ]);
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

/// Widens the layer's vectors and decides, per matrix, view-in-place or copy.
pub(crate) fn prepare_layer<'b>(
    lt: &LayerTensors,
    bytes_of: impl Fn(&TensorRef) -> Result<&'b [u8], EngineError>,
) -> Result<PreparedLayer, EngineError> {
    let (vecs, mats) = layer_tensors(lt);
    Ok(PreparedLayer {
        vecs: vecs
            .into_iter()
            .map(|t| widen(t, bytes_of(t)?))
            .collect::<Result<_, _>>()?,
        mats: mats
            .into_iter()
            .map(|t| prepare_mat(t, bytes_of(t)?))
            .collect::<Result<_, _>>()?,
    })
}

/// Prepares the tensors of one piece of a layer (docs/STREAMING.md#trunk-pieces) into
/// `p`: `bytes_of` gives the bytes of the tensors in the bound piece and `None` for the
/// others. Vectors are widened once and kept (a later piece's pass may read them); matrices
/// outside the piece become empty 0×0 stand-ins, viewed over no bytes, so a view never
/// reaches bytes that are not bound.
pub(crate) fn prepare_piece<'b>(
    lt: &LayerTensors,
    p: &mut PreparedLayer,
    bytes_of: impl Fn(&TensorRef) -> Option<&'b [u8]>,
) -> Result<(), EngineError> {
    let (vecs, mats) = layer_tensors(lt);
    p.vecs.resize(vecs.len(), Vec::new());
    for (slot, t) in p.vecs.iter_mut().zip(vecs) {
        if let Some(b) = bytes_of(t) {
            *slot = widen(t, b)?;
        }
    }
    p.mats = mats
        .into_iter()
        .map(|t| match bytes_of(t) {
            Some(b) => prepare_mat(t, b),
            None => Ok(Mat::OwnedF32 {
                data: Vec::new(),
                rows: 0,
                cols: 0,
            }),
        })
        .collect::<Result<_, _>>()?;
    Ok(())
}

/// A layer with nothing prepared yet, for [`prepare_piece`].
pub(crate) fn unprepared() -> PreparedLayer {
    PreparedLayer {
        vecs: Vec::new(),
        mats: Vec::new(),
    }
}

/// The model's view of a matrix prepared by [`prepare_mat`] over `bytes`.
// Infallible: binding checked every tensor's byte length against its shape and `prepare_mat`
// copied any misaligned tensor, so this never sees unvalidated lengths.
#[allow(clippy::expect_used)]
pub(crate) fn matrix<'a>(m: &'a Mat, bytes: &'a [u8]) -> Matrix<'a> {
    let built = match m {
        Mat::View {
            f32: true,
            rows,
            cols,
        } => Matrix::f32(*rows, *cols, bytemuck::cast_slice(bytes)),
        Mat::View {
            f32: false,
            rows,
            cols,
        } => Matrix::bf16(*rows, *cols, bytemuck::cast_slice(bytes)),
        Mat::OwnedBf16 { data, rows, cols } => Matrix::bf16(*rows, *cols, data),
        Mat::OwnedF32 { data, rows, cols } => Matrix::f32(*rows, *cols, data),
        Mat::OwnedQ8 {
            values,
            scales,
            rows,
            cols,
        } => Matrix::q8(*rows, *cols, values, scales),
        Mat::OwnedMxfp4 {
            packed,
            scales,
            rows,
            cols,
        } => Matrix::mxfp4(*rows, *cols, packed, scales),
    };
    // Binding checked every tensor's byte length against its shape.
    built.expect("bound tensor length matches its shape")
}

impl PreparedLayer {
    /// A layer whose vectors and matrices are all owned (a draft trunk's): [`view_layer`]
    /// then needs no bytes.
    pub(crate) fn owned(vecs: Vec<Vec<f32>>, mats: Vec<Mat>) -> Self {
        PreparedLayer { vecs, mats }
    }
}

/// Builds [`LayerWeights`] from a prepared layer; `bytes_of` must return the same bytes that
/// were given to [`prepare_layer`] (same alignment).
pub(crate) fn view_layer<'a>(
    lt: &'a LayerTensors,
    p: &'a PreparedLayer,
    bytes_of: impl Fn(&TensorRef) -> &'a [u8],
) -> LayerWeights<'a> {
    let (_, mat_refs) = layer_tensors(lt);
    let v = |i: usize| p.vecs[i].as_slice();
    let m = |i: usize| matrix(&p.mats[i], bytes_of(mat_refs[i]));
    let (attn, na, nv) = match &lt.attn {
        AttnTensors::Kda(_) => (
            AttnWeights::Kda(KdaWeights {
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
            8,
            12,
        ),
        AttnTensors::Mla(t) => (
            AttnWeights::Mla(MlaWeights {
                q_a_proj: m(0),
                q_b_proj: m(1),
                kv_a_proj: m(2),
                kv_b_proj: m(3),
                o_proj: m(4),
                g_proj: t.g_proj.as_ref().map(|_| m(5)),
                q_a_norm: v(6),
                kv_a_norm: v(7),
            }),
            5 + usize::from(t.g_proj.is_some()),
            8,
        ),
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

/// Builds an expert's three MXFP4 matrices from its six parts (w1p, w1s, w2p, w2s, w3p, w3s);
/// `shapes` are the stored U8 shapes `[rows, cols/2]` of the packed parts.
pub(crate) fn expert_view<'a>(
    shapes: &[[usize; 2]; 6],
    part: impl Fn(usize) -> Result<&'a [u8], SourceError>,
) -> Result<ExpertWeights<'a>, SourceError> {
    let mat = |p: usize| -> Result<Matrix<'a>, SourceError> {
        let [rows, half_cols] = shapes[p];
        Matrix::mxfp4(rows, half_cols * 2, part(p)?, part(p + 1)?).ok_or_else(|| {
            format!(
                "MXFP4 part {p}: byte lengths disagree with shape [{rows}, {}]",
                half_cols * 2
            )
            .into()
        })
    };
    Ok(ExpertWeights {
        w1: mat(0)?,
        w2: mat(2)?,
        w3: mat(4)?,
    })
}
