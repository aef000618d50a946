//! The trunk store: exact bytes for every pin/ring mix over cyclic passes, no read-ahead with
//! one slot, read-ahead with two or more, failures confined to their layer.

mod common;

use common::{bytes, FaultyFiles, TempFile};
use k3_store::{Fault, FaultyReader, ReadAt, RunLoc, StoreError, TrunkStore};
use std::sync::Arc;
use std::time::Duration;

/// Layer sizes (deliberately unaligned) and the gap before each run.
const SIZES: [usize; 7] = [20_000, 9_000, 13_333, 4096, 17_001, 1, 9_999];
const GAPS: [usize; 7] = [0, 123, 4096, 77, 5000, 3, 4095];

/// Two files holding the layers (even layers in file 0, odd in file 1), with the readers
/// wrapped in fault injectors.
struct Trunk {
    _tmp: Vec<TempFile>,
    runs: Vec<RunLoc>,
    faulty: Vec<Arc<FaultyReader>>,
}

impl Trunk {
    fn new(direct: bool) -> Trunk {
        let mut data = [Vec::new(), Vec::new()];
        let mut runs = Vec::new();
        for (l, (&size, &gap)) in SIZES.iter().zip(&GAPS).enumerate() {
            let d = &mut data[l % 2];
            d.extend(std::iter::repeat_n(0xEE, gap));
            runs.push(RunLoc {
                file: l % 2,
                offset: d.len() as u64,
                len: size as u64,
            });
            d.extend(bytes(l as u64, 0, size));
        }
        data[1].extend([1, 2, 3]);
        let files = FaultyFiles::new("trunk", &data, direct);
        Trunk {
            _tmp: files.tmp,
            runs,
            faulty: files.readers,
        }
    }

    fn files(&self) -> Vec<Arc<dyn ReadAt>> {
        self.faulty
            .iter()
            .map(|f| Arc::clone(f) as Arc<dyn ReadAt>)
            .collect()
    }

    fn store(&self, pinned: &[bool], ring: usize) -> TrunkStore {
        TrunkStore::new(self.files(), self.runs.clone(), pinned, ring).expect("store")
    }

    fn reads(&self) -> u64 {
        self.faulty.iter().map(|f| f.reads()).sum()
    }

    fn inject(&self, l: usize, fault: Fault) {
        let r = self.runs[l];
        self.faulty[r.file].inject(r.offset..r.offset + r.len, fault);
    }

    fn clear(&self) {
        self.faulty.iter().for_each(|f| f.clear());
    }
}

/// The bytes of layer `l`.
fn layer_bytes(l: usize) -> Vec<u8> {
    bytes(l as u64, 0, SIZES[l])
}

fn check_layer(store: &TrunkStore, runs: &[RunLoc], l: usize) {
    let g = store.layer(l).expect("layer");
    assert_eq!(g.len(), SIZES[l]);
    assert_eq!(g.as_ptr() as usize % 4096, (runs[l].offset % 4096) as usize);
    assert!(*g == layer_bytes(l)[..], "layer {l} bytes differ");
}

fn passes(t: &Trunk, pinned: &[bool], ring: usize) -> TrunkStore {
    let store = t.store(pinned, ring);
    for _ in 0..3 {
        for l in 0..SIZES.len() {
            check_layer(&store, &t.runs, l);
        }
    }
    let s = store.stats();
    let npin = pinned.iter().filter(|&&p| p).count();
    assert_eq!(s.binds, 3 * SIZES.len() as u64);
    assert_eq!(s.pinned_hits, 3 * npin as u64);
    assert_eq!(s.pinned_layers, npin);
    store
}

const N: usize = SIZES.len();
const ALL: [bool; N] = [true; N];
const NONE: [bool; N] = [false; N];
const MIXED: [bool; N] = [true, false, false, true, false, true, false];

#[test]
fn all_pinned() {
    let t = Trunk::new(true);
    let reads0 = t.reads();
    let store = passes(&t, &ALL, 2);
    assert_eq!(store.stats().ring_slots, 0);
    assert_eq!(store.stats().reads, N as u64);
    assert_eq!(t.reads() - reads0, N as u64, "pinned layers are read once");
}

#[test]
fn ring_sizes_and_pin_mixes_give_exact_bytes() {
    for direct in [true, false] {
        let t = Trunk::new(direct);
        for ring in 1..=3 {
            for mask in [&NONE, &MIXED] {
                let s = passes(&t, mask, ring).stats();
                assert_eq!(s.ring_slots, ring);
                let streamed = mask.iter().filter(|p| !**p).count() as u64;
                // Every streamed layer is read once per pass (ring < streamed layers here),
                // plus at most ring − 1 read-aheads into the next (unplayed) pass.
                let ring_reads = s.reads - s.pinned_layers as u64;
                let extra = ring as u64 - 1;
                assert!(ring_reads >= 3 * streamed, "ring {ring}: {s:?}");
                assert!(ring_reads <= 3 * streamed + extra, "ring {ring}: {s:?}");
            }
        }
    }
}

