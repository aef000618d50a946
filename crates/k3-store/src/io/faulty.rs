//! Fault injection for reads: a test tool, public so the engine's fault tests can use it.

use super::ReadAt;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What happens to a read that overlaps an injected byte range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The read fails with `EIO` (a bad sector, a yanked disk).
    Eio,
    /// The read fills part of the buffer, then fails with
    /// [`io::ErrorKind::UnexpectedEof`] (a truncated file).
    Short,
    /// The read succeeds after sleeping this long (a slow or contended disk).
    Delay(Duration),
}

/// **Test tool.** Wraps a reader and injects [`Fault`]s into reads that overlap chosen byte
/// ranges; counts every read it is asked for.
///
/// Faults apply to both [`ReadAt::read_exact_at`] and [`ReadAt::read_into_aligned`] (which is
/// forwarded to the inner reader, so O_DIRECT stays in use underneath). Delays of every
/// overlapping range add up; the first overlapping `Eio` or `Short` (in injection order)
/// decides a failure. Faults can be added and removed while the stores are running.
pub struct FaultyReader {
    inner: Arc<dyn ReadAt>,
    faults: Mutex<Vec<(Range<u64>, Fault)>>,
    reads: AtomicU64,
}

impl FaultyReader {
    /// Wraps `inner` with no fault injected.
    pub fn new(inner: Arc<dyn ReadAt>) -> Self {
        Self {
            inner,
            faults: Mutex::new(Vec::new()),
            reads: AtomicU64::new(0),
        }
    }

    /// Injects `fault` for every read overlapping the absolute byte range `range`.
    pub fn inject(&self, range: Range<u64>, fault: Fault) {
        self.lock().push((range, fault));
    }

    /// Removes every injected fault.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Reads asked of this reader so far (successful or not).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Range<u64>, Fault)>> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sleeps for the delays overlapping `[offset, offset + len)` and returns the first
    /// failing fault, if any.
    fn faults_for(&self, offset: u64, len: usize) -> Option<Fault> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let end = offset + len.max(1) as u64;
        let hits: Vec<Fault> = self
            .lock()
            .iter()
            .filter(|(r, _)| r.start < end && offset < r.end)
            .map(|(_, f)| *f)
            .collect();
        let delay: Duration = hits
            .iter()
            .map(|f| match f {
                Fault::Delay(d) => *d,
                _ => Duration::ZERO,
            })
            .sum();
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        hits.into_iter().find(|f| !matches!(f, Fault::Delay(_)))
    }

    fn error(&self, fault: Fault, offset: u64, len: usize) -> io::Error {
        let path = self.inner.path().display();
        match fault {
            Fault::Short => io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{path}: injected short read of {len} bytes at offset {offset}"),
            ),
            _ => {
                let eio = io::Error::from_raw_os_error(libc::EIO);
                io::Error::new(
                    eio.kind(),
                    format!("{path}: injected {eio} reading {len} bytes at offset {offset}"),
                )
            }
        }
    }
}

impl ReadAt for FaultyReader {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self.faults_for(offset, buf.len()) {
            None => self.inner.read_exact_at(buf, offset),
            Some(Fault::Short) => {
                let half = buf.len() / 2;
                self.inner.read_exact_at(&mut buf[..half], offset)?;
                Err(self.error(Fault::Short, offset, buf.len()))
            }
            Some(f) => Err(self.error(f, offset, buf.len())),
        }
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn read_into_aligned(&self, dst: &mut [u8], offset: u64, len: usize) -> io::Result<()> {
        match self.faults_for(offset, len) {
            None => self.inner.read_into_aligned(dst, offset, len),
            Some(Fault::Short) => {
                let half = len / 2;
                self.inner.read_into_aligned(dst, offset, half)?;
                Err(self.error(Fault::Short, offset, len))
            }
            Some(f) => Err(self.error(f, offset, len)),
        }
    }
}
