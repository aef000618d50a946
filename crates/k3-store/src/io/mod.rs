//! Positional reads of checkpoint shards: O_DIRECT where the filesystem allows it, buffered
//! otherwise.
//!
//! Upstream (docs/MODEL.md#streaming-lessons-from-upstream) reads trunk runs and routed experts with `O_DIRECT` so that the
//! 1.45 TB of experts and the streamed trunk layers do not churn the page cache: the cache
//! would otherwise fill with bytes the engine already holds in its own slots, and the kernel
//! would evict the engine's memory to keep them. `O_DIRECT` demands that the file offset,
//! the length and the buffer address all be multiples of 4096, so a read of an unaligned
//! byte run is widened to 4096 boundaries at both ends, lands in a 4096-aligned buffer, and
//! the payload is the sub-slice at `offset % 4096` ([`ReadAt::read_into_aligned`]). That is
//! why every slot holds `align4096(bytes + 2·4096)` (docs/MODEL.md#upstream-expert-cache). Filesystems that refuse
//! `O_DIRECT` (tmpfs, some network filesystems) fall back to buffered reads transparently.
//!
//! Every `pread` is clamped below 2 GiB (Linux returns at most `0x7ffff000` bytes per call;
//! the 2.34 GB dense trunk layer needs two calls), `EINTR` is retried and short reads are
//! continued ([`pread_loop`]).

mod faulty;

pub use faulty::{Fault, FaultyReader};

use std::fs::File;
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The O_DIRECT granularity: offsets, lengths and buffer addresses are multiples of this.
pub const ALIGN: usize = 4096;

/// Largest byte count asked of one `pread`: below 2 GiB and a multiple of [`ALIGN`], so a
/// chunked O_DIRECT read stays aligned from one call to the next.
pub const MAX_PREAD: usize = (1 << 31) - ALIGN;

/// Bounce-buffer size for O_DIRECT reads into caller buffers that are not aligned.
const BOUNCE: usize = 8 << 20;

/// Rounds `x` down to a multiple of [`ALIGN`].
pub fn align_down(x: u64) -> u64 {
    x - x % ALIGN as u64
}

/// Rounds `x` up to a multiple of [`ALIGN`].
pub fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN as u64) * ALIGN as u64
}

/// Bytes an aligned read of `len` bytes at `offset` covers: from `align_down(offset)` to
/// `align_up(offset + len)`. The payload sits at `offset % 4096` inside that span.
pub fn aligned_span(offset: u64, len: u64) -> u64 {
    align_up(offset % ALIGN as u64 + len)
}

/// A file that can be read at any offset from several threads at once.
///
/// Implemented by [`ShardFile`] (a real file, O_DIRECT when possible) and [`FaultyReader`]
/// (fault injection for tests). The stores hold `Arc<dyn ReadAt>`.
pub trait ReadAt: Send + Sync {
    /// Fills all of `buf` with the bytes at `offset`, or fails. A read that reaches the end of
    /// the file first fails with [`io::ErrorKind::UnexpectedEof`]; nothing is ever returned
    /// half-read as success.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// File length in bytes (fixed at open: checkpoints are immutable while served).
    fn len(&self) -> u64;

    /// True when the file holds no byte.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file's path, for error messages.
    fn path(&self) -> &Path;

    /// Reads `len` bytes at `offset` into `dst[offset % 4096 ..][.. len]`.
    ///
    /// `dst` must start on a 4096-byte boundary and hold at least
    /// [`aligned_span`]`(offset, len)` bytes; the bytes around the payload are unspecified.
    /// Every implementation places the payload at the same position, so a caller sees the
    /// same alignment whether or not O_DIRECT is in use. The default reads the payload with
    /// [`ReadAt::read_exact_at`]; [`ShardFile`] reads the widened range in place instead.
    fn read_into_aligned(&self, dst: &mut [u8], offset: u64, len: usize) -> io::Result<()> {
        let pad = check_aligned_dst(dst, offset, len)?;
        self.read_exact_at(&mut dst[pad..pad + len], offset)
    }
}

/// Validates a [`ReadAt::read_into_aligned`] destination; returns the payload offset.
fn check_aligned_dst(dst: &[u8], offset: u64, len: usize) -> io::Result<usize> {
    let span = aligned_span(offset, len as u64);
    if !(dst.as_ptr() as usize).is_multiple_of(ALIGN) || (dst.len() as u64) < span {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "aligned read of {len} bytes at offset {offset} needs a 4096-aligned buffer \
                 of {span} bytes, got {} bytes at address mod 4096 = {}",
                dst.len(),
                dst.as_ptr() as usize % ALIGN
            ),
        ));
    }
    Ok((offset % ALIGN as u64) as usize)
}

