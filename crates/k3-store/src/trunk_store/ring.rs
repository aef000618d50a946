//! The ring's bookkeeping, shared by the store and its reader thread: which unit (a layer,
//! or a piece of one) each slot holds, who holds it, and the reads that fill it.

use super::{decode, RunLoc, TrunkStats};
use crate::io::{aligned_span, AlignedBuf, ReadAt};
use crate::StoreError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Instant;

/// What a ring slot holds.
#[derive(Debug)]
pub(super) enum Slot {
    Empty,
    Reading(usize),
    Ready(usize),
    Failed(usize, StoreError),
}

/// Ring bookkeeping, under one mutex.
pub(super) struct RingState {
    pub(super) slots: Vec<Slot>,
    /// Live guards per slot; a slot with users is never read into.
    pub(super) users: Vec<usize>,
    pub(super) stats: TrunkStats,
}

/// Everything the reader thread shares with the store. Units are numbered layer-major
/// (`layer · pieces + piece`) and visited in that cyclic order by every pass.
pub(super) struct Shared {
    pub(super) files: Vec<Arc<dyn ReadAt>>,
    /// Where each unit's bytes lie.
    pub(super) runs: Vec<RunLoc>,
    /// Pieces per layer (1: whole layers).
    pub(super) pieces: usize,
    /// Pinned unit buffers (`None` for streamed units).
    pub(super) pinned: Vec<Option<AlignedBuf>>,
    pub(super) ring: Vec<RwLock<AlignedBuf>>,
    /// The piece class (`unit % pieces`) each ring slot serves.
    pub(super) slot_class: Vec<usize>,
    pub(super) state: Mutex<RingState>,
    pub(super) cv: Condvar,
    /// Set for a compressed trunk: runs are read into staging and decoded into the buffers.
    pub(super) decoding: Option<decode::Decoding>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The name of unit `u` in messages: `trunk layer L` or `trunk layer L piece P`.
    pub(super) fn what(&self, u: usize) -> String {
        unit_name(u, self.pieces)
    }

    /// A slot to read unit `next` into, seen from the compute position `from`: of `next`'s
    /// class, no live guard, no read in flight; empty or failed first, else the ready unit
    /// needed furthest in the future (cyclically after `from`) — and only if that is later
    /// than `next` itself.
    pub(super) fn victim(&self, st: &RingState, from: usize, next: usize) -> Option<usize> {
        let n = self.runs.len();
        let dist = |k: usize| (k + n - from) % n;
        let score = |s: usize| match st.slots[s] {
            Slot::Empty | Slot::Failed(..) => Some(n + 1),
            Slot::Ready(k) if k == from => Some(n),
            Slot::Ready(k) => Some(dist(k)),
            Slot::Reading(_) => None,
        };
        let class = next % self.pieces;
        (0..st.slots.len())
            .filter(|&s| self.slot_class[s] == class && st.users[s] == 0)
            .filter_map(|s| score(s).map(|v| (v, s)))
            .filter(|&(v, _)| next == from || v > dist(next))
            .max()
            .map(|(_, s)| s)
    }

    /// Reads unit `unit` into ring slot `slot` (marked `Reading` by the caller) and
    /// publishes the outcome.
    pub(super) fn fill(&self, slot: usize, unit: usize) {
        let t = Instant::now();
        let result = {
            // Never blocks in practice: the slot was chosen with no live guard, and a guard
            // is only taken on a `Ready` slot. Were that ever wrong, the write lock would
            // wait for the reader of the old bytes rather than overwrite them.
            let mut buf = self.ring[slot].write().unwrap_or_else(|e| e.into_inner());
            load(self, unit, &mut buf)
        };
        let mut st = self.lock();
        let decode_s = *result.as_ref().unwrap_or(&0.0);
        st.stats.io_seconds += t.elapsed().as_secs_f64() - decode_s;
        st.stats.decode_seconds += decode_s;
        st.slots[slot] = match result {
            Ok(_) => {
                st.stats.reads += 1;
                st.stats.bytes_read += self.runs[unit].len;
                if let Some(d) = &self.decoding {
                    st.stats.bytes_decoded += d.decoder.decoded_len(unit);
                }
                Slot::Ready(unit)
            }
            Err(e) => {
                st.stats.failures += 1;
                Slot::Failed(unit, e)
            }
        };
        self.cv.notify_all();
    }
}

