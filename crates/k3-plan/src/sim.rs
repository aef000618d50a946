//! Expert-trace replay: the cache simulator behind `cargo xtask sim-cache`.
//!
//! Trace file layout (upstream `--dump-cache-trace`, `expert_trace.bin`): a flat array of
//! records, 8 bytes each, `u32` little-endian layer then `u32` little-endian expert, one
//! record per expert request in request order, no header. See `docs/PERFORMANCE.md`.

use crate::policy::{ExpertKey, KeySpace, PolicyKind};
use crate::slots::{CacheError, SlotTable};
use std::collections::HashSet;
use std::ops::Range;

/// Bytes per trace record.
pub const RECORD_BYTES: usize = 8;

/// Errors reading or replaying a trace.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The byte length is not a whole number of records.
    #[error("trace is {0} bytes, not a multiple of {RECORD_BYTES} (u32 layer, u32 expert)")]
    Length(usize),
    /// A record names a key outside the key space.
    #[error(
        "trace record {index}: ({layer}, {expert}) outside {n_layers} layers x {n_experts} experts"
    )]
    OutOfRange {
        /// Record index.
        index: usize,
        /// Layer field.
        layer: u32,
        /// Expert field.
        expert: u32,
        /// Layers in the key space.
        n_layers: u32,
        /// Experts in the key space.
        n_experts: u32,
    },
    /// The cache is smaller than the engine allows.
    #[error("capacity {capacity} is below the minimum top-k + 1 = {min}")]
    Capacity {
        /// Requested slots.
        capacity: usize,
        /// Minimum slots.
        min: usize,
    },
    /// The slot table refused a request.
    #[error(transparent)]
    Cache(#[from] CacheError),
}

/// A request sequence split into batches: one batch = one token's top-k at one layer, the
/// unit the engine reserves (and pins) at once.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Key space the requests live in.
    pub space: KeySpace,
    /// Experts per token per layer.
    pub top_k: usize,
    /// Requests in order.
    pub requests: Vec<ExpertKey>,
    /// Batch boundaries (consecutive, covering `requests`).
    pub batches: Vec<Range<usize>>,
}

/// Facts about a trace, for the layout report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceSummary {
    /// Number of requests.
    pub requests: usize,
    /// Distinct keys.
    pub distinct: usize,
    /// Lowest and highest layer seen.
    pub layers: (u32, u32),
    /// Number of distinct layers seen.
    pub n_layers_seen: usize,
    /// Highest expert index seen.
    pub max_expert: u32,
    /// Tokens in each forward pass (a pass = one ascending walk over the layers).
    pub pass_tokens: Vec<usize>,
    /// Every batch holds `top_k` distinct experts.
    pub batches_distinct: bool,
    /// Each pass repeats the previous pass's requests as its prefix at every layer (full
    /// recompute of a growing sequence).
    pub prefix_consistent: bool,
}

impl TraceSummary {
    /// Token forwards in the trace (`requests / (layers × top_k)`).
    pub fn token_forwards(&self, top_k: usize) -> f64 {
        self.requests as f64 / (self.n_layers_seen * top_k) as f64
    }
}

impl Trace {
    /// Parses the 8-byte-record layout.
    pub fn parse(bytes: &[u8], space: KeySpace, top_k: usize) -> Result<Self, SimError> {
        if !bytes.len().is_multiple_of(RECORD_BYTES) {
            return Err(SimError::Length(bytes.len()));
        }
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let mut requests = Vec::with_capacity(bytes.len() / RECORD_BYTES);
        for (index, rec) in bytes.chunks_exact(RECORD_BYTES).enumerate() {
            let key = ExpertKey::new(word(&rec[..4]), word(&rec[4..]));
            if !space.contains(key) {
                return Err(SimError::OutOfRange {
                    index,
                    layer: key.layer,
                    expert: key.expert,
                    n_layers: space.n_layers,
                    n_experts: space.n_experts,
                });
            }
            requests.push(key);
        }
        Ok(Self::from_requests(space, top_k, requests))
    }

    /// Splits `requests` into batches: runs of one layer, cut every `top_k` requests.
    pub fn from_requests(space: KeySpace, top_k: usize, requests: Vec<ExpertKey>) -> Self {
        let mut batches = Vec::new();
        for run in layer_runs(&requests) {
            let mut s = run.start;
            while s < run.end {
                let e = (s + top_k.max(1)).min(run.end);
                batches.push(s..e);
                s = e;
            }
        }
        Self {
            space,
            top_k,
            requests,
            batches,
        }
    }

