//! One model over N ranks (docs/DISTRIBUTED.md), proven in-process: N threads, each an
//! engine holding one rank of a `LocalComm` group, run the same calls; rank 0 samples and
//! broadcasts each id. Ids and logits (teacher-forced over the prompt, then after every
//! sampled id) must be bit-identical to one process, on both tiny checkpoints, resident and
//! at a streaming budget, at any thread count; batched feeding too. A rank that fails ends
//! every rank with an error naming it.

use k3_engine::planning::budget_extremes;
use k3_engine::{shard_readers, BatchFeed, Budget, Engine, EXIT_RUNTIME};
use k3_format::{bind_model, Checkpoint, K3Config};
use k3_model::{Comm, LocalComm};
use k3_store::io::{Fault, FaultyReader, ReadAt};
use proptest::prelude::*;
use std::sync::Arc;

#[path = "support/ranks.rs"]
mod ranks;
use ranks::{bits, dir, options, reference, trace, Trace, NEW_TOKENS, PROMPT};

/// The smallest trunk budget (every layer streams) with room for every expert.
fn streaming(name: &str) -> Budget {
    match budget_extremes(&dir(name)).unwrap().0 {
        Budget::Split { trunk, .. } => Budget::Split {
            trunk,
            cache: 64 << 20,
        },
        other => panic!("the smallest budget is a split: {other:?}"),
    }
}

