//! What a rank spends on collectives (docs/DISTRIBUTED.md#memory-per-rank): a [`Comm`]
//! decorator that counts every collective, the bytes it moved and the seconds it took, and
//! the end-of-run gather of every rank's figures for `k3 run --json`'s `ranks`.

use k3_model::{Comm, CommError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Collective counters of one rank, cumulative since the engine opened.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommStats {
    /// Collective calls (all-gathers, broadcasts, barriers).
    pub calls: u64,
    /// Bytes this rank contributed (its slice of an all-gather; a broadcast's payload at the
    /// root).
    pub bytes_sent: u64,
    /// Bytes this rank received from the others (an all-gather's other slices; a
    /// broadcast's payload at a non-root rank).
    pub bytes_received: u64,
    /// Seconds spent inside collectives (waiting for the slowest rank included).
    pub seconds: f64,
}

impl CommStats {
    /// Counters accumulated between `earlier` and `self`.
    pub fn since(&self, earlier: &CommStats) -> CommStats {
        CommStats {
            calls: self.calls - earlier.calls,
            bytes_sent: self.bytes_sent - earlier.bytes_sent,
            bytes_received: self.bytes_received - earlier.bytes_received,
            seconds: self.seconds - earlier.seconds,
        }
    }
}

/// A [`Comm`] that forwards to `inner` and counts ([`CommStats`]). `abort`, `rank` and
/// `size` are not collectives and are not counted.
#[derive(Debug)]
pub struct CountingComm {
    inner: Arc<dyn Comm>,
    calls: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
    nanos: AtomicU64,
}

impl CountingComm {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Comm>) -> CountingComm {
        CountingComm {
            inner,
            calls: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> CommStats {
        CommStats {
            calls: self.calls.load(Ordering::Relaxed),
            bytes_sent: self.sent.load(Ordering::Relaxed),
            bytes_received: self.received.load(Ordering::Relaxed),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    fn count<T>(&self, sent: u64, f: impl FnOnce() -> T, received: impl FnOnce(&T) -> u64) -> T {
        let t = Instant::now();
        let out = f();
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.sent.fetch_add(sent, Ordering::Relaxed);
        self.received.fetch_add(received(&out), Ordering::Relaxed);
        out
    }
}

impl Comm for CountingComm {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn allgather_f32(
        &self,
        mine: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError> {
        let others = (out.len().saturating_sub(mine.len()) * 4) as u64;
        self.count(
            (mine.len() * 4) as u64,
            || self.inner.allgather_f32(mine, counts, out),
            |_| others,
        )
    }
    fn broadcast_u32(&self, root: usize, ids: &mut Vec<u32>) -> Result<(), CommError> {
        let root_here = root == self.rank();
        let sent = if root_here { ids.len() as u64 * 4 } else { 0 };
        let inner = &self.inner;
        let r = self.count(sent, || inner.broadcast_u32(root, ids), |_| 0);
        if !root_here {
            self.received
                .fetch_add(ids.len() as u64 * 4, Ordering::Relaxed);
        }
        r
    }
    fn allgather_u64(&self, mine: u64) -> Result<Vec<u64>, CommError> {
        let others = (self.size().saturating_sub(1) * 8) as u64;
        self.count(8, || self.inner.allgather_u64(mine), |_| others)
    }
    fn barrier(&self) -> Result<(), CommError> {
        self.count(0, || self.inner.barrier(), |_| 0)
    }
    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }
}

/// One rank's figures in `k3 run --json`'s `ranks` (docs/DISTRIBUTED.md#memory-per-rank).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct RankFigures {
    /// The rank.
    pub rank: usize,
    /// Its peak resident set, bytes (as the caller measured it).
    pub peak_rss_bytes: u64,
    /// Trunk bytes it read from disk.
    pub bytes_read_trunk: u64,
    /// Routed-expert bytes it read from disk.
    pub bytes_read_experts: u64,
    /// Collective calls it made.
    pub collective_calls: u64,
    /// Bytes it contributed to collectives.
    pub collective_bytes_sent: u64,
    /// Bytes it received in collectives.
    pub collective_bytes_received: u64,
    /// Seconds it spent inside collectives.
    pub collective_seconds: f64,
}

impl RankFigures {
    fn to_words(self) -> [u64; 7] {
        [
            self.peak_rss_bytes,
            self.bytes_read_trunk,
            self.bytes_read_experts,
            self.collective_calls,
            self.collective_bytes_sent,
            self.collective_bytes_received,
            self.collective_seconds.to_bits(),
        ]
    }

    fn from_words(rank: usize, w: &[u64]) -> RankFigures {
        RankFigures {
            rank,
            peak_rss_bytes: w[0],
            bytes_read_trunk: w[1],
            bytes_read_experts: w[2],
            collective_calls: w[3],
            collective_bytes_sent: w[4],
            collective_bytes_received: w[5],
            collective_seconds: f64::from_bits(w[6]),
        }
    }
}

/// Every rank's `mine`, in rank order: a collective every rank makes (7 all-gathers of one
/// `u64`). One process: `[mine]`.
pub fn gather_figures(comm: &dyn Comm, mine: RankFigures) -> Result<Vec<RankFigures>, CommError> {
    let words = mine.to_words();
    let mut per_field = Vec::with_capacity(words.len());
    for w in words {
        per_field.push(comm.allgather_u64(w)?);
    }
    let n = comm.size();
    if per_field.iter().any(|v| v.len() != n) {
        return Err(CommError::Mismatch(
            "rank figures: an all-gather returned the wrong number of ranks".into(),
        ));
    }
    Ok((0..n)
        .map(|q| {
            let w: Vec<u64> = per_field.iter().map(|v| v[q]).collect();
            RankFigures::from_words(q, &w)
        })
        .collect())
}

impl crate::Engine {
    /// Every rank feeds a prompt in the same chunks (each chunk is one pass of collectives):
    /// per-rank plans differ a little (a rank's share, the experts it owns), so the ranks
    /// take the smallest of their prefill chunks. A collective, made once at open.
    pub(crate) fn agree_prefill_chunk(&mut self) -> Result<(), crate::EngineError> {
        let mine = self.prefill_chunk() as u64;
        let all = self
            .comm()
            .allgather_u64(mine)
            .map_err(|e| crate::EngineError::from(k3_model::ModelError::from(e)))?;
        let least = all.into_iter().min().unwrap_or(mine);
        if least < mine {
            self.max_prefill_chunk = Some(least as usize);
        }
        Ok(())
    }

    /// This rank's collective counters since open (zeros for one process).
    pub fn comm_stats(&self) -> CommStats {
        self.comm_counter
            .as_ref()
            .map(|c| c.stats())
            .unwrap_or_default()
    }

    /// Every rank's figures for a report, in rank order: this rank's bytes read and
    /// collectives (counted before this gather) with `peak_rss_bytes` as the caller measured
    /// it. A collective: every rank must call it, at the same point (docs/DISTRIBUTED.md).
    pub fn rank_figures(
        &self,
        peak_rss_bytes: u64,
    ) -> Result<Vec<RankFigures>, crate::EngineError> {
        let (io, comm) = (self.stats(), self.comm_stats());
        let mine = RankFigures {
            rank: self.comm().rank(),
            peak_rss_bytes,
            bytes_read_trunk: io.trunk_bytes_read,
            bytes_read_experts: io.expert_bytes_read,
            collective_calls: comm.calls,
            collective_bytes_sent: comm.bytes_sent,
            collective_bytes_received: comm.bytes_received,
            collective_seconds: comm.seconds,
        };
        gather_figures(self.comm().as_ref(), mine)
            .map_err(|e| crate::EngineError::from(k3_model::ModelError::from(e)))
    }
}
