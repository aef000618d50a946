//! Cache-only lookups for a draft model (docs/STREAMING.md#hybrid-drafting): deliver what is
//! resident now, read nothing, wait for nothing, leave the replacement policy untouched.

use super::{lock, ExpertStore, Meta, UnpinOnDrop};
use k3_plan::ExpertKey;

impl ExpertStore {
    /// Delivers those of `experts` (of `layer`) whose bytes are resident in the cache right
    /// now — `on_ready(i, bytes)` once per delivered index, duplicates included — and returns
    /// which indices were delivered. Never reads, never waits on a read in flight, and does
    /// not touch recency (the exact model's cache behaviour, hence its speed, is unchanged by
    /// drafting); only the `draft_*` counters move. Delivered slots are pinned for the call,
    /// so a hinted read landing meanwhile cannot evict them.
    pub fn fetch_cached(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &[u8]),
    ) -> Vec<bool> {
        let _serial = lock(&self.fetch_lock);
        let mut found: Vec<(usize, usize, usize, usize)> = Vec::new(); // (index, slot, start, len)
        let mut pinned: Vec<ExpertKey> = Vec::new();
        {
            let mut t = lock(&self.table);
            for (i, &e) in experts.iter().enumerate() {
                let Ok(key) = self.check_key(layer, e) else {
                    continue;
                };
                let Some(slot) = t.slots.slot_of(key) else {
                    continue;
                };
                if let Meta::Resident { start, len } = t.meta[slot] {
                    if !pinned.contains(&key) {
                        if t.slots.pin(key).is_err() {
                            continue;
                        }
                        pinned.push(key);
                    }
                    found.push((i, slot, start, len));
                }
            }
            t.stats.draft_requests += experts.len() as u64;
            t.stats.draft_hits += found.len() as u64;
        }
        let _unpin = UnpinOnDrop {
            table: &self.table,
            keys: pinned,
        };
        let mut served = vec![false; experts.len()];
        for &(i, slot, start, len) in &found {
            let buf = lock(&self.shared.bufs[slot]);
            on_ready(i, &buf[start..start + len]);
            served[i] = true;
        }
        served
    }
}
