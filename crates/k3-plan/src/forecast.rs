//! What a plan costs per token: the expert hit rate a preset is expected to reach and the I/O
//! floor of a token's seconds at measured read rates (`k3 doctor`, `k3 presets`).
//!
//! ```text
//! bytes/token = unpinned trunk + MoE layers · top-k · (1 − hit rate) · expert bytes
//! s/token    ≥ trunk / bandwidth(1 read) + experts / bandwidth(16 reads)
//! ```

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

#[cfg(test)]
mod tests {
    #[test]
    fn the_floor_adds_each_stream_at_its_rate() {
        assert_eq!(super::io_floor_secs(2e9, 6e9, 1e9, 3e9), 4.0);
    }
}
