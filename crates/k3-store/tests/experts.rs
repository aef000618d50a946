//! The expert store: exact bytes, counts against the simulator, waves, duplicates, failures,
//! arrival order under delays, the trace, concurrent callers.

mod common;

use common::{bytes, FaultyFiles, TempFile};
use k3_plan::sim::{simulate, Trace};
use k3_plan::{ExpertKey, KeySpace, PolicyKind};
use k3_store::io::align_up;
use k3_store::{ExpertLoc, ExpertStore, Fault, FaultyReader, ReadAt};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Expert size: deliberately not a multiple of 4096.
const EXP: usize = 3 * 4096 + 100;
const LAYERS: u32 = 4;
const EXPERTS: u32 = 12;
const SPACE: KeySpace = KeySpace {
    n_layers: LAYERS,
    n_experts: EXPERTS,
};

fn expected(layer: usize, e: u32) -> Vec<u8> {
    bytes(1000 + layer as u64, u64::from(e), EXP)
}

/// Two files: file 0 holds every expert with `e % 3 != 2` contiguously at unaligned offsets;
/// file 1 holds the others split into six pieces placed out of order.
struct Experts {
    _tmp: Vec<TempFile>,
    locs: HashMap<(usize, u32), ExpertLoc>,
    faulty: Vec<Arc<FaultyReader>>,
}

impl Experts {
    fn new(direct: bool) -> Experts {
        let (mut f0, mut f1) = (vec![0x55u8; 333], vec![0x66u8; 4096 + 17]);
        let mut locs = HashMap::new();
        for l in 0..LAYERS as usize {
            for e in 0..EXPERTS {
                let data = expected(l, e);
                if e % 3 != 2 {
                    let off = f0.len() as u64;
                    f0.extend(&data);
                    f0.extend([0xAB; 37]);
                    locs.insert((l, e), one(0, off, EXP as u64));
                } else {
                    locs.insert((l, e), scatter(&mut f1, &data));
                }
            }
        }
        let files = FaultyFiles::new("experts", &[f0, f1], direct);
        Experts {
            _tmp: files.tmp,
            locs,
            faulty: files.readers,
        }
    }

    fn store(&self, slots: usize, policy: PolicyKind, threads: usize) -> ExpertStore {
        let files = self
            .faulty
            .iter()
            .map(|f| Arc::clone(f) as Arc<dyn ReadAt>)
            .collect();
        let locs = self.locs.clone();
        let locate = Box::new(move |l: usize, e: u32| {
            locs.get(&(l, e))
                .cloned()
                .ok_or_else(|| format!("no expert ({l}, {e})"))
        });
        let slot_bytes = align_up(EXP as u64 + 2 * 4096);
        ExpertStore::new_in(SPACE, files, locate, slots, slot_bytes, policy, threads)
            .expect("store")
    }

    /// Injects `fault` on every byte of expert `(l, e)`.
    fn inject(&self, l: usize, e: u32, fault: Fault) {
        let loc = &self.locs[&(l, e)];
        for &(off, len) in &loc.reads {
            self.faulty[loc.file].inject(off..off + len, fault);
        }
    }

    fn clear(&self) {
        self.faulty.iter().for_each(|f| f.clear());
    }
}

fn one(file: usize, off: u64, len: u64) -> ExpertLoc {
    ExpertLoc {
        file,
        reads: vec![(off, len)],
        total: len,
    }
}

/// Writes `data` as six pieces in reverse order with gaps; returns the reads that rebuild it.
fn scatter(f: &mut Vec<u8>, data: &[u8]) -> ExpertLoc {
    let cuts = [0, 4000, 4100, 9000, 9001, 12_000, data.len()];
    let mut reads = vec![(0, 0); 6];
    for p in (0..6).rev() {
        f.extend([0x77; 13]);
        reads[p] = (f.len() as u64, (cuts[p + 1] - cuts[p]) as u64);
        f.extend(&data[cuts[p]..cuts[p + 1]]);
    }
    ExpertLoc {
        file: 1,
        reads,
        total: data.len() as u64,
    }
}

