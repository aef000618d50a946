//! k3-plan: memory planning for the k3 engine.
//!
//! * [`policy`]: expert-cache replacement policies (LRU, LFU with decay, ARC, per-layer LRU,
//!   Belady OPT for simulation) over `(layer, expert)` keys, and [`SlotTable`], the slot
//!   bookkeeping that enforces pins.
//! * [`sim`]: replay of recorded expert traces through the policies (`cargo xtask sim-cache`).
//! * [`plan`]: the memory planner (presets, budgets, trunk pinning, expert-cache slots,
//!   the printed plan table, and the refusal when it does not fit).
//! * [`io`]: positional reads (O_DIRECT when possible), aligned buffers, fault injection.
//! * [`trunk_store`]: pinned trunk layers plus a read-ahead ring for the rest.
//! * [`expert_store`]: the routed-expert cache (slots, policy, batched parallel reads).

#![warn(missing_docs)]
// Untrusted data must never reach an unwrap/expect (docs/RELIABILITY.md); tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod expert_store;
pub mod io;
pub mod plan;
pub mod policy;
pub mod sim;
mod slots;
mod store_error;
pub mod trunk_store;

pub use expert_store::{ExpertLoc, ExpertStats, ExpertStore, LocateFn};
pub use io::{AlignedBuf, Fault, FaultyReader, ReadAt, ShardFile};
pub use plan::{
    available_memory, Available, Budget, MemoryPlan, ModelSizes, PlanError, PlanRequest, Preset,
    TrunkPlan,
};
pub use policy::{ExpertKey, KeySpace, PolicyKind, ReplacementPolicy};
pub use slots::{CacheError, Lookup, SlotTable};
pub use store_error::{ExpertFetchFailure, StoreError};
pub use trunk_store::{LayerBytes, RunLoc, TrunkStats, TrunkStore};
