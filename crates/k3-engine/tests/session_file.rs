//! Sessions on disk: a saved and reloaded session continues with bit-identical logits on both
//! tiny models, and every damaged or mismatched file is refused with exit code 2.

use k3_engine::{DecodeMode, Engine, EngineError, EngineOptions, Session};
use std::path::PathBuf;

fn open(name: &str) -> Engine {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name);
    Engine::open(
        &dir,
        EngineOptions {
            threads: Some(2),
            ..EngineOptions::default()
        },
    )
    .expect("tiny model opens")
}

fn tmp(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("k3-session-{}-{tag}.k3ss", std::process::id()))
}

const A: [u32; 7] = [637, 229, 263, 638, 730, 42, 197];
const B: [u32; 5] = [11, 300, 5, 91, 402];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Feeds B, generates 8, steps once more: the ids and every logit bit seen on the way.
fn continue_run(s: &mut Session<'_>) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    s.feed(&B).unwrap();
    let after_b = bits(s.logits());
    let ids = s.generate(8, DecodeMode::Incremental, |_| true).unwrap();
    s.step(*ids.last().unwrap(), DecodeMode::Incremental)
        .unwrap();
    (ids, after_b, bits(s.logits()))
}

fn round_trip(name: &str) {
    let engine = open(name);
    let mut s = engine.new_session(64).unwrap();
    s.feed(&A).unwrap();
    let first = s.generate(4, DecodeMode::Incremental, |_| true).unwrap();
    let path = tmp(&format!("{name}-rt"));
    let info = s.save(&path).unwrap();
    assert_eq!(info.tokens, A.len() + 4);
    assert_eq!(
        info.prefill_tokens_saved,
        A.len() + 3,
        "the last generated token is pending"
    );
    assert_eq!(info.fingerprint, engine.fingerprint());
    let uninterrupted = continue_run(&mut s);

    let (mut loaded, linfo) = engine.load_session_with_info(&path, 64).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(linfo, info);
    let mut want_tokens = A.to_vec();
    want_tokens.extend(&first);
    assert_eq!(loaded.tokens(), want_tokens);
    assert_eq!(loaded.state().pos(), A.len() + 3);
    let resumed = continue_run(&mut loaded);
    assert_eq!(
        resumed.0, uninterrupted.0,
        "{name}: generated ids after reload"
    );
    assert_eq!(resumed.1, uninterrupted.1, "{name}: logits after feeding B");
    assert_eq!(
        resumed.2, uninterrupted.2,
        "{name}: logits after the last step"
    );
    eprintln!(
        "{name}: {} bytes, prefill_tokens_saved = {}",
        info.bytes, info.prefill_tokens_saved
    );
}

#[test]
fn round_trip_tiny_k3() {
    round_trip("tiny-k3");
}

#[test]
fn round_trip_tiny_k3_wide() {
    round_trip("tiny-k3-wide");
}

#[test]
fn saved_after_feed_keeps_logits_and_bytes_round_trip() {
    let engine = open("tiny-k3");
    let mut s = engine.new_session(32).unwrap();
    s.feed(&A).unwrap();
    let bytes = s.to_bytes().unwrap();
    let mut r = engine.session_from_bytes(&bytes, 32).unwrap();
    assert_eq!(bits(r.logits()), bits(s.logits()));
    let want = s.generate(6, DecodeMode::Incremental, |_| true).unwrap();
    assert_eq!(
        r.generate(6, DecodeMode::Incremental, |_| true).unwrap(),
        want
    );
    // A fresh session round-trips too.
    let empty = engine.new_session(8).unwrap().to_bytes().unwrap();
    let e = engine.session_from_bytes(&empty, 8).unwrap();
    assert!(e.tokens().is_empty() && e.state().pos() == 0);
}

fn refused(r: Result<Session<'_>, EngineError>, needle: &str) {
    match r {
        Ok(_) => panic!("expected a refusal mentioning `{needle}`"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(needle), "`{msg}` should mention `{needle}`");
            assert_eq!(e.exit_code(), 2, "{msg}");
        }
    }
}

