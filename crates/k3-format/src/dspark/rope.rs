//! The draft's RoPE as config.json states it (docs/DSPARK.md#rope): plain, or DeepSeek YaRN.
//!
//! Key mapping, as vLLM normalises a config before its K3 MLA builds the rotary embedding:
//! the dictionary is `rope_scaling` (legacy name) or else `rope_parameters`; its type is
//! `rope_type` or the legacy `type` (both present and different is refused); `"default"` is
//! plain RoPE; `"yarn"` and `"deepseek_yarn"` are both run as `deepseek_yarn` (vLLM's K3 MLA
//! turns every non-default type into it); any other type is refused by name.

use super::config::Keys;
use super::DsparkError;
use serde_json::{Map, Value};

/// DeepSeek YaRN parameters (vLLM `DeepseekScalingRotaryEmbedding`), defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    /// `factor`: context extension factor (required).
    pub factor: f64,
    /// `original_max_position_embeddings` (required, in the dictionary or at the top level).
    pub original_max_position_embeddings: f64,
    /// `beta_fast` (default 32): rotations bounding the extrapolated band.
    pub beta_fast: f64,
    /// `beta_slow` (default 1): rotations bounding the interpolated band.
    pub beta_slow: f64,
    /// `mscale` (default 1).
    pub mscale: f64,
    /// `mscale_all_dim` (default 0).
    pub mscale_all_dim: f64,
    /// `extrapolation_factor` (default 1).
    pub extrapolation_factor: f64,
    /// `attn_factor` (default 1).
    pub attn_factor: f64,
}

/// How the draft turns its rope slots.
#[derive(Clone, Debug, PartialEq)]
pub enum DraftRope {
    /// `theta^(−2i/rope)` per pair, unscaled.
    Plain,
    /// DeepSeek YaRN: blended inverse frequencies, cos/sin and softmax scaled.
    Yarn(Yarn),
}

/// Reads the RoPE dictionary and `rope_theta` (docs/DSPARK.md#rope).
pub(super) fn parse(k: &Keys<'_>) -> Result<(DraftRope, f64), DsparkError> {
    let present = |name: &str| k.root.get(name).filter(|v| !v.is_null());
    let (key, dict) = match (present("rope_scaling"), present("rope_parameters")) {
        (Some(v), _) => ("rope_scaling", Some(v)),
        (None, Some(v)) => ("rope_parameters", Some(v)),
        (None, None) => ("rope_scaling", None),
    };
    let dict = match dict {
        None => None,
        Some(Value::Object(o)) => Some(o),
        Some(v) => return Err(k.err(key, format!("{v} is not an object"))),
    };
    let theta = rope_theta(k, key, dict)?;
    let Some(d) = dict else {
        return Ok((DraftRope::Plain, theta));
    };
    let kind = rope_type(k, key, d)?;
    match kind.as_str() {
        "default" => Ok((DraftRope::Plain, theta)),
        "yarn" | "deepseek_yarn" => Ok((DraftRope::Yarn(yarn(k, key, d)?), theta)),
        other => Err(k.err(
            key,
            format!(
                "rope_type {other:?} is not supported (plain RoPE: null or \"default\"; \
                 YaRN: \"yarn\" or \"deepseek_yarn\")"
            ),
        )),
    }
}

fn rope_type(k: &Keys<'_>, key: &str, d: &Map<String, Value>) -> Result<String, DsparkError> {
    let text = |name: &str| match d.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(k.err(key, format!("{name} {v} is not a string"))),
    };
    match (text("rope_type")?, text("type")?) {
        (Some(a), Some(b)) if a != b => Err(k.err(
            key,
            format!("rope_type {a:?} and type {b:?} disagree: give one of them"),
        )),
        (Some(a), _) | (None, Some(a)) => Ok(a),
        (None, None) => Err(k.err(key, "has no rope_type (or type)")),
    }
}

/// `rope_theta`: the top-level key or the dictionary's; both present and different is refused
/// (vLLM with transformers 4 takes the top level, other loaders the dictionary).
fn rope_theta(k: &Keys<'_>, key: &str, d: Option<&Map<String, Value>>) -> Result<f64, DsparkError> {
    let inner = d.and_then(|d| d.get("rope_theta"));
    match (k.root.get("rope_theta"), inner) {
        (None, None) => Err(k.err("rope_theta", "missing")),
        (Some(_), None) => k.float("rope_theta"),
        (None, Some(v)) => positive(k, key, "rope_theta", v),
        (Some(top), Some(v)) => {
            let (a, b) = (k.float("rope_theta")?, positive(k, key, "rope_theta", v)?);
            if a != b {
                return Err(k.err(
                    "rope_theta",
                    format!("{top} but {key}.rope_theta is {v}: give one value"),
                ));
            }
            Ok(a)
        }
    }
}

fn positive(k: &Keys<'_>, key: &str, name: &str, v: &Value) -> Result<f64, DsparkError> {
    v.as_f64()
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| k.err(key, format!("{name} {v} is not a positive number")))
}

fn yarn(k: &Keys<'_>, key: &str, d: &Map<String, Value>) -> Result<Yarn, DsparkError> {
    // Both change only whether the softmax scale takes mscale², and vLLM's NVIDIA
    // (`apply_yarn_scaling`) and AMD (`attention_factor == 1`) K3 paths read different keys.
    for name in ["apply_yarn_scaling", "attention_factor"] {
        if d.get(name).is_some_and(|v| !v.is_null()) {
            return Err(k.err(
                key,
                format!("{name} is not supported (vLLM's K3 paths disagree on it)"),
            ));
        }
    }
    let number = |name: &str, default: Option<f64>| -> Result<f64, DsparkError> {
        match (d.get(name), default) {
            (None | Some(Value::Null), Some(x)) => Ok(x),
            (None | Some(Value::Null), None) => Err(k.err(key, format!("{name} is missing"))),
            (Some(v), _) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| k.err(key, format!("{name} {v} is not a non-negative number"))),
        }
    };
    let factor = number("factor", None)?;
    if factor <= 0.0 {
        return Err(k.err(key, "factor must be above 0"));
    }
    Ok(Yarn {
        factor,
        original_max_position_embeddings: original_max_position(k, key, d)?,
        beta_fast: number("beta_fast", Some(32.0))?,
        beta_slow: number("beta_slow", Some(1.0))?,
        mscale: number("mscale", Some(1.0))?,
        mscale_all_dim: number("mscale_all_dim", Some(0.0))?,
        extrapolation_factor: number("extrapolation_factor", Some(1.0))?,
        attn_factor: number("attn_factor", Some(1.0))?,
    })
}

/// `original_max_position_embeddings`, in the dictionary or at the top level (vLLM copies a
/// top-level value into the dictionary); both present and different is refused.
fn original_max_position(
    k: &Keys<'_>,
    key: &str,
    d: &Map<String, Value>,
) -> Result<f64, DsparkError> {
    const NAME: &str = "original_max_position_embeddings";
    let inner = match d.get(NAME) {
        None | Some(Value::Null) => None,
        Some(v) => Some(positive(k, key, NAME, v)?),
    };
    let top = match k.root.get(NAME) {
        None | Some(Value::Null) => None,
        Some(_) => Some(k.float(NAME)?),
    };
    match (inner, top) {
        (Some(a), Some(b)) if a != b => {
            Err(k.err(NAME, format!("{b} but {key}.{NAME} is {a}: give one value")))
        }
        (Some(a), _) | (None, Some(a)) => Ok(a),
        (None, None) => Err(k.err(key, format!("{NAME} is missing (YaRN needs it)"))),
    }
}
