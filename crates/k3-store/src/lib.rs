//! k3-store: the stores that enforce a [`k3_plan::MemoryPlan`] with real I/O. The planner
//! decides sizes; this crate owns the threads, files and buffers.
//!
//! * [`io`]: positional reads (O_DIRECT when possible), aligned buffers, fault injection.
//! * [`trunk_store`]: pinned trunk layers plus a read-ahead ring for the rest.
//! * [`expert_store`]: the routed-expert cache (slots, policy, batched parallel reads).
//! * [`probe`]: free disk space, peak RSS, measured read rates.
//! * [`available_memory`]: what `/proc/meminfo` and the cgroup files leave to this process.
//!
//! Dependencies point one way: k3-store → k3-plan, never the reverse.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// Untrusted data must never reach an unwrap/expect (docs/RELIABILITY.md); tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod avail;
pub mod expert_store;
pub mod io;
pub mod probe;
mod store_error;
pub mod trunk_store;

pub use avail::{available_memory, available_memory_at, memory_cgroup};
pub use expert_store::{ExpertLoc, ExpertStats, ExpertStore, LocateFn};
pub use io::{
    thp_mode, AlignedBuf, BufferPolicy, Fault, FaultyReader, Prefault, ReadAt, ShardFile,
};
pub use store_error::{ExpertFetchFailure, StoreError};
pub use trunk_store::{LayerBytes, RunDecoder, RunLoc, TrunkStats, TrunkStore};
