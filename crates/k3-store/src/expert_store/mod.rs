//! The routed-expert store: a fixed arena of slots, a replacement policy, batched reads on
//! a small pool of plain I/O threads.
//!
//! Lessons from upstream (docs/MODEL.md#upstream-expert-cache) this module honours:
//!
//! * **Experts are never resident as a whole** (1.45 TB): a cache of `slots` slots holds the
//!   recently used ones; victims are chosen by a [`PolicyKind`] (ARC by default, chosen by
//!   replaying upstream's trace) through the crate's [`SlotTable`], which never evicts a
//!   pinned key.
//! * **Slot states**: empty / reading / resident, and pinned for the current batch. A slot
//!   handed out for the batch being computed is pinned until delivered, so a later miss in
//!   the same batch can never evict it (upstream relies on `capacity > top-k`; here a batch
//!   larger than the cache is split into waves instead of deadlocking).
//! * **Batch reads**: every miss of a batch is issued at once to the I/O pool, sorted by file
//!   offset; experts are delivered as they land (resident hits first), so compute overlaps
//!   I/O. I/O threads are plain threads, never rayon: a compute thread never blocks on a read
//!   it did not ask for.
//! * **O_DIRECT**: each slot holds `align4096(expert + 2·4096)` so a contiguous expert is one
//!   aligned read widened at both ends; its payload offset within the slot is recorded.
//! * **A failed read is never half-delivered**: the slot returns to empty, the failure is
//!   counted (the CLI exits 4, as upstream does on `k3_expert_drops`), and the fetch returns
//!   an error naming the layer and expert.

mod cached;
mod hint;
mod pool;

use crate::io::{aligned_span, AlignedBuf, ReadAt};
use crate::{ExpertFetchFailure, StoreError};
use k3_plan::{ExpertKey, KeySpace, PolicyKind, SlotTable};
use pool::{Done, Job, Pool};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Where one expert's bytes lie: absolute `(offset, len)` reads in one file whose
/// concatenation is the expert's canonical buffer (w1p, w1s, w2p, w2s, w3p, w3s). The
/// released checkpoint needs one read per expert; a re-packed one may need six.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertLoc {
    /// Index into the store's file list.
    pub file: usize,
    /// `(offset, len)` reads, concatenated in order.
    pub reads: Vec<(u64, u64)>,
    /// Total bytes (the sum of the read lengths).
    pub total: u64,
}

/// Maps `(layer, expert)` to its bytes; called on the fetching thread for each expert.
pub type LocateFn = Box<dyn Fn(usize, u32) -> Result<ExpertLoc, String> + Send + Sync>;

/// Counters of an [`ExpertStore`], for the cache report (`slots`, `requests … hits …
/// misses … evictions`, `read from disk …`, `I/O share of wall clock`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertStats {
    /// Slots in the cache.
    pub slots: usize,
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// Experts requested (duplicates within one fetch count once).
    pub requests: u64,
    /// Requests served from a resident slot.
    pub resident_hits: u64,
    /// Requests that needed a read.
    pub misses: u64,
    /// Resident experts evicted to make room.
    pub evictions: u64,
    /// Bytes read from disk.
    pub bytes_read: u64,
    /// Expert reads that failed (or experts that could not be located).
    pub failures: u64,
    /// Seconds spent inside expert reads, summed over I/O threads (may exceed wall time).
    pub io_seconds: f64,
    /// Experts read because of a lookahead hint (included in `bytes_read`).
    pub hint_reads: u64,
    /// Bytes of those reads.
    pub hint_bytes: u64,
    /// Hinted reads a later fetch of the same layer asked for (useful prefetches).
    pub hint_useful_reads: u64,
    /// Experts a draft model asked for through [`ExpertStore::fetch_cached`].
    pub draft_requests: u64,
    /// Those that were resident (the rest were dropped from the draft's top-k).
    pub draft_hits: u64,
    /// Hinted reads that failed (not errors: the fetch reads the expert itself).
    pub hint_failures: u64,
    /// Hinted reads dropped before they started because the fetch did not ask for them.
    pub hint_cancelled: u64,
    /// Experts predicted by hints that were scored against a fetch of their layer.
    pub hint_predicted: u64,
    /// Distinct experts those fetches asked for.
    pub hint_requested: u64,
    /// Predicted experts the fetch did ask for (recall = correct / requested).
    pub hint_correct: u64,
}