/// Fetches and checks every delivered buffer; returns the indices in arrival order.
fn fetch_ok(store: &ExpertStore, layer: usize, experts: &[u32]) -> Vec<usize> {
    let mut order = Vec::new();
    store
        .fetch(layer, experts, &mut |i, b| {
            let want = expected(layer, experts[i]);
            let first = b.iter().zip(&want).position(|(x, y)| x != y);
            assert!(
                b == want,
                "expert {} of layer {layer}: len {} vs {}, first diff {first:?}",
                experts[i],
                b.len(),
                want.len()
            );
            order.push(i);
        })
        .expect("fetch");
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..experts.len()).collect::<Vec<_>>(),
        "each index exactly once"
    );
    order
}

#[test]
fn delivers_exact_bytes_contiguous_and_scattered() {
    for direct in [true, false] {
        let x = Experts::new(direct);
        let store = x.store(6, PolicyKind::DEFAULT, 2);
        for l in 0..LAYERS as usize {
            for batch in [[0u32, 1, 2], [3, 4, 5], [2, 5, 8], [9, 10, 11]] {
                fetch_ok(&store, l, &batch);
                fetch_ok(&store, l, &batch); // hits
            }
        }
        let s = store.stats();
        assert_eq!(s.requests, 2 * 4 * 12);
        assert_eq!(s.resident_hits + s.misses, s.requests);
        assert!(s.resident_hits >= 4 * 12);
        assert_eq!(s.failures, 0);
        assert_eq!(s.bytes_read, s.misses * EXP as u64);
    }
}

#[test]
fn hand_made_lru_sequence_counts() {
    let x = Experts::new(true);
    let store = x.store(4, PolicyKind::Lru, 2); // capacity = batch size + 1
    fetch_ok(&store, 1, &[0, 1, 2]); // 3 misses
    fetch_ok(&store, 1, &[0, 1, 2]); // 3 hits
    fetch_ok(&store, 1, &[3, 0, 1]); // 1 miss into the free slot, 2 hits
    fetch_ok(&store, 1, &[4, 5, 0]); // 4 evicts 2, 5 evicts 3, 0 hits
    let s = store.stats();
    assert_eq!(
        (s.requests, s.resident_hits, s.misses, s.evictions),
        (12, 6, 6, 2)
    );
    fetch_ok(&store, 1, &[2, 3, 1]); // all evicted or old: 2, 3 miss; 1 hit
    let s = store.stats();
    assert_eq!((s.resident_hits, s.misses, s.evictions), (7, 8, 4));
}

#[test]
fn counts_match_the_simulator_for_every_online_policy() {
    let x = Experts::new(true);
    let mut requests = Vec::new();
    let mut seed = 12345u64;
    for t in 0..60usize {
        let layer = 1 + (t % 3) as u32;
        let mut batch: Vec<u32> = Vec::new();
        while batch.len() < 3 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let e = ((seed >> 33) % 7) as u32;
            if !batch.contains(&e) {
                batch.push(e);
            }
        }
        requests.extend(batch.iter().map(|&e| ExpertKey::new(layer, e)));
    }
    let trace = Trace::from_requests(SPACE, 3, requests.clone());
    for policy in [
        PolicyKind::Lru,
        PolicyKind::Arc,
        PolicyKind::LayerLru,
        PolicyKind::Lfu { half_life: 8 },
    ] {
        for cap in [4, 6, 9] {
            let store = x.store(cap, policy, 3);
            for b in requests.chunks(3) {
                let ids: Vec<u32> = b.iter().map(|k| k.expert).collect();
                fetch_ok(&store, b[0].layer as usize, &ids);
            }
            let sim = simulate(&trace, cap, policy).expect("sim");
            let s = store.stats();
            assert_eq!(
                (s.requests, s.resident_hits, s.misses, s.evictions),
                (sim.requests, sim.hits, sim.misses, sim.evictions),
                "{policy} with {cap} slots"
            );
        }
    }
}

