//! A DSpark draft's `config.json` (docs/DSPARK.md#configjson), checked against the target.

use super::rope::{self, DraftRope};
use super::DsparkError;
use crate::K3Config;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Which target hidden stream the draft reads (docs/DSPARK.md#taps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapStream {
    /// The tapped layer's output (its running attention-residual block), before any norm.
    Prefix,
    /// The AttnRes mixture the next consumer of that output reads, before any norm.
    AttnRes,
}

/// MLP activation of the draft layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DraftAct {
    /// `silu(gate) · up`.
    Silu,
    /// SiTU-GLU with betas `b1` (gate) and `b2` (up), as the target's dense MLP.
    Situ {
        /// `activation_situ_beta`.
        b1: f32,
        /// `activation_situ_linear_beta`.
        b2: f32,
    },
}

/// The fields of a DSpark `config.json` the forward reads.
#[derive(Clone, Debug, PartialEq)]
pub struct DsparkConfig {
    /// Draft width (= the target's hidden size).
    pub hidden_size: usize,
    /// Dense MLP width.
    pub intermediate_size: usize,
    /// Draft layers.
    pub num_hidden_layers: usize,
    /// MLA heads.
    pub num_attention_heads: usize,
    /// Query LoRA rank.
    pub q_lora_rank: usize,
    /// Latent KV width.
    pub kv_lora_rank: usize,
    /// Per-head no-position query/key width.
    pub qk_nope_head_dim: usize,
    /// RoPE slot width (even).
    pub qk_rope_head_dim: usize,
    /// Per-head value width.
    pub v_head_dim: usize,
    /// Vocabulary (= the target's).
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Plain RoPE or DeepSeek YaRN (docs/DSPARK.md#rope).
    pub rope: DraftRope,
    /// Per-tap RMSNorm (`fc_norm.{i}.weight`) before `context_proj`.
    pub fc_norm: bool,
    /// Tapped target layers (0-based), in concatenation order.
    pub target_layer_ids: Vec<usize>,
    /// Which hidden stream is tapped.
    pub stream: TapStream,
    /// Id of the mask token that fills the block.
    pub mask_token_id: u32,
    /// Query rows per pass (= drafts per pass).
    pub block_size: usize,
    /// Markov head rank.
    pub markov_rank: usize,
    /// Confidence head present.
    pub confidence_head: bool,
    /// The confidence head's input includes the Markov embedding.
    pub confidence_with_markov: bool,
    /// MLP activation.
    pub act: DraftAct,
}

/// Longest block k3 accepts (the published drafts use 7; a verifying pass also carries the
/// owed tokens, and the speculative loop caps custom drafts at 16).
pub const MAX_BLOCK: usize = 16;

/// Reads keys of one JSON object, each error naming the file and the key.
pub(super) struct Keys<'a> {
    file: &'a Path,
    pub(super) root: &'a Map<String, Value>,
}

impl Keys<'_> {
    pub(super) fn err(&self, key: &str, detail: impl Into<String>) -> DsparkError {
        DsparkError::Config {
            file: self.file.to_path_buf(),
            key: key.to_string(),
            detail: detail.into(),
        }
    }
    fn uint(&self, key: &str) -> Result<usize, DsparkError> {
        match self.root.get(key) {
            None => Err(self.err(key, "missing")),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| self.err(key, format!("{v} is not a non-negative integer"))),
        }
    }
    fn positive(&self, key: &str) -> Result<usize, DsparkError> {
        match self.uint(key)? {
            0 => Err(self.err(key, "must be at least 1")),
            n => Ok(n),
        }
    }
    pub(super) fn float(&self, key: &str) -> Result<f64, DsparkError> {
        let v = self.root.get(key).ok_or_else(|| self.err(key, "missing"))?;
        v.as_f64()
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| self.err(key, format!("{v} is not a positive number")))
    }
    fn flag(&self, key: &str) -> Result<bool, DsparkError> {
        match self.root.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.err(key, format!("{v} is not true or false"))),
        }
    }
    fn text(&self, key: &str) -> Result<Option<&str>, DsparkError> {
        match self.root.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(key, format!("{v} is not a string"))),
        }
    }
}

