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
//! * **Pieces smaller than a layer** ([`TrunkStore::new_pieces`]): each layer's run is split
//!   into `P` pieces (the token mixer's tensors, then the channel mixer's), bound one after
//!   the other by the pass; the ring holds one slot per piece class, so the next piece is
//!   read while the current one computes in about one layer's bytes. The same rules hold per
//!   piece: a slot with a live guard is never read into.

mod decode;
mod ring;

pub use decode::RunDecoder;

use crate::io::{AlignedBuf, ReadAt};
use crate::StoreError;
use k3_plan::TrunkPlan;
use ring::{check_runs, load_with, placement, RingState, Shared, Slot};
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
    /// Bytes of the largest ring slot.
    pub slot_bytes: u64,
    /// Bytes of all ring slots.
    pub ring_bytes: u64,
    /// Pieces each layer streams in (1: whole layers).
    pub pieces: usize,
    /// Layers bound ([`TrunkStore::layer`], or [`TrunkStore::piece`] of a layer's first
    /// piece) that returned bytes.
    pub binds: u64,
    /// Of those, binds served by a pinned layer.
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
    /// Bytes of the two staging buffers compressed runs are read into (0 for a plain trunk).
    pub staging_bytes: u64,
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
    /// at offset 0), reads land in a staging buffer and are decoded between the read and
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
        Self::build(files, runs, 1, pinned, ring_slots, decoder, progress)
    }

    /// A store whose layers stream in `pieces` pieces each: `runs[l · pieces + p]` is piece
    /// `p` of layer `l` (a decoder, when given, is asked for the same unit numbers). A pinned
    /// layer pins all its pieces; the ring holds ONE slot per piece class, each the size of
    /// that class's largest unpinned piece, and with two or more slots a reader reads the next
    /// unit (the next piece, or the next layer's first) into its class's slot while the
    /// current one computes. Bind pieces with [`TrunkStore::piece`], in order.
    pub fn new_pieces(
        files: Vec<Arc<dyn ReadAt>>,
        runs: Vec<RunLoc>,
        pieces: usize,
        pinned: &[bool],
        decoder: Option<Arc<dyn RunDecoder>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<TrunkStore, StoreError> {
        Self::build(files, runs, pieces, pinned, 1, decoder, progress)
    }

    /// The constructors' common path: `slots_per_class` ring slots for each piece class.
    fn build(
        files: Vec<Arc<dyn ReadAt>>,
        runs: Vec<RunLoc>,
        pieces: usize,
        pinned_layers: &[bool],
        slots_per_class: usize,
        decoder: Option<Arc<dyn RunDecoder>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<TrunkStore, StoreError> {
        check_runs(&files, &runs, pieces, pinned_layers, slots_per_class)?;
        let decoding = decoder.map(|d| decode::Decoding::new(d, &runs));
        let pinned: Vec<bool> = (0..runs.len()).map(|u| pinned_layers[u / pieces]).collect();
        let mut stats = TrunkStats {
            layers: pinned_layers.len(),
            pieces,
            staging_bytes: decoding.as_ref().map_or(0, |d| d.staging_bytes()),
            ..TrunkStats::default()
        };
        let bufs = read_pinned(
            &files,
            &runs,
            pieces,
            &pinned,
            decoding.as_ref(),
            &mut stats,
            progress,
        )?;
        let (ring, slot_class) =
            allocate_ring(&runs, pieces, &pinned, decoding.as_ref(), slots_per_class);
        stats.ring_slots = ring.len();
        stats.ring_bytes = ring.iter().map(|b| b.len() as u64).sum();
        stats.slot_bytes = ring.iter().map(|b| b.len() as u64).max().unwrap_or(0);
        let n = ring.len();
        let shared = Arc::new(Shared {
            files,
            runs,
            pieces,
            pinned: bufs,
            ring: ring.into_iter().map(RwLock::new).collect(),
            slot_class,
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
                while let Ok((slot, unit)) = rx.recv() {
                    shared.fill(slot, unit);
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
    /// the run's file offset, valid while the guard lives. (A store of pieces: its first
    /// piece, as [`TrunkStore::piece`]`(l, 0)`.)
    ///
    /// A pinned layer returns at once. A streamed layer blocks on an in-flight read of it, or
    /// reads it now into a free slot. After binding, the next unpinned layers in cyclic order
    /// are queued for the background reader into FREE slots — never into a slot in use (with
    /// one slot there is no reader and so no read-ahead at all). A failed read returns
    /// [`StoreError::Read`] naming layer `l`; the slot is freed and the next call retries.
    pub fn layer(&self, l: usize) -> Result<LayerBytes<'_>, StoreError> {
        self.piece(l, 0)
    }

    /// Piece `p` of layer `l` (as [`TrunkStore::layer`], for a store of pieces): after
    /// binding, the next unit — the layer's next piece, or the next streamed layer's first —
    /// is queued for the reader into a free slot of its class.
    pub fn piece(&self, l: usize, p: usize) -> Result<LayerBytes<'_>, StoreError> {
        let shared = &*self.shared;
        let layers = shared.runs.len() / shared.pieces;
        if l >= layers || p >= shared.pieces {
            return Err(StoreError::LayerOutOfRange { layer: l, layers });
        }
        let u = l * shared.pieces + p;
        let (start, len, _) = placement(shared.decoding.as_ref(), u, &shared.runs[u]);
        if let Some(buf) = &shared.pinned[u] {
            let mut st = shared.lock();
            if p == 0 {
                st.stats.binds += 1;
                st.stats.pinned_hits += 1;
            }
            self.read_ahead(&mut st, u);
            let src = Src::Pinned(buf);
            return Ok(LayerBytes { src, start, len });
        }
        let t = Instant::now();
        let (slot, mut st) = self.bind_slot(u)?;
        st.users[slot] += 1;
        st.stats.binds += u64::from(p == 0);
        st.stats.wait_seconds += t.elapsed().as_secs_f64();
        self.read_ahead(&mut st, u);
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
    /// A store of pieces: piece `p` of it, through [`TrunkStore::pinned_piece`].
    pub fn pinned_layer(&self, l: usize) -> Option<LayerBytes<'_>> {
        self.pinned_piece(l, 0)
    }

    /// Piece `p` of layer `l` when the layer is pinned ([`TrunkStore::pinned_layer`]).
    pub fn pinned_piece(&self, l: usize, p: usize) -> Option<LayerBytes<'_>> {
        let shared = &*self.shared;
        if p >= shared.pieces {
            return None;
        }
        let u = l.checked_mul(shared.pieces)? + p;
        let run = *shared.runs.get(u)?;
        let buf = shared.pinned.get(u)?.as_ref()?;
        let (start, len, _) = placement(shared.decoding.as_ref(), u, &run);
        Some(LayerBytes {
            src: Src::Pinned(buf),
            start,
            len,
        })
    }

    /// Finds (waiting for, or reading) the slot holding unit `u`; returns it with the lock.
    fn bind_slot(&self, u: usize) -> Result<(usize, MutexGuard<'_, RingState>), StoreError> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        loop {
            let holds = |x: &Slot| matches!(x, Slot::Ready(k) if *k == u);
            if let Some(s) = st.slots.iter().position(holds) {
                return Ok((s, st));
            }
            let failed = |x: &Slot| matches!(x, Slot::Failed(k, _) if *k == u);
            if let Some(s) = st.slots.iter().position(failed) {
                if let Slot::Failed(_, e) = std::mem::replace(&mut st.slots[s], Slot::Empty) {
                    return Err(e);
                }
            }
            let in_flight = st.slots.iter().any(|x| matches!(x, Slot::Reading(_)));
            if st
                .slots
                .iter()
                .any(|x| matches!(x, Slot::Reading(k) if *k == u))
            {
                st = shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            match shared.victim(&st, u, u) {
                Some(s) => {
                    st.slots[s] = Slot::Reading(u);
                    drop(st);
                    shared.fill(s, u);
                    st = shared.lock();
                }
                None if in_flight => st = shared.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                None => {
                    let what = shared.what(u);
                    let class = u % shared.pieces;
                    let slots = shared.slot_class.iter().filter(|&&c| c == class).count();
                    return Err(StoreError::RingBusy { what, slots });
                }
            }
        }
    }

    /// Queues the next `ring − 1` unpinned units after `u` (cyclic) for the reader, each into
    /// a free slot of its class holding nothing needed sooner. No reader (ring of 1) ⇒
    /// nothing.
    fn read_ahead(&self, st: &mut RingState, u: usize) {
        let Some(jobs) = &self.jobs else { return };
        let shared = &*self.shared;
        let n = shared.runs.len();
        let ahead = (1..n)
            .map(|d| (u + d) % n)
            .filter(|&k| shared.pinned[k].is_none())
            .take(shared.ring.len() - 1);
        for next in ahead {
            let held = |x: &Slot| matches!(x, Slot::Ready(k) | Slot::Reading(k) if *k == next);
            if st.slots.iter().any(held) {
                continue;
            }
            let Some(s) = shared.victim(st, u, next) else {
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

    /// True when layer `l` (its first piece) is pinned, or sits in a ring slot ready or being
    /// read. Diagnostics (tests use it to see read-ahead happen).
    pub fn is_ready_or_loading(&self, l: usize) -> bool {
        self.piece_ready_or_loading(l, 0)
    }

    /// [`TrunkStore::is_ready_or_loading`] for piece `p` of layer `l`.
    pub fn piece_ready_or_loading(&self, l: usize, p: usize) -> bool {
        let u = l * self.shared.pieces + p;
        if self.shared.pinned.get(u).is_some_and(Option::is_some) {
            return true;
        }
        let st = self.shared.lock();
        let found = st
            .slots
            .iter()
            .any(|x| matches!(x, Slot::Ready(k) | Slot::Reading(k) if *k == u));
        found
    }

    /// Pieces each layer streams in (1: whole layers).
    pub fn pieces(&self) -> usize {
        self.shared.pieces
    }

    /// Counters so far.
    pub fn stats(&self) -> TrunkStats {
        self.shared.lock().stats.clone()
    }
}

/// Reads (and decodes) every pinned unit into an exact-size buffer; `None` for the others.
fn read_pinned(
    files: &[Arc<dyn ReadAt>],
    runs: &[RunLoc],
    pieces: usize,
    pinned: &[bool],
    decoding: Option<&decode::Decoding>,
    stats: &mut TrunkStats,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<Option<AlignedBuf>>, StoreError> {
    let pin_total: u64 = runs
        .iter()
        .zip(pinned)
        .filter(|(_, &p)| p)
        .map(|(r, _)| r.len)
        .sum();
    let mut bufs = Vec::with_capacity(runs.len());
    for (u, run) in runs.iter().enumerate() {
        if !pinned[u] {
            bufs.push(None);
            continue;
        }
        let (_, decoded, bytes) = placement(decoding, u, run);
        let mut buf = AlignedBuf::new(bytes);
        let t = Instant::now();
        let next = (u + 1..runs.len()).find(|&k| pinned[k]);
        let decode_s = load_with(files, decoding, (pieces, runs), u, &mut buf, next)?;
        stats.io_seconds += t.elapsed().as_secs_f64() - decode_s;
        stats.decode_seconds += decode_s;
        stats.bytes_decoded += decoding.map_or(0, |_| decoded as u64);
        stats.reads += 1;
        stats.bytes_read += run.len;
        stats.pinned_layers += usize::from(u % pieces == 0);
        stats.pinned_bytes += buf.len() as u64;
        progress(stats.bytes_read, pin_total);
        bufs.push(Some(buf));
    }
    Ok(bufs)
}

/// `slots_per_class` slots for each piece class that has an unpinned unit, each the size of
/// that class's largest unpinned unit; returns the slots and their classes.
fn allocate_ring(
    runs: &[RunLoc],
    pieces: usize,
    pinned: &[bool],
    decoding: Option<&decode::Decoding>,
    slots_per_class: usize,
) -> (Vec<AlignedBuf>, Vec<usize>) {
    let mut ring = Vec::new();
    let mut classes = Vec::new();
    for class in 0..pieces {
        let biggest = (class..runs.len())
            .step_by(pieces)
            .filter(|&u| !pinned[u])
            .map(|u| placement(decoding, u, &runs[u]).2)
            .max();
        let Some(bytes) = biggest else { continue };
        for _ in 0..slots_per_class {
            // Ring slots are refilled every token: fault their (huge) pages in now, as the
            // expert pool does (docs/PERFORMANCE.md#cold-start: THP advice without
            // pre-faulting measured slower than either).
            let slot = AlignedBuf::new(bytes);
            if crate::io::BufferPolicy::current().prefault {
                slot.prefault();
            }
            ring.push(slot);
            classes.push(class);
        }
    }
    (ring, classes)
}

impl Drop for TrunkStore {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}
