//! Compressed trunk runs (docs/STREAMING.md#compressed-trunk): the store reads a layer's
//! stored bytes into one staging buffer and has a [`RunDecoder`] turn them into the decoded
//! run in the layer's buffer (pinned buffer or ring slot), between the read and the bind.
//! The store never knows the codec; the engine supplies the decoder (which decodes
//! chunk-parallel on the compute pool).

use super::{read_run, span, RunLoc};
use crate::io::{AlignedBuf, ReadAt};
use crate::StoreError;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Turns a layer's stored bytes into its decoded run.
pub trait RunDecoder: Send + Sync {
    /// Length of layer `l`'s decoded run.
    fn decoded_len(&self, l: usize) -> u64;
    /// Decodes layer `l`'s stored run `stored` into `out` (exactly [`Self::decoded_len`]
    /// bytes); a damaged run is an error naming what is damaged, never wrong bytes.
    fn decode(&self, l: usize, stored: &[u8], out: &mut [u8]) -> Result<(), String>;
}

/// The decoder and the one staging buffer (the largest stored run's span) that reads land
/// in before decoding. Loads are serialised on it: the drive reads one run at a time anyway.
pub(super) struct Decoding {
    pub(super) decoder: Arc<dyn RunDecoder>,
    staging: Mutex<AlignedBuf>,
}

impl Decoding {
    pub(super) fn new(decoder: Arc<dyn RunDecoder>, runs: &[RunLoc]) -> Decoding {
        let biggest = runs.iter().map(span).max().unwrap_or(0);
        Decoding {
            decoder,
            staging: Mutex::new(AlignedBuf::new(biggest)),
        }
    }

    /// Bytes the staging buffer holds.
    pub(super) fn staging_bytes(&self) -> u64 {
        self.staging.lock().map_or(0, |b| b.len() as u64)
    }

    /// Reads layer `l`'s stored run and decodes it into `out[..decoded_len]`; returns the
    /// seconds spent decoding.
    pub(super) fn load(
        &self,
        files: &[Arc<dyn ReadAt>],
        l: usize,
        run: &RunLoc,
        out: &mut [u8],
    ) -> Result<f64, StoreError> {
        let mut staging = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        read_run(files, l, run, &mut staging)?;
        let start = (run.offset % crate::io::ALIGN as u64) as usize;
        let stored = &staging[start..start + run.len as usize];
        let n = self.decoder.decoded_len(l) as usize;
        let t = Instant::now();
        self.decoder
            .decode(l, stored, &mut out[..n])
            .map_err(|reason| StoreError::Decode { layer: l, reason })?;
        Ok(t.elapsed().as_secs_f64())
    }
}
