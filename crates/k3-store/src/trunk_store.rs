//! The trunk store: pinned layers in RAM, the rest streamed through a small ring.
//!
//! Lessons from upstream (docs/MODEL.md#upstream-trunk-streaming) this module honours:
//!
//! * **A cyclic scan defeats LRU.** Every token walks layers 0..93 in order, so an LRU cache
//!   of K < 93 layers hits 0%. Instead K layers are *pinned* (read once, in exact-size
//!   buffers) and the others stream through a ring of uniform slots: the hit rate is exactly
//!   K/93, deterministic.
//! * **With one slot, never read ahead.** Upstream's background reader once prefetched layer
//!   L+1 into the only slot while layer L was still being computed from it: silent wrong
//!   tokens. Here the reader thread exists only when the ring has ≥ 2 slots, a slot with a
//!   live [`LayerBytes`] guard is never chosen for a read, and each slot sits behind a
//!   `RwLock`, so even a bookkeeping bug could only block, never overwrite bytes in use.
//! * **Read ahead one layer in cyclic order.** After binding layer L the next unpinned layer
//!   (wrapping to 0 for the next token) is queued for the reader — with more slots, the next
//!   `ring − 1` unpinned layers — so a read overlaps the compute of the layer before it.
//! * **O_DIRECT** for every read (through [`ReadAt::read_into_aligned`]): a streamed layer is
//!   read once per token, so keeping it in the page cache only steals memory from the plan.

mod decode;

pub use decode::RunDecoder;

use crate::io::{aligned_span, AlignedBuf, ReadAt};
use crate::StoreError;
use k3_plan::TrunkPlan;
use std::ops::Deref;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// Where one layer's trunk bytes lie: one contiguous run in one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunLoc {
    /// Index into the store's file list.
    pub file: usize,
    /// Absolute byte offset of the run in that file.
    pub offset: u64,
    /// Run length in bytes.
    pub len: u64,
}

/// Counters of a [`TrunkStore`], for the trunk report ("pinned K/93 layers, ring R slots",
/// "binds, hits, reads", "read X GB in Y s").
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrunkStats {
    /// Layers in the trunk.
    pub layers: usize,
    /// Pinned layers.
    pub pinned_layers: usize,
    /// Bytes held by pinned layers (aligned allocations).
    pub pinned_bytes: u64,
    /// Ring slots (0 when everything is pinned).
    pub ring_slots: usize,
    /// Bytes per ring slot.
    pub slot_bytes: u64,
    /// [`TrunkStore::layer`] calls that returned bytes.
    pub binds: u64,
    /// Binds served by a pinned layer.
    pub pinned_hits: u64,
    /// Run reads completed (pins at construction, synchronous ring reads, read-aheads).
    pub reads: u64,
    /// Reads issued by the background reader ahead of their bind.
    pub read_aheads: u64,
    /// Bytes read from disk.
    pub bytes_read: u64,
    /// Seconds spent inside reads (on any thread).
    pub io_seconds: f64,
    /// Seconds [`TrunkStore::layer`] blocked waiting for bytes (compute stalled on I/O).
    pub wait_seconds: f64,
    /// Failed reads.
    pub failures: u64,
    /// Decoded bytes produced from compressed runs (0 for a plain trunk).
    pub bytes_decoded: u64,
    /// Seconds spent decoding (on any thread).
    pub decode_seconds: f64,
    /// Bytes of the staging buffer compressed runs are read into (0 for a plain trunk).
    pub staging_bytes: u64,
}

/// What a ring slot holds.
#[derive(Debug)]
enum Slot {
    Empty,
    Reading(usize),
    Ready(usize),
    Failed(usize, StoreError),
}

/// Ring bookkeeping, under one mutex.
struct RingState {
    slots: Vec<Slot>,
    /// Live guards per slot; a slot with users is never read into.
    users: Vec<usize>,
    stats: TrunkStats,
}

/// Everything the reader thread shares with the store.
struct Shared {
    files: Vec<Arc<dyn ReadAt>>,
    runs: Vec<RunLoc>,
    /// Pinned layer buffers (`None` for streamed layers).
    pinned: Vec<Option<AlignedBuf>>,
    ring: Vec<RwLock<AlignedBuf>>,
    state: Mutex<RingState>,
    cv: Condvar,
    /// Set for a compressed trunk: runs are read into staging and decoded into the buffers.
    decoding: Option<decode::Decoding>,
}

