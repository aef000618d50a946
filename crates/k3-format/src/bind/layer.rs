//! The per-tensor rules of docs/MODEL.md#binding-rules and the binder that applies them.

use super::{
    AttnTensors, BindError, DenseTensors, FfnTensors, GlobalTensors, KdaTensors, LayerTensors,
    MlaTensors, MoeTensors, TensorRef, LM_HEAD, LM_PREFIX,
};
use crate::config::K3Config;
use crate::dtype::Dtype;
use crate::index::Checkpoint;

/// Accepted dtype family.
#[derive(Clone, Copy)]
enum Kind {
    /// BF16 or F32.
    Matrix,
    /// BF16, F16 or F32.
    Vector,
}

impl Kind {
    fn accepts(self, d: Dtype) -> bool {
        match self {
            Kind::Matrix => matches!(d, Dtype::BF16 | Dtype::F32),
            Kind::Vector => matches!(d, Dtype::BF16 | Dtype::F16 | Dtype::F32),
        }
    }
    fn expected(self) -> &'static str {
        match self {
            Kind::Matrix => "BF16 or F32 (matrix)",
            Kind::Vector => "BF16, F16 or F32 (vector)",
        }
    }
}

/// Accepted shape.
#[derive(Clone, Copy)]
enum Rule {
    /// `[a, b]`.
    Mat(usize, usize),
    /// `[n]`.
    Vec(usize),
    /// `[1, n]` or `[n]` (res_proj rows).
    Row(usize),
    /// `[p, 1, k]` or `[p, k]` (depthwise conv taps).
    Conv(usize, usize),
    /// `[d]` with `d >= n` (A_log: a per-head prefix is used).
    VecAtLeast(usize),
}

impl Rule {
    fn accepts(self, s: &[usize]) -> bool {
        match self {
            Rule::Mat(a, b) => s == [a, b],
            Rule::Vec(n) => s == [n],
            Rule::Row(n) => s == [1, n] || s == [n],
            Rule::Conv(p, k) => s == [p, 1, k] || s == [p, k],
            Rule::VecAtLeast(n) => s.len() == 1 && s[0] >= n,
        }
    }
    fn describe(self) -> String {
        match self {
            Rule::Mat(a, b) => format!("[{a}, {b}]"),
            Rule::Vec(n) => format!("[{n}]"),
            Rule::Row(n) => format!("[1, {n}] or [{n}]"),
            Rule::Conv(p, k) => format!("[{p}, 1, {k}] or [{p}, {k}]"),
            Rule::VecAtLeast(n) => format!("[D] with D >= {n}"),
        }
    }
}

/// The tensor a binder error names (for the placeholder of a collecting binder).
fn bound_name(e: &BindError) -> String {
    match e {
        BindError::Missing { tensor, .. }
        | BindError::Shape { tensor, .. }
        | BindError::Dtype { tensor, .. } => tensor.clone(),
        _ => String::new(),
    }
}

/// Applies the rules to one checkpoint and config.
pub(super) struct Binder<'a> {
    pub ck: &'a Checkpoint,
    pub cfg: &'a K3Config,
    /// When set, every problem is pushed here and binding goes on with a placeholder, so one
    /// pass reports all of them (`k3 verify`); when `None` the first problem is returned.
    pub sink: Option<&'a std::cell::RefCell<Vec<BindError>>>,
}

