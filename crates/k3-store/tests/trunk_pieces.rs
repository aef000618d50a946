//! The trunk store over pieces smaller than a layer: exact bytes for every pin mix over cyclic
//! passes, read-ahead of the next piece into the other class's slot, and — checked on every
//! read and every decode — no byte of a slot is ever written while a guard on it lives.

mod common;

use common::{bytes, TempFile};
use k3_store::{LayerBytes, ReadAt, RunDecoder, RunLoc, ShardFile, StoreError, TrunkStore};
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Layer sizes and where each splits: piece 0 (bound first, as the token mixer's tensors are)
/// is the run's TAIL `[cut, len)`, piece 1 its head `[0, cut)` — the order of the
/// checkpoint's names, where `block_sparse_moe`/`mlp` sort before `self_attn`.
const SIZES: [usize; 5] = [30_000, 9_000, 13_333, 8192, 17_001];
const CUTS: [usize; 5] = [20_000, 4_500, 1, 4096, 9_000];
const LAYERS: usize = SIZES.len();

/// Memory ranges of the live guards, and writes seen landing in one of them.
#[derive(Default)]
struct Watch {
    live: Mutex<Vec<Range<usize>>>,
    overwrites: AtomicU64,
    writes: AtomicU64,
    /// Units are decoded (they start at offset 0 of their buffer).
    decoded: bool,
}

impl Watch {
    /// Counts a write into `dst`, and an overwrite if it meets a live guard's bytes.
    fn write(&self, dst: &[u8]) {
        let r = dst.as_ptr() as usize..dst.as_ptr() as usize + dst.len();
        let live = self.live.lock().unwrap();
        if live.iter().any(|g| g.start < r.end && r.start < g.end) {
            self.overwrites.fetch_add(1, Ordering::SeqCst);
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
    }

    fn range(g: &LayerBytes<'_>) -> Range<usize> {
        g.as_ptr() as usize..g.as_ptr() as usize + g.len()
    }

    /// Binds piece `p` of layer `l`, checks its bytes and registers it as live.
    fn bind<'s>(
        &self,
        store: &'s TrunkStore,
        runs: &[RunLoc],
        l: usize,
        p: usize,
    ) -> LayerBytes<'s> {
        let g = store.piece(l, p).expect("piece");
        self.live.lock().unwrap().push(Self::range(&g));
        assert!(
            *g == piece_bytes(l, p)[..],
            "layer {l} piece {p} bytes differ"
        );
        let skew = if self.decoded {
            0
        } else {
            runs[l * 2 + p].offset % 4096
        };
        assert_eq!(g.as_ptr() as usize % 4096, skew as usize);
        g
    }

    /// Checks the guard's bytes are still intact, unregisters it, then drops it.
    fn release(&self, g: LayerBytes<'_>, l: usize, p: usize) {
        assert!(
            *g == piece_bytes(l, p)[..],
            "layer {l} piece {p} changed while bound"
        );
        let r = Self::range(&g);
        self.live.lock().unwrap().retain(|x| *x != r);
        drop(g);
    }
}

/// A reader that reports every destination buffer to the watch, slowly (so reads overlap
/// binds).
struct WatchedReader {
    inner: ShardFile,
    watch: Arc<Watch>,
    delay: Duration,
}

impl ReadAt for WatchedReader {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.watch.write(buf);
        std::thread::sleep(self.delay);
        self.inner.read_exact_at(buf, offset)
    }
    fn read_into_aligned(&self, dst: &mut [u8], offset: u64, len: usize) -> io::Result<()> {
        self.watch.write(dst);
        std::thread::sleep(self.delay);
        self.inner.read_into_aligned(dst, offset, len)
    }
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn path(&self) -> &Path {
        self.inner.path()
    }
}

/// Stored = decoded XOR 0x5A; also reports every decode destination to the watch.
struct XorDecoder {
    lens: Vec<u64>,
    watch: Arc<Watch>,
}