/// A zeroed byte buffer whose first byte sits on a 4096-byte boundary (O_DIRECT's rule).
///
/// Backed by an anonymous memory map (safe `memmap2` calls, no unsafe here): `mmap` returns
/// page-aligned addresses and every page size is a multiple of 4096. Pages are zero-filled
/// by the kernel on first touch, so a 2.4 GB ring slot costs nothing until read into.
/// Buffers of at least [`HUGE_PAGE`] bytes are advised for transparent huge pages
/// (`MADV_HUGEPAGE`, unless [`BufferPolicy`] says otherwise; the kernel honours it when
/// `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` or `always`), so their first
/// touch costs one fault per 2 MiB instead of one per 4 KiB (docs/PERFORMANCE.md#cold-start).
/// [`AlignedBuf::prefault`] populates the pages ahead of their first use. Where an anonymous
/// map cannot be made, a zeroed `Vec` over-allocated by 4096 bytes stands in (never resized,
/// so its address is stable for the buffer's life).
pub struct AlignedBuf {
    backing: Backing,
    len: usize,
}

/// Where an [`AlignedBuf`]'s bytes live.
enum Backing {
    /// An anonymous map of exactly the buffer's length; `huge`: the kernel accepted
    /// `MADV_HUGEPAGE` for it.
    Map { map: memmap2::MmapMut, huge: bool },
    /// A `Vec` whose first aligned byte is at `start`.
    Heap { raw: Vec<u8>, start: usize },
}

/// Size of a transparent huge page on x86-64 and 4 KiB-page arm64: buffers this large or
/// larger are advised for huge pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// How [`AlignedBuf::prefault`] populated a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefault {
    /// `MADV_POPULATE_WRITE` (Linux 5.14+): the kernel faulted every page in one call.
    Populated,
    /// The kernel refused the advice; nothing was populated (the pages fault on first use).
    Refused,
    /// A zero-length or heap-backed buffer: nothing to do.
    Nothing,
}

/// How new [`AlignedBuf`]s are backed and whether the stores pre-fault them: a process-wide
/// setting so a benchmark can compare the ways in one binary (`cargo xtask bench-compute
/// --model DIR --cold`); the default (all `true`) is what k3 runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferPolicy {
    /// Anonymous maps (`false`: the zeroed-`Vec` stand-in, k3's backing before the maps).
    pub anon_map: bool,
    /// Advise maps of at least [`HUGE_PAGE`] bytes for transparent huge pages.
    pub huge_pages: bool,
    /// Let the stores pre-fault buffers ahead of use (the expert cache's slots on a
    /// background thread at open, docs/PERFORMANCE.md#cold-start).
    pub prefault: bool,
}

impl Default for BufferPolicy {
    fn default() -> Self {
        BufferPolicy {
            anon_map: true,
            huge_pages: true,
            prefault: true,
        }
    }
}

static NO_ANON_MAP: AtomicBool = AtomicBool::new(false);
static NO_HUGE_PAGES: AtomicBool = AtomicBool::new(false);
static NO_PREFAULT: AtomicBool = AtomicBool::new(false);

impl BufferPolicy {
    /// The policy new buffers and stores follow now.
    pub fn current() -> BufferPolicy {
        BufferPolicy {
            anon_map: !NO_ANON_MAP.load(Ordering::Relaxed),
            huge_pages: !NO_HUGE_PAGES.load(Ordering::Relaxed),
            prefault: !NO_PREFAULT.load(Ordering::Relaxed),
        }
    }

    /// Makes `self` the policy of buffers and stores created from now on.
    pub fn install(self) {
        NO_ANON_MAP.store(!self.anon_map, Ordering::Relaxed);
        NO_HUGE_PAGES.store(!self.huge_pages, Ordering::Relaxed);
        NO_PREFAULT.store(!self.prefault, Ordering::Relaxed);
    }
}

impl AlignedBuf {
    /// A zeroed, 4096-aligned buffer of `len` bytes (pages untouched until used), backed as
    /// [`BufferPolicy::current`] says.
    pub fn new(len: usize) -> Self {
        let policy = BufferPolicy::current();
        if !policy.anon_map {
            return Self::on_heap(len);
        }
        match anon_map(len, policy.huge_pages) {
            Some((map, huge)) => Self {
                backing: Backing::Map { map, huge },
                len,
            },
            None => Self::on_heap(len),
        }
    }

