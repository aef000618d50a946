//! Errors of binding tensors by their released names.

use crate::dtype::Dtype;
use std::path::PathBuf;

/// Failure to bind the model's tensors or locate a routed expert.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// A required tensor is not in the checkpoint.
    #[error("tensor {tensor:?} is missing from the checkpoint ({count} tensors indexed): incomplete download, or not a Kimi K3 checkpoint")]
    Missing {
        /// The released name looked up.
        tensor: String,
        /// How many tensors the checkpoint holds.
        count: usize,
    },

    /// A tensor's shape disagrees with the config.
    #[error("tensor {tensor:?} has shape {found:?}, expected {expected} from the config: checkpoint and config.json disagree")]
    Shape {
        /// The tensor name.
        tensor: String,
        /// The accepted shape(s), written out.
        expected: String,
        /// The shape found.
        found: Vec<usize>,
    },

    /// A tensor's dtype is not one the engine accepts there.
    #[error("tensor {tensor:?} is {found}, expected {expected}")]
    Dtype {
        /// The tensor name.
        tensor: String,
        /// The accepted dtype(s).
        expected: &'static str,
        /// The dtype found.
        found: Dtype,
    },

    /// An MXFP4 packed/scale pair disagree on rows.
    #[error("expert tensors {packed:?} ({packed_rows} rows) and {scale:?} ({scale_rows} rows) must have the same number of rows")]
    ExpertRows {
        /// The packed tensor.
        packed: String,
        /// Its rows.
        packed_rows: usize,
        /// The scale tensor.
        scale: String,
        /// Its rows.
        scale_rows: usize,
    },

    /// An MXFP4 scale tensor implies a group size other than 32.
    #[error("expert tensors {packed:?} ({packed_cols} packed columns = {logical} values per row) and {scale:?} ({scale_cols} scale columns) imply group size {group}, not 32")]
    ExpertGroup {
        /// The packed tensor.
        packed: String,
        /// Packed columns (two values per byte).
        packed_cols: usize,
        /// Logical values per row.
        logical: usize,
        /// The scale tensor.
        scale: String,
        /// Scale columns.
        scale_cols: usize,
        /// The implied group size, written out (may be fractional).
        group: String,
    },

    /// The six tensors of one expert are not all in one shard.
    #[error("expert {expert} of layer {layer}: {first:?} is in {first_shard} but {other:?} is in {other_shard}: an expert must be in one shard")]
    ExpertShards {
        /// Layer index (zero-based).
        layer: usize,
        /// Expert index.
        expert: usize,
        /// The first tensor.
        first: String,
        /// Its shard file.
        first_shard: PathBuf,
        /// A tensor in another shard.
        other: String,
        /// Its shard file.
        other_shard: PathBuf,
    },

    /// A routed expert was requested that the model does not have.
    #[error("no routed expert {expert} in layer {layer}: {why}")]
    NoSuchExpert {
        /// Layer requested.
        layer: usize,
        /// Expert requested.
        expert: usize,
        /// Why (dense layer, layer or expert out of range).
        why: String,
    },
}
