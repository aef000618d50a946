//! Compressed trunk runs (docs/STREAMING.md#compressed-trunk): the store reads a unit's (a
//! layer's, or a piece's) stored bytes into a staging buffer and has a [`RunDecoder`] turn
//! them into the decoded bytes in the unit's buffer (pinned buffer or ring slot), between the
//! read and the bind. There are two staging buffers: while unit `u` decodes from one, a
//! stager thread reads the unit expected next into the other, so the drive does not idle
//! during the decode (docs/STREAMING.md#overlapped-decode).
//! The store never knows the codec; the engine supplies the decoder (which decodes
//! chunk-parallel on a pool of its own).

use super::ring::{read_run, span};
use super::RunLoc;
use crate::io::{AlignedBuf, ReadAt};
use crate::StoreError;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// Turns a unit's stored bytes into its decoded bytes. Units are the store's runs: layers,
/// or with `P` pieces per layer, piece `p` of layer `l` is unit `l · P + p`.
pub trait RunDecoder: Send + Sync {
    /// Length of unit `u`'s decoded bytes.
    fn decoded_len(&self, u: usize) -> u64;
    /// Decodes unit `u`'s stored run `stored` into `out` (exactly [`Self::decoded_len`]
    /// bytes); a damaged run is an error naming what is damaged, never wrong bytes.
    fn decode(&self, u: usize, stored: &[u8], out: &mut [u8]) -> Result<(), String>;
}

/// What a staging buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Staged {
    Empty,
    /// The stager is reading this unit's stored run into it.
    Reading(usize),
    /// This unit's stored run, read ahead of its load.
    Ready(usize),
    /// A load is reading into it or decoding from it.
    InUse,
}

/// The staging buffers, what each holds, and the condition the stager signals.
struct Stage {
    /// Two buffers, each the largest stored run's span. A buffer's lock is only taken by
    /// the one party its state gives it to (a load when `InUse`, the stager when `Reading`).
    bufs: [Mutex<AlignedBuf>; 2],
    held: Mutex<[Staged; 2]>,
    cv: Condvar,
}

impl Stage {
    fn held(&self) -> MutexGuard<'_, [Staged; 2]> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn buf(&self, b: usize) -> MutexGuard<'_, AlignedBuf> {
        self.bufs[b].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets buffer `b`'s state and wakes the waiters.
    fn set(&self, b: usize, to: Staged) {
        self.held()[b] = to;
        self.cv.notify_all();
    }
}

/// A read for the stager thread: unit `unit`'s stored run `run` of `file` into buffer `buf`.
struct StageRead {
    buf: usize,
    unit: usize,
    run: RunLoc,
    file: Arc<dyn ReadAt>,
    what: String,
}

/// The decoder, the staging buffers reads land in before decoding, and the stager thread
/// that reads the next unit while the current one decodes. Loads are serialised (the drive
/// reads one run at a time anyway).
pub(super) struct Decoding {
    pub(super) decoder: Arc<dyn RunDecoder>,
    stage: Arc<Stage>,
    loads: Mutex<()>,
    /// Reads for the stager thread (`None` if it could not be started: loads then read
    /// their own runs, serially).
    stager: Option<(Sender<StageRead>, JoinHandle<()>)>,
}

impl Decoding {
    pub(super) fn new(decoder: Arc<dyn RunDecoder>, runs: &[RunLoc]) -> Decoding {
        let biggest = runs.iter().map(span).max().unwrap_or(0);
        let stage = Arc::new(Stage {
            bufs: [
                Mutex::new(AlignedBuf::new(biggest)),
                Mutex::new(AlignedBuf::new(biggest)),
            ],
            held: Mutex::new([Staged::Empty; 2]),
            cv: Condvar::new(),
        });
        Decoding {
            decoder,
            stager: start_stager(Arc::clone(&stage)),
            stage,
            loads: Mutex::new(()),
        }
    }

    /// Bytes the staging buffers hold.
    pub(super) fn staging_bytes(&self) -> u64 {
        (0..2).map(|b| self.stage.buf(b).len() as u64).sum()
    }

