//! The compressed trunk's decoder (docs/STREAMING.md#compressed-trunk): a pack's layer runs
//! decoded chunk by chunk in parallel on the compute pool. Called by the trunk store between a
//! layer's read and its bind: by the reader thread for read-aheads (the chunks then run on the
//! pool's threads between the forward pass's own work), inline for a synchronous read.

use k3_format::TrunkPack;
use rayon::prelude::*;
use std::sync::Arc;

/// [`k3_store::RunDecoder`] over a compressed [`TrunkPack`].
pub(crate) struct PackDecoder {
    pack: TrunkPack,
    pool: Arc<rayon::ThreadPool>,
}

impl PackDecoder {
    pub(crate) fn new(pack: TrunkPack, pool: Arc<rayon::ThreadPool>) -> PackDecoder {
        PackDecoder { pack, pool }
    }
}

impl k3_store::RunDecoder for PackDecoder {
    fn decoded_len(&self, l: usize) -> u64 {
        self.pack.decoded_bytes(l)
    }

    /// Every chunk's stored hash is checked before it is decoded (`TrunkPack::decode_job`);
    /// the decoded run's checksum is checked by the streaming store the first time the layer
    /// is bound, as for a plain pack.
    fn decode(&self, l: usize, stored: &[u8], out: &mut [u8]) -> Result<(), String> {
        let jobs = self.pack.split_jobs(l, out);
        if self.pool.current_num_threads() < 2 && self.pool.current_thread_index().is_none() {
            // One compute thread may be the one blocked waiting for this layer: a job queued
            // on its pool would never run. The reader thread decodes it alone instead.
            let mut scratch = Vec::new();
            return jobs
                .into_iter()
                .try_for_each(|(job, dst)| self.pack.decode_job(l, &job, stored, dst, &mut scratch))
                .map_err(|e| e.to_string());
        }
        self.pool.install(|| {
            jobs.into_par_iter()
                .try_for_each_init(Vec::new, |scratch, (job, dst)| {
                    self.pack.decode_job(l, &job, stored, dst, scratch)
                })
                .map_err(|e| e.to_string())
        })
    }
}