    /// The `Vec` stand-in: zeroed, over-allocated by 4096 bytes, started at the first aligned
    /// address inside.
    fn on_heap(len: usize) -> Self {
        let raw = vec![0u8; len + ALIGN];
        let start = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
        Self {
            backing: Backing::Heap { raw, start },
            len,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the buffer is an anonymous map advised for transparent huge pages.
    pub fn huge_page_advised(&self) -> bool {
        matches!(self.backing, Backing::Map { huge: true, .. })
    }

    /// Faults every page of the buffer in now (zero-filled, writable), so that a later read
    /// into it does not stop on page faults. Takes `&self`: the contents do not change (they
    /// are zero or already written). Costs the kernel's zeroing of the untouched pages.
    pub fn prefault(&self) -> Prefault {
        match &self.backing {
            Backing::Map { map, .. } if self.len > 0 => populate_write(map),
            _ => Prefault::Nothing,
        }
    }
}

/// An anonymous map of `len` bytes and whether it is huge-page advised (from [`HUGE_PAGE`]
/// up); `None` when the map cannot be made or (never on Linux) is not 4096-aligned.
fn anon_map(len: usize, huge_pages: bool) -> Option<(memmap2::MmapMut, bool)> {
    let map = memmap2::MmapMut::map_anon(len).ok()?;
    if !(map.as_ptr() as usize).is_multiple_of(ALIGN) {
        return None;
    }
    let huge = huge_pages && len >= HUGE_PAGE && advise_huge(&map);
    Some((map, huge))
}

/// `MADV_HUGEPAGE`: advice only; a kernel without THP refuses it and the map keeps 4 KiB
/// pages.
#[cfg(target_os = "linux")]
fn advise_huge(map: &memmap2::MmapMut) -> bool {
    map.advise(memmap2::Advice::HugePage).is_ok()
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_map: &memmap2::MmapMut) -> bool {
    false
}

#[cfg(target_os = "linux")]
fn populate_write(m: &memmap2::MmapMut) -> Prefault {
    match m.advise(memmap2::Advice::PopulateWrite) {
        Ok(()) => Prefault::Populated,
        Err(_) => Prefault::Refused,
    }
}

#[cfg(not(target_os = "linux"))]
fn populate_write(_m: &memmap2::MmapMut) -> Prefault {
    Prefault::Refused
}

/// The kernel's transparent-huge-page mode, the bracketed word of
/// `/sys/kernel/mm/transparent_hugepage/enabled` (`always`, `madvise` or `never`); `None`
/// where the file is absent (not Linux, or no THP in the kernel).
pub fn thp_mode() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let start = s.find('[')? + 1;
    let end = start + s[start..].find(']')?;
    Some(s[start..end].to_string())
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.backing {
            Backing::Map { map, .. } => &map[..self.len],
            Backing::Heap { raw, start } => &raw[*start..*start + self.len],
        }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.backing {
            Backing::Map { map, .. } => &mut map[..self.len],
            Backing::Heap { raw, start } => &mut raw[*start..*start + self.len],
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// The read loop under every positional read: calls `pread(chunk, at)` until at least `need`
/// bytes of `buf` are filled, asking for at most `max_chunk` bytes per call (the 2 GiB
/// clamp, [`MAX_PREAD`]), retrying `EINTR` and continuing after short reads. A zero-byte
/// return before `need` is reached is [`io::ErrorKind::UnexpectedEof`]. Each call asks for
/// `min(max_chunk, buf.len() − filled)` bytes, so with an aligned `buf` length and an aligned
/// `max_chunk` every O_DIRECT call stays aligned. Returns the bytes filled (≥ `need`).
pub fn pread_loop(
    mut pread: impl FnMut(&mut [u8], u64) -> io::Result<usize>,
    buf: &mut [u8],
    offset: u64,
    need: usize,
    max_chunk: usize,
) -> io::Result<usize> {
    let mut filled = 0;
    while filled < need {
        let end = buf.len().min(filled + max_chunk.max(1));
        match pread(&mut buf[filled..end], offset + filled as u64) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "end of file after {filled} of {need} bytes at offset {offset} (short read)"
                    ),
                ))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// One checkpoint file opened for positional reads.
///
/// `ShardFile::open(path, true)` tries `O_DIRECT` (Linux) and probes one aligned read; when
/// the filesystem refuses it (tmpfs answers `EINVAL`) the file is reopened buffered and
/// [`ShardFile::is_direct`] says so — the report prints "reads use O_DIRECT (page cache
/// bypassed)" or "buffered I/O" from it, as upstream does.
#[derive(Debug)]
pub struct ShardFile {
    file: File,
    path: PathBuf,
    len: u64,
    direct: bool,
}

impl ShardFile {
    /// Opens `path`; with `direct`, uses O_DIRECT when the filesystem accepts it.
    pub fn open(path: impl AsRef<Path>, direct: bool) -> io::Result<ShardFile> {
        let path = path.as_ref();
        if direct {
            if let Some(f) = open_direct(path)? {
                return Ok(f);
            }
        }
        let file = File::open(path).map_err(|e| with_path(e, path))?;
        let len = file.metadata().map_err(|e| with_path(e, path))?.len();
        Ok(ShardFile {
            file,
            path: path.to_path_buf(),
            len,
            direct: false,
        })
    }

    /// True when reads bypass the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn check_range(&self, offset: u64, len: usize) -> io::Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: read of {len} bytes at offset {offset} runs past the end ({} bytes)",
                    self.path.display(),
                    self.len
                ),
            )),
        }
    }

    /// O_DIRECT read of the aligned range starting at `aligned_off` into the aligned `span`,
    /// until at least `need` bytes are in.
    fn direct_read(&self, span: &mut [u8], aligned_off: u64, need: usize) -> io::Result<()> {
        pread_loop(
            |b, o| self.file.read_at(b, o),
            span,
            aligned_off,
            need,
            MAX_PREAD,
        )
        .map(|_| ())
        .map_err(|e| with_path(e, &self.path))
    }

    /// O_DIRECT read into an arbitrary buffer through a bounded aligned bounce buffer.
    fn direct_bounce(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let total = buf.len();
        let mut bounce = AlignedBuf::new(BOUNCE.min(aligned_span(offset, total as u64) as usize));
        let mut pos = 0;
        while pos < total {
            let at = offset + pos as u64;
            let pad = (at % ALIGN as u64) as usize;
            let n = (total - pos).min(bounce.len() - pad);
            let span = aligned_span(at, n as u64) as usize;
            self.direct_read(&mut bounce[..span], at - pad as u64, pad + n)?;
            buf[pos..pos + n].copy_from_slice(&bounce[pad..pad + n]);
            pos += n;
        }
        Ok(())
    }
}

