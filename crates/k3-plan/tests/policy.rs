//! Replacement policies on hand-made traces with known hit counts.

use k3_plan::policy::{LfuDecay, Lru, Pins};
use k3_plan::sim::{simulate, Trace};
use k3_plan::{ExpertKey, KeySpace, Lookup, PolicyKind, ReplacementPolicy, SlotTable};
use proptest::prelude::*;

const SPACE: KeySpace = KeySpace {
    n_layers: 2,
    n_experts: 16,
};

/// Keys of layer 0 named by letters.
fn keys(s: &str) -> Vec<ExpertKey> {
    s.bytes()
        .map(|c| ExpertKey::new(0, u32::from(c - b'A')))
        .collect()
}

/// Hits of `seq` (one request per batch) through `capacity` slots.
fn hits(policy: PolicyKind, capacity: usize, seq: Vec<ExpertKey>) -> u64 {
    let trace = Trace::from_requests(SPACE, 1, seq);
    simulate(&trace, capacity, policy).unwrap().hits
}

#[test]
fn lru_known_counts() {
    assert_eq!(hits(PolicyKind::Lru, 2, keys("ABACBA")), 1);
    assert_eq!(hits(PolicyKind::Lru, 2, keys("ABCABC")), 0);
    assert_eq!(hits(PolicyKind::Lru, 3, keys("ABCABC")), 3);
}

#[test]
fn opt_known_counts() {
    // A B C: evict B (next use 4 > A's 3); A hit; B evicts A (never again); C hit.
    assert_eq!(hits(PolicyKind::Opt, 2, keys("ABCABC")), 2);
    assert_eq!(hits(PolicyKind::Opt, 2, keys("ABACBA")), 2);
}

#[test]
fn lfu_known_counts() {
    let lfu = PolicyKind::Lfu { half_life: 1 << 20 };
    // A is frequent and survives the B/C alternation, which thrashes in the other slot.
    assert_eq!(hits(lfu, 2, keys("AAABCBCA")), 3);
    assert_eq!(hits(PolicyKind::Lru, 2, keys("AAABCBCA")), 4);
    // A frequent key survives a scan that flushes LRU.
    assert_eq!(hits(lfu, 2, keys("AAABCDA")), 3);
    assert_eq!(hits(PolicyKind::Lru, 2, keys("AAABCDA")), 2);
}

#[test]
fn arc_resists_a_scan() {
    let seq = keys("ABABCDEFGHAB");
    assert_eq!(hits(PolicyKind::Arc, 4, seq.clone()), 4);
    assert_eq!(hits(PolicyKind::Lru, 4, seq), 2);
}

#[test]
fn layer_quota_protects_other_layers() {
    let (a, b) = (ExpertKey::new(0, 0), ExpertKey::new(0, 1));
    let burst: Vec<_> = (0..4).map(|e| ExpertKey::new(1, e)).collect();
    let seq: Vec<_> = [a, b].into_iter().chain(burst).chain([a, b]).collect();
    assert_eq!(hits(PolicyKind::LayerLru, 4, seq.clone()), 2);
    assert_eq!(hits(PolicyKind::Lru, 4, seq), 0);
}

#[test]
fn pinned_keys_are_never_victims() {
    let [a, b, c] = [0, 1, 2].map(|e| ExpertKey::new(0, e));
    let mut t = SlotTable::new(SPACE, 2, Box::new(Lru::new(SPACE)));
    t.access(a).unwrap();
    t.access(b).unwrap();
    t.pin(a).unwrap();
    assert_eq!(
        t.access(c).unwrap(),
        Lookup::Miss {
            slot: 1,
            evicted: Some(b)
        }
    );
    t.pin(c).unwrap();
    assert!(t.access(b).is_err(), "everything pinned");
    t.unpin(a).unwrap();
    assert!(matches!(t.access(b).unwrap(), Lookup::Miss { evicted: Some(x), .. } if x == a));
}

