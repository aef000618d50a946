//! Belady's OPT (MIN): evict the key whose next request lies furthest in the future.

use super::{ExpertKey, KeySpace, Pins, ReplacementPolicy};
use std::collections::BTreeSet;

/// Offline optimal policy. Built from the whole request sequence; the simulator must then
/// call `on_hit`/`on_insert` exactly once per request, in that order. Not usable online.
#[derive(Clone, Debug)]
pub struct Belady {
    space: KeySpace,
    /// For request `i`, the position of the next request of the same key (`usize::MAX`
    /// when never requested again).
    next_use: Vec<usize>,
    /// Next use of each resident key, by dense index.
    resident_next: Vec<usize>,
    /// Resident keys ordered by next use.
    order: BTreeSet<(usize, usize)>,
    pos: usize,
}

impl Belady {
    /// Prepares OPT for `future`, the exact sequence of requests that will be replayed.
    pub fn new(space: KeySpace, future: &[ExpertKey]) -> Self {
        let mut last = vec![usize::MAX; space.len()];
        let mut next_use = vec![usize::MAX; future.len()];
        for (i, k) in future.iter().enumerate().rev() {
            let idx = space.index(*k);
            next_use[i] = last[idx];
            last[idx] = i;
        }
        Self {
            space,
            next_use,
            resident_next: vec![usize::MAX; space.len()],
            order: BTreeSet::new(),
            pos: 0,
        }
    }

    fn touch(&mut self, key: ExpertKey) {
        let idx = self.space.index(key);
        self.order.remove(&(self.resident_next[idx], idx));
        let next = self.next_use.get(self.pos).copied().unwrap_or(usize::MAX);
        self.resident_next[idx] = next;
        self.order.insert((next, idx));
        self.pos += 1;
    }
}

impl ReplacementPolicy for Belady {
    fn name(&self) -> &str {
        "opt"
    }

    fn on_hit(&mut self, key: ExpertKey) {
        self.touch(key);
    }

    fn on_insert(&mut self, key: ExpertKey) {
        self.touch(key);
    }

    fn choose_victim(&mut self, _incoming: ExpertKey, pins: &Pins) -> Option<ExpertKey> {
        let &(_, idx) = self
            .order
            .iter()
            .rev()
            .find(|(_, i)| !pins.is_pinned_index(*i))?;
        Some(self.space.key(idx))
    }

    fn on_evict(&mut self, key: ExpertKey) {
        let idx = self.space.index(key);
        self.order.remove(&(self.resident_next[idx], idx));
    }
}
