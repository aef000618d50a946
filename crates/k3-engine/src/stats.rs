//! I/O counters of the streaming stores, as one plain struct for reports and `--json`.

use k3_store::expert_store::ExpertStats;
use k3_store::trunk_store::TrunkStats;

/// Cumulative counters since the engine opened (zeros for the resident store).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoreStats {
    /// Trunk layer binds (one per layer per forward).
    pub trunk_binds: u64,
    /// Binds served by a pinned layer.
    pub trunk_pinned_hits: u64,
    /// Trunk bytes read from disk (pins at open included; stored bytes of a compressed trunk).
    pub trunk_bytes_read: u64,
    /// Trunk bytes decoded from a compressed trunk (0 for a plain one).
    pub trunk_bytes_decoded: u64,
    /// Seconds spent decoding a compressed trunk (summed over decoding calls).
    pub trunk_decode_seconds: f64,
    /// Pieces each streamed layer is read in (1: whole layers; 2: a ring of pieces,
    /// docs/STREAMING.md#trunk-pieces; 0: no streaming store). Not a counter.
    pub trunk_pieces: u64,
    /// Trunk reads (layers or pieces) the background reader issued ahead of their bind.
    pub trunk_read_aheads: u64,
    /// Routed-expert requests.
    pub expert_requests: u64,
    /// Requests served from the expert cache.
    pub expert_resident_hits: u64,
    /// Expert bytes read from disk.
    pub expert_bytes_read: u64,
    /// Experts evicted from the cache.
    pub expert_evictions: u64,
    /// Failed expert reads.
    pub expert_failures: u64,
    /// Seconds spent inside reads (all I/O threads together).
    pub io_seconds: f64,
    /// Seconds the compute thread blocked waiting for a streamed trunk layer.
    pub trunk_wait_seconds: f64,
    /// Seconds the compute thread blocked waiting for routed experts to arrive (inside a
    /// fetch, outside the per-expert compute).
    pub expert_wait_seconds: f64,
    /// Experts read early because the next layer's router predicted them (lookahead).
    pub lookahead_reads: u64,
    /// Of those, the ones the layer then asked for.
    pub lookahead_useful_reads: u64,
    /// Early reads dropped before they started because the layer did not ask for them.
    pub lookahead_cancelled: u64,
    /// Distinct experts asked for by layers whose experts had been predicted.
    pub lookahead_requested: u64,
    /// Of those, the ones predicted (recall = predicted-and-asked ÷ asked).
    pub lookahead_correct: u64,
    /// Experts the draft model asked the cache for (hybrid drafting).
    pub draft_expert_requests: u64,
    /// Of those, the ones resident (the rest were dropped from the draft's top-k).
    pub draft_expert_hits: u64,
}

impl StoreStats {
    pub(crate) fn from_parts(t: TrunkStats, e: ExpertStats, expert_wait: f64) -> StoreStats {
        StoreStats {
            trunk_binds: t.binds,
            trunk_pinned_hits: t.pinned_hits,
            trunk_bytes_read: t.bytes_read,
            trunk_bytes_decoded: t.bytes_decoded,
            trunk_decode_seconds: t.decode_seconds,
            trunk_pieces: t.pieces as u64,
            trunk_read_aheads: t.read_aheads,
            expert_requests: e.requests,
            expert_resident_hits: e.resident_hits,
            expert_bytes_read: e.bytes_read,
            expert_evictions: e.evictions,
            expert_failures: e.failures,
            io_seconds: t.io_seconds + e.io_seconds,
            trunk_wait_seconds: t.wait_seconds,
            expert_wait_seconds: expert_wait,
            lookahead_reads: e.hint_reads,
            lookahead_useful_reads: e.hint_useful_reads,
            lookahead_cancelled: e.hint_cancelled,
            lookahead_requested: e.hint_requested,
            lookahead_correct: e.hint_correct,
            draft_expert_requests: e.draft_requests,
            draft_expert_hits: e.draft_hits,
        }
    }