#[test]
fn batch_larger_than_the_cache_runs_in_waves() {
    let x = Experts::new(true);
    let store = x.store(4, PolicyKind::DEFAULT, 2);
    let batch: Vec<u32> = vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 0];
    fetch_ok(&store, 2, &batch);
    fetch_ok(&store, 2, &batch);
    let s = store.stats();
    assert_eq!(s.requests, 24);
    assert_eq!(s.failures, 0);
    let one_slot = x.store(1, PolicyKind::Lru, 1);
    fetch_ok(&one_slot, 3, &[5, 6, 5, 7]);
}

#[test]
fn duplicates_are_read_once_and_delivered_to_each_index() {
    let x = Experts::new(true);
    let store = x.store(5, PolicyKind::DEFAULT, 2);
    fetch_ok(&store, 1, &[5, 5, 7, 5, 7]);
    let s = store.stats();
    assert_eq!((s.requests, s.misses), (2, 2));
    assert_eq!(s.bytes_read, 2 * EXP as u64);
}

#[test]
fn failed_expert_is_named_counted_and_the_cache_stays_consistent() {
    for fault in [Fault::Eio, Fault::Short] {
        for e_bad in [4u32, 5] {
            // 4: contiguous; 5: scattered.
            let x = Experts::new(true);
            let store = x.store(5, PolicyKind::DEFAULT, 3);
            fetch_ok(&store, 1, &[0, 1]);
            x.inject(1, e_bad, fault);
            let mut got = Vec::new();
            let err = store
                .fetch(1, &[0, e_bad, 3, 1], &mut |i, b| {
                    assert!(b == expected(1, [0, e_bad, 3, 1][i]));
                    got.push(i);
                })
                .expect_err("must fail");
            assert_eq!((err.layer, err.expert), (1, e_bad));
            let msg = err.to_string();
            assert!(msg.contains(&format!("expert {e_bad} of layer 1")), "{msg}");
            assert!(!got.contains(&1), "the failed expert was delivered");
            assert_eq!(store.stats().failures, 1);
            fetch_ok(&store, 1, &[0, 3, 1, 7]);
            assert!(
                store.fetch(1, &[e_bad], &mut |_, _| {}).is_err(),
                "still faulty"
            );
            assert_eq!(store.stats().failures, 2);
            x.clear();
            let misses = store.stats().misses;
            fetch_ok(&store, 1, &[e_bad]); // re-read from disk, not a stale half-read slot
            assert_eq!(store.stats().misses, misses + 1);
            fetch_ok(&store, 1, &[e_bad, 0, 3]);
        }
    }
}

#[test]
fn locate_and_key_errors_name_the_expert() {
    let x = Experts::new(false);
    let store = x.store(4, PolicyKind::DEFAULT, 1);
    let err = store
        .fetch(0, &[EXPERTS], &mut |_, _| {})
        .expect_err("out of space");
    assert_eq!(err.expert, EXPERTS);
    let store2 = {
        let files = vec![Arc::clone(&x.faulty[0]) as Arc<dyn ReadAt>];
        let locate = Box::new(|l: usize, e: u32| -> Result<ExpertLoc, String> {
            if e == 3 {
                Err("no such tensor".into())
            } else {
                Ok(one(0, 1 << 40, 10 + l as u64))
            }
        });
        ExpertStore::new_in(SPACE, files, locate, 4, 8192, PolicyKind::Lru, 1).expect("store")
    };
    let err = store2.fetch(2, &[3], &mut |_, _| {}).expect_err("locate");
    assert!(err.to_string().contains("expert 3 of layer 2"), "{err}");
    assert!(err.to_string().contains("no such tensor"), "{err}");
    let err = store2
        .fetch(2, &[1], &mut |_, _| {})
        .expect_err("past the end");
    assert!(err.to_string().contains("expert 1 of layer 2"), "{err}");
    assert_eq!(store2.stats().failures, 2);
}

