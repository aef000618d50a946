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