#[test]
fn one_slot_ring_never_reads_ahead() {
    let t = Trunk::new(true);
    for mask in [&NONE, &MIXED] {
        let store = t.store(mask, 1);
        for _ in 0..3 {
            for l in 0..N {
                let g = store.layer(l).expect("layer");
                let before = t.reads();
                std::thread::sleep(Duration::from_millis(3));
                assert_eq!(
                    t.reads(),
                    before,
                    "a read was issued while layer {l} is live"
                );
                assert!(*g == layer_bytes(l)[..]);
            }
        }
        assert_eq!(store.stats().read_aheads, 0);
    }
}

#[test]
fn ring_of_two_reads_ahead_in_cyclic_order() {
    let t = Trunk::new(true);
    let store = t.store(&MIXED, 2);
    let unpinned: Vec<usize> = (0..N).filter(|&l| !MIXED[l]).collect();
    for _ in 0..2 {
        for l in 0..N {
            let g = store.layer(l).expect("layer");
            let next = (1..=N)
                .map(|d| (l + d) % N)
                .find(|k| !MIXED[*k])
                .expect("some");
            assert!(
                store.is_ready_or_loading(next),
                "layer {next} not read ahead after {l}"
            );
            assert!(*g == layer_bytes(l)[..]);
        }
    }
    let s = store.stats();
    assert!(s.read_aheads >= 2 * unpinned.len() as u64 - 1, "{s:?}");
}

#[test]
fn slow_reads_give_the_same_bytes() {
    let t = Trunk::new(true);
    for l in 0..N {
        t.inject(l, Fault::Delay(Duration::from_millis(2)));
    }
    for ring in 1..=3 {
        passes(&t, &MIXED, ring);
        passes(&t, &NONE, ring);
    }
}

#[test]
fn failed_layer_is_named_and_others_unaffected() {
    for fault in [Fault::Eio, Fault::Short] {
        for ring in 1..=3 {
            let t = Trunk::new(true);
            let store = t.store(&MIXED, ring);
            t.inject(4, fault);
            for l in 0..N {
                if l == 4 {
                    let err = store.layer(4).err().expect("layer 4 must fail");
                    assert!(matches!(err, StoreError::Read { .. }), "{err}");
                    assert!(err.to_string().contains("trunk layer 4"), "{err}");
                } else {
                    check_layer(&store, &t.runs, l);
                }
            }
            t.clear();
            for _ in 0..2 {
                for l in 0..N {
                    check_layer(&store, &t.runs, l);
                }
            }
            assert!(store.stats().failures >= 1);
        }
    }
}

#[test]
fn failed_pinned_layer_fails_construction() {
    let t = Trunk::new(true);
    t.inject(3, Fault::Eio);
    let err = TrunkStore::new(t.files(), t.runs.clone(), &MIXED, 2)
        .err()
        .expect("fails");
    assert!(err.to_string().contains("trunk layer 3"), "{err}");
}

#[test]
fn second_guard_with_one_slot_is_refused_not_overwritten() {
    let t = Trunk::new(true);
    let store = t.store(&NONE, 1);
    let g = store.layer(1).expect("layer 1");
    let err = store.layer(2).err().expect("busy");
    assert!(
        matches!(&err, StoreError::RingBusy { what, slots: 1 } if what == "trunk layer 2"),
        "{err}"
    );
    assert!(*g == bytes(1, 0, SIZES[1])[..]);
    drop(g);
    check_layer(&store, &t.runs, 2);
    // Two slots: two live guards are fine.
    let store = t.store(&NONE, 2);
    let a = store.layer(0).expect("0");
    let b = store.layer(5).expect("5");
    assert!(*a == bytes(0, 0, SIZES[0])[..] && *b == bytes(5, 0, SIZES[5])[..]);
}

#[test]
fn bad_arguments_are_refused() {
    let t = Trunk::new(false);
    assert!(TrunkStore::new(t.files(), t.runs.clone(), &NONE, 0).is_err());
    assert!(TrunkStore::new(t.files(), t.runs.clone(), &NONE[..3], 1).is_err());
    let mut runs = t.runs.clone();
    runs[2].len = 1 << 30;
    let err = TrunkStore::new(t.files(), runs, &NONE, 1)
        .err()
        .expect("out of file");
    assert!(err.to_string().contains("trunk layer 2"), "{err}");
    let store = t.store(&NONE, 1);
    assert!(matches!(
        store.layer(N),
        Err(StoreError::LayerOutOfRange { .. })
    ));
}

#[test]
fn from_plan_uses_the_plans_pins_and_ring() {
    let t = Trunk::new(true);
    let plan = k3_plan::TrunkPlan {
        pinned: vec![0, 3, 5],
        ring_slots: 2,
        ring_slot_bytes: 0,
        pinned_bytes: 0,
        streamed_per_token: 0,
        single_slot_forced: false,
        piece_slot_bytes: Vec::new(),
    };
    let store = TrunkStore::from_plan(t.files(), t.runs.clone(), &plan).expect("store");
    let s = store.stats();
    assert_eq!((s.pinned_layers, s.ring_slots), (3, 2));
    for l in 0..N {
        check_layer(&store, &t.runs, l);
    }
}
