//! Errors of the trunk and expert stores.

use std::io;
use std::path::PathBuf;

/// Errors of [`TrunkStore`](crate::TrunkStore) and [`ExpertStore`](crate::ExpertStore).
/// Every message names the file, the layer or expert, the offset and the length involved.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A read failed (I/O error, end of file, injected fault).
    #[error("reading {what}: {len} bytes at offset {offset} of {}: {source}", path.display())]
    Read {
        /// What was being read: `trunk layer 7`, `expert 12 of layer 3`.
        what: String,
        /// The file.
        path: PathBuf,
        /// Absolute byte offset in the file.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A byte location does not fit its file or its slot.
    #[error("{what}: {reason}")]
    Layout {
        /// The trunk layer or expert concerned.
        what: String,
        /// What is wrong (with file, offset and length).
        reason: String,
    },
    /// A compressed trunk run did not decode (damaged chunk): nothing of it is used.
    #[error("decoding {what}: {reason}")]
    Decode {
        /// The unit: `trunk layer L` or `trunk layer L piece P`.
        what: String,
        /// The decoder's message (naming the chunk).
        reason: String,
    },
    /// The store was built with arguments that cannot work.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// A layer index past the model.
    #[error("trunk layer {layer} does not exist (the trunk has {layers} layers)")]
    LayerOutOfRange {
        /// Requested layer.
        layer: usize,
        /// Layers in the store.
        layers: usize,
    },
    /// Every ring slot is held by a live [`LayerBytes`](crate::trunk_store::LayerBytes)
    /// guard, so unit `what` has nowhere to go (drop the previous guard first).
    #[error("{what}: all {slots} ring slots of its class are held by live layer guards")]
    RingBusy {
        /// The unit asked for: `trunk layer L` or `trunk layer L piece P`.
        what: String,
        /// Ring slots.
        slots: usize,
    },
    /// The locator could not place an expert.
    #[error("cannot locate expert {expert} of layer {layer}: {message}")]
    Locate {
        /// Layer.
        layer: usize,
        /// Expert.
        expert: u32,
        /// The locator's message.
        message: String,
    },
    /// The expert key lies outside the cache's key space, or the table refused it.
    #[error(transparent)]
    Cache(#[from] k3_plan::CacheError),
    /// An I/O thread could not be started.
    #[error("cannot start an I/O thread: {0}")]
    Spawn(#[source] io::Error),
    /// The I/O pool stopped (a thread panicked); no read can complete.
    #[error("the I/O thread pool stopped while {0} was being read")]
    IoPoolGone(String),
}

/// A routed expert could not be made available: the token being computed is unsound (the
/// CLI exits 4 after its report, as upstream does when `k3_expert_drops` is non-zero).
#[derive(Debug, thiserror::Error)]
#[error("routed expert {expert} of layer {layer} failed to load: {error}")]
pub struct ExpertFetchFailure {
    /// Layer of the failed expert.
    pub layer: usize,
    /// The failed expert.
    pub expert: u32,
    /// Why.
    #[source]
    pub error: StoreError,
}