impl RunDecoder for XorDecoder {
    fn decoded_len(&self, u: usize) -> u64 {
        self.lens[u]
    }
    fn decode(&self, _u: usize, stored: &[u8], out: &mut [u8]) -> Result<(), String> {
        self.watch.write(out);
        out.iter_mut().zip(stored).for_each(|(o, s)| *o = s ^ 0x5A);
        Ok(())
    }
}

fn layer_bytes(l: usize) -> Vec<u8> {
    bytes(l as u64, 7, SIZES[l])
}

fn piece_range(l: usize, p: usize) -> Range<usize> {
    match p {
        0 => CUTS[l]..SIZES[l],
        _ => 0..CUTS[l],
    }
}

fn piece_bytes(l: usize, p: usize) -> Vec<u8> {
    layer_bytes(l)[piece_range(l, p)].to_vec()
}

struct Pieces {
    _tmp: TempFile,
    runs: Vec<RunLoc>,
    file: Arc<dyn ReadAt>,
    watch: Arc<Watch>,
}

/// One file of layers (gaps between them), `xor` applied to every stored byte.
fn pieces(xor: u8) -> Pieces {
    let mut data = Vec::new();
    let mut runs = Vec::new();
    for l in 0..LAYERS {
        data.extend(std::iter::repeat_n(0xEE, 1000 + 777 * l));
        let start = data.len() as u64;
        data.extend(layer_bytes(l).iter().map(|b| b ^ xor));
        for p in 0..2 {
            let r = piece_range(l, p);
            runs.push(RunLoc {
                file: 0,
                offset: start + r.start as u64,
                len: r.len() as u64,
            });
        }
    }
    let tmp = TempFile::new("pieces", &data);
    let watch = Arc::new(Watch {
        decoded: xor != 0,
        ..Watch::default()
    });
    let file = Arc::new(WatchedReader {
        inner: ShardFile::open(tmp.path(), true).expect("open"),
        watch: Arc::clone(&watch),
        delay: Duration::from_millis(2),
    });
    Pieces {
        _tmp: tmp,
        runs,
        file,
        watch,
    }
}

/// Three passes binding each layer as the model does: piece 0, release, piece 1, release.
fn model_passes(t: &Pieces, store: &TrunkStore) {
    for _ in 0..3 {
        for l in 0..LAYERS {
            let g = t.watch.bind(store, &t.runs, l, 0);
            std::thread::sleep(Duration::from_millis(3));
            t.watch.release(g, l, 0);
            let g = t.watch.bind(store, &t.runs, l, 1);
            std::thread::sleep(Duration::from_millis(3));
            t.watch.release(g, l, 1);
        }
    }
}

const MIXED: [bool; LAYERS] = [false, true, false, false, true];

#[test]
fn pieces_give_exact_bytes_and_read_ahead_into_the_other_slot() {
    for mask in [[false; LAYERS], MIXED] {
        let t = pieces(0);
        let store = TrunkStore::new_pieces(
            vec![t.file.clone()],
            t.runs.clone(),
            2,
            &mask,
            None,
            &mut |_, _| {},
        )
        .expect("store");
        let s = store.stats();
        assert_eq!((s.ring_slots, s.pieces), (2, 2), "one slot per piece class");
        let biggest = |p: usize| {
            (0..LAYERS)
                .filter(|&l| !mask[l])
                .map(|l| piece_range(l, p).len())
                .max()
                .unwrap()
        };
        assert!(
            s.ring_bytes <= (biggest(0) + biggest(1)) as u64 + 4 * 4096,
            "{s:?}"
        );
        model_passes(&t, &store);
        let s = store.stats();
        assert_eq!(s.binds, 3 * LAYERS as u64, "a layer counts once");
        let streamed = mask.iter().filter(|p| !**p).count() as u64;
        assert!(s.read_aheads >= 3 * 2 * streamed - 2, "{s:?}");
        assert_eq!(t.watch.overwrites.load(Ordering::SeqCst), 0);
    }
}

