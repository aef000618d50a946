//! Compressed trunk runs (docs/STREAMING.md#compressed-trunk): the store reads a unit's (a
//! layer's, or a piece's) stored bytes into one staging buffer and has a [`RunDecoder`] turn
//! them into the decoded bytes in the unit's buffer (pinned buffer or ring slot), between the
//! read and the bind.
//! The store never knows the codec; the engine supplies the decoder (which decodes
//! chunk-parallel on the compute pool).

use super::ring::{read_run, span};
use super::RunLoc;
use crate::io::{AlignedBuf, ReadAt};
use crate::StoreError;
use std::sync::{Arc, Mutex};
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

    /// Reads unit `u`'s stored run (`what` in messages) and decodes it into
    /// `out[..decoded_len]`; returns the seconds spent decoding.
    pub(super) fn load(
        &self,
        files: &[Arc<dyn ReadAt>],
        u: usize,
        what: &str,
        run: &RunLoc,
        out: &mut [u8],
    ) -> Result<f64, StoreError> {
        let mut staging = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        read_run(files, what, run, &mut staging)?;
        let start = (run.offset % crate::io::ALIGN as u64) as usize;
        let stored = &staging[start..start + run.len as usize];
        let n = self.decoder.decoded_len(u) as usize;
        let t = Instant::now();
        self.decoder
            .decode(u, stored, &mut out[..n])
            .map_err(|reason| StoreError::Decode {
                what: what.to_string(),
                reason,
            })?;
        Ok(t.elapsed().as_secs_f64())
    }
}
