//! Least frequently used with exponential decay.

use super::{ExpertKey, KeySpace, Pins, ReplacementPolicy};
use std::collections::BTreeSet;

/// LFU with decay: each request adds weight to its key, and weights halve every
/// `half_life` requests. History is kept for evicted keys too (a returning key remembers its
/// past), so a key re-requested every pass outranks a one-off. Ties go to the least recently
/// used key.
///
/// Decay is implemented by letting the increment grow by `2^(1/half_life)` per request
/// instead of shrinking every score (same order); scores are renormalised when the increment
/// gets large.
#[derive(Clone, Debug)]
pub struct LfuDecay {
    space: KeySpace,
    score: Vec<f64>,
    last_use: Vec<u64>,
    resident: Vec<bool>,
    /// Resident keys ordered by (score bits, last use, index); positive f64 bits sort like
    /// the values.
    order: BTreeSet<(u64, u64, usize)>,
    inc: f64,
    growth: f64,
    clock: u64,
}

impl LfuDecay {
    /// Default half-life in requests: 8 decode tokens of the released model (8 × 92 × 16).
    pub const DEFAULT_HALF_LIFE: u32 = 8 * 92 * 16;

    /// An empty LFU whose weights halve every `half_life` requests (≥ 1).
    pub fn new(space: KeySpace, half_life: u32) -> Self {
        Self {
            space,
            score: vec![0.0; space.len()],
            last_use: vec![0; space.len()],
            resident: vec![false; space.len()],
            order: BTreeSet::new(),
            inc: 1.0,
            growth: 2f64.powf(1.0 / f64::from(half_life.max(1))),
            clock: 0,
        }
    }

    fn entry(&self, idx: usize) -> (u64, u64, usize) {
        (self.score[idx].to_bits(), self.last_use[idx], idx)
    }

    fn bump(&mut self, key: ExpertKey, insert: bool) {
        let idx = self.space.index(key);
        if self.resident[idx] {
            self.order.remove(&self.entry(idx));
        }
        self.resident[idx] |= insert;
        self.clock += 1;
        self.score[idx] += self.inc;
        self.last_use[idx] = self.clock;
        if self.resident[idx] {
            self.order.insert(self.entry(idx));
        }
        self.inc *= self.growth;
        if self.inc > 1e200 {
            self.renormalise();
        }
    }

    fn renormalise(&mut self) {
        let inc = self.inc;
        self.score.iter_mut().for_each(|s| *s /= inc);
        self.inc = 1.0;
        let resident: Vec<usize> = self.order.iter().map(|e| e.2).collect();
        self.order = resident.into_iter().map(|i| self.entry(i)).collect();
    }
}

impl ReplacementPolicy for LfuDecay {
    fn name(&self) -> &str {
        "lfu"
    }

    fn on_hit(&mut self, key: ExpertKey) {
        self.bump(key, false);
    }

    fn on_insert(&mut self, key: ExpertKey) {
        self.bump(key, true);
    }

    fn choose_victim(&mut self, _incoming: ExpertKey, pins: &Pins) -> Option<ExpertKey> {
        let &(_, _, idx) = self.order.iter().find(|e| !pins.is_pinned_index(e.2))?;
        Some(self.space.key(idx))
    }

    fn on_evict(&mut self, key: ExpertKey) {
        let idx = self.space.index(key);
        if self.resident[idx] {
            self.order.remove(&self.entry(idx));
            self.resident[idx] = false;
        }
    }
}