    /// Layout facts (layers, passes, batch shape).
    pub fn summary(&self) -> TraceSummary {
        let distinct: HashSet<ExpertKey> = self.requests.iter().copied().collect();
        let layers: HashSet<u32> = self.requests.iter().map(|k| k.layer).collect();
        let passes = self.passes();
        TraceSummary {
            requests: self.requests.len(),
            distinct: distinct.len(),
            layers: (
                layers.iter().copied().min().unwrap_or(0),
                layers.iter().copied().max().unwrap_or(0),
            ),
            n_layers_seen: layers.len(),
            max_expert: self.requests.iter().map(|k| k.expert).max().unwrap_or(0),
            pass_tokens: passes.iter().map(|p| p[0].len() / self.top_k).collect(),
            batches_distinct: self.batches.iter().all(|b| {
                let set: HashSet<_> = self.requests[b.clone()].iter().collect();
                b.len() == self.top_k && set.len() == self.top_k
            }),
            prefix_consistent: passes.windows(2).all(|w| {
                w[0].len() == w[1].len()
                    && w[0].iter().zip(&w[1]).all(|(a, b)| {
                        let (a, b) = (&self.requests[a.clone()], &self.requests[b.clone()]);
                        b.starts_with(a)
                    })
            }),
        }
    }

    /// The same run as incremental decode would request it, derived from a full-recompute
    /// trace: the first pass whole (the prefill), then only the newest token of each later
    /// pass (the last `top_k` requests of every layer run). `None` unless the trace is
    /// prefix-consistent.
    pub fn decode_view(&self) -> Option<Trace> {
        if !self.summary().prefix_consistent {
            return None;
        }
        let passes = self.passes();
        let mut requests = Vec::new();
        for (p, runs) in passes.iter().enumerate() {
            for run in runs {
                let from = if p == 0 {
                    run.start
                } else {
                    run.end - self.top_k
                };
                requests.extend_from_slice(&self.requests[from..run.end]);
            }
        }
        Some(Trace::from_requests(self.space, self.top_k, requests))
    }

    /// Layer runs grouped into passes (a pass ends where the layer index goes down).
    fn passes(&self) -> Vec<Vec<Range<usize>>> {
        let mut passes: Vec<Vec<Range<usize>>> = Vec::new();
        let mut prev_layer = None;
        for run in layer_runs(&self.requests) {
            let layer = self.requests[run.start].layer;
            match passes.last_mut() {
                Some(pass) if prev_layer.is_some_and(|p| layer >= p) => pass.push(run),
                _ => passes.push(vec![run]),
            }
            prev_layer = Some(layer);
        }
        passes
    }
}

/// Maximal runs of consecutive requests to the same layer.
fn layer_runs(requests: &[ExpertKey]) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=requests.len() {
        if i == requests.len() || requests[i].layer != requests[start].layer {
            if i > start {
                runs.push(start..i);
            }
            start = i;
        }
    }
    runs
}

/// Counters of one replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Requests replayed.
    pub requests: u64,
    /// Requests found resident.
    pub hits: u64,
    /// Requests that had to be read.
    pub misses: u64,
    /// Misses that evicted another expert.
    pub evictions: u64,
}

impl SimStats {
    /// Hits / requests (0 for an empty trace).
    pub fn hit_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }
}

/// Replays `trace` through a cache of `capacity` slots under `policy`. Each batch is pinned
/// while it is served, as the engine does, so capacity must be at least `top_k + 1`.
pub fn simulate(trace: &Trace, capacity: usize, policy: PolicyKind) -> Result<SimStats, SimError> {
    let min = trace.top_k + 1;
    if capacity < min {
        return Err(SimError::Capacity { capacity, min });
    }
    let built = policy.build(trace.space, capacity, &trace.requests);
    let mut table = SlotTable::new(trace.space, capacity, built);
    let mut stats = SimStats::default();
    for batch in &trace.batches {
        let keys = &trace.requests[batch.clone()];
        for &k in keys {
            table.pin(k)?;
        }
        for &k in keys {
            stats.requests += 1;
            match table.access(k)? {
                crate::Lookup::Hit { .. } => stats.hits += 1,
                crate::Lookup::Miss { evicted, .. } => {
                    stats.misses += 1;
                    stats.evictions += u64::from(evicted.is_some());
                }
            }
        }
        for &k in keys {
            table.unpin(k)?;
        }
    }
    Ok(stats)
}