    /// Counters accumulated between `earlier` and `self`.
    pub fn since(&self, earlier: &StoreStats) -> StoreStats {
        StoreStats {
            trunk_binds: self.trunk_binds - earlier.trunk_binds,
            trunk_pinned_hits: self.trunk_pinned_hits - earlier.trunk_pinned_hits,
            trunk_bytes_read: self.trunk_bytes_read - earlier.trunk_bytes_read,
            trunk_bytes_decoded: self.trunk_bytes_decoded - earlier.trunk_bytes_decoded,
            trunk_decode_seconds: self.trunk_decode_seconds - earlier.trunk_decode_seconds,
            trunk_pieces: self.trunk_pieces,
            trunk_read_aheads: self.trunk_read_aheads - earlier.trunk_read_aheads,
            expert_requests: self.expert_requests - earlier.expert_requests,
            expert_resident_hits: self.expert_resident_hits - earlier.expert_resident_hits,
            expert_bytes_read: self.expert_bytes_read - earlier.expert_bytes_read,
            expert_evictions: self.expert_evictions - earlier.expert_evictions,
            expert_failures: self.expert_failures - earlier.expert_failures,
            io_seconds: self.io_seconds - earlier.io_seconds,
            trunk_wait_seconds: self.trunk_wait_seconds - earlier.trunk_wait_seconds,
            expert_wait_seconds: self.expert_wait_seconds - earlier.expert_wait_seconds,
            lookahead_reads: self.lookahead_reads - earlier.lookahead_reads,
            lookahead_useful_reads: self.lookahead_useful_reads - earlier.lookahead_useful_reads,
            lookahead_cancelled: self.lookahead_cancelled - earlier.lookahead_cancelled,
            lookahead_requested: self.lookahead_requested - earlier.lookahead_requested,
            lookahead_correct: self.lookahead_correct - earlier.lookahead_correct,
            draft_expert_requests: self.draft_expert_requests - earlier.draft_expert_requests,
            draft_expert_hits: self.draft_expert_hits - earlier.draft_expert_hits,
        }
    }

    /// Trunk plus expert bytes read.
    pub fn bytes_read(&self) -> u64 {
        self.trunk_bytes_read + self.expert_bytes_read
    }

    /// Share of expert requests served from the cache (0 when none).
    pub fn expert_hit_rate(&self) -> f64 {
        ratio(self.expert_resident_hits, self.expert_requests)
    }

    /// Lookahead recall: share of the experts asked for that the next-layer router had
    /// predicted (recall@top-k; 0 when nothing was predicted).
    pub fn lookahead_recall(&self) -> f64 {
        ratio(self.lookahead_correct, self.lookahead_requested)
    }

    /// Share of trunk binds served by pinned layers (0 when none).
    pub fn trunk_hit_rate(&self) -> f64 {
        ratio(self.trunk_pinned_hits, self.trunk_binds)
    }

    /// The I/O report of a run. The share of wall clock is the time the compute thread
    /// waited for reads (trunk layers and routed experts), so it cannot pass 100 %; the
    /// reader threads' busy time is summed over threads and given apart. `wall` is `None`
    /// where there is no run to compare with (chat's `/stats`).
    pub fn report(&self, wall: Option<f64>) -> String {
        let s = self;
        let waited = s.trunk_wait_seconds + s.expert_wait_seconds;
        let share = match wall {
            Some(w) => format!(
                " of {w:.3} s wall clock ({:.1}%)",
                (100.0 * waited / w.max(1e-9)).min(100.0)
            ),
            None => String::new(),
        };
        let mut text = format!(
            "I/O report\n  trunk      {} binds, {:.1}% pinned, {:.3} GB read\n  experts    {} requests, {:.1}% resident hits, {} evictions, {} failed reads, {:.3} GB read\n  I/O wait   {waited:.3} s{share}: trunk {:.3} s, experts {:.3} s; reader threads busy {:.3} s in all",
            s.trunk_binds,
            100.0 * s.trunk_hit_rate(),
            s.trunk_bytes_read as f64 / 1e9,
            s.expert_requests,
            100.0 * s.expert_hit_rate(),
            s.expert_evictions,
            s.expert_failures,
            s.expert_bytes_read as f64 / 1e9,
            s.trunk_wait_seconds,
            s.expert_wait_seconds,
            s.io_seconds,
        );
        if s.trunk_bytes_decoded > 0 {
            text.push_str(&format!(
                "\n  decode     {:.3} GB of trunk decoded from {:.3} GB read ({:.3}) in {:.3} s",
                s.trunk_bytes_decoded as f64 / 1e9,
                s.trunk_bytes_read as f64 / 1e9,
                s.trunk_bytes_read as f64 / s.trunk_bytes_decoded as f64,
                s.trunk_decode_seconds
            ));
        }
        if s.lookahead_requested > 0 {
            text.push_str(&format!(
                "\n  lookahead  recall {:.1}% of the experts asked for; {} early reads, {} of them used",
                100.0 * s.lookahead_recall(),
                s.lookahead_reads,
                s.lookahead_useful_reads
            ));
        }
        text
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_share_is_the_wait_and_never_passes_100_percent() {
        let s = StoreStats {
            io_seconds: 2.881,
            trunk_wait_seconds: 0.4,
            expert_wait_seconds: 0.1,
            ..StoreStats::default()
        };
        let r = s.report(Some(1.0));
        assert!(
            r.contains("I/O wait   0.500 s of 1.000 s wall clock (50.0%)"),
            "{r}"
        );
        assert!(r.contains("reader threads busy 2.881 s in all"), "{r}");
        let r = s.report(Some(0.25));
        assert!(r.contains("(100.0%)"), "{r}");
        assert!(!s.report(None).contains("wall clock"));
    }
}
