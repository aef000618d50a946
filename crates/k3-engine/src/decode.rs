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
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Per unit: its chunks' stored hashes all checked once (later reads skip them).
    hashed: Vec<AtomicBool>,
}

/// Per unit, not yet hashed.
fn unhashed(units: usize) -> Vec<AtomicBool> {
    (0..units).map(|_| AtomicBool::new(false)).collect()
}

impl PackDecoder {
    pub(crate) fn new(pack: TrunkPack, pool: Arc<rayon::ThreadPool>) -> PackDecoder {
        PackDecoder {
            hashed: unhashed(pack.num_layers()),
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
            hashed: unhashed(pieces.len()),
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

    /// The first time a unit is read, every chunk's stored hash is checked before it is
    /// decoded (`TrunkPack::decode_job_in`), and the streaming store checks the decoded
    /// run's checksum the first time the layer is bound, as for a plain pack; later reads
    /// run the decoder's own checks only (hashing every read cost a fifth of the decode).
    fn decode(&self, u: usize, stored: &[u8], out: &mut [u8]) -> Result<(), String> {
        let (l, decoded, base) = self.unit(u);
        let jobs = jobs_in(&self.pack, l, &decoded, out);
        let hash = !self
            .hashed
            .get(u)
            .is_some_and(|h| h.load(Ordering::Acquire));
        let run = |job: &DecodeJob, dst: &mut [u8], scratch: &mut Vec<u8>| {
            self.pack
                .decode_job_in(l, job, stored, base, dst, scratch, hash)
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
        }?;
        if let Some(h) = self.hashed.get(u) {
            h.store(true, Ordering::Release);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k3_format::pack::{write_compressed_pack_with, CompressOptions, PackOptions};
    use k3_format::{bind_model, Checkpoint, K3Config};
    use k3_store::RunDecoder;

    /// A unit's stored hashes are checked until one read of it succeeds, then skipped.
    #[test]
    fn a_unit_is_hashed_until_it_decodes_once() {
        let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3");
        let out = tempfile::tempdir().unwrap();
        let cfg = K3Config::load(model.join("config.json")).unwrap();
        let ck = Checkpoint::open(&model).unwrap();
        let b = bind_model(&ck, &cfg).unwrap();
        let c = CompressOptions {
            chunk_values: 1000,
            min_coded_bytes: 0,
        };
        let pack = write_compressed_pack_with(
            &ck,
            &b,
            &cfg,
            out.path(),
            &PackOptions::default(),
            &c,
            &mut |_, _| {},
        )
        .unwrap();
        let (off, len) = pack.layer(0);
        let bin = std::fs::read(pack.path()).unwrap();
        let stored = &bin[off as usize..(off + len) as usize];
        let mut damaged = stored.to_vec();
        let last = damaged.len() - 1; // a sign+mantissa byte: only the hash sees it
        damaged[last] ^= 1;
        let pool = Arc::new(
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap(),
        );
        let dec = PackDecoder::new(pack, pool);
        let mut decoded = vec![0u8; dec.decoded_len(0) as usize];
        let err = dec.decode(0, &damaged, &mut decoded).unwrap_err();
        assert!(err.contains("stored bytes hash to"), "{err}");
        assert!(!dec.hashed[0].load(Ordering::Acquire));
        dec.decode(0, stored, &mut decoded).unwrap();
        assert!(dec.hashed[0].load(Ordering::Acquire));
        dec.decode(0, &damaged, &mut decoded).unwrap();
    }
}