    /// Reads unit `u`'s stored run (`what` in messages) — or takes it from the staging
    /// buffer it was read ahead into — and decodes it into `out[..decoded_len]`, while the
    /// stager reads `next` (the unit expected after `u`: its number, run and name) into the
    /// other buffer; returns the seconds spent decoding.
    pub(super) fn load(
        &self,
        files: &[Arc<dyn ReadAt>],
        u: usize,
        what: &str,
        run: &RunLoc,
        out: &mut [u8],
        next: Option<(usize, RunLoc, String)>,
    ) -> Result<f64, StoreError> {
        let _serial = self.loads.lock().unwrap_or_else(|e| e.into_inner());
        let (b, staged) = self.claim(u);
        let mut buf = self.stage.buf(b);
        let result = (|| {
            if !staged {
                read_run(files, what, run, &mut buf)?;
            }
            self.stage_next(files, b, next);
            let start = (run.offset % crate::io::ALIGN as u64) as usize;
            let stored = &buf[start..start + run.len as usize];
            let n = self.decoder.decoded_len(u) as usize;
            let t = Instant::now();
            self.decoder
                .decode(u, stored, &mut out[..n])
                .map_err(|reason| StoreError::Decode {
                    what: what.to_string(),
                    reason,
                })?;
            Ok(t.elapsed().as_secs_f64())
        })();
        drop(buf);
        self.stage.set(b, Staged::Empty);
        result
    }

    /// A staging buffer for unit `u`, marked in use: the one `u` was read ahead into
    /// (`true`; waiting for that read if it is in flight), else a free one (`false`).
    fn claim(&self, u: usize) -> (usize, bool) {
        let mut held = self.stage.held();
        loop {
            if let Some(b) = held.iter().position(|s| *s == Staged::Ready(u)) {
                held[b] = Staged::InUse;
                return (b, true);
            }
            let reading_u = held.contains(&Staged::Reading(u));
            let free = held
                .iter()
                .position(|s| matches!(s, Staged::Empty | Staged::Ready(_)));
            match free {
                Some(b) if !reading_u => {
                    held[b] = Staged::InUse;
                    return (b, false);
                }
                // Loads are serialised, so the other buffer is at most being read into.
                _ => held = self.stage.cv.wait(held).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// Queues `next`'s read into the buffer other than `b` unless it is already staged or
    /// the stager is busy.
    fn stage_next(
        &self,
        files: &[Arc<dyn ReadAt>],
        b: usize,
        next: Option<(usize, RunLoc, String)>,
    ) {
        let (Some((tx, _)), Some((unit, run, what))) = (&self.stager, next) else {
            return;
        };
        let other = 1 - b;
        let mut held = self.stage.held();
        if held[other] == Staged::Ready(unit) || matches!(held[other], Staged::Reading(_)) {
            return;
        }
        let Some(file) = files.get(run.file) else {
            return;
        };
        held[other] = Staged::Reading(unit);
        let read = StageRead {
            buf: other,
            unit,
            run,
            file: Arc::clone(file),
            what,
        };
        if tx.send(read).is_err() {
            held[other] = Staged::Empty;
        }
    }
}

/// Starts the stager thread: each read lands in its buffer, which becomes `Ready` (or
/// `Empty` if the read failed: the load then reads the run itself and reports the error).
fn start_stager(stage: Arc<Stage>) -> Option<(Sender<StageRead>, JoinHandle<()>)> {
    let (tx, rx) = channel::<StageRead>();
    let handle = std::thread::Builder::new()
        .name("k3-trunk-stager".into())
        .spawn(move || {
            while let Ok(r) = rx.recv() {
                let ok = {
                    let mut buf = stage.buf(r.buf);
                    read_run(std::slice::from_ref(&r.file), &r.what, &r.run0(), &mut buf).is_ok()
                };
                let to = if ok {
                    Staged::Ready(r.unit)
                } else {
                    Staged::Empty
                };
                stage.set(r.buf, to);
            }
        })
        .ok()?;
    Some((tx, handle))
}

impl StageRead {
    /// The run as seen in the one-file slice the stager reads from.
    fn run0(&self) -> RunLoc {
        RunLoc {
            file: 0,
            ..self.run
        }
    }
}

impl Drop for Decoding {
    fn drop(&mut self) {
        if let Some((tx, handle)) = self.stager.take() {
            drop(tx);
            let _ = handle.join();
        }
    }
}
