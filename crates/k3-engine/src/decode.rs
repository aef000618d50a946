//! The compressed trunk's decoder (docs/STREAMING.md#compressed-trunk): a pack's layer runs
//! decoded chunk by chunk in parallel. Called by the trunk store between a unit's read and its
//! bind: inline on the compute pool for a synchronous read, and by the reader thread for
//! read-aheads, whose chunks run on a decode pool of their own. Never on the compute pool from
//! the reader: a compute thread that stole one of its chunks can later take the forward pass
//! on top of it and block waiting for the very unit that chunk belongs to (a deadlock seen with
//! the piece ring at 2 threads). A unit is a layer, or one piece of a layer
//! (docs/STREAMING.md#trunk-pieces).

use k3_format::pack::DecodeJob;
use k3_format::TrunkPack;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

/// One piece of a layer in a compressed pack: its bytes of the decoded run, and where its
/// stored bytes start in the layer's stored run.
#[derive(Clone, Debug)]
pub(crate) struct PieceSpan {
    pub(crate) layer: usize,
    pub(crate) decoded: Range<usize>,
    pub(crate) stored: Range<usize>,
}

/// [`k3_store::RunDecoder`] over a compressed [`TrunkPack`].
pub(crate) struct PackDecoder {
    pack: TrunkPack,
    pool: Arc<rayon::ThreadPool>,
    /// The reader thread's decode pool, as many threads as `pool`, built at the first
    /// read-ahead (`None` if it could not be: the reader then decodes alone).
    reader_pool: OnceLock<Option<rayon::ThreadPool>>,
    /// Units are these pieces (`None`: units are whole layers).
    pieces: Option<Vec<PieceSpan>>,
}

impl PackDecoder {
    pub(crate) fn new(pack: TrunkPack, pool: Arc<rayon::ThreadPool>) -> PackDecoder {
        PackDecoder {
            pack,
            pool,
            reader_pool: OnceLock::new(),
            pieces: None,
        }
    }

    /// A decoder whose unit `u` is `pieces[u]`.
    pub(crate) fn for_pieces(
        pack: TrunkPack,
        pool: Arc<rayon::ThreadPool>,
        pieces: Vec<PieceSpan>,
    ) -> PackDecoder {
        PackDecoder {
            pack,
            pool,
            reader_pool: OnceLock::new(),
            pieces: Some(pieces),
        }
    }

    /// Unit `u`'s layer, decoded range and stored base.
    fn unit(&self, u: usize) -> (usize, Range<usize>, usize) {
        match &self.pieces {
            None => (u, 0..self.pack.decoded_bytes(u) as usize, 0),
            Some(p) => (p[u].layer, p[u].decoded.clone(), p[u].stored.start),
        }
    }
}

/// The stored range of the decoded bytes `decoded` of layer `l`: every job inside `decoded`
/// must come from stored bytes that no job outside it uses. `None` when `decoded` does not
/// fall on job boundaries or the stored bytes interleave (the layer then streams whole).
pub(crate) fn stored_range(
    pack: &TrunkPack,
    l: usize,
    decoded: &Range<usize>,
) -> Option<Range<usize>> {
    let jobs = pack.decode_jobs(l);
    let inside = |j: &DecodeJob| decoded.start <= j.dst.start && j.dst.end <= decoded.end;
    let outside = |j: &DecodeJob| j.dst.end <= decoded.start || decoded.end <= j.dst.start;
    if !jobs.iter().all(|j| inside(j) || outside(j)) {
        return None;
    }
    let mine = jobs.iter().filter(|j| inside(j));
    let start = mine.clone().map(|j| j.src.start).min()?;
    let end = mine.map(|j| j.src.end).max()?;
    let overlaps = jobs
        .iter()
        .filter(|j| outside(j))
        .any(|j| j.src.start < end && start < j.src.end);
    (!overlaps).then_some(start..end)
}

/// Layer `l`'s jobs inside `decoded`, each with its slice of `out` (the decoded range).
fn jobs_in<'o>(
    pack: &TrunkPack,
    l: usize,
    decoded: &Range<usize>,
    out: &'o mut [u8],
) -> Vec<(DecodeJob, &'o mut [u8])> {
    let mut rest = out;
    let mut at = decoded.start;
    let mut v = Vec::new();
    let mut jobs: Vec<DecodeJob> = pack
        .decode_jobs(l)
        .into_iter()
        .filter(|j| decoded.start <= j.dst.start && j.dst.end <= decoded.end)
        .collect();
    jobs.sort_by_key(|j| j.dst.start);
    for job in jobs {
        let taken = std::mem::take(&mut rest);
        let skip = job.dst.start - at;
        let (_, tail) = taken.split_at_mut(skip);
        let (mine, tail) = tail.split_at_mut(job.dst.len());
        at = job.dst.end;
        rest = tail;
        v.push((job, mine));
    }
    v
}

impl PackDecoder {
    /// The read-ahead decode pool (see the module comment), `None` with one compute thread
    /// (the reader decodes alone, as fast) or when no thread could be started.
    fn reader_pool(&self) -> Option<&rayon::ThreadPool> {
        let threads = self.pool.current_num_threads();
        self.reader_pool
            .get_or_init(|| {
                (threads > 1).then(|| {
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .thread_name(|i| format!("k3-decode-{i}"))
                        .build()
                        .ok()
                })?
            })
            .as_ref()
    }
}

impl k3_store::RunDecoder for PackDecoder {
    fn decoded_len(&self, u: usize) -> u64 {
        self.unit(u).1.len() as u64
    }

    /// Every chunk's stored hash is checked before it is decoded (`TrunkPack::decode_job`);
    /// the decoded run's checksum is checked by the streaming store the first time the layer
    /// is bound, as for a plain pack.
    fn decode(&self, u: usize, stored: &[u8], out: &mut [u8]) -> Result<(), String> {
        let (l, decoded, base) = self.unit(u);
        let jobs = jobs_in(&self.pack, l, &decoded, out);
        let run = |job: &DecodeJob, dst: &mut [u8], scratch: &mut Vec<u8>| {
            self.pack.decode_job_in(l, job, stored, base, dst, scratch)
        };
        // A synchronous read on a compute thread decodes on its own pool; the reader thread
        // on its decode pool.
        let pool = match self.pool.current_thread_index() {
            Some(_) => Some(&*self.pool),
            None => self.reader_pool(),
        };
        match pool {
            Some(pool) => pool.install(|| {
                jobs.into_par_iter()
                    .try_for_each_init(Vec::new, |scratch, (job, dst)| run(&job, dst, scratch))
                    .map_err(|e| e.to_string())
            }),
            None => {
                let mut scratch = Vec::new();
                jobs.into_iter()
                    .try_for_each(|(job, dst)| run(&job, dst, &mut scratch))
                    .map_err(|e| e.to_string())
            }
        }
    }
}
