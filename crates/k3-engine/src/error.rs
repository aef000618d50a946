//! The engine's error type and its mapping to the documented process exit codes.

use k3_model::ModelError;
use std::path::PathBuf;

/// Process exit code for a usage, configuration or refusal error.
pub const EXIT_USAGE: u8 = 2;
/// Process exit code for a runtime failure.
pub const EXIT_RUNTIME: u8 = 1;
/// Process exit code when a routed expert failed to load: the token ids are unsound.
pub const EXIT_EXPERT: u8 = 4;

/// Everything that can go wrong opening a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The checkpoint's shards or index are unreadable or damaged.
    #[error(transparent)]
    Format(#[from] k3_format::FormatError),
    /// `config.json` is missing keys or has invalid values.
    #[error(transparent)]
    Config(#[from] k3_format::ConfigError),
    /// A tensor the config requires is missing, or has the wrong dtype or shape.
    #[error(transparent)]
    Bind(#[from] k3_format::BindError),
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] k3_model::ModelError),
    /// The tokenizer files are missing or malformed.
    #[error(transparent)]
    Tokenizer(#[from] k3_tokenizer::TokenizerError),
    /// The packed trunk (`--trunk DIR`) is missing, damaged or of another checkpoint.
    #[error(transparent)]
    Pack(#[from] k3_format::PackError),
    /// A DSpark draft checkpoint was refused (docs/DSPARK.md).
    #[error(transparent)]
    Dspark(Box<k3_format::DsparkError>),
    /// The memory plan cannot be made, or does not fit this machine.
    #[error(transparent)]
    Plan(#[from] k3_plan::PlanError),
    /// A streaming store failed (trunk read, expert cache setup).
    #[error(transparent)]
    Store(#[from] k3_store::StoreError),
    /// An operating-system error on a named file.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The model directory itself is unusable.
    #[error("{path}: {what}")]
    ModelDir { path: PathBuf, what: String },
    /// A caller-supplied value is out of range (token id, context length…).
    #[error("{0}")]
    Invalid(String),
}

impl EngineError {
    /// The documented exit code for this error (0 ok, 1 runtime, 2 usage/config/refusal,
    /// 4 expert load failure).
    pub fn exit_code(&self) -> u8 {
        match self {
            EngineError::Format(k3_format::FormatError::Io { .. }) => EXIT_RUNTIME,
            EngineError::Format(_) | EngineError::Config(_) | EngineError::Bind(_) => EXIT_USAGE,
            EngineError::ModelDir { .. } | EngineError::Invalid(_) | EngineError::Plan(_) => {
                EXIT_USAGE
            }
            EngineError::Tokenizer(_) | EngineError::Pack(_) => EXIT_USAGE,
            EngineError::Dspark(_) => EXIT_USAGE, // a wrong or damaged --draft-model DIR
            EngineError::Store(_) | EngineError::Io { .. } => EXIT_RUNTIME,
            EngineError::Model(e) => match e {
                ModelError::Expert { .. } => EXIT_EXPERT,
                ModelError::TokenOutOfRange { .. }
                | ModelError::ContextOverflow { .. }
                | ModelError::NoTokens
                | ModelError::ConfigUnsupported(_) => EXIT_USAGE,
                _ => EXIT_RUNTIME,
            },
        }
    }
}

/// Boxed: its shape refusals carry two shapes and a path, and `EngineError` stays small.
impl From<k3_format::DsparkError> for EngineError {
    fn from(e: k3_format::DsparkError) -> Self {
        EngineError::Dspark(Box::new(e))
    }
}