#[test]
fn zero_slots_and_opt_are_refused() {
    let x = Experts::new(false);
    let files = || vec![Arc::clone(&x.faulty[0]) as Arc<dyn ReadAt>];
    let locate = || Box::new(|_: usize, _: u32| Err::<ExpertLoc, _>("x".to_string()));
    assert!(ExpertStore::new(files(), locate(), 0, 8192, PolicyKind::Lru, 1).is_err());
    assert!(ExpertStore::new(files(), locate(), 4, 8192, PolicyKind::Opt, 1).is_err());
    assert!(ExpertStore::new(files(), locate(), 4, 8192, PolicyKind::DEFAULT, 0).is_ok());
}

#[test]
fn delays_change_arrival_order_yet_deliver_each_index_once() {
    let x = Experts::new(true);
    let store = x.store(8, PolicyKind::DEFAULT, 4);
    x.inject(1, 0, Fault::Delay(Duration::from_millis(150)));
    fetch_ok(&store, 1, &[6]); // resident before the batch
    let order = fetch_ok(&store, 1, &[0, 1, 3, 6, 4]);
    assert_eq!(order[0], 3, "the resident hit comes first: {order:?}");
    assert_eq!(
        *order.last().expect("some"),
        0,
        "the delayed expert lands last: {order:?}"
    );
}

#[test]
fn trace_records_distinct_requests_in_order() {
    let x = Experts::new(true);
    let store = x.store(4, PolicyKind::DEFAULT, 1);
    fetch_ok(&store, 1, &[9]);
    store.set_trace(true);
    fetch_ok(&store, 1, &[0, 1, 0]);
    fetch_ok(&store, 3, &[7, 2]);
    store.set_trace(false);
    fetch_ok(&store, 2, &[5]);
    assert_eq!(store.take_trace(), vec![(1, 0), (1, 1), (3, 7), (3, 2)]);
    assert!(store.take_trace().is_empty());
}

