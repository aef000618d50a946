//! Session files (`Engine::load_session`), at the library level: every damaged or mismatched
//! file is an error whose exit code is 2 (1 for an unreadable path) naming the file, never a
//! panic — including hostile counts behind a valid checksum.

use crate::common::*;
use k3_engine::{Engine, EngineOptions};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

fn open(dir: &Path) -> Engine {
    Engine::open(
        dir,
        EngineOptions {
            threads: Some(1),
            ..EngineOptions::default()
        },
    )
    .expect("tiny model opens")
}

/// A saved session of `engine` after feeding 7 tokens and generating 2.
fn saved(engine: &Engine, path: &Path) -> Vec<u8> {
    let mut s = engine.new_session(64).unwrap();
    s.feed(&[637, 229, 263, 638, 730, 42, 197]).unwrap();
    s.generate(2, k3_engine::DecodeMode::Incremental, |_| true)
        .unwrap();
    s.save(path).unwrap();
    std::fs::read(path).unwrap()
}

/// Overwrites the u64 at `at` and re-seals the checksum, so only the value is hostile.
fn sealed_u64(mut b: Vec<u8>, at: usize, v: u64) -> Vec<u8> {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    let end = b.len() - 8;
    let sum = xxh3_64(&b[..end]);
    b[end..].copy_from_slice(&sum.to_le_bytes());
    b
}

/// Fixes body_len and the checksum after the body was edited.
fn resealed(mut b: Vec<u8>) -> Vec<u8> {
    let body = (b.len() - 32) as u64;
    b[16..24].copy_from_slice(&body.to_le_bytes());
    let end = b.len() - 8;
    let sum = xxh3_64(&b[..end]);
    b[end..].copy_from_slice(&sum.to_le_bytes());
    b
}

/// Offset of the first KDA layer's recurrent-state length (after tokens and logits).
fn kda_len_at(b: &[u8]) -> usize {
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    let n_logits_at = 48 + 4 * u64_at(40);
    n_logits_at + 8 + 4 * u64_at(n_logits_at) + 4
}

type Damage = Box<dyn Fn(Vec<u8>) -> Vec<u8>>;

/// Regression: a sealed `pos` of 2^64-1 used to overflow the `pos + 1` token-count check
/// (a panic in debug, a wrapped slice bound in release); it is refused like any bad count.
#[test]
fn damaged_session_files_are_refused() {
    session_cases(|_| true, true);
}

