//! Validation rules of docs/MODEL.md#config-validation (plus positivity of every dimension), each a clear error
//! naming the key and the value.

use super::error::ConfigError;
use super::load::{as_integer, show};
use serde_json::Value;

/// Most experts one token may select (upstream `K3_MAX_TOPK`).
pub const MAX_TOPK: usize = 64;

/// Checks `value >= min` for the integer field `key` and converts it.
pub(super) fn at_least(
    source: &str,
    key: &'static str,
    value: i64,
    min: i64,
) -> Result<usize, ConfigError> {
    if value < min {
        return Err(ConfigError::NonPositive {
            source_name: source.to_string(),
            key,
            value,
            min,
        });
    }
    usize::try_from(value).map_err(|_| ConfigError::NonPositive {
        source_name: source.to_string(),
        key,
        value,
        min,
    })
}

/// Validates the ONE-based `full_attn_layers` entries against `layers` (rules 2 and 3).
pub(super) fn layer_map(
    source: &str,
    list: &[Value],
    layers: usize,
) -> Result<Vec<usize>, ConfigError> {
    let mut out: Vec<usize> = Vec::with_capacity(list.len());
    for (index, v) in list.iter().enumerate() {
        let not_number = || ConfigError::LayerEntryNotNumber {
            source_name: source.to_string(),
            index,
            found: show(v),
        };
        if !v.is_number() {
            return Err(not_number());
        }
        let value = as_integer(v).ok_or_else(not_number)?;
        if value < 1 || value > layers as i64 {
            return Err(ConfigError::LayerIndexOutOfRange {
                source_name: source.to_string(),
                index,
                value,
                layers,
            });
        }
        let value = value as usize;
        if let Some(first) = out.iter().position(|&x| x == value) {
            return Err(ConfigError::DuplicateLayerEntry {
                source_name: source.to_string(),
                index,
                value,
                first,
            });
        }
        out.push(value);
    }
    if out.len() >= layers {
        return Err(ConfigError::AllFullAttention {
            source_name: source.to_string(),
            marked: out.len(),
            layers,
        });
    }
    Ok(out)
}

/// Rules 4 and 5: top-k within the build limit and within the expert count.
pub(super) fn topk(source: &str, topk: usize, experts: usize) -> Result<(), ConfigError> {
    if topk > MAX_TOPK {
        return Err(ConfigError::TopkTooLarge {
            source_name: source.to_string(),
            topk,
            max: MAX_TOPK,
        });
    }
    if topk > experts {
        return Err(ConfigError::TopkExceedsExperts {
            source_name: source.to_string(),
            topk,
            experts,
        });
    }
    Ok(())
}

/// Rule 6: `attn_res_block_size >= 1`.
pub(super) fn block(source: &str, value: i64) -> Result<usize, ConfigError> {
    if value < 1 {
        return Err(ConfigError::AttnResBlock {
            source_name: source.to_string(),
            value,
        });
    }
    Ok(value as usize)
}

/// Rule 7: `short_conv_kernel_size >= 1`.
pub(super) fn conv_kernel(source: &str, value: i64) -> Result<usize, ConfigError> {
    if value < 1 {
        return Err(ConfigError::ConvKernel {
            source_name: source.to_string(),
            value,
        });
    }
    Ok(value as usize)
}

/// Float fields: finite, and strictly positive where `positive`.
pub(super) fn float(
    source: &str,
    key: &'static str,
    value: f64,
    positive: bool,
) -> Result<f64, ConfigError> {
    let bad = |why| ConfigError::BadFloat {
        source_name: source.to_string(),
        key,
        value,
        why,
    };
    if !value.is_finite() {
        return Err(bad("is not a finite number"));
    }
    if positive && value <= 0.0 {
        return Err(bad("must be greater than 0"));
    }
    Ok(value)
}
