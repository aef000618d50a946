//! k3-plan: memory planning for the k3 engine.
//!
//! * [`policy`]: expert-cache replacement policies (LRU, LFU with decay, ARC, per-layer LRU,
//!   Belady OPT for simulation) over `(layer, expert)` keys, and [`SlotTable`], the slot
//!   bookkeeping that enforces pins.
//! * [`sim`]: replay of recorded expert traces through the policies (`cargo xtask sim-cache`).
//! * [`plan`]: the memory planner (presets, budgets, trunk pinning, expert-cache slots,
//!   the printed plan table, and the refusal when it does not fit).

#![warn(missing_docs)]

pub mod plan;
pub mod policy;
pub mod sim;
mod slots;

pub use plan::{
    available_memory, Available, Budget, MemoryPlan, ModelSizes, PlanError, PlanRequest, Preset,
    TrunkPlan,
};
pub use policy::{ExpertKey, KeySpace, PolicyKind, ReplacementPolicy};
pub use slots::{CacheError, Lookup, SlotTable};