impl DsparkConfig {
    /// Reads `path` (a draft's config.json) and checks it against the target's config.
    pub fn load(path: &Path, target: &K3Config) -> Result<DsparkConfig, DsparkError> {
        let text = std::fs::read_to_string(path).map_err(|source| DsparkError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| DsparkError::Config {
            file: path.to_path_buf(),
            key: "(document)".into(),
            detail: format!("not JSON: {e}"),
        })?;
        let root = value.as_object().ok_or_else(|| DsparkError::Config {
            file: path.to_path_buf(),
            key: "(document)".into(),
            detail: "not a JSON object".into(),
        })?;
        let cfg = Self::parse(&Keys { file: path, root })?;
        cfg.check_target(&Keys { file: path, root }, target)?;
        Ok(cfg)
    }

    fn parse(k: &Keys<'_>) -> Result<DsparkConfig, DsparkError> {
        refuse_unsupported(k)?;
        let ids = match k.root.get("target_layer_ids") {
            Some(Value::Array(a)) if !a.is_empty() => a
                .iter()
                .map(|v| v.as_u64().and_then(|n| usize::try_from(n).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| k.err("target_layer_ids", "holds a non-integer"))?,
            Some(v) => {
                return Err(k.err("target_layer_ids", format!("{v} is not a non-empty list")))
            }
            None => return Err(k.err("target_layer_ids", "missing")),
        };
        let stream = match k.text("aux_hidden_stream")? {
            None | Some("prefix") => TapStream::Prefix,
            Some("attn_res") => TapStream::AttnRes,
            Some(s) => {
                return Err(k.err(
                    "aux_hidden_stream",
                    format!("{s:?} is not \"prefix\" or \"attn_res\""),
                ))
            }
        };
        let act = match k.text("hidden_act")? {
            None | Some("silu") => DraftAct::Silu,
            Some("situ") => DraftAct::Situ {
                b1: k.float("activation_situ_beta")? as f32,
                b2: k.float("activation_situ_linear_beta")? as f32,
            },
            Some(s) => {
                return Err(k.err("hidden_act", format!("{s:?} is not \"silu\" or \"situ\"")))
            }
        };
        let block_size = k.positive("block_size")?;
        if block_size > MAX_BLOCK {
            return Err(k.err("block_size", format!("{block_size} is above {MAX_BLOCK}")));
        }
        let rope = k.positive("qk_rope_head_dim")?;
        if rope % 2 == 1 {
            return Err(k.err(
                "qk_rope_head_dim",
                format!("{rope} is odd: RoPE turns pairs"),
            ));
        }
        let confidence_head = k.flag("enable_confidence_head")?;
        let (rope_kind, rope_theta) = rope::parse(k)?;
        Ok(DsparkConfig {
            hidden_size: k.positive("hidden_size")?,
            intermediate_size: k.positive("intermediate_size")?,
            num_hidden_layers: k.positive("num_hidden_layers")?,
            num_attention_heads: k.positive("num_attention_heads")?,
            q_lora_rank: k.positive("q_lora_rank")?,
            kv_lora_rank: k.positive("kv_lora_rank")?,
            qk_nope_head_dim: k.positive("qk_nope_head_dim")?,
            qk_rope_head_dim: rope,
            v_head_dim: k.positive("v_head_dim")?,
            vocab_size: k.positive("vocab_size")?,
            rms_norm_eps: k.float("rms_norm_eps")?,
            rope_theta,
            rope: rope_kind,
            fc_norm: k.flag("fc_norm")?,
            target_layer_ids: ids,
            stream,
            mask_token_id: u32::try_from(k.uint("mask_token_id")?)
                .map_err(|_| k.err("mask_token_id", "above 2^32"))?,
            block_size,
            markov_rank: k.positive("markov_rank")?,
            confidence_head,
            confidence_with_markov: confidence_head && k.flag("confidence_head_with_markov")?,
            act,
        })
    }

    fn check_target(&self, k: &Keys<'_>, t: &K3Config) -> Result<(), DsparkError> {
        let mismatch = |key: &str, draft: usize, target: usize, what: &str| DsparkError::Target {
            file: k.file.to_path_buf(),
            key: key.to_string(),
            draft,
            target,
            what: what.to_string(),
        };
        if self.hidden_size != t.hidden_size {
            return Err(mismatch(
                "hidden_size",
                self.hidden_size,
                t.hidden_size,
                "hidden size",
            ));
        }
        let target_hidden = k.uint("target_hidden_size").unwrap_or(self.hidden_size);
        if target_hidden != t.hidden_size {
            return Err(mismatch(
                "target_hidden_size",
                target_hidden,
                t.hidden_size,
                "hidden size",
            ));
        }
        if self.vocab_size != t.vocab_size {
            return Err(mismatch(
                "vocab_size",
                self.vocab_size,
                t.vocab_size,
                "vocabulary",
            ));
        }
        if let Ok(dv) = k.uint("draft_vocab_size") {
            if dv != t.vocab_size {
                return Err(mismatch(
                    "draft_vocab_size",
                    dv,
                    t.vocab_size,
                    "vocabulary (reduced draft vocabularies are not supported)",
                ));
            }
        }
        if let Ok(layers) = k.uint("target_num_hidden_layers") {
            if layers != t.num_hidden_layers {
                return Err(mismatch(
                    "target_num_hidden_layers",
                    layers,
                    t.num_hidden_layers,
                    "layer count",
                ));
            }
        }
        let n_taps = self.target_layer_ids.len();
        if let Ok(n) = k.uint("num_target_layers") {
            if n != n_taps {
                return Err(k.err(
                    "num_target_layers",
                    format!("{n} but target_layer_ids lists {n_taps}"),
                ));
            }
        }
        let out_of_range =
            |key: &str, value: usize, limit: usize, what: &str| DsparkError::OutOfRange {
                file: k.file.to_path_buf(),
                key: key.to_string(),
                value,
                limit,
                what: what.to_string(),
            };
        if let Some(&id) = self
            .target_layer_ids
            .iter()
            .find(|&&id| id >= t.num_hidden_layers)
        {
            return Err(out_of_range(
                "target_layer_ids",
                id,
                t.num_hidden_layers,
                "layers (0-based ids)",
            ));
        }
        if self.mask_token_id as usize >= t.vocab_size {
            return Err(out_of_range(
                "mask_token_id",
                self.mask_token_id as usize,
                t.vocab_size,
                "token ids",
            ));
        }
        Ok(())
    }

    /// Floats per position of one layer's context latent KV (`kv_lora + rope`).
    pub fn kv_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// Published fields whose non-default values k3 does not run (each refused by name).
///
/// `mla_use_output_gate` and `mla_use_nope` are accepted whatever their value: vLLM's K3
/// DSpark layer (NVIDIA, AMD and the common module) builds its MLA with RoPE and without the
/// output gate regardless, and a draft config copied from the target carries both as `true`
/// (a `g_proj` tensor is still refused as unexpected).
fn refuse_unsupported(k: &Keys<'_>) -> Result<(), DsparkError> {
    k.flag("mla_use_output_gate")?;
    k.flag("mla_use_nope")?;
    if let Some(t) = k.text("markov_head_type")? {
        if t != "vanilla" {
            return Err(k.err(
                "markov_head_type",
                format!("{t:?} is not supported (only \"vanilla\")"),
            ));
        }
    }
    Ok(())
}

/// `dir/config.json`.
pub fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}