#[test]
fn concurrent_fetches_do_not_corrupt() {
    let x = Experts::new(true);
    let store = Arc::new(x.store(5, PolicyKind::DEFAULT, 2));
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut seed = t + 1;
                for _ in 0..40 {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let layer = (seed >> 60) as usize % LAYERS as usize;
                    let batch: Vec<u32> = (0..4)
                        .map(|k| ((seed >> (8 * k + 8)) % EXPERTS as u64) as u32)
                        .collect();
                    fetch_ok(&store, layer, &batch);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let s = store.stats();
    assert_eq!(s.resident_hits + s.misses, s.requests);
    assert_eq!(s.failures, 0);
}

#[test]
fn hinted_experts_become_hits_and_are_scored() {
    let x = Experts::new(true);
    let store = x.store(6, PolicyKind::DEFAULT, 2);
    store.hint(2, &[4, 5, 4]);
    let s = store.stats();
    assert_eq!(s.hint_reads, 2, "distinct, not yet cached: {s:?}");
    assert_eq!(s.requests, 0, "a hint is not a request");
    // Hinted 4 and 5; layer 2 then asks for 4, 1 and 5: two hits, one miss, recall 2/3.
    fetch_ok(&store, 2, &[4, 1, 5]);
    let s = store.stats();
    assert_eq!((s.requests, s.resident_hits, s.misses), (3, 2, 1), "{s:?}");
    assert_eq!((s.hint_requested, s.hint_correct), (3, 2), "{s:?}");
    assert_eq!((s.hint_useful_reads, s.hint_predicted), (2, 2), "{s:?}");
    assert_eq!(s.bytes_read, 3 * EXP as u64, "every expert read once");
    assert_eq!(s.hint_bytes, 2 * EXP as u64);
    // A hint for an already cached expert reads nothing; a prediction for another layer
    // is not scored against this one.
    store.hint(2, &[4]);
    store.hint(3, &[0]);
    fetch_ok(&store, 2, &[4]);
    assert_eq!(store.stats().hint_requested, 3);
}

#[test]
fn a_failed_hinted_read_is_not_an_error_and_the_fetch_reads_again() {
    let x = Experts::new(true);
    let store = x.store(6, PolicyKind::DEFAULT, 2);
    x.inject(1, 5, Fault::Eio);
    store.hint(1, &[5, 6]);
    fetch_ok(&store, 1, &[6]);
    let s = store.stats();
    // 5 is not wanted: its read failed or was cancelled before it started — never an error.
    assert_eq!(s.failures, 0, "{s:?}");
    assert_eq!(s.hint_failures + s.hint_cancelled, 1, "{s:?}");
    x.clear();
    fetch_ok(&store, 1, &[5, 6]);
    assert_eq!(store.stats().failures, 0);
}

#[test]
fn hints_never_take_slots_pinned_by_the_batch_being_delivered() {
    let x = Experts::new(true);
    // 3 slots, all pinned by the fetch while `on_ready` hints: the hint must read nothing.
    let store = x.store(3, PolicyKind::DEFAULT, 2);
    let experts = [0u32, 1, 2];
    store
        .fetch(0, &experts, &mut |i, b| {
            assert!(b == expected(0, experts[i]));
            store.hint(1, &[7, 8]);
        })
        .expect("fetch");
    assert_eq!(store.stats().hint_reads, 0);
    // With a free slot the same hint reads during the fetch and the next fetch hits it.
    let store = x.store(4, PolicyKind::DEFAULT, 2);
    store
        .fetch(0, &experts, &mut |_, _| store.hint(1, &[7]))
        .expect("fetch");
    fetch_ok(&store, 1, &[7]);
    let s = store.stats();
    assert_eq!((s.hint_reads, s.resident_hits), (1, 1), "{s:?}");
}

#[test]
fn stale_hinted_reads_still_queued_are_cancelled_by_the_next_fetch() {
    let x = Experts::new(true);
    // One I/O thread, busy on expert 7 (delayed) while 9 and 8 wait in the queue (jobs run
    // in file/offset order: 7 and 9 live in file 0, 8 in file 1).
    let store = x.store(8, PolicyKind::DEFAULT, 1);
    x.inject(1, 7, Fault::Delay(Duration::from_millis(300)));
    store.hint(1, &[7, 8, 9]);
    fetch_ok(&store, 1, &[7]);
    let s = store.stats();
    assert_eq!((s.hint_reads, s.hint_cancelled), (3, 2), "{s:?}");
    assert_eq!((s.resident_hits, s.misses), (1, 0), "{s:?}");
    assert_eq!(s.bytes_read, EXP as u64, "only the wanted expert was read");
    // The cancelled experts are not cached: asking for them reads them now.
    x.clear();
    fetch_ok(&store, 1, &[8, 9]);
    assert_eq!(store.stats().misses, 2);
}

/// A draft model's lookups: only resident experts are delivered (with their exact bytes),
/// nothing is read, and the replacement policy does not see them.
#[test]
fn fetch_cached_delivers_only_resident_experts_and_reads_nothing() {
    let ex = Experts::new(false);
    let store = ex.store(4, PolicyKind::Lru, 2);
    let mut got = Vec::new();
    let served = store.fetch_cached(1, &[0, 1, 2], &mut |i, _| got.push(i));
    assert_eq!(
        (served, got.len()),
        (vec![false; 3], 0),
        "a cold cache has nothing"
    );
    assert_eq!(store.stats().bytes_read, 0);
    fetch_ok(&store, 1, &[0, 1, 2, 3]);
    let read = store.stats().bytes_read;
    let mut got = Vec::new();
    let served = store.fetch_cached(1, &[3, 5, 0, 3], &mut |i, b| {
        assert_eq!(b, expected(1, [3, 5, 0, 3][i]));
        got.push(i);
    });
    assert_eq!(served, vec![true, false, true, true]);
    assert_eq!(
        got,
        vec![0, 2, 3],
        "duplicates are delivered for each index"
    );
    let s = store.stats();
    assert_eq!((s.bytes_read, s.draft_requests, s.draft_hits), (read, 7, 3));
    // Recency untouched: LRU still evicts expert 0 (the least recently FETCHED), although
    // the draft asked for it last.
    fetch_ok(&store, 1, &[4]);
    let served = store.fetch_cached(1, &[0, 1, 2, 3, 4], &mut |_, _| {});
    assert_eq!(served, vec![false, true, true, true, true]);
}