/// What a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Meta {
    Empty,
    Reading,
    Resident { start: usize, len: usize },
}

/// Slot bookkeeping under one mutex.
struct Table {
    slots: SlotTable,
    meta: Vec<Meta>,
    stats: ExpertStats,
}

/// State shared with the I/O threads.
pub(crate) struct Shared {
    files: Vec<Arc<dyn ReadAt>>,
    bufs: Vec<Mutex<AlignedBuf>>,
    slot_len: usize,
}

/// The routed-expert cache. `Sync`: concurrent [`ExpertStore::fetch`] calls are safe (they
/// are serialised; the engine runs one generation at a time anyway).
pub struct ExpertStore {
    shared: Arc<Shared>,
    locate: LocateFn,
    space: KeySpace,
    table: Mutex<Table>,
    pool: Pool,
    fetch_lock: Mutex<()>,
    trace: Mutex<(bool, Vec<(u32, u32)>)>,
    hints: Mutex<Vec<hint::HintBatch>>,
    prediction: Mutex<Option<hint::Prediction>>,
}

/// One distinct expert of a wave: its key, location, and the batch indices asking for it.
struct Want {
    key: ExpertKey,
    loc: ExpertLoc,
    indices: Vec<usize>,
}

impl ExpertStore {
    /// A cache over the released model's key space ([`KeySpace::K3`]: 93 layers × 896
    /// experts); see [`ExpertStore::new_in`].
    pub fn new(
        files: Vec<Arc<dyn ReadAt>>,
        locate: LocateFn,
        slots: usize,
        slot_bytes: u64,
        policy: PolicyKind,
        io_threads: usize,
    ) -> Result<ExpertStore, StoreError> {
        Self::new_in(
            KeySpace::K3,
            files,
            locate,
            slots,
            slot_bytes,
            policy,
            io_threads,
        )
    }

    /// A cache of `slots` slots of `slot_bytes` each (use `align4096(expert + 2·4096)`) over
    /// the keys of `space`, evicting with `policy`, reading on `io_threads` plain threads
    /// (at least one). Refuses 0 slots and the belady policy (it needs the future).
    pub fn new_in(
        space: KeySpace,
        files: Vec<Arc<dyn ReadAt>>,
        locate: LocateFn,
        slots: usize,
        slot_bytes: u64,
        policy: PolicyKind,
        io_threads: usize,
    ) -> Result<ExpertStore, StoreError> {
        if slots == 0 {
            return Err(StoreError::Config(
                "the expert cache needs at least 1 slot".into(),
            ));
        }
        if policy == PolicyKind::Opt {
            return Err(StoreError::Config(
                "policy opt needs the future; simulator only".into(),
            ));
        }
        let slot_len = usize::try_from(slot_bytes)
            .map_err(|_| StoreError::Config(format!("slot of {slot_bytes} bytes")))?;
        let bufs = (0..slots)
            .map(|_| Mutex::new(AlignedBuf::new(slot_len)))
            .collect();
        let shared = Arc::new(Shared {
            files,
            bufs,
            slot_len,
        });
        let pool = Pool::start(Arc::clone(&shared), io_threads.max(1))?;
        let stats = ExpertStats {
            slots,
            slot_bytes,
            ..ExpertStats::default()
        };
        let table = Table {
            slots: SlotTable::new(space, slots, policy.build(space, slots, &[])),
            meta: vec![Meta::Empty; slots],
            stats,
        };
        Ok(ExpertStore {
            shared,
            locate,
            space,
            table: Mutex::new(table),
            pool,
            fetch_lock: Mutex::new(()),
            trace: Mutex::new((false, Vec::new())),
            hints: Mutex::new(Vec::new()),
            prediction: Mutex::new(None),
        })
    }

