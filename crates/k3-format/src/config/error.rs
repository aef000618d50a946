//! Errors of `config.json` loading: every message names the file and the key and value.

use std::path::PathBuf;

/// The message appended to a missing-keys report (docs/MODEL.md#config-key-lookup).
pub const REFUSE_DEFAULTS: &str = "refusing to substitute defaults: a config this reader cannot \
fully understand would silently produce a DIFFERENT model";

/// Failure to load or validate a `config.json`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read config: {source}")]
    Io {
        /// The config path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// The text is not JSON.
    #[error("{source_name}: not valid JSON: {detail}")]
    Json {
        /// File name (or other label) of the document.
        source_name: String,
        /// Parser message with line and column.
        detail: String,
    },

    /// The document root is not an object.
    #[error("{source_name}: the config must be a JSON object, found {found}")]
    NotAnObject {
        /// File name of the document.
        source_name: String,
        /// JSON type found.
        found: &'static str,
    },

    /// Required keys are absent (or present with a non-number value); all reported at once.
    #[error("{source_name} is missing {count} required field(s):\n{list}\n{REFUSE_DEFAULTS}")]
    Missing {
        /// File name of the document.
        source_name: String,
        /// How many fields are missing.
        count: usize,
        /// One indented line per field (first 32), with why it counts as missing.
        list: String,
        /// The bare key names, in table order.
        keys: Vec<String>,
    },

    /// An integer field holds a non-integral or out-of-range number.
    #[error("{source_name}: `{key}` = {value} is not an integer (integer fields accept whole numbers such as 96 or 96.0)")]
    NotInteger {
        /// File name of the document.
        source_name: String,
        /// The key as found.
        key: String,
        /// The value as written.
        value: String,
    },

    /// A dimension or count that must be positive (or non-negative) is not.
    #[error("{source_name}: `{key}` = {value} must be at least {min} (non-positive layers/hidden/vocab or other dimension)")]
    NonPositive {
        /// File name of the document.
        source_name: String,
        /// The key.
        key: &'static str,
        /// Its value.
        value: i64,
        /// Smallest accepted value.
        min: i64,
    },

    /// A float field is not finite or out of its domain.
    #[error("{source_name}: `{key}` = {value} {why}")]
    BadFloat {
        /// File name of the document.
        source_name: String,
        /// The key.
        key: &'static str,
        /// Its value.
        value: f64,
        /// What is wrong.
        why: &'static str,
    },

    /// Every layer is marked full attention.
    #[error("{source_name}: full_attn_layers marks {marked} of {layers} layers as full attention, leaving no KDA layers")]
    AllFullAttention {
        /// File name of the document.
        source_name: String,
        /// Entries in the list.
        marked: usize,
        /// `num_hidden_layers`.
        layers: usize,
    },

    /// A layer-map entry is outside `1..=num_hidden_layers`.
    #[error("{source_name}: full_attn_layers[{index}] = {value} is outside 1..{layers} (the list is ONE-based)")]
    LayerIndexOutOfRange {
        /// File name of the document.
        source_name: String,
        /// Position in the list.
        index: usize,
        /// The entry.
        value: i64,
        /// `num_hidden_layers`.
        layers: usize,
    },

    /// A layer-map entry is not a number (or not a whole number).
    #[error("{source_name}: full_attn_layers[{index}] is not a number: found {found} (entries are ONE-based layer numbers)")]
    LayerEntryNotNumber {
        /// File name of the document.
        source_name: String,
        /// Position in the list.
        index: usize,
        /// The JSON value found.
        found: String,
    },

    /// A layer-map entry appears twice.
    #[error("{source_name}: full_attn_layers[{index}] = {value} repeats full_attn_layers[{first}]: each layer may be listed once")]
    DuplicateLayerEntry {
        /// File name of the document.
        source_name: String,
        /// Position of the repeat.
        index: usize,
        /// The repeated layer number.
        value: usize,
        /// Position of the first occurrence.
        first: usize,
    },

    /// `num_experts_per_token` above the supported maximum.
    #[error("{source_name}: num_experts_per_token selects top-{topk}, but this build supports at most {max}")]
    TopkTooLarge {
        /// File name of the document.
        source_name: String,
        /// The value.
        topk: usize,
        /// The maximum.
        max: usize,
    },

    /// `num_experts_per_token` above `num_experts`.
    #[error("{source_name}: num_experts_per_token selects {topk} of {experts} experts")]
    TopkExceedsExperts {
        /// File name of the document.
        source_name: String,
        /// The value.
        topk: usize,
        /// `num_experts`.
        experts: usize,
    },

    /// `attn_res_block_size` is zero (or negative).
    #[error("{source_name}: attn_res_block_size = {value}: layer_idx % {value} would divide by zero or misplace block boundaries; it must be at least 1")]
    AttnResBlock {
        /// File name of the document.
        source_name: String,
        /// The value.
        value: i64,
    },

    /// `short_conv_kernel_size` below 1.
    #[error("{source_name}: has short_conv_kernel_size {value}; the KDA short convolution needs at least 1 tap")]
    ConvKernel {
        /// File name of the document.
        source_name: String,
        /// The value.
        value: i64,
    },

    /// `first_k_dense_replace` beyond the layer count.
    #[error("{source_name}: first_k_dense_replace = {value} exceeds num_hidden_layers = {layers}")]
    FirstDenseTooLarge {
        /// File name of the document.
        source_name: String,
        /// The value.
        value: usize,
        /// `num_hidden_layers`.
        layers: usize,
    },
}
