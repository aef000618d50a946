//! Least recently used.

use super::list::Lists;
use super::{ExpertKey, KeySpace, Pins, ReplacementPolicy};

/// LRU: evicts the least recently requested unpinned key.
#[derive(Clone, Debug)]
pub struct Lru {
    space: KeySpace,
    lists: Lists,
}

impl Lru {
    /// An empty LRU over `space`.
    pub fn new(space: KeySpace) -> Self {
        Self {
            space,
            lists: Lists::new(space.len(), 1),
        }
    }
}

impl ReplacementPolicy for Lru {
    fn name(&self) -> &str {
        "lru"
    }

    fn on_hit(&mut self, key: ExpertKey) {
        self.lists.move_front(0, self.space.index(key));
    }

    fn on_insert(&mut self, key: ExpertKey) {
        self.lists.move_front(0, self.space.index(key));
    }

    fn choose_victim(&mut self, _incoming: ExpertKey, pins: &Pins) -> Option<ExpertKey> {
        let i = self
            .lists
            .iter_back(0)
            .find(|&i| !pins.is_pinned_index(i))?;
        Some(self.space.key(i))
    }

    fn on_evict(&mut self, key: ExpertKey) {
        self.lists.remove(self.space.index(key));
    }
}