#[test]
fn policies_skip_pins_in_choose_victim() {
    let mut pins = Pins::new(SPACE);
    let mut lfu = LfuDecay::new(SPACE, 100);
    let [a, b] = [0, 1].map(|e| ExpertKey::new(1, e));
    lfu.on_insert(a);
    lfu.on_insert(b);
    lfu.on_hit(b);
    assert_eq!(lfu.choose_victim(b, &pins), Some(a));
    pins.pin(a);
    assert_eq!(lfu.choose_victim(b, &pins), Some(b));
    pins.pin(b);
    assert_eq!(lfu.choose_victim(b, &pins), None);
}

#[test]
fn batches_are_pinned_while_served() {
    // top-k 2, capacity 3: batch [A, D] must not evict A (resident, just hit) for D.
    let space = SPACE;
    let seq = keys("ABCA").into_iter().chain([ExpertKey::new(1, 3)]);
    let mut reqs: Vec<_> = seq.collect();
    reqs.insert(3, ExpertKey::new(1, 0)); // A B | C A'(layer1 run: A', D')
    let trace = Trace::from_requests(space, 2, reqs);
    for p in PolicyKind::all() {
        simulate(&trace, 3, p).unwrap();
    }
}

fn arb_trace() -> impl Strategy<Value = Vec<ExpertKey>> {
    prop::collection::vec((0u32..2, 0u32..6), 1..200)
        .prop_map(|v| v.into_iter().map(|(l, e)| ExpertKey::new(l, e)).collect())
}

/// Plain LRU: a list ordered by recency.
fn naive_lru(cap: usize, seq: &[ExpertKey]) -> u64 {
    let mut cache: Vec<ExpertKey> = Vec::new();
    let mut hits = 0;
    for k in seq {
        if let Some(p) = cache.iter().position(|x| x == k) {
            hits += 1;
            cache.remove(p);
        } else if cache.len() == cap {
            cache.remove(0);
        }
        cache.push(*k);
    }
    hits
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn lru_matches_naive(seq in arb_trace(), cap in 2usize..8) {
        prop_assert_eq!(hits(PolicyKind::Lru, cap, seq.clone()), naive_lru(cap, &seq));
    }

    #[test]
    fn lfu_with_half_life_one_is_lru(seq in arb_trace(), cap in 2usize..8) {
        let lfu = PolicyKind::Lfu { half_life: 1 };
        prop_assert_eq!(hits(lfu, cap, seq.clone()), hits(PolicyKind::Lru, cap, seq));
    }

    #[test]
    fn opt_is_never_beaten(seq in arb_trace(), cap in 2usize..8) {
        let opt = hits(PolicyKind::Opt, cap, seq.clone());
        for p in PolicyKind::all() {
            prop_assert!(hits(p, cap, seq.clone()) <= opt, "{} beat opt", p);
        }
    }
}

#[test]
fn policy_names_round_trip() {
    for p in PolicyKind::all()
        .into_iter()
        .chain([PolicyKind::Lfu { half_life: 7 }])
    {
        assert_eq!(p.to_string().parse::<PolicyKind>().unwrap(), p);
    }
    assert!("mru".parse::<PolicyKind>().is_err());
    assert!("lfu:0".parse::<PolicyKind>().is_err());
}

#[test]
fn slot_table_remove_frees_the_slot() {
    let mut t = SlotTable::new(SPACE, 2, PolicyKind::Lru.build(SPACE, 2, &[]));
    let (a, b, c) = (
        ExpertKey::new(0, 1),
        ExpertKey::new(0, 2),
        ExpertKey::new(1, 3),
    );
    assert!(matches!(
        t.access(a),
        Ok(Lookup::Miss { evicted: None, .. })
    ));
    assert!(matches!(
        t.access(b),
        Ok(Lookup::Miss { evicted: None, .. })
    ));
    let slot = t.remove(a).expect("a was resident");
    assert_eq!(t.slot_of(a), None);
    assert_eq!(t.remove(a), None);
    // The freed slot is reused without evicting b.
    assert_eq!(
        t.access(c),
        Ok(Lookup::Miss {
            slot,
            evicted: None
        })
    );
    assert!(matches!(t.access(b), Ok(Lookup::Hit { .. })));
}