fn session_cases(keep: impl Fn(&str) -> bool, catalogue: bool) {
    let dir = Scratch::empty(if catalogue { "session" } else { "session-bugs" });
    let engine = open(&tiny());
    let good = saved(&engine, &dir.path().join("good.k3ss"));
    let wide = saved(
        &open(&fixtures().join("tiny-k3-wide")),
        &dir.path().join("wide.k3ss"),
    );
    let cases: Vec<(&str, &str, Damage, usize, u8, &str)> = vec![
        (
            "wrong-model",
            "a session saved by tiny-k3-wide, loaded into tiny-k3",
            Box::new(move |_| wide.clone()),
            64,
            2,
            "saved by another model",
        ),
        (
            "truncated",
            "session file cut in half",
            Box::new(|b: Vec<u8>| b[..b.len() / 2].to_vec()),
            64,
            2,
            "truncated",
        ),
        (
            "header-only",
            "session file of 20 bytes",
            Box::new(|b: Vec<u8>| b[..20].to_vec()),
            64,
            2,
            "truncated: 20 bytes",
        ),
        (
            "empty",
            "session file of 0 bytes",
            Box::new(|_| Vec::new()),
            64,
            2,
            "truncated: 0 bytes",
        ),
        (
            "bad-checksum",
            "one body byte flipped",
            Box::new(|mut b: Vec<u8>| {
                let mid = b.len() / 2;
                b[mid] ^= 0x40;
                b
            }),
            64,
            2,
            "bad checksum",
        ),
        (
            "wrong-version",
            "version field 2",
            Box::new(|mut b: Vec<u8>| {
                b[4..8].copy_from_slice(&2u32.to_le_bytes());
                b
            }),
            64,
            2,
            "format version 2; this build reads version 1",
        ),
        (
            "wrong-magic",
            "magic \"GGUF\"",
            Box::new(|mut b: Vec<u8>| {
                b[..4].copy_from_slice(b"GGUF");
                b
            }),
            64,
            2,
            "not a k3 session file",
        ),
        (
            "trailing-bytes",
            "16 bytes appended",
            Box::new(|mut b: Vec<u8>| {
                b.extend_from_slice(&[0; 16]);
                b
            }),
            64,
            2,
            "damaged",
        ),
        (
            "body-len-max",
            "body_len 2^64-1",
            Box::new(|b| sealed_u64(b, 16, u64::MAX)),
            64,
            2,
            "damaged",
        ),
        (
            "pos-max-sealed",
            "pos 2^64-1 behind a valid checksum",
            Box::new(|b| sealed_u64(b, 32, u64::MAX)),
            64,
            2,
            "session file",
        ),
        (
            "n-tokens-max-sealed",
            "n_tokens 2^64-1 behind a valid checksum",
            Box::new(|b| sealed_u64(b, 40, u64::MAX)),
            64,
            2,
            "session file",
        ),
        (
            "body-cut-sealed",
            "the last 1000 state bytes removed, body_len and checksum fixed",
            Box::new(|mut b: Vec<u8>| {
                let end = b.len() - 8;
                b.drain(end - 1000..end);
                resealed(b)
            }),
            64,
            2,
            "malformed: ",
        ),
        (
            "kda-len-sealed",
            "first KDA state length 7 behind a valid checksum",
            Box::new(|b: Vec<u8>| {
                let at = kda_len_at(&b);
                sealed_u64(b, at, 7)
            }),
            64,
            2,
            "KDA layer 0 recurrent state has 7 values",
        ),
        (
            "ctx-too-small",
            "a 9-token session loaded into a 4-position context",
            Box::new(|b| b),
            4,
            2,
            "session file",
        ),
    ];
    let cases: Vec<_> = cases.into_iter().filter(|c| keep(c.0)).collect();
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    for (name, input, damage, ctx, code, needle) in &cases {
        let path = dir.path().join(format!("{name}.k3ss"));
        std::fs::write(&path, damage(good.clone())).unwrap();
        let got = catch_unwind(AssertUnwindSafe(|| {
            engine
                .load_session(&path, *ctx)
                .map(|_| ())
                .map_err(|e| (e.exit_code(), e.to_string()))
        }));
        let shown = match got {
            Err(_) => {
                failures.push(format!("[session/{name}] PANICKED"));
                continue;
            }
            Ok(Ok(())) => {
                failures.push(format!("[session/{name}] was accepted"));
                continue;
            }
            Ok(Err((c, msg))) => {
                if c != *code || !msg.contains(needle) || !msg.contains(&path.display().to_string())
                {
                    failures.push(format!("[session/{name}] code {c} (want {code}), message lacks {needle:?} or the path: {msg}"));
                }
                msg.replace(&dir.path().display().to_string(), "$TMP")
            }
        };
        rows.push(format!(
            "| session | {name} | {input} | {code} | `{}` |",
            shown.replace('|', "\\|")
        ));
    }
    // The clean file still loads, and a missing path is an I/O error (exit 1) naming it.
    assert!(engine
        .load_session(&dir.path().join("good.k3ss"), 64)
        .is_ok());
    let missing = dir.path().join("absent.k3ss");
    match engine.load_session(&missing, 64) {
        Ok(_) => failures.push("[session/missing-file] was accepted".into()),
        Err(e) => {
            if e.exit_code() != 1 || !e.to_string().contains("absent.k3ss") {
                failures.push(format!(
                    "[session/missing-file] code {}: {e}",
                    e.exit_code()
                ));
            }
            rows.push(format!(
                "| session | missing-file | path does not exist | 1 | `{}` |",
                e.to_string()
                    .replace(&dir.path().display().to_string(), "$TMP")
            ));
        }
    }
    if let Some(d) = std::env::var_os("K3_HOSTILE_CATALOGUE").filter(|_| catalogue) {
        let _ = std::fs::create_dir_all(&d);
        let _ = std::fs::write(Path::new(&d).join("session.md"), rows.join("\n") + "\n");
    }
    eprintln!(
        "session: {} cases, {} failed",
        cases.len() + 1,
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
