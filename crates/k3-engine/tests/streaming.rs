//! The streaming stores give the same logits, bit for bit, as the resident store at every
//! budget (smallest legal → everything resident), thread count and I/O mode; injected faults
//! are reported with the documented exit codes, never as a panic or a silent wrong token.

use k3_engine::planning::{budget_extremes, piece_ring_budget};
use k3_engine::{
    argmax, shard_readers, Budget, DecodeMode, Engine, EngineOptions, EXIT_EXPERT, EXIT_RUNTIME,
};
use k3_format::{bind_model, Checkpoint, K3Config};
use k3_store::io::{Fault, FaultyReader, ReadAt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

const PROMPT: [u32; 7] = [637, 229, 263, 638, 730, 42, 197];

fn opts(budget: Option<Budget>, threads: usize, direct: bool) -> EngineOptions {
    EngineOptions {
        threads: Some(threads),
        budget,
        ctx: 64,
        direct_io: direct,
        ..EngineOptions::default()
    }
}

/// Logits after the prompt and after each of 6 greedy steps, plus the ids chosen.
fn trace(engine: &Engine) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut s = engine.new_session(64).unwrap();
    s.feed(&PROMPT).unwrap();
    let (mut logits, mut ids) = (vec![s.logits().to_vec()], Vec::new());
    for _ in 0..6 {
        let id = argmax(s.logits());
        ids.push(id);
        s.step(id, DecodeMode::Incremental).unwrap();
        logits.push(s.logits().to_vec());
    }
    (logits, ids)
}

fn mid_budget(smallest: Budget, everything: Budget) -> Budget {
    match (smallest, everything) {
        (
            Budget::Split {
                trunk: t0,
                cache: c0,
            },
            Budget::Split {
                trunk: t1,
                cache: c1,
            },
        ) => Budget::Split {
            trunk: (t0 + t1) / 2,
            cache: (c0 + c1) / 3,
        },
        _ => unreachable!("budget_extremes returns splits"),
    }
}

fn same_logits_at_every_budget(name: &str) {
    let d = dir(name);
    let reference = trace(&Engine::open(&d, opts(None, 2, true)).unwrap());
    let (smallest, everything) = budget_extremes(&d).unwrap();
    let pieces = piece_ring_budget(&d)
        .unwrap()
        .expect("tiny layers split into pieces");
    let budgets = [
        pieces,
        smallest,
        mid_budget(smallest, everything),
        everything,
    ];
    for budget in budgets {
        for (threads, direct) in [(1, true), (2, false)] {
            let engine = Engine::open(&d, opts(Some(budget), threads, direct)).unwrap();
            let got = trace(&engine);
            assert_eq!(
                got.1, reference.1,
                "{name}: ids at {budget:?}, {threads} threads, direct {direct}"
            );
            assert!(
                got.0 == reference.0,
                "{name}: logits differ at {budget:?}, {threads} threads, direct {direct}"
            );
            let st = engine.stats();
            assert!(
                st.expert_requests > 0 && st.trunk_binds > 0,
                "{name}: counters move: {st:?}"
            );
        }
    }
    // The piece ring: each layer in two pieces, the next one read while the current one
    // computes (every pass: 2 reads ahead per layer, less the first).
    let ring = Engine::open(&d, opts(Some(pieces), 1, true)).unwrap();
    let plan = ring.plan().expect("a plan");
    assert_eq!(plan.trunk.piece_slot_bytes.len(), 2, "{name}: {plan}");
    assert!(plan.trunk.reads_ahead());
    trace(&ring);
    let st = ring.stats();
    assert_eq!(st.trunk_pieces, 2, "{st:?}");
    let layers = plan.n_layers as u64;
    assert_eq!(
        st.trunk_binds % layers,
        0,
        "a layer is bound once per pass: {st:?}"
    );
    assert!(st.trunk_read_aheads >= 2 * st.trunk_binds - 2, "{st:?}");
    // At the smallest budget nothing is pinned, so every bind streams.
    let small = Engine::open(&d, opts(Some(smallest), 1, true)).unwrap();
    trace(&small);
    let st = small.stats();
    assert_eq!(
        st.trunk_pinned_hits, 0,
        "{name}: smallest budget pins nothing: {st:?}"
    );
    assert!(
        st.trunk_bytes_read > 0 && st.expert_bytes_read > 0,
        "{st:?}"
    );
    // With everything resident, decoding reads no trunk bytes beyond the pins at open.
    let big = Engine::open(&d, opts(Some(everything), 1, true)).unwrap();
    let before = big.stats();
    trace(&big);
    let after = big.stats();
    assert_eq!(
        after.trunk_bytes_read, before.trunk_bytes_read,
        "{name}: all pinned"
    );
}

#[test]
fn tiny_k3_same_logits_at_every_budget() {
    same_logits_at_every_budget("tiny-k3");
}

