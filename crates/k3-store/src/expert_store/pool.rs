//! The expert store's I/O pool: a few plain threads (never rayon) fed by one queue, and one
//! short-lived thread that pre-faults the cache's slots at open
//! (docs/PERFORMANCE.md#cold-start).

use super::{lock, ExpertLoc, Shared};
use crate::io::BufferPolicy;
use crate::StoreError;
use k3_plan::ExpertKey;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// One expert read: into `slot`, for wave entry `want`.
pub(crate) struct Job {
    pub(crate) slot: usize,
    pub(crate) want: usize,
    key: ExpertKey,
    pub(crate) loc: ExpertLoc,
    /// Set before the read starts ⇒ the read is skipped (a stale lookahead hint).
    cancel: Option<Arc<AtomicBool>>,
}

impl Job {
    /// A read of `loc` into `slot` for wave entry `want` (expert `key`).
    pub(crate) fn new(slot: usize, want: usize, key: ExpertKey, loc: ExpertLoc) -> Self {
        Self {
            slot,
            want,
            key,
            loc,
            cancel: None,
        }
    }

    /// The same read, skipped if `flag` is set before a thread picks it up.
    pub(crate) fn cancellable(mut self, flag: Arc<AtomicBool>) -> Self {
        self.cancel = Some(flag);
        self
    }
}

/// A finished read.
pub(crate) struct Done {
    pub(crate) slot: usize,
    pub(crate) want: usize,
    /// Payload `(start, len)` within the slot, or the error.
    pub(crate) result: Result<(usize, usize), StoreError>,
    /// Seconds the read took.
    pub(crate) seconds: f64,
    /// The read was cancelled before it started (nothing was read).
    pub(crate) skipped: bool,
}

type Queued = (Job, Sender<Done>);

/// Stack of the pre-fault thread (it only loops over the slots).
const PREFAULT_STACK: usize = 64 << 10;

/// Plain I/O threads sharing one job queue.
pub(crate) struct Pool {
    queue: Option<Sender<Queued>>,
    threads: Vec<JoinHandle<()>>,
    /// Set on drop: the pre-fault thread stops at its next slot.
    stop: Arc<AtomicBool>,
}

impl Pool {
    /// Starts `n` threads reading into `shared`'s slots.
    pub(crate) fn start(shared: Arc<Shared>, n: usize) -> Result<Pool, StoreError> {
        let (tx, rx) = channel::<Queued>();
        let rx = Arc::new(Mutex::new(rx));
        let mut pool = Pool {
            queue: Some(tx),
            threads: Vec::with_capacity(n + 1),
            stop: Arc::new(AtomicBool::new(false)),
        };
        if BufferPolicy::current().prefault {
            let (shared, stop) = (Arc::clone(&shared), Arc::clone(&pool.stop));
            let spawned = std::thread::Builder::new()
                .name("k3-expert-prefault".into())
                // It calls one madvise per slot: a small stack keeps the address space of a
                // capped run (`prlimit --as`, k3-cli's mem_cap test) as it was.
                .stack_size(PREFAULT_STACK)
                .spawn(move || prefault_slots(&shared, &stop));
            // Pre-faulting only moves work earlier: where no thread can be made for it, the
            // slots fault on first use as before, and the I/O threads below report the error.
            if let Ok(handle) = spawned {
                pool.threads.push(handle);
            }
        }
        for i in 0..n {
            let (shared, rx) = (Arc::clone(&shared), Arc::clone(&rx));
            let handle = std::thread::Builder::new()
                .name(format!("k3-expert-io-{i}"))
                .spawn(move || worker(&shared, &rx))
                .map_err(StoreError::Spawn)?;
            pool.threads.push(handle);
        }
        Ok(pool)
    }

    /// Queues every job (in the given order) and returns their completions as they arrive.
    pub(crate) fn submit(&self, jobs: Vec<Job>) -> Pending {
        let (tx, rx) = channel();
        let mut pending = Pending {
            rx,
            outstanding: Vec::with_capacity(jobs.len()),
            gone: Vec::new(),
        };
        for job in jobs {
            let ticket = (job.slot, job.want, job.key);
            match self.queue.as_ref().map(|q| q.send((job, tx.clone()))) {
                Some(Ok(())) => pending.outstanding.push(ticket),
                _ => pending.gone.push(gone(ticket)),
            }
        }
        pending
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.queue = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Completions of one submission; yields exactly one [`Done`] per job.
pub(crate) struct Pending {
    rx: Receiver<Done>,
    outstanding: Vec<(usize, usize, ExpertKey)>,
    gone: Vec<Done>,
}

impl Iterator for Pending {
    type Item = Done;
    fn next(&mut self) -> Option<Done> {
        if let Some(d) = self.gone.pop() {
            return Some(d);
        }
        if self.outstanding.is_empty() {
            return None;
        }
        match self.rx.recv() {
            Ok(done) => {
                self.outstanding.retain(|t| t.0 != done.slot);
                Some(done)
            }
            // Every worker holding one of our senders is gone: fail what is left.
            Err(_) => self.outstanding.pop().map(gone),
        }
    }
}

/// The completion of a job the pool could not run.
fn gone((slot, want, key): (usize, usize, ExpertKey)) -> Done {
    let what = format!("expert {} of layer {}", key.expert, key.layer);
    Done {
        slot,
        want,
        result: Err(StoreError::IoPoolGone(what)),
        seconds: 0.0,
        skipped: false,
    }
}

/// Faults in every cache slot's pages in slot order (the order an empty cache hands slots
/// out), so the first reads into them do not stop on page faults. A slot whose lock an I/O
/// thread holds is skipped: that read faults its own pages, as without pre-faulting.
fn prefault_slots(shared: &Shared, stop: &AtomicBool) {
    for buf in &shared.bufs {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(slot) = buf.try_lock() {
            slot.prefault();
        }
    }
}

fn worker(shared: &Shared, rx: &Mutex<Receiver<Queued>>) {
    loop {
        let next = lock(rx).recv();
        let Ok((job, reply)) = next else { return };
        if job
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Acquire))
        {
            let what = format!("expert {} of layer {}", job.key.expert, job.key.layer);
            let _ = reply.send(Done {
                slot: job.slot,
                want: job.want,
                result: Err(StoreError::IoPoolGone(format!("{what}: hint cancelled"))),
                seconds: 0.0,
                skipped: true,
            });
            continue;
        }
        let t = Instant::now();
        let result = shared
            .read_expert(job.slot, &job.loc)
            .map_err(|(offset, len, source)| {
                let f = &shared.files[job.loc.file];
                StoreError::Read {
                    what: format!("expert {} of layer {}", job.key.expert, job.key.layer),
                    path: f.path().to_path_buf(),
                    offset,
                    len,
                    source,
                }
            });
        let seconds = t.elapsed().as_secs_f64();
        let _ = reply.send(Done {
            slot: job.slot,
            want: job.want,
            result,
            seconds,
            skipped: false,
        });
    }
}
