//! What a plan costs per token: the expert hit rate a preset is expected to reach and the I/O
//! floor of a token's seconds at measured read rates (`k3 doctor`, `k3 presets`).
//!
//! ```text
//! bytes/token = unpinned trunk + MoE layers · top-k · (1 − hit rate) · expert bytes
//! s/token    ≥ trunk / bandwidth(1 read) + experts / bandwidth(16 reads)
//! ```
//!
//! Over a group of N machines (`cargo xtask predict-dist`, docs/PERFORMANCE.md#predicted-stoken-on-216-machines)
//! each rank's floor is [`group_floor_secs`]: the slower of its disk and DRAM traffic, plus
//! the network; a rank's cache of a fraction of its experts hits at
//! [`interpolated_hit_rate`].

use crate::plan::GB;
use crate::{MemoryPlan, ModelSizes, Preset};

/// Decode-view ARC hit rates per preset (docs/PERFORMANCE.md, the expert-cache policy table).
pub fn table_hit_rate(p: Preset) -> f64 {
    match p {
        Preset::Laptop => 0.096,
        Preset::Desktop => 0.136,
        Preset::Server => 0.152,
        Preset::Workstation => 0.276,
        Preset::Max => 0.418,
    }
}

/// Whether the plan keeps the whole model resident (nothing read per token after warm-up).
pub fn holds_everything(p: &MemoryPlan, sizes: &ModelSizes) -> bool {
    p.trunk.streamed_per_token == 0 && p.expert_slots >= sizes.n_routed_experts
}

/// The expert hit rate a preset's plan is expected to reach: 100 % when it holds every expert,
/// else the table's figure.
pub fn hit_rate(p: Preset, plan: &MemoryPlan, sizes: &ModelSizes) -> f64 {
    if holds_everything(plan, sizes) {
        1.0
    } else {
        table_hit_rate(p)
    }
}

/// The I/O-floor seconds of a token: `trunk` bytes at `one_read` bytes/s (the trunk is read
/// in order, one request at a time) and `experts` bytes at `many_reads` bytes/s (a layer's
/// experts are read together).
pub fn io_floor_secs(trunk: f64, experts: f64, one_read: f64, many_reads: f64) -> f64 {
    trunk / one_read + experts / many_reads
}

/// The table's hit rates at the presets' cache slots, each as a fraction of the released
/// model's routed experts, in ascending order.
fn hit_points() -> [(f64, f64); 5] {
    let whole = ModelSizes::k3_estimate();
    let slot = whole.expert_slot_bytes();
    let mut points = Preset::ALL.map(|p| {
        let slots = (p.gb().1 * GB / slot) as f64;
        (slots / whole.n_routed_experts as f64, table_hit_rate(p))
    });
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

/// Expected expert hit rate with `slots` cache slots over `experts` (owned) experts: piecewise
/// linear through the table's rates at the presets' cache fractions, 100 % when the cache holds
/// every expert. A rank that owns experts `e % N` sees a `1/N` sample of the one-machine
/// trace, so the same rate at the same fraction is assumed.
pub fn interpolated_hit_rate(slots: u64, experts: u64) -> f64 {
    if experts == 0 || slots >= experts {
        return 1.0;
    }
    let f = slots as f64 / experts as f64;
    let mut prev = (0.0, 0.0);
    for (x, y) in hit_points().into_iter().chain([(1.0, 1.0)]) {
        if f <= x {
            return prev.1 + (y - prev.1) * (f - prev.0) / (x - prev.0);
        }
        prev = (x, y);
    }
    1.0
}

/// What one decoded token costs a rank of a group on the network.
#[derive(Clone, Copy, Debug)]
pub struct NetworkCost {
    /// Collective calls per token.
    pub collectives: u64,
    /// Bytes the rank receives per token.
    pub received_bytes: u64,
    /// Link rate, bits/s.
    pub link_bits_per_s: f64,
    /// One point-to-point step of a small collective, seconds.
    pub latency_s: f64,
}

/// The decode floor of one token on a rank of a `ranks`-machine group: reads overlap compute
/// (the ring prefetches), so the slower of `disk_secs` and `dram_secs`; every collective is a
/// synchronisation point of the pass, so the network adds `collectives · ⌈log₂ N⌉` latencies
/// (recursive doubling for small all-gathers) plus the received bytes at the link rate. One
/// machine has no network term. Compute is left out: a floor, like [`io_floor_secs`].
pub fn group_floor_secs(disk_secs: f64, dram_secs: f64, ranks: usize, net: NetworkCost) -> f64 {
    let io = disk_secs.max(dram_secs);
    if ranks <= 1 {
        return io;
    }
    let steps = (ranks as f64).log2().ceil();
    io + net.collectives as f64 * steps * net.latency_s
        + net.received_bytes as f64 * 8.0 / net.link_bits_per_s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_adds_each_stream_at_its_rate() {
        assert_eq!(super::io_floor_secs(2e9, 6e9, 1e9, 3e9), 4.0);
    }

    #[test]
    fn hit_rate_passes_through_the_measured_points_and_ends_at_one() {
        let points = hit_points();
        assert!(points
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        for (f, h) in points {
            let slots = (f * 82_432.0).round() as u64;
            assert!(
                (interpolated_hit_rate(slots, 82_432) - h).abs() < 1e-3,
                "{slots}"
            );
        }
        assert_eq!(interpolated_hit_rate(0, 82_432), 0.0);
        assert_eq!(interpolated_hit_rate(82_432, 82_432), 1.0);
        assert_eq!(interpolated_hit_rate(10, 0), 1.0);
        let mut last = 0.0;
        for s in (0..82_432).step_by(997) {
            let h = interpolated_hit_rate(s, 82_432);
            assert!(h >= last);
            last = h;
        }
    }

    #[test]
    fn the_group_floor_is_the_slower_read_plus_the_network() {
        let net = NetworkCost {
            collectives: 10,
            received_bytes: 1_000_000,
            link_bits_per_s: 8e9,
            latency_s: 1e-5,
        };
        // one machine: no network, the slower of disk and DRAM
        assert_eq!(group_floor_secs(0.5, 0.2, 1, net), 0.5);
        assert_eq!(group_floor_secs(0.1, 0.2, 1, net), 0.2);
        // 4 machines: 2 doubling steps per collective, 1 MB at 1 GB/s
        let want = 0.5 + 10.0 * 2.0 * 1e-5 + 1e-3;
        assert!((group_floor_secs(0.5, 0.2, 4, net) - want).abs() < 1e-12);
        // 5 machines round the steps up to 3
        let want5 = 0.5 + 10.0 * 3.0 * 1e-5 + 1e-3;
        assert!((group_floor_secs(0.5, 0.2, 5, net) - want5).abs() < 1e-12);
    }
}