/// Pinned trunk layers plus a ring of slots streaming the rest, with read-ahead.
///
/// [`TrunkStore::layer`] is meant to be called by one compute thread, one layer guard at a
/// time, in the engine's cyclic order; any order is correct, only slower. The store is
/// `Sync`, and the bytes it hands out are exactly the file's bytes in every configuration.
pub struct TrunkStore {
    shared: Arc<Shared>,
    jobs: Option<Sender<(usize, usize)>>,
    reader: Option<JoinHandle<()>>,
}

/// Layer bytes handed out by [`TrunkStore::layer`]; the bytes stay valid (and their ring slot
/// untouched) while the guard lives. `Sync` (compute threads may share `&[u8]` views of it)
/// but not `Send`: drop it on the thread that bound it, before binding past the ring size.
pub struct LayerBytes<'a> {
    src: Src<'a>,
    start: usize,
    len: usize,
}

enum Src<'a> {
    Pinned(&'a AlignedBuf),
    Ring {
        guard: RwLockReadGuard<'a, AlignedBuf>,
        slot: usize,
        shared: &'a Shared,
    },
}

impl Deref for LayerBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let buf: &AlignedBuf = match &self.src {
            Src::Pinned(b) => b,
            Src::Ring { guard, .. } => guard,
        };
        &buf[self.start..self.start + self.len]
    }
}

impl Drop for LayerBytes<'_> {
    fn drop(&mut self) {
        if let Src::Ring { slot, shared, .. } = &self.src {
            let mut st = shared.lock();
            st.users[*slot] -= 1;
            shared.cv.notify_all();
        }
    }
}

impl TrunkStore {
    /// Reads every pinned layer now (exact-size aligned buffers), allocates `ring_slots` slots
    /// of the largest unpinned run, and starts ONE background reader thread only if
    /// `ring_slots >= 2` (upstream's lesson: with one slot a reader would overwrite the layer
    /// being computed). With a reader, the first unpinned layer is queued at once.
    ///
    /// `pinned[l]` says whether layer `l` (described by `runs[l]`, in `files[runs[l].file]`) is
    /// pinned. Refuses a mask of the wrong length, runs outside their file, and a ring of 0
    /// slots while some layer is unpinned.
    pub fn new(
        files: Vec<Arc<dyn ReadAt>>,
        runs: Vec<RunLoc>,
        pinned: &[bool],
        ring_slots: usize,
    ) -> Result<TrunkStore, StoreError> {
        Self::new_with_progress(files, runs, pinned, ring_slots, &mut |_, _| {})
    }