impl Binder<'_> {
    fn get(&self, name: String, kind: Kind, rule: Rule) -> Result<TensorRef, BindError> {
        let r = self.check(name, kind, rule);
        match (r, self.sink) {
            (Err(e), Some(sink)) => {
                let name = bound_name(&e);
                sink.borrow_mut().push(e);
                Ok(TensorRef {
                    name,
                    shard: 0,
                    offset: 0,
                    nbytes: 0,
                    dtype: Dtype::U8,
                    shape: Vec::new(),
                })
            }
            (r, _) => r,
        }
    }

    fn check(&self, name: String, kind: Kind, rule: Rule) -> Result<TensorRef, BindError> {
        let Some(v) = self.ck.get(&name) else {
            return Err(BindError::Missing {
                tensor: name,
                count: self.ck.len(),
            });
        };
        if !kind.accepts(v.dtype) {
            return Err(BindError::Dtype {
                tensor: name,
                expected: kind.expected(),
                found: v.dtype,
            });
        }
        if !rule.accepts(v.shape) {
            return Err(BindError::Shape {
                tensor: name,
                expected: rule.describe(),
                found: v.shape.to_vec(),
            });
        }
        Ok(TensorRef::from_view(&v))
    }

    fn mat(&self, name: String, a: usize, b: usize) -> Result<TensorRef, BindError> {
        self.get(name, Kind::Matrix, Rule::Mat(a, b))
    }

    fn vec(&self, name: String, rule: Rule) -> Result<TensorRef, BindError> {
        self.get(name, Kind::Vector, rule)
    }

    /// Model-level tensors.
    pub fn globals(&self) -> Result<GlobalTensors, BindError> {
        let (v, e) = (self.cfg.vocab_size, self.cfg.hidden_size);
        let g = |s: &str| format!("{LM_PREFIX}{s}");
        Ok(GlobalTensors {
            embed_tokens: self.mat(g("embed_tokens.weight"), v, e)?,
            norm: self.vec(g("norm.weight"), Rule::Vec(e))?,
            output_attn_res_norm: self.vec(g("output_attn_res_norm.weight"), Rule::Vec(e))?,
            output_attn_res_proj: self.vec(g("output_attn_res_proj.weight"), Rule::Row(e))?,
            lm_head: self.mat(LM_HEAD.to_string(), v, e)?,
        })
    }

    /// Every trunk tensor of layer `l`.
    pub fn layer(&self, l: usize) -> Result<LayerTensors, BindError> {
        let e = self.cfg.hidden_size;
        let n = |s: &str| format!("{LM_PREFIX}layers.{l}.{s}");
        Ok(LayerTensors {
            layer: l,
            input_layernorm: self.vec(n("input_layernorm.weight"), Rule::Vec(e))?,
            post_attention_layernorm: self
                .vec(n("post_attention_layernorm.weight"), Rule::Vec(e))?,
            self_attention_res_norm: self.vec(n("self_attention_res_norm.weight"), Rule::Vec(e))?,
            self_attention_res_proj: self.vec(n("self_attention_res_proj.weight"), Rule::Row(e))?,
            mlp_res_norm: self.vec(n("mlp_res_norm.weight"), Rule::Vec(e))?,
            mlp_res_proj: self.vec(n("mlp_res_proj.weight"), Rule::Row(e))?,
            attn: if self.cfg.is_mla(l) {
                AttnTensors::Mla(self.mla(l)?)
            } else {
                AttnTensors::Kda(self.kda(l)?)
            },
            ffn: if self.cfg.is_dense(l) {
                FfnTensors::Dense(self.dense(l)?)
            } else {
                FfnTensors::Moe(self.moe(l)?)
            },
        })
    }

    fn kda(&self, l: usize) -> Result<KdaTensors, BindError> {
        let c = self.cfg;
        let (e, h, d, p, k) = (
            c.hidden_size,
            c.kda_num_heads,
            c.kda_head_dim,
            c.kda_proj(),
            c.short_conv_kernel_size,
        );
        let n = |s: &str| format!("{LM_PREFIX}layers.{l}.self_attn.{s}");
        Ok(KdaTensors {
            q_proj: self.mat(n("q_proj.weight"), p, e)?,
            k_proj: self.mat(n("k_proj.weight"), p, e)?,
            v_proj: self.mat(n("v_proj.weight"), p, e)?,
            g_proj: self.mat(n("g_proj.weight"), p, e)?,
            o_proj: self.mat(n("o_proj.weight"), e, p)?,
            q_conv1d: self.vec(n("q_conv1d.weight"), Rule::Conv(p, k))?,
            k_conv1d: self.vec(n("k_conv1d.weight"), Rule::Conv(p, k))?,
            v_conv1d: self.vec(n("v_conv1d.weight"), Rule::Conv(p, k))?,
            f_a_proj: self.mat(n("f_a_proj.weight"), d, e)?,
            f_b_proj: self.mat(n("f_b_proj.weight"), p, d)?,
            b_proj: self.mat(n("b_proj.weight"), h, e)?,
            a_log: self.vec(n("A_log"), Rule::VecAtLeast(h))?,
            dt_bias: self.vec(n("dt_bias"), Rule::Vec(p))?,
            o_norm: self.vec(n("o_norm.weight"), Rule::Vec(d))?,
        })
    }

    fn mla(&self, l: usize) -> Result<MlaTensors, BindError> {
        let c = self.cfg;
        let (e, h) = (c.hidden_size, c.num_attention_heads);
        let n = |s: &str| format!("{LM_PREFIX}layers.{l}.self_attn.{s}");
        let kvd = c.qk_nope_head_dim + c.v_head_dim;
        let g_proj = if c.mla_use_output_gate {
            Some(self.mat(n("g_proj.weight"), h * c.v_head_dim, e)?)
        } else {
            None
        };
        Ok(MlaTensors {
            q_a_proj: self.mat(n("q_a_proj.weight"), c.q_lora_rank, e)?,
            q_a_layernorm: self.vec(n("q_a_layernorm.weight"), Rule::Vec(c.q_lora_rank))?,
            q_b_proj: self.mat(n("q_b_proj.weight"), h * c.mla_qk_head(), c.q_lora_rank)?,
            kv_a_proj_with_mqa: self.mat(n("kv_a_proj_with_mqa.weight"), c.mla_kv_a_width(), e)?,
            kv_a_layernorm: self.vec(n("kv_a_layernorm.weight"), Rule::Vec(c.kv_lora_rank))?,
            kv_b_proj: self.mat(n("kv_b_proj.weight"), h * kvd, c.kv_lora_rank)?,
            o_proj: self.mat(n("o_proj.weight"), e, h * c.v_head_dim)?,
            g_proj,
        })
    }

    fn dense(&self, l: usize) -> Result<DenseTensors, BindError> {
        let (e, di) = (self.cfg.hidden_size, self.cfg.intermediate_size);
        let n = |s: &str| format!("{LM_PREFIX}layers.{l}.mlp.{s}");
        Ok(DenseTensors {
            gate_proj: self.mat(n("gate_proj.weight"), di, e)?,
            up_proj: self.mat(n("up_proj.weight"), di, e)?,
            down_proj: self.mat(n("down_proj.weight"), e, di)?,
        })
    }

    fn moe(&self, l: usize) -> Result<MoeTensors, BindError> {
        let c = self.cfg;
        let (e, ne, lat, si) = (
            c.hidden_size,
            c.num_experts,
            c.routed_expert_hidden_size,
            c.shared_inter(),
        );
        let n = |s: &str| format!("{LM_PREFIX}layers.{l}.block_sparse_moe.{s}");
        Ok(MoeTensors {
            gate: self.mat(n("gate.weight"), ne, e)?,
            e_score_correction_bias: self.vec(n("gate.e_score_correction_bias"), Rule::Vec(ne))?,
            routed_expert_down_proj: self.mat(n("routed_expert_down_proj.weight"), lat, e)?,
            routed_expert_norm: self.vec(n("routed_expert_norm.weight"), Rule::Vec(lat))?,
            routed_expert_up_proj: self.mat(n("routed_expert_up_proj.weight"), e, lat)?,
            shared_gate_proj: self.mat(n("shared_experts.gate_proj.weight"), si, e)?,
            shared_up_proj: self.mat(n("shared_experts.up_proj.weight"), si, e)?,
            shared_down_proj: self.mat(n("shared_experts.down_proj.weight"), e, si)?,
        })
    }
}