    /// Makes `experts[i]` of `layer` available and calls `on_ready(i, bytes)` once per `i`, on
    /// the calling thread, as each becomes available: resident hits first, then misses as
    /// their reads complete (any order). `bytes` is the expert's canonical buffer.
    ///
    /// All misses are issued at once to the I/O pool, sorted by offset. Duplicates in
    /// `experts` are read once and delivered for each index. Slots handed out in this call
    /// are pinned until delivered. A batch with more distinct experts than the cache has
    /// slots is processed in waves of at most `slots` experts. On a failed read the fetch
    /// counts it, stops delivering, waits for its other reads to settle, returns the failed
    /// slot to empty and returns [`ExpertFetchFailure`] naming the layer and expert.
    ///
    /// Fetches are serialised: `on_ready` must not call `fetch` on the same store.
    pub fn fetch(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), ExpertFetchFailure> {
        let _serial = lock(&self.fetch_lock);
        let mut order: Vec<(u32, Vec<usize>)> = Vec::new();
        let mut pos: HashMap<u32, usize> = HashMap::new();
        for (i, &e) in experts.iter().enumerate() {
            let p = *pos.entry(e).or_insert_with(|| {
                order.push((e, Vec::new()));
                order.len() - 1
            });
            order[p].1.push(i);
        }
        {
            let mut trace = lock(&self.trace);
            if trace.0 {
                trace
                    .1
                    .extend(order.iter().map(|(e, _)| (layer as u32, *e)));
            }
        }
        let distinct: Vec<u32> = order.iter().map(|(e, _)| *e).collect();
        self.score_hint(layer, &distinct);
        let capacity = self.shared.bufs.len();
        for wave in order.chunks(capacity) {
            self.settle_hints(layer, &distinct);
            let wants = self.locate_wave(layer, wave)?;
            self.run_wave(layer, wants, on_ready)?;
        }
        Ok(())
    }

    /// Counters so far.
    pub fn stats(&self) -> ExpertStats {
        lock(&self.table).stats.clone()
    }

    /// Starts (`true`) or stops recording the request trace.
    pub fn set_trace(&self, on: bool) {
        lock(&self.trace).0 = on;
    }

    /// Takes the recorded trace: one `(layer, expert)` per distinct expert of each fetch, in
    /// request order — the layout of upstream's `expert_trace.bin` (`u32` LE layer, `u32` LE
    /// expert), which the simulator replays.
    pub fn take_trace(&self) -> Vec<(u32, u32)> {
        std::mem::take(&mut lock(&self.trace).1)
    }

    /// Locates and validates every expert of a wave (before any slot is touched).
    fn locate_wave(
        &self,
        layer: usize,
        wave: &[(u32, Vec<usize>)],
    ) -> Result<Vec<Want>, ExpertFetchFailure> {
        let mut wants = Vec::with_capacity(wave.len());
        for (e, indices) in wave {
            let r = self.check_key(layer, *e).and_then(|key| {
                let loc = (self.locate)(layer, *e).map_err(|message| StoreError::Locate {
                    layer,
                    expert: *e,
                    message,
                })?;
                self.check_loc(layer, *e, &loc)?;
                Ok(Want {
                    key,
                    loc,
                    indices: indices.clone(),
                })
            });
            match r {
                Ok(w) => wants.push(w),
                Err(error) => return Err(self.failure(layer, *e, error)),
            }
        }
        Ok(wants)
    }

