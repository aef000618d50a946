//! Errors of the forward pass.

use crate::weights::SourceError;

/// Everything that can stop a forward pass. After any error except [`ModelError::TokenOutOfRange`],
/// [`ModelError::ContextOverflow`], [`ModelError::StateMismatch`] and [`ModelError::NoTokens`]
/// (which are detected before any state is touched), the [`crate::State`] is poisoned and must be
/// [`reset`](crate::State::reset) before reuse.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The trunk weight store failed (`layer` is `None` for the embedding and the head).
    #[error("weights of {}: {source}", layer_name(*.layer))]
    Weights {
        /// Zero-based layer, or `None` for model-level weights.
        layer: Option<usize>,
        /// The store's error.
        #[source]
        source: SourceError,
    },
    /// A routed expert could not be made available (the CLI maps this to exit code 4).
    #[error("routed expert {expert} of layer {layer}: {source}")]
    Expert {
        /// Zero-based layer.
        layer: usize,
        /// Expert id within the layer.
        expert: u32,
        /// The store's error.
        #[source]
        source: SourceError,
    },
    /// A weight tensor handed over by a store has the wrong shape for the config.
    #[error("weights of {}: {what} has shape {got}, the config implies {want}", layer_name(*.layer))]
    Shape {
        /// Zero-based layer, or `None` for model-level weights.
        layer: Option<usize>,
        /// Which tensor.
        what: &'static str,
        /// Shape received.
        got: String,
        /// Shape expected.
        want: String,
    },
    /// A token id is not below the vocabulary size.
    #[error("token id {id} at input index {index} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// Its index in the call's token slice.
        index: usize,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The call would write positions at or beyond the session's `max_ctx`.
    #[error("context overflow: {pos} cached + {tokens} new tokens exceed max_ctx {max_ctx}")]
    ContextOverflow {
        /// Positions already in the session.
        pos: usize,
        /// Tokens in this call.
        tokens: usize,
        /// Capacity of the session.
        max_ctx: usize,
    },
    /// The config describes a model this build cannot run.
    #[error("unsupported config: {0}")]
    ConfigUnsupported(String),
    /// The state was built for a different model geometry.
    #[error("session state does not match the model: {0}")]
    StateMismatch(String),
    /// An earlier forward failed half-way; the state must be reset.
    #[error("session state is poisoned by an earlier failed forward; reset it")]
    StatePoisoned,
    /// `forward` was called with no tokens.
    #[error("forward called with no tokens")]
    NoTokens,
    /// A collective across ranks failed (docs/DISTRIBUTED.md#faults): names the rank.
    #[error("distributed: {0}")]
    Dist(CommError),
}

fn layer_name(layer: Option<usize>) -> String {
    match layer {
        Some(l) => format!("layer {l}"),
        None => "the model head/embedding".to_string(),
    }
}

/// Builds a [`ModelError::Shape`] unless `got == want`.
pub(crate) fn check_shape(
    layer: Option<usize>,
    what: &'static str,
    got: (usize, usize),
    want: (usize, usize),
) -> Result<(), ModelError> {
    if got == want {
        Ok(())
    } else {
        Err(ModelError::Shape {
            layer,
            what,
            got: format!("[{}, {}]", got.0, got.1),
            want: format!("[{}, {}]", want.0, want.1),
        })
    }
}

/// [`check_shape`] for vectors.
pub(crate) fn check_len(
    layer: Option<usize>,
    what: &'static str,
    got: usize,
    want: usize,
) -> Result<(), ModelError> {
    check_shape(layer, what, (got, 1), (want, 1))
}

/// A collective failed: a rank aborted, died, timed out or disagreed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommError {
    /// Rank `rank` gave up (its error is `reason`); every other rank stops with this.
    #[error("rank {rank} failed: {reason}")]
    Aborted {
        /// The rank that failed first.
        rank: usize,
        /// What it reported.
        reason: String,
    },
    /// A collective got inconsistent contributions (a caller's bug or mismatched ranks).
    #[error("collective mismatch: {0}")]
    Mismatch(String),
    /// The transport itself failed.
    #[error("transport: {0}")]
    Transport(String),
}

impl From<CommError> for ModelError {
    fn from(e: CommError) -> Self {
        ModelError::Dist(e)
    }
}
