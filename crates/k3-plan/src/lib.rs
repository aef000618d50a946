//! k3-plan: the pure memory planner of the k3 engine — numbers in, numbers out. It has no
//! threads, opens no files and has no `unsafe`; `k3-store` enforces its plans with real I/O.
//!
//! * [`policy`]: expert-cache replacement policies (LRU, LFU with decay, ARC, per-layer LRU,
//!   Belady OPT for simulation) over `(layer, expert)` keys, and [`SlotTable`], the slot
//!   bookkeeping that enforces pins.
//! * [`forecast`]: the expected expert hit rate of a preset and a token's I/O floor.
//! * [`recommend`]: the budget candidates `k3 doctor` weighs and the one it recommends.
//! * [`cgroup`]: the cgroup memory limit, parsed from texts the caller read.
//! * [`sim`]: replay of recorded expert traces through the policies (`cargo xtask sim-cache`).
//! * [`plan`]: the memory planner (presets, budgets, trunk pinning, expert-cache slots,
//!   the printed plan table, and the refusal when it does not fit). What memory the machine
//!   has is parsed here from texts the caller read ([`Available::from_reader`]).

#![warn(missing_docs)]
#![forbid(unsafe_code)]
// Untrusted data must never reach an unwrap/expect (docs/RELIABILITY.md); tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod cgroup;
pub mod forecast;
pub mod plan;
pub mod policy;
pub mod recommend;
pub mod sim;
mod slots;

pub use plan::{
    Available, Budget, DraftKind, MemoryPlan, ModelSizes, PlanError, PlanRequest, Preset, TrunkPlan,
};
pub use policy::{ExpertKey, KeySpace, PolicyKind, ReplacementPolicy};
pub use slots::{CacheError, Lookup, SlotTable};