#[test]
fn tiny_k3_wide_same_logits_at_every_budget() {
    same_logits_at_every_budget("tiny-k3-wide");
}

/// Shard readers wrapped for fault injection, and the wrappers to inject through.
fn faulty(d: &std::path::Path) -> (Vec<Arc<dyn ReadAt>>, Vec<Arc<FaultyReader>>) {
    let wrapped: Vec<Arc<FaultyReader>> = shard_readers(d, false)
        .unwrap()
        .into_iter()
        .map(|r| Arc::new(FaultyReader::new(r)))
        .collect();
    (
        wrapped
            .iter()
            .map(|w| w.clone() as Arc<dyn ReadAt>)
            .collect(),
        wrapped,
    )
}

/// Opens `d` at its smallest budget over `readers` (1 thread) and feeds the prompt, which
/// must fail.
fn feed_at_smallest_budget(
    d: &std::path::Path,
    readers: Vec<Arc<dyn ReadAt>>,
) -> (Engine, k3_engine::EngineError) {
    let (smallest, _) = budget_extremes(d).unwrap();
    let o = EngineOptions {
        readers: Some(readers),
        ..opts(Some(smallest), 1, false)
    };
    let engine = Engine::open(d, o).unwrap();
    let err = engine.new_session(16).unwrap().feed(&PROMPT).unwrap_err();
    (engine, err)
}

#[test]
fn failed_expert_read_is_exit_4_naming_the_expert() {
    let d = dir("tiny-k3");
    let cfg = K3Config::load(d.join("config.json")).unwrap();
    let binding = bind_model(&Checkpoint::open(&d).unwrap(), &cfg).unwrap();
    let (readers, handles) = faulty(&d);
    // Every expert of layer 1 fails to read.
    for e in 0..cfg.num_experts {
        let loc = binding.expert(1, e).unwrap();
        for &(off, len) in &loc.reads {
            handles[loc.shard].inject(off..off + len, Fault::Eio);
        }
    }
    let (engine, err) = feed_at_smallest_budget(&d, readers);
    assert_eq!(err.exit_code(), EXIT_EXPERT, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("expert") && msg.contains("layer 1"), "{msg}");
    assert!(engine.stats().expert_failures >= 1, "{:?}", engine.stats());
}

#[test]
fn failed_trunk_read_is_exit_1_naming_the_layer() {
    let d = dir("tiny-k3");
    let cfg = K3Config::load(d.join("config.json")).unwrap();
    let binding = bind_model(&Checkpoint::open(&d).unwrap(), &cfg).unwrap();
    let run = binding.layers[5].trunk_run().unwrap();
    let (readers, handles) = faulty(&d);
    handles[run.shard].inject(run.start..run.end, Fault::Short);
    let (_engine, err) = feed_at_smallest_budget(&d, readers);
    assert_eq!(err.exit_code(), EXIT_RUNTIME, "{err}");
    assert!(err.to_string().contains("layer 5"), "{err}");
}

#[test]
fn slow_disk_gives_the_same_tokens() {
    let d = dir("tiny-k3");
    let reference = trace(&Engine::open(&d, opts(None, 1, false)).unwrap());
    let (readers, handles) = faulty(&d);
    for h in &handles {
        h.inject(0..u64::MAX, Fault::Delay(Duration::from_micros(300)));
    }
    let (smallest, _) = budget_extremes(&d).unwrap();
    let engine = Engine::open(
        &d,
        EngineOptions {
            readers: Some(readers),
            ..opts(Some(smallest), 2, false)
        },
    )
    .unwrap();
    assert_eq!(trace(&engine), reference);
}

