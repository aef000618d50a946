//! Fallback for a layer whose trunk tensors are NOT one contiguous run in one shard (the
//! released checkpoint never needs it; a re-saved or hand-merged one might): its tensors are
//! laid out back to back in a virtual file, [`Gather`], whose reads turn into one read per
//! tensor on the real shards. The trunk store then streams or pins that virtual run exactly
//! like a contiguous one, and [`RunMap`] tells where each tensor landed.

use k3_format::bind::LayerTensors;
use k3_format::TensorRef;
use k3_store::io::ReadAt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a layer's tensors sit inside its run buffer.
pub(crate) enum RunMap {
    /// Contiguous in the shard: a tensor sits at `offset − start`.
    Contiguous { start: u64 },
    /// Gathered: `(shard, absolute offset) → offset in the run`, one entry per tensor.
    Gathered(Vec<(usize, u64, u64)>),
}

impl RunMap {
    /// Offset of `t` inside the layer's run buffer.
    pub(crate) fn offset_of(&self, t: &TensorRef) -> Option<usize> {
        match self {
            RunMap::Contiguous { start } => t.offset.checked_sub(*start).map(|o| o as usize),
            RunMap::Gathered(v) => v
                .iter()
                .find(|(s, o, _)| *s == t.shard && *o == t.offset)
                .map(|e| e.2 as usize),
        }
    }
}

/// A virtual file concatenating byte ranges of real files.
pub(crate) struct Gather {
    files: Vec<Arc<dyn ReadAt>>,
    /// `(virtual start, file, file offset, len)`, sorted by virtual start, non-overlapping.
    pieces: Vec<(u64, usize, u64, u64)>,
    len: u64,
    path: PathBuf,
}

/// Alignment of each piece's virtual offset relative to its file offset: keeping them equal
/// modulo 64 keeps every tensor's in-buffer alignment what it is in the shard.
const PIECE_ALIGN: u64 = 64;

impl Gather {
    pub(crate) fn new(files: Vec<Arc<dyn ReadAt>>) -> Gather {
        let path = PathBuf::from("<trunk tensors gathered from non-contiguous layers>");
        Gather {
            files,
            pieces: Vec::new(),
            len: 0,
            path,
        }
    }

    /// Appends every trunk tensor of `lt` (in offset order); returns the layer's virtual run
    /// `(offset, len)` and its map.
    pub(crate) fn add_layer(&mut self, lt: &LayerTensors) -> ((u64, u64), RunMap) {
        let mut tensors = lt.tensors();
        tensors.sort_by_key(|t| (t.shard, t.offset));
        let start = self.len.next_multiple_of(4096);
        self.len = start;
        let mut map = Vec::with_capacity(tensors.len());
        for t in tensors {
            let mut v = self.len.next_multiple_of(PIECE_ALIGN) + t.offset % PIECE_ALIGN;
            if v < self.len {
                v += PIECE_ALIGN;
            }
            self.pieces.push((v, t.shard, t.offset, t.nbytes));
            map.push((t.shard, t.offset, v - start));
            self.len = v + t.nbytes;
        }
        ((start, self.len - start), RunMap::Gathered(map))
    }
}

impl ReadAt for Gather {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        if end > self.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("gathered read {offset}..{end} beyond {}", self.len),
            ));
        }
        // Gaps between pieces are padding: zero them.
        buf.fill(0);
        for &(v, file, off, len) in &self.pieces {
            let (lo, hi) = (v.max(offset), (v + len).min(end));
            if lo < hi {
                let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
                self.files[file].read_exact_at(dst, off + (lo - v))?;
            }
        }
        Ok(())
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn path(&self) -> &Path {
        &self.path
    }
}