#[test]
fn every_refusal() {
    let engine = open("tiny-k3");
    let mut s = engine.new_session(32).unwrap();
    s.feed(&A).unwrap();
    s.generate(2, DecodeMode::Incremental, |_| true).unwrap();
    let good = s.to_bytes().unwrap();
    assert!(engine.session_from_bytes(&good, 32).is_ok());

    let mut magic = good.clone();
    magic[0] = b'X';
    refused(
        engine.session_from_bytes(&magic, 32),
        "not a k3 session file",
    );

    let mut version = good.clone();
    version[4] = 9;
    refused(engine.session_from_bytes(&version, 32), "format version 9");

    for cut in [good.len() - 1, good.len() / 2, 30, 10, 3, 0] {
        refused(engine.session_from_bytes(&good[..cut], 32), "truncated");
    }
    let mut longer = good.clone();
    longer.push(0);
    refused(engine.session_from_bytes(&longer, 32), "damaged");

    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    refused(engine.session_from_bytes(&flipped, 32), "bad checksum");

    // tokens: 7 fed + 1 fed + 1 pending = 9; position 8
    refused(engine.session_from_bytes(&good, 8), "raise --ctx");
    assert!(engine.session_from_bytes(&good, 9).is_ok());

    let wide = open("tiny-k3-wide");
    assert_ne!(wide.fingerprint(), engine.fingerprint());
    refused(wide.session_from_bytes(&good, 32), "another model");

    // From a file: the error names it; a missing file is an I/O error.
    let path = tmp("refuse");
    std::fs::write(&path, &flipped).unwrap();
    refused(engine.load_session(&path, 32), &path.display().to_string());
    let _ = std::fs::remove_file(&path);
    assert!(matches!(
        engine.load_session(&path, 32),
        Err(EngineError::Io { .. })
    ));
}

/// The numeric mode is in the fingerprint (docs/NUMERICS.md#numeric-mode-fast): contract v2
/// adds nothing, so files saved before numeric modes existed still load; each AMX mode has
/// its own, and a file saved under another mode is refused. (The test never switches the
/// process's mode: the other tests here run beside it.)
#[test]
fn numeric_mode_is_in_the_fingerprint() {
    use k3_kernels::fast::{numerics, Numerics};
    let engine = open("tiny-k3");
    // the v2 fingerprints from before numeric modes (quoted in docs/RELIABILITY.md)
    assert_eq!(engine.fingerprint_in(Numerics::V2), 0xebedd8de25d3b4dd);
    assert_eq!(
        open("tiny-k3-wide").fingerprint_in(Numerics::V2),
        0xd7c1ad2193e18081
    );
    assert_eq!(engine.fingerprint(), engine.fingerprint_in(numerics()));
    let modes = [
        Numerics::V2,
        Numerics::FAST,
        Numerics::Amx { pieces: 2 },
        Numerics::Amx { pieces: 1 },
    ];
    let fps = modes.map(|m| engine.fingerprint_in(m));
    for i in 0..fps.len() {
        for j in 0..i {
            assert_ne!(fps[i], fps[j], "{:?} vs {:?}", modes[i], modes[j]);
        }
    }

    let mut s = engine.new_session(32).unwrap();
    s.feed(&A).unwrap();
    let mut other = s.to_bytes().unwrap();
    let mode = if numerics() == Numerics::V2 {
        Numerics::FAST
    } else {
        Numerics::V2
    };
    other[8..16].copy_from_slice(&engine.fingerprint_in(mode).to_le_bytes());
    let end = other.len() - 8;
    let sum = xxhash_rust::xxh3::xxh3_64(&other[..end]);
    other[end..].copy_from_slice(&sum.to_le_bytes());
    refused(
        engine.session_from_bytes(&other, 32),
        "saved by another model or numeric mode",
    );
}

#[test]
fn save_is_atomic_and_overwrites() {
    let engine = open("tiny-k3");
    let mut s = engine.new_session(32).unwrap();
    s.feed(&A[..3]).unwrap();
    let path = tmp("atomic");
    s.save(&path).unwrap();
    s.feed(&A[3..]).unwrap();
    let info = s.save(&path).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), info.bytes);
    let dir = path.parent().unwrap();
    let stem = path.file_name().unwrap().to_string_lossy().into_owned();
    let leftovers = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{stem}.tmp"))
        })
        .count();
    assert_eq!(leftovers, 0);
    assert_eq!(engine.load_session(&path, 32).unwrap().tokens(), A.to_vec());
    let _ = std::fs::remove_file(&path);
}
