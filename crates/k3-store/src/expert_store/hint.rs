//! Lookahead prefetch: [`ExpertStore::hint`] reads experts a later fetch is predicted to ask
//! for, while the caller computes.
//!
//! A hint only ever takes slots nobody has pinned and queues its reads BEHIND the reads
//! already issued (the pool is FIFO, and the model hints after its own layer's reads are
//! queued). The next fetch wave first cancels the hinted reads it does not want that have not
//! started (dropped unread), settles the rest (publishes them, releases their pins), then
//! assigns slots as usual — so a hinted expert is a plain resident hit. A failed hinted read is counted apart and forgotten: the demand fetch
//! reads that expert again and only its failure is an error. Hints change which experts are
//! cached, never the bytes delivered, so outputs are bit-identical with and without them.

use super::pool::{Job, Pending};
use super::{lock, ExpertStore, Meta};
use k3_plan::{ExpertKey, Lookup};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Reads issued by one hint, not yet settled, each with its cancel flag.
pub(super) struct HintBatch {
    pending: Pending,
    keys: Vec<ExpertKey>,
    cancel: Vec<Arc<AtomicBool>>,
}

/// What the last hint predicted, scored against the next fetch of its layer.
pub(super) struct Prediction {
    layer: usize,
    predicted: Vec<u32>,
    read: Vec<u32>,
}

impl ExpertStore {
    /// Lookahead prefetch of `experts` of `layer`: starts reading the ones not cached into
    /// unpinned slots and returns at once. Experts that cannot be located, and everything
    /// once no slot is free of pins, are skipped silently (a hint is only a hint).
    pub fn hint(&self, layer: usize, experts: &[u32]) {
        let mut distinct: Vec<u32> = Vec::with_capacity(experts.len());
        for &e in experts {
            if !distinct.contains(&e) {
                distinct.push(e);
            }
        }
        let (mut jobs, mut keys, mut read) = (Vec::new(), Vec::new(), Vec::new());
        let mut cancel = Vec::new();
        {
            let mut t = lock(&self.table);
            for &e in &distinct {
                let Ok(key) = self.check_key(layer, e) else {
                    continue;
                };
                if t.slots.slot_of(key).is_some() {
                    continue; // resident already
                }
                let Ok(loc) = (self.locate)(layer, e) else {
                    continue;
                };
                if self.check_loc(layer, e, &loc).is_err() || t.slots.pin(key).is_err() {
                    continue;
                }
                match t.slots.access(key) {
                    Ok(Lookup::Miss { slot, evicted }) => {
                        t.stats.evictions += u64::from(evicted.is_some());
                        t.stats.hint_reads += 1;
                        t.meta[slot] = Meta::Reading;
                        let flag = Arc::new(AtomicBool::new(false));
                        cancel.push(Arc::clone(&flag));
                        jobs.push(Job::new(slot, keys.len(), key, loc).cancellable(flag));
                        keys.push(key);
                        read.push(e);
                    }
                    Ok(Lookup::Hit { .. }) => {
                        let _ = t.slots.unpin(key);
                    }
                    Err(_) => {
                        // Every slot is pinned by the batch being computed: stop here.
                        let _ = t.slots.unpin(key);
                        break;
                    }
                }
            }
        }
        *lock(&self.prediction) = Some(Prediction {
            layer,
            predicted: distinct,
            read,
        });
        if jobs.is_empty() {
            return;
        }
        jobs.sort_by_key(|j| (j.loc.file, j.loc.reads[0].0));
        let pending = self.pool.submit(jobs);
        lock(&self.hints).push(HintBatch {
            pending,
            keys,
            cancel,
        });
    }

    /// Cancels the hinted reads of experts this fetch (`layer`, `wanted`) does not ask for
    /// and that have not started, then waits for the rest, publishes them (resident, or empty
    /// again on failure or cancellation) and releases their pins. Called at the start of
    /// every fetch wave, so a stale prediction never queues ahead of the real reads.
    pub(super) fn settle_hints(&self, layer: usize, wanted: &[u32]) {
        let batches = std::mem::take(&mut *lock(&self.hints));
        for batch in batches {
            for (key, flag) in batch.keys.iter().zip(&batch.cancel) {
                let needed = key.layer as usize == layer && wanted.contains(&key.expert);
                if !needed {
                    flag.store(true, Ordering::Release);
                }
            }
            for done in batch.pending {
                let Some(&key) = batch.keys.get(done.want) else {
                    continue;
                };
                let mut t = lock(&self.table);
                t.stats.io_seconds += done.seconds;
                if done.skipped {
                    t.stats.hint_cancelled += 1;
                    t.meta[done.slot] = Meta::Empty;
                    t.slots.remove(key);
                    continue;
                }
                match done.result {
                    Ok((start, len)) => {
                        t.stats.bytes_read += len as u64;
                        t.stats.hint_bytes += len as u64;
                        t.meta[done.slot] = Meta::Resident { start, len };
                    }
                    Err(_) => {
                        t.stats.hint_failures += 1;
                        t.meta[done.slot] = Meta::Empty;
                        t.slots.remove(key);
                    }
                }
            }
            let mut t = lock(&self.table);
            for key in batch.keys {
                let _ = t.slots.unpin(key);
            }
        }
    }

    /// Scores the last hint against a fetch of `layer` asking for the distinct `requested`.
    pub(super) fn score_hint(&self, layer: usize, requested: &[u32]) {
        let Some(p) = lock(&self.prediction).take_if(|p| p.layer == layer) else {
            return;
        };
        let mut t = lock(&self.table);
        t.stats.hint_predicted += p.predicted.len() as u64;
        t.stats.hint_requested += requested.len() as u64;
        t.stats.hint_correct += p.predicted.iter().filter(|e| requested.contains(e)).count() as u64;
        t.stats.hint_useful_reads += p.read.iter().filter(|e| requested.contains(e)).count() as u64;
    }
}