    fn check_key(&self, layer: usize, expert: u32) -> Result<ExpertKey, StoreError> {
        let key = ExpertKey::new(u32::try_from(layer).unwrap_or(u32::MAX), expert);
        if self.space.contains(key) {
            Ok(key)
        } else {
            Err(k3_plan::CacheError::OutOfRange {
                key,
                space: self.space,
            }
            .into())
        }
    }

    /// Checks that a location fits its file and a slot.
    fn check_loc(&self, layer: usize, expert: u32, loc: &ExpertLoc) -> Result<(), StoreError> {
        let bad = |reason: String| StoreError::Layout {
            what: format!("expert {expert} of layer {layer}"),
            reason,
        };
        let f = self.shared.files.get(loc.file).ok_or_else(|| {
            bad(format!(
                "file index {} but only {} files",
                loc.file,
                self.shared.files.len()
            ))
        })?;
        let sum: u64 = loc.reads.iter().map(|r| r.1).sum();
        if loc.reads.is_empty() || sum != loc.total {
            return Err(bad(format!(
                "{} reads summing to {sum}, total {}",
                loc.reads.len(),
                loc.total
            )));
        }
        for &(off, len) in &loc.reads {
            if off.checked_add(len).is_none_or(|end| end > f.len()) {
                let p = f.path().display();
                return Err(bad(format!(
                    "{len} bytes at offset {off} pass the end of {p} ({} bytes)",
                    f.len()
                )));
            }
        }
        let need = match loc.reads[..] {
            [(off, len)] => aligned_span(off, len),
            _ => loc.total,
        };
        let slot = self.shared.slot_len as u64;
        if need > slot {
            return Err(bad(format!(
                "needs {need} bytes of slot, slots hold {slot}"
            )));
        }
        Ok(())
    }

    /// Counts a failure and wraps it.
    fn failure(&self, layer: usize, expert: u32, error: StoreError) -> ExpertFetchFailure {
        lock(&self.table).stats.failures += 1;
        ExpertFetchFailure {
            layer,
            expert,
            error,
        }
    }