/// Runs `ranks` ranks as threads (each its own engine with `threads` compute threads) and
/// returns every rank's trace, rank order.
fn group(name: &str, ranks: usize, threads: usize, budget: Option<Budget>) -> Vec<Trace> {
    let comms = LocalComm::group(ranks);
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                scope.spawn(move || {
                    let comm: Arc<dyn Comm> = Arc::new(c);
                    let o = options(threads, budget, Some(Arc::clone(&comm)));
                    let engine = Engine::open(&dir(name), o).unwrap();
                    trace(&engine, comm.as_ref())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn assert_group_matches(name: &str, ranks: usize, threads: usize, budget: Option<Budget>) {
    let want = reference(name);
    assert_eq!(want.ids.len(), NEW_TOKENS);
    for (rank, got) in group(name, ranks, threads, budget).iter().enumerate() {
        assert_eq!(got.ids, want.ids, "{name} N={ranks} rank {rank}: ids");
        assert!(
            got.logit_bits == want.logit_bits,
            "{name} N={ranks} threads={threads} budget={budget:?} rank {rank}: logits differ"
        );
    }
}

#[test]
fn two_and_three_ranks_match_one_process_resident_and_streaming() {
    for name in ["tiny-k3", "tiny-k3-wide"] {
        for ranks in [1, 2, 3] {
            assert_group_matches(name, ranks, 1, None);
            assert_group_matches(name, ranks, 2, Some(streaming(name)));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn any_rank_count_thread_count_and_budget_is_bit_identical(
        wide in any::<bool>(),
        ranks in 1usize..=3,
        threads in 1usize..=3,
        stream in any::<bool>(),
    ) {
        let name = if wide { "tiny-k3-wide" } else { "tiny-k3" };
        let budget = stream.then(|| streaming(name));
        assert_group_matches(name, ranks, threads, budget);
    }
}

/// Two sessions fed together (prompt, then one id each) on every rank.
fn batched(engine: &Engine) -> Vec<Vec<u32>> {
    let prompts: [&[u32]; 2] = [&PROMPT[..4], &PROMPT[2..]];
    let mut sessions: Vec<_> = (0..2).map(|_| engine.new_session(64).unwrap()).collect();
    let mut out = vec![Vec::new(); 2];
    for round in 0..2 {
        let ids: Vec<Vec<u32>> = if round == 0 {
            prompts.iter().map(|p| p.to_vec()).collect()
        } else {
            vec![vec![11], vec![12]]
        };
        let mut feeds: Vec<BatchFeed<'_, '_>> = sessions
            .iter_mut()
            .zip(&ids)
            .map(|(session, ids)| BatchFeed { session, ids })
            .collect();
        engine.feed_batch(&mut feeds).unwrap();
        drop(feeds);
        for (o, s) in out.iter_mut().zip(&sessions) {
            o.extend(bits(s.logits()));
        }
    }
    out
}

#[test]
fn batched_feeding_over_ranks_matches_one_process() {
    let d = dir("tiny-k3");
    let want = batched(&Engine::open(&d, options(2, None, None)).unwrap());
    let comms = LocalComm::group(2);
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let d = d.clone();
                scope.spawn(move || {
                    let o = options(1, None, Some(Arc::new(c)));
                    batched(&Engine::open(&d, o).unwrap())
                })
            })
            .collect();
        for (rank, h) in handles.into_iter().enumerate() {
            assert!(
                h.join().unwrap() == want,
                "rank {rank}: batched logits differ"
            );
        }
    });
}

#[test]
fn a_rank_that_cannot_open_its_share_ends_every_rank_naming_it() {
    let comms = LocalComm::group(2);
    let d = dir("tiny-k3");
    std::thread::scope(|scope| {
        let mut it = comms.into_iter();
        let (c0, c1) = (it.next().unwrap(), it.next().unwrap());
        scope.spawn(move || c1.abort("cannot open its share: fixtures/missing: not found"));
        // rank 0 fails at its open (the fingerprint exchange) or its first pass
        let follower =
            scope.spawn(
                move || match Engine::open(&d, options(1, None, Some(Arc::new(c0)))) {
                    Err(e) => e,
                    Ok(engine) => engine.new_session(16).unwrap().feed(&PROMPT).unwrap_err(),
                },
            );
        let err = follower.join().unwrap();
        let msg = err.to_string();
        assert_eq!(err.exit_code(), EXIT_RUNTIME, "{msg}");
        assert!(
            msg.contains("rank 1") && msg.contains("cannot open its share"),
            "{msg}"
        );
    });
}

/// Rank 1's expert reads of layer 1 fail; rank 0 never reads them (the experts it owns
/// differ) but must still stop, with an error naming rank 1 and the expert failure.
#[test]
fn an_expert_failure_on_one_rank_ends_every_rank_naming_it() {
    let d = dir("tiny-k3");
    let cfg = K3Config::load(d.join("config.json")).unwrap();
    let binding = bind_model(&Checkpoint::open(&d).unwrap(), &cfg).unwrap();
    let wrapped: Vec<Arc<FaultyReader>> = shard_readers(&d, false)
        .unwrap()
        .into_iter()
        .map(|r| Arc::new(FaultyReader::new(r)))
        .collect();
    for e in 0..cfg.num_experts {
        let loc = binding.expert(1, e).unwrap();
        for &(off, len) in &loc.reads {
            wrapped[loc.shard].inject(off..off + len, Fault::Eio);
        }
    }
    let readers: Vec<Arc<dyn ReadAt>> = wrapped.iter().map(|w| w.clone() as _).collect();
    let budget = budget_extremes(&d).unwrap().0;
    let comms = LocalComm::group(2);
    let errs: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let rank = c.rank();
                let mut o = options(1, Some(budget), Some(Arc::new(c)));
                if rank == 1 {
                    o.readers = Some(readers.clone());
                }
                let d = d.clone();
                scope.spawn(move || {
                    let engine = Engine::open(&d, o).unwrap();
                    let err = engine.new_session(16).unwrap().feed(&PROMPT).unwrap_err();
                    err.to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        errs[1].contains("expert") && errs[1].contains("layer 1"),
        "{}",
        errs[1]
    );
    assert!(
        errs[0].contains("rank 1") && errs[0].contains("layer 1"),
        "{}",
        errs[0]
    );
}

/// Copies the files of `src` into a fresh directory.
fn copy_model(src: &std::path::Path) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
        }
    }
    tmp
}