    /// [`TrunkStore::new`], calling `progress(done, total)` with pinned bytes read so far (at
    /// real scale pinning reads up to ~110 GB, minutes of I/O, before the first token).
    pub fn new_with_progress(
        files: Vec<Arc<dyn ReadAt>>,
        runs: Vec<RunLoc>,
        pinned: &[bool],
        ring_slots: usize,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<TrunkStore, StoreError> {
        Self::new_decoding(files, runs, pinned, ring_slots, None, progress)
    }

    /// [`TrunkStore::new_with_progress`] over runs that `decoder` (when given) turns into the
    /// layers' bytes: every buffer holds a DECODED run (its length from the decoder, starting
    /// at offset 0), reads land in one staging buffer and are decoded between the read and
    /// the bind — by the reader thread for read-aheads, so decoding overlaps compute as reads
    /// do; pinned layers are decoded once, here.
    pub fn new_decoding(
        files: Vec<Arc<dyn ReadAt>>,
        runs: Vec<RunLoc>,
        pinned: &[bool],
        ring_slots: usize,
        decoder: Option<Arc<dyn RunDecoder>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<TrunkStore, StoreError> {
        check_runs(&files, &runs, pinned, ring_slots)?;
        let decoding = decoder.map(|d| decode::Decoding::new(d, &runs));
        let place = |l: usize| placement(decoding.as_ref(), l, &runs[l]);
        let pin_total: u64 = runs
            .iter()
            .zip(pinned)
            .filter(|(_, &p)| p)
            .map(|(r, _)| r.len)
            .sum();
        let mut stats = TrunkStats {
            layers: runs.len(),
            staging_bytes: decoding.as_ref().map_or(0, |d| d.staging_bytes()),
            ..TrunkStats::default()
        };
        let mut bufs = Vec::with_capacity(runs.len());
        for (l, run) in runs.iter().enumerate() {
            bufs.push(if pinned[l] {
                let mut buf = AlignedBuf::new(place(l).2);
                let t = Instant::now();
                let decode_s = load(&files, decoding.as_ref(), l, run, &mut buf)?;
                stats.io_seconds += t.elapsed().as_secs_f64() - decode_s;
                stats.decode_seconds += decode_s;
                stats.bytes_decoded += decoding.as_ref().map_or(0, |_| place(l).1 as u64);
                stats.reads += 1;
                stats.bytes_read += run.len;
                stats.pinned_layers += 1;
                stats.pinned_bytes += buf.len() as u64;
                progress(stats.bytes_read, pin_total);
                Some(buf)
            } else {
                None
            });
        }
        let slot_bytes = (0..runs.len())
            .filter(|&l| !pinned[l])
            .map(|l| place(l).2)
            .max();
        let ring: Vec<_> = match slot_bytes {
            Some(b) => (0..ring_slots)
                .map(|_| {
                    // Ring slots are refilled every token: fault their (huge) pages in now,
                    // as the expert pool does (docs/PERFORMANCE.md#cold-start: THP advice
                    // without pre-faulting measured slower than either).
                    let slot = AlignedBuf::new(b);
                    if crate::io::BufferPolicy::current().prefault {
                        slot.prefault();
                    }
                    RwLock::new(slot)
                })
                .collect(),
            None => Vec::new(),
        };
        stats.ring_slots = ring.len();
        stats.slot_bytes = slot_bytes.unwrap_or(0) as u64;
        let n = ring.len();
        let shared = Arc::new(Shared {
            files,
            runs,
            pinned: bufs,
            ring,
            state: Mutex::new(RingState {
                slots: (0..n).map(|_| Slot::Empty).collect(),
                users: vec![0; n],
                stats,
            }),
            cv: Condvar::new(),
            decoding,
        });
        let mut store = TrunkStore {
            shared,
            jobs: None,
            reader: None,
        };
        if n >= 2 {
            store.start_reader()?;
        }
        Ok(store)
    }

    /// [`TrunkStore::new`] with the pins and ring of a planner's [`TrunkPlan`].
    pub fn from_plan(
        files: Vec<Arc<dyn ReadAt>>,
        runs: Vec<RunLoc>,
        plan: &TrunkPlan,
    ) -> Result<TrunkStore, StoreError> {
        let mut mask = vec![false; runs.len()];
        for &l in &plan.pinned {
            match mask.get_mut(l) {
                Some(m) => *m = true,
                None => {
                    return Err(StoreError::LayerOutOfRange {
                        layer: l,
                        layers: runs.len(),
                    })
                }
            }
        }
        TrunkStore::new(files, runs, &mask, plan.ring_slots)
    }

    fn start_reader(&mut self) -> Result<(), StoreError> {
        let (tx, rx) = channel::<(usize, usize)>();
        let shared = Arc::clone(&self.shared);
        let handle = std::thread::Builder::new()
            .name("k3-trunk-reader".into())
            .spawn(move || {
                while let Ok((slot, layer)) = rx.recv() {
                    shared.fill(slot, layer);
                }
            })
            .map_err(StoreError::Spawn)?;
        self.jobs = Some(tx);
        self.reader = Some(handle);
        let last = self.shared.runs.len() - 1;
        let mut st = self.shared.lock();
        self.read_ahead(&mut st, last);
        Ok(())
    }

    /// Layer `l`'s run bytes: exactly `runs[l].len` bytes, at the same alignment mod 4096 as
    /// the run's file offset, valid while the guard lives.
    ///
    /// A pinned layer returns at once. A streamed layer blocks on an in-flight read of it, or
    /// reads it now into a free slot. After binding, the next unpinned layers in cyclic order
    /// are queued for the background reader into FREE slots — never into a slot in use (with
    /// one slot there is no reader and so no read-ahead at all). A failed read returns
    /// [`StoreError::Read`] naming layer `l`; the slot is freed and the next call retries.
    pub fn layer(&self, l: usize) -> Result<LayerBytes<'_>, StoreError> {
        let shared = &*self.shared;
        let layers = shared.runs.len();
        let run = *shared
            .runs
            .get(l)
            .ok_or(StoreError::LayerOutOfRange { layer: l, layers })?;
        let (start, len, _) = placement(shared.decoding.as_ref(), l, &run);
        if let Some(buf) = &shared.pinned[l] {
            let mut st = shared.lock();
            st.stats.binds += 1;
            st.stats.pinned_hits += 1;
            self.read_ahead(&mut st, l);
            let src = Src::Pinned(buf);
            return Ok(LayerBytes { src, start, len });
        }
        let t = Instant::now();
        let (slot, mut st) = self.bind_slot(l)?;
        st.users[slot] += 1;
        st.stats.binds += 1;
        st.stats.wait_seconds += t.elapsed().as_secs_f64();
        self.read_ahead(&mut st, l);
        drop(st);
        let guard = shared.ring[slot].read().unwrap_or_else(|e| e.into_inner());
        let src = Src::Ring {
            guard,
            slot,
            shared,
        };
        Ok(LayerBytes { src, start, len })
    }

    /// Layer `l`'s bytes when it is PINNED; `None` otherwise. Never reads, never starts a
    /// read-ahead and is not counted as a bind (for router lookahead, which must not wait).
    pub fn pinned_layer(&self, l: usize) -> Option<LayerBytes<'_>> {
        let shared = &*self.shared;
        let run = *shared.runs.get(l)?;
        let buf = shared.pinned.get(l)?.as_ref()?;
        let (start, len, _) = placement(shared.decoding.as_ref(), l, &run);
        Some(LayerBytes {
            src: Src::Pinned(buf),
            start,
            len,
        })
    }