/// `trunk layer L` (whole layers) or `trunk layer L piece P`.
pub(super) fn unit_name(u: usize, pieces: usize) -> String {
    match pieces {
        1 => format!("trunk layer {u}"),
        p => format!("trunk layer {} piece {}", u / p, u % p),
    }
}

/// Bytes a run needs in an aligned buffer (widened to 4096 boundaries at both ends).
pub(super) fn span(run: &RunLoc) -> usize {
    aligned_span(run.offset, run.len) as usize
}

/// Where unit `u`'s bytes sit in its buffer: `(start, len, buffer bytes)`. A plain run keeps
/// its file offset modulo 4096; a decoded run starts at 0.
pub(super) fn placement(
    decoding: Option<&decode::Decoding>,
    u: usize,
    run: &RunLoc,
) -> (usize, usize, usize) {
    match decoding {
        None => (
            (run.offset % crate::io::ALIGN as u64) as usize,
            run.len as usize,
            span(run),
        ),
        Some(d) => {
            let n = d.decoder.decoded_len(u) as usize;
            (0, n, n.div_ceil(crate::io::ALIGN) * crate::io::ALIGN)
        }
    }
}

/// Reads unit `u`'s run into `buf` — directly, or through a staging buffer and the decoder,
/// staging the next streamed unit meanwhile; returns the seconds spent decoding.
pub(super) fn load(shared: &Shared, u: usize, buf: &mut AlignedBuf) -> Result<f64, StoreError> {
    let n = shared.runs.len();
    let next = (1..n)
        .map(|d| (u + d) % n)
        .find(|&k| shared.pinned[k].is_none());
    load_with(
        &shared.files,
        shared.decoding.as_ref(),
        (shared.pieces, &shared.runs),
        u,
        buf,
        next,
    )
}

/// [`load`] before the store exists (pinned units at construction): unit `u` of `runs`
/// (`pieces` per layer); a compressed trunk stages unit `next` while `u` decodes.
pub(super) fn load_with(
    files: &[Arc<dyn ReadAt>],
    decoding: Option<&decode::Decoding>,
    (pieces, runs): (usize, &[RunLoc]),
    u: usize,
    buf: &mut AlignedBuf,
    next: Option<usize>,
) -> Result<f64, StoreError> {
    let what = || unit_name(u, pieces);
    match decoding {
        None => read_run(files, &what(), &runs[u], buf).map(|()| 0.0),
        Some(d) => {
            let next = next.map(|k| (k, runs[k], unit_name(k, pieces)));
            d.load(files, u, &what(), &runs[u], buf, next)
        }
    }
}

/// Reads one run into `buf` at `offset % 4096`; errors name `what`.
pub(super) fn read_run(
    files: &[Arc<dyn ReadAt>],
    what: &str,
    run: &RunLoc,
    buf: &mut AlignedBuf,
) -> Result<(), StoreError> {
    let f = &files[run.file];
    f.read_into_aligned(&mut buf[..span(run)], run.offset, run.len as usize)
        .map_err(|source| StoreError::Read {
            what: what.to_string(),
            path: f.path().to_path_buf(),
            offset: run.offset,
            len: run.len,
            source,
        })
}

/// Validates the constructor's arguments: `runs` holds `pinned.len() · pieces` units.
pub(super) fn check_runs(
    files: &[Arc<dyn ReadAt>],
    runs: &[RunLoc],
    pieces: usize,
    pinned: &[bool],
    ring_slots: usize,
) -> Result<(), StoreError> {
    if pieces == 0 || pinned.len() * pieces != runs.len() {
        return Err(StoreError::Config(format!(
            "pin mask has {} entries for {} trunk runs in {pieces} pieces per layer",
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
    for (u, r) in runs.iter().enumerate() {
        let what = unit_name(u, pieces);
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