#[test]
fn the_next_piece_is_read_while_the_current_one_is_bound() {
    let t = pieces(0);
    let store = TrunkStore::new_pieces(
        vec![t.file.clone()],
        t.runs.clone(),
        2,
        &[false; LAYERS],
        None,
        &mut |_, _| {},
    )
    .expect("store");
    for l in 0..LAYERS {
        let g = t.watch.bind(&store, &t.runs, l, 0);
        assert!(
            store.piece_ready_or_loading(l, 1),
            "piece 1 of layer {l} not read ahead"
        );
        t.watch.release(g, l, 0);
        let g = t.watch.bind(&store, &t.runs, l, 1);
        let next = (l + 1) % LAYERS;
        assert!(
            store.piece_ready_or_loading(next, 0),
            "layer {next} not read ahead"
        );
        t.watch.release(g, l, 1);
    }
    assert_eq!(t.watch.overwrites.load(Ordering::SeqCst), 0);
}

/// Any binding order, with up to one guard per class alive: bytes exact, every write (read
/// or decode) lands outside every live guard, and a third guard is refused, never served by
/// overwriting.
#[test]
fn no_slot_is_written_while_bound_in_any_order() {
    for xor in [0u8, 0x5A] {
        let t = pieces(xor);
        let decoder = (xor != 0).then(|| {
            let lens = t.runs.iter().map(|r| r.len).collect();
            Arc::new(XorDecoder {
                lens,
                watch: Arc::clone(&t.watch),
            }) as Arc<dyn RunDecoder>
        });
        let store = TrunkStore::new_pieces(
            vec![t.file.clone()],
            t.runs.clone(),
            2,
            &[false; LAYERS],
            decoder,
            &mut |_, _| {},
        )
        .expect("store");
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let mut held: Vec<(LayerBytes<'_>, usize, usize)> = Vec::new();
        for _ in 0..200 {
            let (l, p) = (next(LAYERS), next(2));
            if held.iter().any(|h| h.2 == p) {
                // The class's only slot is bound: refused, and the bound bytes stay intact.
                match store.piece(l, p) {
                    Err(StoreError::RingBusy { .. }) => {}
                    Ok(g) => assert!(
                        held.iter().any(|h| h.1 == l && h.2 == p) && *g == piece_bytes(l, p)[..]
                    ),
                    Err(e) => panic!("{e}"),
                }
                let (g, hl, hp) = held.remove(next(held.len()));
                t.watch.release(g, hl, hp);
                continue;
            }
            let g = t.watch.bind(&store, &t.runs, l, p);
            held.push((g, l, p));
        }
        for (g, l, p) in held.drain(..) {
            t.watch.release(g, l, p);
        }
        assert!(t.watch.writes.load(Ordering::SeqCst) > 50);
        assert_eq!(
            t.watch.overwrites.load(Ordering::SeqCst),
            0,
            "a slot was written while bound"
        );
    }
}

#[test]
fn piece_arguments_are_checked() {
    let t = pieces(0);
    let files = || vec![t.file.clone()];
    let err = TrunkStore::new_pieces(
        files(),
        t.runs[..3].to_vec(),
        2,
        &[false; 2],
        None,
        &mut |_, _| {},
    );
    assert!(matches!(err, Err(StoreError::Config(_))));
    let store = TrunkStore::new_pieces(
        files(),
        t.runs.clone(),
        2,
        &[false; LAYERS],
        None,
        &mut |_, _| {},
    )
    .expect("store");
    assert!(matches!(
        store.piece(LAYERS, 0),
        Err(StoreError::LayerOutOfRange { .. })
    ));
    assert!(matches!(
        store.piece(0, 2),
        Err(StoreError::LayerOutOfRange { .. })
    ));
}
