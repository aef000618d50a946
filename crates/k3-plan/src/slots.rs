//! Slot bookkeeping for the expert cache, shared by the engine's store and the simulator.

use crate::policy::{ExpertKey, KeySpace, Pins, ReplacementPolicy};

const EMPTY: u32 = u32::MAX;

/// Errors of the slot table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheError {
    /// The key is outside the table's key space.
    #[error("expert ({layer}, {expert}) is outside the key space {n_layers} layers x {n_experts} experts", layer = key.layer, expert = key.expert, n_layers = space.n_layers, n_experts = space.n_experts)]
    OutOfRange {
        /// The offending key.
        key: ExpertKey,
        /// The table's key space.
        space: KeySpace,
    },
    /// A miss found no victim: every resident slot is pinned or in flight.
    #[error("all {capacity} expert-cache slots are pinned or in flight; none can be evicted")]
    AllPinned {
        /// Slots in the table.
        capacity: usize,
    },
}

/// Outcome of [`SlotTable::access`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The key was resident in `slot`.
    Hit {
        /// Slot index.
        slot: usize,
    },
    /// The key was not resident; `slot` is now assigned to it (the caller loads it), after
    /// evicting `evicted` if the table was full.
    Miss {
        /// Slot index now owned by the key.
        slot: usize,
        /// The key that lost the slot, if any.
        evicted: Option<ExpertKey>,
    },
}

/// A fixed number of slots, the key in each, pins, and a replacement policy choosing
/// victims. Pin a batch's keys before accessing them (as the engine does for one layer's
/// top-k), so that a miss later in the batch cannot evict an expert the batch still needs.
pub struct SlotTable {
    space: KeySpace,
    slot_of: Vec<u32>,
    key_of: Vec<Option<ExpertKey>>,
    free: Vec<u32>,
    pins: Pins,
    policy: Box<dyn ReplacementPolicy>,
}

impl SlotTable {
    /// An empty table of `capacity` slots over `space`, evicting with `policy`.
    pub fn new(space: KeySpace, capacity: usize, policy: Box<dyn ReplacementPolicy>) -> Self {
        Self {
            space,
            slot_of: vec![EMPTY; space.len()],
            key_of: vec![None; capacity],
            free: (0..capacity as u32).rev().collect(),
            pins: Pins::new(space),
            policy,
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.key_of.len()
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }

    /// The slot holding `key`, if resident.
    pub fn slot_of(&self, key: ExpertKey) -> Option<usize> {
        if !self.space.contains(key) {
            return None;
        }
        let s = self.slot_of[self.space.index(key)];
        (s != EMPTY).then_some(s as usize)
    }

    /// Protects `key` from eviction until a matching [`SlotTable::unpin`].
    pub fn pin(&mut self, key: ExpertKey) -> Result<(), CacheError> {
        self.check(key)?;
        self.pins.pin(key);
        Ok(())
    }

    /// Releases one pin of `key`.
    pub fn unpin(&mut self, key: ExpertKey) -> Result<(), CacheError> {
        self.check(key)?;
        self.pins.unpin(key);
        Ok(())
    }

    /// Requests `key`: a hit, or a miss that assigns it a slot (evicting if full).
    pub fn access(&mut self, key: ExpertKey) -> Result<Lookup, CacheError> {
        self.check(key)?;
        if let Some(slot) = self.slot_of(key) {
            self.policy.on_hit(key);
            return Ok(Lookup::Hit { slot });
        }
        let (slot, evicted) = match self.free.pop() {
            Some(s) => (s as usize, None),
            None => {
                let capacity = self.capacity();
                let victim = self
                    .policy
                    .choose_victim(key, &self.pins)
                    .ok_or(CacheError::AllPinned { capacity })?;
                let vi = self.space.index(victim);
                let s = self.slot_of[vi] as usize;
                debug_assert!(!self.pins.is_pinned(victim));
                self.policy.on_evict(victim);
                self.slot_of[vi] = EMPTY;
                (s, Some(victim))
            }
        };
        self.slot_of[self.space.index(key)] = slot as u32;
        self.key_of[slot] = Some(key);
        self.policy.on_insert(key);
        Ok(Lookup::Miss { slot, evicted })
    }

    /// Drops `key` from the table as if evicted (its slot becomes free); returns that slot,
    /// or `None` when `key` was not resident. The expert store calls it when the read into
    /// the key's slot failed, so nothing half-read stays cached under the key.
    pub fn remove(&mut self, key: ExpertKey) -> Option<usize> {
        let slot = self.slot_of(key)?;
        self.policy.on_evict(key);
        self.slot_of[self.space.index(key)] = EMPTY;
        self.key_of[slot] = None;
        self.free.push(slot as u32);
        Some(slot)
    }

    fn check(&self, key: ExpertKey) -> Result<(), CacheError> {
        if self.space.contains(key) {
            Ok(())
        } else {
            Err(CacheError::OutOfRange {
                key,
                space: self.space,
            })
        }
    }
}