    /// Finds (waiting for, or reading) the slot holding layer `l`; returns it with the lock.
    fn bind_slot(&self, l: usize) -> Result<(usize, MutexGuard<'_, RingState>), StoreError> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        loop {
            if let Some(s) = st
                .slots
                .iter()
                .position(|x| matches!(x, Slot::Ready(k) if *k == l))
            {
                return Ok((s, st));
            }
            if let Some(s) = st
                .slots
                .iter()
                .position(|x| matches!(x, Slot::Failed(k, _) if *k == l))
            {
                if let Slot::Failed(_, e) = std::mem::replace(&mut st.slots[s], Slot::Empty) {
                    return Err(e);
                }
            }
            let in_flight = st.slots.iter().any(|x| matches!(x, Slot::Reading(_)));
            if st
                .slots
                .iter()
                .any(|x| matches!(x, Slot::Reading(k) if *k == l))
            {
                st = shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            match shared.victim(&st, l, l) {
                Some(s) => {
                    st.slots[s] = Slot::Reading(l);
                    drop(st);
                    shared.fill(s, l);
                    st = shared.lock();
                }
                None if in_flight => st = shared.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                None => {
                    let slots = st.slots.len();
                    return Err(StoreError::RingBusy { layer: l, slots });
                }
            }
        }
    }

    /// Queues the next `ring − 1` unpinned layers after `l` (cyclic) for the reader, each into
    /// a free slot holding nothing needed sooner. No reader (ring of 1) ⇒ nothing.
    fn read_ahead(&self, st: &mut RingState, l: usize) {
        let Some(jobs) = &self.jobs else { return };
        let shared = &*self.shared;
        let n = shared.runs.len();
        let ahead = (1..n)
            .map(|d| (l + d) % n)
            .filter(|&k| shared.pinned[k].is_none())
            .take(shared.ring.len() - 1);
        for next in ahead {
            let held = |x: &Slot| matches!(x, Slot::Ready(k) | Slot::Reading(k) if *k == next);
            if st.slots.iter().any(held) {
                continue;
            }
            let Some(s) = shared.victim(st, l, next) else {
                return;
            };
            st.slots[s] = Slot::Reading(next);
            if jobs.send((s, next)).is_err() {
                st.slots[s] = Slot::Empty;
                return;
            }
            st.stats.read_aheads += 1;
        }
    }

    /// True when layer `l` is pinned, or sits in a ring slot ready or being read.
    /// Diagnostics (tests use it to see read-ahead happen).
    pub fn is_ready_or_loading(&self, l: usize) -> bool {
        if self.shared.pinned.get(l).is_some_and(Option::is_some) {
            return true;
        }
        let st = self.shared.lock();
        let found = st
            .slots
            .iter()
            .any(|x| matches!(x, Slot::Ready(k) | Slot::Reading(k) if *k == l));
        found
    }

    /// Counters so far.
    pub fn stats(&self) -> TrunkStats {
        self.shared.lock().stats.clone()
    }
}

impl Drop for TrunkStore {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot to read layer `next` into, seen from the compute position `from`: no live guard,
    /// no read in flight; empty or failed first, else the ready layer needed furthest in the
    /// future (cyclically after `from`) — and only if that is later than `next` itself.
    fn victim(&self, st: &RingState, from: usize, next: usize) -> Option<usize> {
        let n = self.runs.len();
        let dist = |k: usize| (k + n - from) % n;
        let score = |s: usize| match st.slots[s] {
            Slot::Empty | Slot::Failed(..) => Some(n + 1),
            Slot::Ready(k) if k == from => Some(n),
            Slot::Ready(k) => Some(dist(k)),
            Slot::Reading(_) => None,
        };
        (0..st.slots.len())
            .filter(|&s| st.users[s] == 0)
            .filter_map(|s| score(s).map(|v| (v, s)))
            .filter(|&(v, _)| next == from || v > dist(next))
            .max()
            .map(|(_, s)| s)
    }

