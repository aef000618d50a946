//! A compressed trunk's two staging buffers (docs/STREAMING.md#overlapped-decode): the next
//! unit's stored run is read while the current one decodes, the bytes stay exact in every
//! binding order, and a read that fails is reported naming its unit.

mod common;

use common::{bytes, TempFile};
use k3_store::{ReadAt, RunDecoder, RunLoc, ShardFile, StoreError, TrunkStore};
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Unit sizes (2 pieces per layer, 4 layers).
const SIZES: [usize; 8] = [9_000, 20_000, 4_096, 13_333, 7_777, 30_000, 12_000, 5_000];
const PIECES: usize = 2;
const XOR: u8 = 0x5A;

/// Time spans of reads (by file offset) and decodes (by unit), from one clock.
#[derive(Default)]
struct Timeline {
    reads: Mutex<Vec<(u64, Instant, Instant)>>,
    decodes: Mutex<Vec<(usize, Instant, Instant)>>,
}

/// A slow reader that logs each read's span, failing at `fail_at` when set.
struct SlowReader {
    inner: ShardFile,
    log: Arc<Timeline>,
    fail_at: Option<u64>,
}

impl ReadAt for SlowReader {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn read_into_aligned(&self, dst: &mut [u8], offset: u64, len: usize) -> io::Result<()> {
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(15));
        if self.fail_at == Some(offset) {
            return Err(io::Error::other("injected read failure"));
        }
        let r = self.inner.read_into_aligned(dst, offset, len);
        self.log
            .reads
            .lock()
            .unwrap()
            .push((offset, t, Instant::now()));
        r
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn path(&self) -> &Path {
        self.inner.path()
    }
}

/// Stored = decoded XOR 0x5A, slowly, logging each decode's span.
struct SlowXor {
    lens: Vec<u64>,
    log: Arc<Timeline>,
}

impl RunDecoder for SlowXor {
    fn decoded_len(&self, u: usize) -> u64 {
        self.lens[u]
    }
    fn decode(&self, u: usize, stored: &[u8], out: &mut [u8]) -> Result<(), String> {
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(25));
        out.iter_mut().zip(stored).for_each(|(o, s)| *o = s ^ XOR);
        self.log
            .decodes
            .lock()
            .unwrap()
            .push((u, t, Instant::now()));
        Ok(())
    }
}

fn unit_bytes(u: usize) -> Vec<u8> {
    bytes(u as u64, 11, SIZES[u])
}

struct Setup {
    _tmp: TempFile,
    runs: Vec<RunLoc>,
    log: Arc<Timeline>,
    store: TrunkStore,
}

/// A store of pieces over one file (gaps between units), nothing pinned but `pinned`.
fn setup(pinned: &[bool], fail_unit: Option<usize>) -> Setup {
    let mut data = Vec::new();
    let mut runs = Vec::new();
    for (u, &n) in SIZES.iter().enumerate() {
        data.extend(std::iter::repeat_n(0xEE, 500 + 333 * u));
        runs.push(RunLoc {
            file: 0,
            offset: data.len() as u64,
            len: n as u64,
        });
        data.extend(unit_bytes(u).iter().map(|b| b ^ XOR));
    }
    let tmp = TempFile::new("staging", &data);
    let log = Arc::new(Timeline::default());
    let file = Arc::new(SlowReader {
        inner: ShardFile::open(tmp.path(), true).expect("open"),
        log: Arc::clone(&log),
        fail_at: fail_unit.map(|u| runs[u].offset),
    });
    let decoder = Arc::new(SlowXor {
        lens: runs.iter().map(|r| r.len).collect(),
        log: Arc::clone(&log),
    });
    let store = TrunkStore::new_pieces(
        vec![file as Arc<dyn ReadAt>],
        runs.clone(),
        PIECES,
        pinned,
        Some(decoder),
        &mut |_, _| {},
    )
    .expect("store");
    Setup {
        _tmp: tmp,
        runs,
        log,
        store,
    }
}

#[test]
fn the_next_run_is_read_while_the_current_one_decodes() {
    let s = setup(&[false; 4], None);
    let staging = s.store.stats().staging_bytes;
    assert!(
        (2 * 30_000..=2 * 9 * 4096).contains(&staging),
        "two buffers of the largest stored span: {staging}"
    );
    for _ in 0..3 {
        for l in 0..4 {
            for p in 0..PIECES {
                let g = s.store.piece(l, p).expect("piece");
                assert!(*g == unit_bytes(l * PIECES + p)[..], "layer {l} piece {p}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    // Each decode of unit u against the read of unit u + 1: they overlap in time.
    let reads = s.log.reads.lock().unwrap().clone();
    let decodes = s.log.decodes.lock().unwrap().clone();
    let mut overlapped = 0;
    for &(u, d0, d1) in &decodes {
        let next = s.runs[(u + 1) % s.runs.len()].offset;
        let meets = |&&(off, r0, r1): &&(u64, Instant, Instant)| off == next && r0 < d1 && d0 < r1;
        overlapped += usize::from(reads.iter().any(|r| meets(&r)));
    }
    assert!(
        overlapped * 2 >= decodes.len(),
        "{overlapped} of {} decodes overlapped the next read",
        decodes.len()
    );
    assert!(s.store.stats().decode_seconds > 0.0);
}

#[test]
fn any_binding_order_gives_exact_bytes() {
    let s = setup(&[false, true, false, false], None);
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for _ in 0..40 {
        let (l, p) = (next(4), next(PIECES));
        let g = s.store.piece(l, p).expect("piece");
        assert!(*g == unit_bytes(l * PIECES + p)[..], "layer {l} piece {p}");
    }
}

#[test]
fn a_failed_read_names_its_unit() {
    let s = setup(&[false; 4], Some(5));
    let mut failed = None;
    'pass: for l in 0..4 {
        for p in 0..PIECES {
            match s.store.piece(l, p) {
                Ok(g) => assert!(*g == unit_bytes(l * PIECES + p)[..]),
                Err(e) => {
                    failed = Some(e);
                    break 'pass;
                }
            }
        }
    }
    match failed {
        Some(StoreError::Read { what, .. }) => assert_eq!(what, "trunk layer 2 piece 1"),
        other => panic!("expected a read error on layer 2 piece 1, got {other:?}"),
    }
}