    /// One wave (at most `slots` distinct experts): pin, assign slots, issue the reads,
    /// deliver hits, then deliver reads as they land; unpin everything at the end.
    fn run_wave(
        &self,
        layer: usize,
        wants: Vec<Want>,
        on_ready: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<(), ExpertFetchFailure> {
        let (hits, jobs) = self
            .assign(&wants)
            .map_err(|e| self.failure(layer, e.0, e.1))?;
        let _unpin = UnpinOnDrop {
            table: &self.table,
            keys: wants.iter().map(|w| w.key).collect(),
        };
        let pending = self.pool.submit(jobs);
        for (w, slot, start, len) in hits {
            let buf = lock(&self.shared.bufs[slot]);
            for &i in &wants[w].indices {
                on_ready(i, &buf[start..start + len]);
            }
        }
        let mut first_err: Option<(u32, StoreError)> = None;
        for done in pending {
            let Done {
                slot,
                want,
                result,
                seconds,
                ..
            } = done;
            let published = self.publish(slot, wants[want].key, result, seconds);
            match (published, &first_err) {
                (Ok((start, len)), None) => {
                    let buf = lock(&self.shared.bufs[slot]);
                    for &i in &wants[want].indices {
                        on_ready(i, &buf[start..start + len]);
                    }
                }
                (Ok(_), Some(_)) => {}
                (Err(e), None) => first_err = Some((wants[want].key.expert, e)),
                (Err(_), Some(_)) => {}
            }
        }
        match first_err {
            Some((expert, error)) => Err(ExpertFetchFailure {
                layer,
                expert,
                error,
            }),
            None => Ok(()),
        }
    }

    /// Pins the wave's keys and gives each a slot: resident hits `(want, slot, start, len)`
    /// and read jobs (sorted by file and offset) for the rest.
    #[allow(clippy::type_complexity)]
    fn assign(
        &self,
        wants: &[Want],
    ) -> Result<(Vec<(usize, usize, usize, usize)>, Vec<Job>), (u32, StoreError)> {
        let mut t = lock(&self.table);
        for w in wants {
            t.slots.pin(w.key).map_err(|e| (w.key.expert, e.into()))?;
        }
        let (mut hits, mut jobs) = (Vec::new(), Vec::new());
        for (i, w) in wants.iter().enumerate() {
            let lookup = t.slots.access(w.key);
            t.stats.requests += 1;
            let (slot, hit) = match lookup {
                Ok(k3_plan::Lookup::Hit { slot }) => (slot, true),
                Ok(k3_plan::Lookup::Miss { slot, evicted }) => {
                    t.stats.evictions += u64::from(evicted.is_some());
                    (slot, false)
                }
                Err(e) => {
                    Self::undo(&mut t, wants, &jobs);
                    return Err((w.key.expert, e.into()));
                }
            };
            match t.meta[slot] {
                Meta::Resident { start, len } if hit => {
                    t.stats.resident_hits += 1;
                    hits.push((i, slot, start, len));
                }
                _ => {
                    t.stats.misses += 1;
                    t.meta[slot] = Meta::Reading;
                    jobs.push(Job::new(slot, i, w.key, w.loc.clone()));
                }
            }
        }
        jobs.sort_by_key(|j| (j.loc.file, j.loc.reads[0].0));
        Ok((hits, jobs))
    }

    /// Rolls back an assignment that could not complete: assigned slots back to empty, pins
    /// released.
    fn undo(t: &mut Table, wants: &[Want], jobs: &[Job]) {
        for j in jobs {
            t.meta[j.slot] = Meta::Empty;
            t.slots.remove(wants[j.want].key);
        }
        for w in wants {
            let _ = t.slots.unpin(w.key);
        }
    }

    /// Publishes a finished read: resident on success; on failure the key leaves the table,
    /// its slot returns to empty and the failure is counted.
    fn publish(
        &self,
        slot: usize,
        key: ExpertKey,
        result: Result<(usize, usize), StoreError>,
        seconds: f64,
    ) -> Result<(usize, usize), StoreError> {
        let mut t = lock(&self.table);
        t.stats.io_seconds += seconds;
        match result {
            Ok((start, len)) => {
                t.stats.bytes_read += len as u64;
                t.meta[slot] = Meta::Resident { start, len };
                Ok((start, len))
            }
            Err(e) => {
                t.stats.failures += 1;
                t.meta[slot] = Meta::Empty;
                t.slots.remove(key);
                Err(e)
            }
        }
    }
}

/// Releases a wave's batch pins when the wave ends — also if `on_ready` panics, so a
/// panicking caller cannot leave slots pinned forever.
struct UnpinOnDrop<'a> {
    table: &'a Mutex<Table>,
    keys: Vec<ExpertKey>,
}

impl Drop for UnpinOnDrop<'_> {
    fn drop(&mut self) {
        let mut t = lock(self.table);
        for &k in &self.keys {
            let _ = t.slots.unpin(k);
        }
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Reads one expert into `slot`; returns where its canonical bytes start and their
    /// length, or the failing read's `(offset, len)` and error.
    fn read_expert(
        &self,
        slot: usize,
        loc: &ExpertLoc,
    ) -> Result<(usize, usize), (u64, u64, std::io::Error)> {
        let f = &self.files[loc.file];
        let mut buf = lock(&self.bufs[slot]);
        if let [(off, len)] = loc.reads[..] {
            let span = aligned_span(off, len) as usize;
            f.read_into_aligned(&mut buf[..span], off, len as usize)
                .map_err(|e| (off, len, e))?;
            return Ok(((off % crate::io::ALIGN as u64) as usize, len as usize));
        }
        let mut pos = 0;
        for &(off, len) in &loc.reads {
            f.read_exact_at(&mut buf[pos..pos + len as usize], off)
                .map_err(|e| (off, len, e))?;
            pos += len as usize;
        }
        Ok((0, pos))
    }
}