    /// Reads layer `layer` into ring slot `slot` (marked `Reading` by the caller) and
    /// publishes the outcome.
    fn fill(&self, slot: usize, layer: usize) {
        let t = Instant::now();
        let result = {
            let mut buf = self.ring[slot].write().unwrap_or_else(|e| e.into_inner());
            let run = &self.runs[layer];
            load(&self.files, self.decoding.as_ref(), layer, run, &mut buf)
        };
        let mut st = self.lock();
        let decode_s = *result.as_ref().unwrap_or(&0.0);
        st.stats.io_seconds += t.elapsed().as_secs_f64() - decode_s;
        st.stats.decode_seconds += decode_s;
        st.slots[slot] = match result {
            Ok(_) => {
                st.stats.reads += 1;
                st.stats.bytes_read += self.runs[layer].len;
                if let Some(d) = &self.decoding {
                    st.stats.bytes_decoded += d.decoder.decoded_len(layer);
                }
                Slot::Ready(layer)
            }
            Err(e) => {
                st.stats.failures += 1;
                Slot::Failed(layer, e)
            }
        };
        self.cv.notify_all();
    }
}

/// Bytes a run needs in an aligned buffer (widened to 4096 boundaries at both ends).
fn span(run: &RunLoc) -> usize {
    aligned_span(run.offset, run.len) as usize
}

/// Where layer `l`'s bytes sit in its buffer: `(start, len, buffer bytes)`. A plain run keeps
/// its file offset modulo 4096; a decoded run starts at 0.
fn placement(decoding: Option<&decode::Decoding>, l: usize, run: &RunLoc) -> (usize, usize, usize) {
    match decoding {
        None => (
            (run.offset % crate::io::ALIGN as u64) as usize,
            run.len as usize,
            span(run),
        ),
        Some(d) => {
            let n = d.decoder.decoded_len(l) as usize;
            (0, n, n.div_ceil(crate::io::ALIGN) * crate::io::ALIGN)
        }
    }
}

/// Reads layer `l`'s run into `buf` — directly, or through the staging buffer and the
/// decoder; returns the seconds spent decoding.
fn load(
    files: &[Arc<dyn ReadAt>],
    decoding: Option<&decode::Decoding>,
    l: usize,
    run: &RunLoc,
    buf: &mut AlignedBuf,
) -> Result<f64, StoreError> {
    match decoding {
        None => read_run(files, l, run, buf).map(|()| 0.0),
        Some(d) => d.load(files, l, run, buf),
    }
}

/// Reads one layer's run into `buf` at `offset % 4096`.
fn read_run(
    files: &[Arc<dyn ReadAt>],
    l: usize,
    run: &RunLoc,
    buf: &mut AlignedBuf,
) -> Result<(), StoreError> {
    let f = &files[run.file];
    f.read_into_aligned(&mut buf[..span(run)], run.offset, run.len as usize)
        .map_err(|source| StoreError::Read {
            what: format!("trunk layer {l}"),
            path: f.path().to_path_buf(),
            offset: run.offset,
            len: run.len,
            source,
        })
}

/// Validates the constructor's arguments.
fn check_runs(
    files: &[Arc<dyn ReadAt>],
    runs: &[RunLoc],
    pinned: &[bool],
    ring_slots: usize,
) -> Result<(), StoreError> {
    if pinned.len() != runs.len() {
        return Err(StoreError::Config(format!(
            "pin mask has {} entries for {} trunk layers",
            pinned.len(),
            runs.len()
        )));
    }
    if runs.is_empty() {
        return Err(StoreError::Config("no trunk layer".into()));
    }
    if ring_slots == 0 && pinned.iter().any(|p| !p) {
        return Err(StoreError::Config(
            "some trunk layers are not pinned but the ring has 0 slots".into(),
        ));
    }
    for (l, r) in runs.iter().enumerate() {
        let what = format!("trunk layer {l}");
        let f = files.get(r.file).ok_or_else(|| StoreError::Layout {
            what: what.clone(),
            reason: format!("file index {} but only {} files", r.file, files.len()),
        })?;
        if r.offset.checked_add(r.len).is_none_or(|end| end > f.len()) {
            return Err(StoreError::Layout {
                what,
                reason: format!(
                    "run of {} bytes at offset {} passes the end of {} ({} bytes)",
                    r.len,
                    r.offset,
                    f.path().display(),
                    f.len()
                ),
            });
        }
    }
    Ok(())
}
