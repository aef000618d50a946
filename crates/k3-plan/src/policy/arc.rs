//! Adaptive Replacement Cache (Megiddo & Modha, FAST 2003).

use super::list::Lists;
use super::{ExpertKey, KeySpace, Pins, ReplacementPolicy};

const T1: usize = 0;
const T2: usize = 1;
const B1: usize = 2;
const B2: usize = 3;

/// ARC: resident lists T1 (seen once recently) and T2 (seen at least twice), ghost lists
/// B1/B2 of recently evicted keys, and an adaptive target `p` for |T1|. Pinned keys are
/// skipped when replacing; ghosts are trimmed after each insertion so that
/// |T1|+|B1| ≤ c and the four lists hold at most 2c keys.
#[derive(Clone, Debug)]
pub struct Arc {
    space: KeySpace,
    lists: Lists,
    capacity: usize,
    p: usize,
}

impl Arc {
    /// An empty ARC for a cache of `capacity` keys.
    pub fn new(space: KeySpace, capacity: usize) -> Self {
        Self {
            space,
            lists: Lists::new(space.len(), 4),
            capacity,
            p: 0,
        }
    }

    fn oldest_unpinned(&self, list: usize, pins: &Pins) -> Option<usize> {
        self.lists
            .iter_back(list)
            .find(|&i| !pins.is_pinned_index(i))
    }

    fn trim_ghosts(&mut self) {
        let c = self.capacity;
        while self.lists.len(T1) + self.lists.len(B1) > c {
            let Some(i) = self.lists.back(B1) else { break };
            self.lists.remove(i);
        }
        while (0..4).map(|l| self.lists.len(l)).sum::<usize>() > 2 * c {
            let Some(i) = self.lists.back(B2).or_else(|| self.lists.back(B1)) else {
                break;
            };
            self.lists.remove(i);
        }
    }
}

impl ReplacementPolicy for Arc {
    fn name(&self) -> &str {
        "arc"
    }

    fn on_hit(&mut self, key: ExpertKey) {
        self.lists.move_front(T2, self.space.index(key));
    }

    fn on_insert(&mut self, key: ExpertKey) {
        let i = self.space.index(key);
        let (b1, b2) = (self.lists.len(B1).max(1), self.lists.len(B2).max(1));
        match self.lists.owner(i) {
            Some(B1) => {
                self.p = (self.p + (b2 / b1).max(1)).min(self.capacity);
                self.lists.move_front(T2, i);
            }
            Some(B2) => {
                self.p = self.p.saturating_sub((b1 / b2).max(1));
                self.lists.move_front(T2, i);
            }
            _ => self.lists.move_front(T1, i),
        }
        self.trim_ghosts();
    }

    fn choose_victim(&mut self, incoming: ExpertKey, pins: &Pins) -> Option<ExpertKey> {
        let t1 = self.lists.len(T1);
        let in_b2 = self.lists.owner(self.space.index(incoming)) == Some(B2);
        let prefer_t1 = t1 >= 1 && (t1 > self.p || (in_b2 && t1 == self.p));
        let (first, second) = if prefer_t1 { (T1, T2) } else { (T2, T1) };
        let i = self
            .oldest_unpinned(first, pins)
            .or_else(|| self.oldest_unpinned(second, pins))?;
        Some(self.space.key(i))
    }

    fn on_evict(&mut self, key: ExpertKey) {
        let i = self.space.index(key);
        match self.lists.owner(i) {
            Some(T1) => self.lists.move_front(B1, i),
            Some(T2) => self.lists.move_front(B2, i),
            _ => {}
        }
    }
}