#[test]
fn ranks_with_different_checkpoints_are_refused_at_open_naming_the_rank() {
    let same = dir("tiny-k3");
    let other = copy_model(&same);
    std::fs::write(other.path().join("extra.safetensors"), b"not the same").unwrap();
    let comms = LocalComm::group(2);
    let errs: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let d = if c.rank() == 0 {
                    same.clone()
                } else {
                    other.path().to_path_buf()
                };
                scope.spawn(
                    move || match Engine::open(&d, options(1, None, Some(Arc::new(c)))) {
                        Ok(_) => "opened".to_string(),
                        Err(e) => e.to_string(),
                    },
                )
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, e) in errs.iter().enumerate() {
        assert!(
            e.contains("rank 1") && e.contains("different checkpoint"),
            "rank {rank}: {e}"
        );
    }
}

/// One decode token costs one all-gather per group of trunk products of one input (KDA 3:
/// f_a, the gated outputs of every rank's heads, o_proj; MLA 3: q_a/kv_a, the heads'
/// outputs, o_proj; dense 2; MoE 4: down/shared gate/shared up, the expert slots, up, shared
/// down) plus lm_head (docs/PERFORMANCE.md#distributed). With heads split
/// (docs/DISTRIBUTED.md#the-seam) q/k/v/g/β/decay and q_b/gate stay on their rank: the count
/// is unchanged, the bytes drop (35,104 bytes per token on tiny-k3 at N=2, from 46,000).
#[test]
fn one_decode_token_costs_one_gather_per_input_of_the_trunk() {
    use k3_model::{Dims, LayerKind};
    let d = dir("tiny-k3");
    let dims = Dims::new(&K3Config::load(d.join("config.json")).unwrap()).unwrap();
    let want: usize = 1
        + (0..dims.n_layers)
            .map(|l| {
                let attn = match dims.kinds[l] {
                    LayerKind::Kda(_) | LayerKind::Mla(_) => 3,
                };
                attn + if dims.dense[l] { 2 } else { 4 }
            })
            .sum::<usize>();
    let comms = LocalComm::group(2);
    let counts: Vec<(usize, usize)> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let d = d.clone();
                scope.spawn(move || {
                    // the engine counts its transport's collectives (k3_engine::CountingComm)
                    let engine = Engine::open(&d, options(1, None, Some(Arc::new(c)))).unwrap();
                    let mut s = engine.new_session(16).unwrap();
                    s.feed(&PROMPT).unwrap();
                    let before = engine.comm_stats();
                    s.feed(&[5]).unwrap();
                    let token = engine.comm_stats().since(&before);
                    (token.calls as usize, token.bytes_sent as usize)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, &(gathers, _)) in counts.iter().enumerate() {
        assert_eq!(gathers, want, "rank {rank}: all-gathers per decode token");
    }
    let sent: usize = counts.iter().map(|c| c.1).sum();
    eprintln!("tiny-k3, N=2: {want} all-gathers per decode token, {sent} bytes sent by all ranks");
    assert!(
        sent >= 4 * dims.vocab,
        "the lm_head rows alone are {} bytes",
        4 * dims.vocab
    );
}

/// Feeds the prompt's first 4 ids, saves, and returns the bytes and the logits after feeding
/// the rest to the saved session (the continuation a loaded copy must reproduce).
fn save_midway(engine: &Engine) -> (Vec<u8>, Vec<u32>) {
    let mut s = engine.new_session(64).unwrap();
    s.feed(&PROMPT[..4]).unwrap();
    let bytes = s.to_bytes().unwrap(); // a collective over ranks: every rank calls it
    let logits = continue_from(engine, &bytes);
    (bytes, logits)
}

/// Loads `bytes` and feeds the rest of the prompt: every logit's bits.
fn continue_from(engine: &Engine, bytes: &[u8]) -> Vec<u32> {
    let mut s = engine.session_from_bytes(bytes, 64).unwrap();
    bits(&s.feed_all_logits(&PROMPT[4..]).unwrap()).collect()
}

/// Runs `f` on every rank of an in-process group of `ranks`, each its own resident engine.
fn on_ranks<T: Send>(name: &str, ranks: usize, f: impl Fn(&Engine) -> T + Sync) -> Vec<T> {
    let comms = LocalComm::group(ranks);
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let f = &f;
                scope.spawn(move || {
                    let engine = Engine::open(&dir(name), options(1, None, Some(Arc::new(c))));
                    f(&engine.unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_session_saved_over_two_ranks_is_the_one_process_file_and_loads_at_any_rank_count() {
    for name in ["tiny-k3", "tiny-k3-wide"] {
        let solo = Engine::open(&dir(name), options(2, None, None)).unwrap();
        let (want_bytes, want) = save_midway(&solo);
        let saved = on_ranks(name, 2, save_midway);
        for (rank, (bytes, logits)) in saved.iter().enumerate() {
            assert!(
                *bytes == want_bytes,
                "{name} rank {rank}: saved bytes differ"
            );
            assert!(
                *logits == want,
                "{name} rank {rank}: continued logits differ"
            );
        }
        let bytes = &saved[0].0;
        assert!(continue_from(&solo, bytes) == want, "{name}: loaded on N=1");
        for (rank, got) in on_ranks(name, 3, |e| continue_from(e, bytes))
            .iter()
            .enumerate()
        {
            assert!(*got == want, "{name}: loaded on N=3, rank {rank}");
        }
    }
}

/// Speculative decoding over ranks: every rank journals its own KDA heads' rows of a pass's
/// tentative drafts and keeps the accepted ones from them
/// (docs/STREAMING.md#keeping-accepted-drafts). With drafts right except every third, the
/// ids and the logits after them equal one process decoding plainly, and every pass feeds
/// its own token and its drafts only.
#[test]
fn speculative_decoding_over_ranks_keeps_accepted_drafts_like_one_process() {
    use k3_engine::{DecodeMode, Sampler, StopConditions};
    const N: usize = 12;
    let plain = |engine: &Engine| {
        let mut s = engine.new_session(64).unwrap();
        s.feed(&PROMPT).unwrap();
        let stop = StopConditions::none();
        let mode = DecodeMode::Incremental;
        let mut sampler = Sampler::greedy();
        let g = s
            .generate_with(N, mode, &mut sampler, &stop, |_| true)
            .unwrap();
        (g.ids, bits(s.logits()).collect::<Vec<u32>>())
    };
    for name in ["tiny-k3", "tiny-k3-wide"] {
        let want = on_ranks(name, 1, plain).remove(0);
        let truth = [&PROMPT[..], &want.0[..]].concat();
        let spec = |engine: &Engine| {
            let mut s = engine.new_session(64).unwrap();
            s.feed(&PROMPT).unwrap();
            let mut drafted = 0usize;
            let drafter = |ctx: &[u32], limit: usize| {
                (ctx.len()..(ctx.len() + limit).min(truth.len()))
                    .map(|p| {
                        drafted += 1;
                        match drafted % 3 {
                            0 => (truth[p] + 1) % 512,
                            _ => truth[p],
                        }
                    })
                    .collect()
            };
            let stop = StopConditions::none();
            let mut sampler = Sampler::greedy();
            let g = s
                .generate_with_drafter(N, &mut sampler, &stop, drafter, |_| true)
                .unwrap();
            let st = s.spec_stats();
            assert!(st.accepted > 0 && st.rollbacks > 0, "{name}: {st:?}");
            assert_eq!(st.positions, st.passes + st.drafted, "{name}: {st:?}");
            (g.ids, bits(s.logits()).collect::<Vec<u32>>())
        };
        for ranks in [1, 2, 3] {
            for (rank, got) in on_ranks(name, ranks, spec).into_iter().enumerate() {
                assert_eq!(got, want, "{name} N={ranks} rank {rank}");
            }
        }
    }
}