fn same_logits_from_a_packed_trunk(name: &str) {
    use k3_format::pack::PackOptions;
    let d = dir(name);
    let cfg = K3Config::load(d.join("config.json")).unwrap();
    let ck = Checkpoint::open(&d).unwrap();
    let binding = bind_model(&ck, &cfg).unwrap();
    let out = std::env::temp_dir().join(format!("k3-pack-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    k3_format::write_trunk_pack(
        &ck,
        &binding,
        &cfg,
        &out,
        &PackOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    let reference = trace(&Engine::open(&d, opts(None, 2, true)).unwrap());
    let (smallest, everything) = budget_extremes(&d).unwrap();
    let pieces = piece_ring_budget(&d)
        .unwrap()
        .expect("tiny layers split into pieces");
    for (budget, threads) in [(pieces, 1), (pieces, 2), (smallest, 2), (everything, 2)] {
        let o = EngineOptions {
            trunk_dir: Some(out.clone()),
            ..opts(Some(budget), threads, true)
        };
        let engine = Engine::open(&d, o).unwrap();
        assert!(
            trace(&engine) == reference,
            "{name}: packed trunk at {budget:?}, {threads} threads"
        );
        let want = if budget == pieces { 2 } else { 1 };
        assert_eq!(engine.stats().trunk_pieces, want, "{name}: {budget:?}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn tiny_k3_same_logits_from_a_packed_trunk() {
    same_logits_from_a_packed_trunk("tiny-k3");
}

#[test]
fn tiny_k3_wide_same_logits_from_a_packed_trunk() {
    same_logits_from_a_packed_trunk("tiny-k3-wide");
}

#[test]
fn missing_or_foreign_pack_is_refused() {
    let d = dir("tiny-k3");
    let (smallest, _) = budget_extremes(&d).unwrap();
    let o = EngineOptions {
        trunk_dir: Some("/nonexistent/k3-pack".into()),
        ..opts(Some(smallest), 1, true)
    };
    let err = Engine::open(&d, o).err().expect("refused");
    assert_eq!(err.exit_code(), 2, "{err}");
    assert!(err.to_string().contains("/nonexistent/k3-pack"), "{err}");
    // A pack of the other tiny model is refused by name.
    use k3_format::pack::PackOptions;
    let w = dir("tiny-k3-wide");
    let cfg = K3Config::load(w.join("config.json")).unwrap();
    let ck = Checkpoint::open(&w).unwrap();
    let out = std::env::temp_dir().join(format!("k3-foreign-pack-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    k3_format::write_trunk_pack(
        &ck,
        &bind_model(&ck, &cfg).unwrap(),
        &cfg,
        &out,
        &PackOptions::default(),
        &mut |_, _| {},
    )
    .unwrap();
    let o = EngineOptions {
        trunk_dir: Some(out.clone()),
        ..opts(Some(smallest), 1, true)
    };
    let err = Engine::open(&d, o).err().expect("foreign pack refused");
    let _ = std::fs::remove_dir_all(&out);
    assert_eq!(err.exit_code(), 2, "{err}");
}

#[test]
fn open_reports_pinning_progress() {
    let d = dir("tiny-k3");
    let (_, everything) = budget_extremes(&d).unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let o = EngineOptions {
        open_progress: Some(Arc::new(move |done, total| {
            log.lock().unwrap().push((done, total))
        })),
        ..opts(Some(everything), 1, true)
    };
    let engine = Engine::open(&d, o).unwrap();
    let calls = seen.lock().unwrap().clone();
    assert_eq!(calls.len(), 13, "one call per pinned layer: {calls:?}");
    let (done, total) = *calls.last().unwrap();
    assert!(total > 0 && done == total, "{calls:?}");
    assert!(
        calls.windows(2).all(|w| w[0].0 < w[1].0),
        "monotonic: {calls:?}"
    );
    assert_eq!(total, engine.stats().trunk_bytes_read);
}

/// A copy of tiny-k3 in which one routed-expert tensor sits between two trunk tensors of
/// layer 2, so that layer's trunk is not one contiguous run.
fn non_contiguous_copy() -> PathBuf {
    let dst = std::env::temp_dir().join(format!("k3-noncontig-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    let is_l2_trunk = |n: &str| n.contains("layers.2.") && !n.contains(".experts.");
    k3_format::writer::copy_rewritten(&dir("tiny-k3"), &dst, |docs| {
        for doc in docs.iter_mut() {
            let find = |d: &Vec<k3_format::writer::TensorDoc>, f: &dyn Fn(&str) -> bool| {
                d.iter().position(|t| f(&t.spec.name))
            };
            let Some(first) = find(&doc.tensors, &is_l2_trunk) else {
                continue;
            };
            let expert =
                find(&doc.tensors, &|n| n.contains(".experts.")).expect("an expert in the shard");
            let moved = doc.tensors.remove(expert);
            let at = find(&doc.tensors, &is_l2_trunk).unwrap_or(first) + 1;
            doc.tensors.insert(at, moved);
        }
    })
    .unwrap();
    dst
}

#[test]
fn non_contiguous_trunk_is_read_tensor_by_tensor_with_the_same_logits() {
    let d = non_contiguous_copy();
    let cfg = K3Config::load(d.join("config.json")).unwrap();
    let binding = bind_model(&Checkpoint::open(&d).unwrap(), &cfg).unwrap();
    assert!(
        binding.layers[2].trunk_run().is_err(),
        "the copy must really be non-contiguous"
    );
    let reference = trace(&Engine::open(&dir("tiny-k3"), opts(None, 2, true)).unwrap());
    let (smallest, everything) = budget_extremes(&d).unwrap();
    for budget in [smallest, everything] {
        for direct in [true, false] {
            let engine = Engine::open(&d, opts(Some(budget), 2, direct)).unwrap();
            assert!(
                trace(&engine) == reference,
                "gathered layer at {budget:?}, direct {direct}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}
