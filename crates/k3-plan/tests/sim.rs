//! The trace simulator on a tiny synthetic full-recompute trace (no fixture file needed), and
//! on the upstream trace when it is present.

use k3_plan::sim::{simulate, SimError, Trace};
use k3_plan::{ExpertKey, KeySpace, PolicyKind};
use std::collections::HashSet;

const SPACE: KeySpace = KeySpace {
    n_layers: 4,
    n_experts: 8,
};

/// Token `t`'s two experts at layer `l` (distinct, deterministic).
fn route(t: u32, l: u32) -> [u32; 2] {
    let a = (t * 3 + l) % 8;
    [a, (a + 1 + t % 3) % 8]
}

/// Passes over 1..=4 tokens, each recomputing every token at layers 1..=3, as bytes.
fn synthetic_bytes() -> Vec<u8> {
    let mut out = Vec::new();
    for tokens in 1..=4 {
        for l in 1..=3 {
            for t in 0..tokens {
                for e in route(t, l) {
                    out.extend_from_slice(&l.to_le_bytes());
                    out.extend_from_slice(&e.to_le_bytes());
                }
            }
        }
    }
    out
}

#[test]
fn synthetic_layout() {
    let trace = Trace::parse(&synthetic_bytes(), SPACE, 2).unwrap();
    let s = trace.summary();
    assert_eq!(s.requests, 2 * 3 * (1 + 2 + 3 + 4));
    assert_eq!((s.layers, s.n_layers_seen), ((1, 3), 3));
    assert_eq!(s.pass_tokens, vec![1, 2, 3, 4]);
    assert!(s.batches_distinct && s.prefix_consistent);
    assert_eq!(s.token_forwards(2), 10.0);
    let d = trace.decode_view().unwrap();
    assert_eq!(d.requests.len(), 2 * 3 * 4);
    assert!(d.summary().pass_tokens.iter().all(|&t| t == 1));
}

#[test]
fn synthetic_replay() {
    let trace = Trace::parse(&synthetic_bytes(), SPACE, 2).unwrap();
    let distinct = trace.requests.iter().collect::<HashSet<_>>().len() as u64;
    for p in PolicyKind::all() {
        let all = simulate(&trace, distinct as usize, p).unwrap();
        assert_eq!(all.misses, distinct, "{p}: only compulsory misses");
        assert_eq!(all.evictions, 0);
        for cap in 3..distinct as usize {
            let st = simulate(&trace, cap, p).unwrap();
            let opt = simulate(&trace, cap, PolicyKind::Opt).unwrap();
            assert_eq!(st.hits + st.misses, st.requests);
            assert!(st.hits <= opt.hits, "{p} beat opt at {cap}");
        }
    }
    // Below top-k + 1 the engine refuses, so does the simulator.
    assert!(matches!(
        simulate(&trace, 2, PolicyKind::Lru),
        Err(SimError::Capacity {
            capacity: 2,
            min: 3
        })
    ));
}

#[test]
fn malformed_traces_are_refused() {
    assert!(matches!(
        Trace::parse(&[0; 7], SPACE, 2),
        Err(SimError::Length(7))
    ));
    let mut b = 9u32.to_le_bytes().to_vec();
    b.extend_from_slice(&0u32.to_le_bytes());
    assert!(matches!(
        Trace::parse(&b, SPACE, 2),
        Err(SimError::OutOfRange { layer: 9, .. })
    ));
    let t = Trace::from_requests(SPACE, 2, vec![ExpertKey::new(1, 0); 3]);
    assert!(!t.summary().batches_distinct);
}

#[test]
fn upstream_trace_layout() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/upstream/expert_trace.bin"
    );
    let bytes = std::fs::read(path).unwrap();
    let t = Trace::parse(&bytes, KeySpace::K3, 16).unwrap();
    let s = t.summary();
    assert_eq!((s.requests, s.distinct), (100_096, 10_010));
    assert_eq!(
        (s.layers, s.n_layers_seen, s.max_expert),
        ((1, 92), 92, 895)
    );
    assert_eq!(s.pass_tokens, (5..=12).collect::<Vec<_>>());
    assert!(s.batches_distinct && s.prefix_consistent);
    assert_eq!(s.token_forwards(16), 68.0);
}

/// Hit %, full trace / decode view, of LRU and ARC at a preset's cache size.
fn preset_hit_rates(trace: &Trace, decode: &Trace, preset: k3_plan::Preset) -> [(f64, f64); 2] {
    use k3_plan::plan::{ModelSizes, GB};
    let slots = (preset.gb().1 * GB / ModelSizes::k3_estimate().expert_slot_bytes()) as usize;
    [PolicyKind::Lru, PolicyKind::Arc].map(|p| {
        let pct = |t: &Trace| 100.0 * simulate(t, slots, p).unwrap().hit_rate();
        (pct(trace), pct(decode))
    })
}

/// The expert-cache policy decision (docs/PERFORMANCE.md#expert-cache-policy) on
/// upstream's recorded trace: the table's LRU and ARC cells, ARC as the default because it
/// never loses more than 2.4 points to LRU and gains at the desktop and server presets'
/// decode, and the planner's decode-view hit rates (`forecast::table_hit_rate`) are ARC's.
#[test]
fn upstream_trace_makes_arc_the_default() {
    use k3_plan::Preset;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/upstream/expert_trace.bin"
    );
    let trace = Trace::parse(&std::fs::read(path).unwrap(), KeySpace::K3, 16).unwrap();
    let decode = trace.decode_view().unwrap();
    // preset: [lru, arc] as (full trace, decode view) hit %, rounded as the table prints them.
    let table = [
        (Preset::Laptop, [(35.5, 9.5), (35.0, 9.6)]),
        (Preset::Desktop, [(36.2, 9.5), (36.1, 13.6)]),
        (Preset::Server, [(36.2, 9.5), (36.1, 15.2)]),
        (Preset::Workstation, [(36.2, 30.0), (37.7, 27.6)]),
        (Preset::Max, [(40.6, 41.5), (45.1, 41.8)]),
    ];
    assert_eq!(PolicyKind::DEFAULT, PolicyKind::Arc);
    for (preset, want) in table {
        let [lru, arc] = preset_hit_rates(&trace, &decode, preset);
        let round = |(f, d): (f64, f64)| ((f * 10.0).round() / 10.0, (d * 10.0).round() / 10.0);
        assert_eq!([round(lru), round(arc)], want, "{preset}: [lru, arc]");
        assert!(
            arc.0 >= lru.0 - 2.4 && arc.1 >= lru.1 - 2.4,
            "{preset}: ARC far behind LRU"
        );
        let planned = 100.0 * k3_plan::forecast::table_hit_rate(preset);
        assert!(
            (planned - arc.1).abs() < 0.05,
            "{preset}: planner {planned} vs ARC {arc:?}"
        );
    }
    for preset in [Preset::Desktop, Preset::Server] {
        let [lru, arc] = preset_hit_rates(&trace, &decode, preset);
        assert!(
            arc.1 >= lru.1 + 4.0,
            "{preset}: ARC's decode gain {arc:?} vs {lru:?}"
        );
    }
}
