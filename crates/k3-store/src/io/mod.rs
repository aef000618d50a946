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

/// A heap byte buffer whose first byte sits on a 4096-byte boundary (O_DIRECT's rule).
///
/// Safe code only: a zeroed `Vec` is over-allocated by 4096 bytes and the buffer starts at
/// the first aligned address inside it. The `Vec` is never resized, so the address is
/// stable for the buffer's life (moving the `AlignedBuf` moves only the handle). Zeroed
/// allocation is lazy for large sizes (fresh pages), so a 2.4 GB ring slot costs nothing
/// until read into.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed, 4096-aligned buffer of `len` bytes.
    pub fn new(len: usize) -> Self {
        let raw = vec![0u8; len + ALIGN];
        let addr = raw.as_ptr() as usize;
        let start = (ALIGN - addr % ALIGN) % ALIGN;
        Self { raw, start, len }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
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
