//! LRU with per-layer quotas.

use super::list::Lists;
use super::{ExpertKey, KeySpace, Pins, ReplacementPolicy};

/// LRU inside per-layer quotas: each layer is entitled to `capacity / n_layers` slots
/// (at least 1). A layer at or over its quota replaces its own least recent key; a layer
/// under quota takes the globally least recent key of a layer that is over quota (plain
/// global LRU when no layer is). Keeps one layer's burst (a prefill chunk's union) from
/// flushing every other layer.
#[derive(Clone, Debug)]
pub struct LayerLru {
    space: KeySpace,
    global: Lists,
    per_layer: Lists,
    count: Vec<usize>,
    quota: usize,
}

impl LayerLru {
    /// An empty per-layer LRU for a cache of `capacity` keys.
    pub fn new(space: KeySpace, capacity: usize) -> Self {
        Self {
            space,
            global: Lists::new(space.len(), 1),
            per_layer: Lists::new(space.len(), space.n_layers as usize),
            count: vec![0; space.n_layers as usize],
            quota: (capacity / space.n_layers.max(1) as usize).max(1),
        }
    }

    fn touch(&mut self, key: ExpertKey) {
        let i = self.space.index(key);
        if self.global.owner(i).is_none() {
            self.count[key.layer as usize] += 1;
        }
        self.global.move_front(0, i);
        self.per_layer.move_front(key.layer as usize, i);
    }
}

impl ReplacementPolicy for LayerLru {
    fn name(&self) -> &str {
        "layer-lru"
    }

    fn on_hit(&mut self, key: ExpertKey) {
        self.touch(key);
    }

    fn on_insert(&mut self, key: ExpertKey) {
        self.touch(key);
    }

    fn choose_victim(&mut self, incoming: ExpertKey, pins: &Pins) -> Option<ExpertKey> {
        let own = incoming.layer as usize;
        let free = |i: &usize| !pins.is_pinned_index(*i);
        let pick = if self.count[own] >= self.quota {
            self.per_layer.iter_back(own).find(free)
        } else {
            let over = |i: &usize| self.count[self.space.key(*i).layer as usize] > self.quota;
            self.global.iter_back(0).filter(free).find(over)
        };
        let i = pick.or_else(|| self.global.iter_back(0).find(free))?;
        Some(self.space.key(i))
    }

    fn on_evict(&mut self, key: ExpertKey) {
        let i = self.space.index(key);
        if self.global.owner(i).is_some() {
            self.count[key.layer as usize] -= 1;
        }
        self.global.remove(i);
        self.per_layer.remove(i);
    }
}