impl ReadAt for ShardFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_range(offset, buf.len())?;
        if self.direct {
            return self.direct_bounce(buf, offset);
        }
        let need = buf.len();
        pread_loop(|b, o| self.file.read_at(b, o), buf, offset, need, MAX_PREAD)
            .map(|_| ())
            .map_err(|e| with_path(e, &self.path))
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn read_into_aligned(&self, dst: &mut [u8], offset: u64, len: usize) -> io::Result<()> {
        let pad = check_aligned_dst(dst, offset, len)?;
        self.check_range(offset, len)?;
        if !self.direct {
            return self.read_exact_at(&mut dst[pad..pad + len], offset);
        }
        let span = aligned_span(offset, len as u64) as usize;
        self.direct_read(&mut dst[..span], offset - pad as u64, pad + len)
    }
}

/// Opens with O_DIRECT and probes one aligned read; `None` when the filesystem refuses.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> io::Result<Option<ShardFile>> {
    use std::os::unix::fs::OpenOptionsExt;
    let refused = |e: &io::Error| e.raw_os_error() == Some(libc::EINVAL);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if refused(&e) => return Ok(None),
        Err(e) => return Err(with_path(e, path)),
    };
    let len = file.metadata().map_err(|e| with_path(e, path))?.len();
    if len > 0 {
        let mut probe = AlignedBuf::new(ALIGN);
        match file.read_at(&mut probe, 0) {
            Ok(_) => {}
            Err(e) if refused(&e) => return Ok(None),
            Err(e) => return Err(with_path(e, path)),
        }
    }
    Ok(Some(ShardFile {
        file,
        path: path.to_path_buf(),
        len,
        direct: true,
    }))
}

/// O_DIRECT is Linux-only here; elsewhere every file is buffered.
#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> io::Result<Option<ShardFile>> {
    Ok(None)
}

/// Prefixes an I/O error with the file it concerns, keeping its kind.
fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}
