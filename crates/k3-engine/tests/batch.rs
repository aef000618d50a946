//! Batched feeding (docs/SERVER.md "Batching"): any mix of sessions — prompt lengths,
//! arrival steps, sampling seeds, batch order, budgets — stepped together through
//! `Engine::feed_batch` gives every session the ids and logits it gets alone, and a batch
//! of decode steps streams the trunk once for all of them.

use k3_engine::planning::budget_extremes;
use k3_engine::{BatchFeed, Budget, Engine, EngineOptions, Sampler, SamplingParams, Session};
use proptest::prelude::*;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3")
}

fn open(budget: Option<Budget>, chunk: Option<usize>) -> Engine {
    let options = EngineOptions {
        threads: Some(2),
        budget,
        ctx: 64,
        max_prefill_chunk: chunk,
        ..EngineOptions::default()
    };
    Engine::open(&dir(), options).unwrap()
}

/// The smallest trunk budget (every layer streams) with room for every expert.
fn streaming() -> Budget {
    match budget_extremes(&dir()).unwrap().0 {
        Budget::Split { trunk, .. } => Budget::Split {
            trunk,
            cache: 64 << 20,
        },
        other => panic!("the smallest budget is a split: {other:?}"),
    }
}

/// One request of a test batch.
#[derive(Clone, Debug)]
struct Req {
    prompt: Vec<u32>,
    arrives: usize,
    new_tokens: usize,
    seed: u64,
    temperature: f32,
}

fn sampler(r: &Req) -> Sampler {
    Sampler::new(SamplingParams {
        temperature: r.temperature,
        top_k: 20,
        seed: r.seed,
        ..SamplingParams::default()
    })
    .unwrap()
}

/// `(ids, logits after each id)` of `r` run alone.
fn solo(e: &Engine, r: &Req) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut s = e.new_session(64).unwrap();
    s.feed(&r.prompt).unwrap();
    let mut smp = sampler(r);
    let (mut ids, mut logits) = (Vec::new(), vec![s.logits().to_vec()]);
    for _ in 0..r.new_tokens {
        let id = smp.sample(s.logits(), s.history());
        ids.push(id);
        s.feed(&[id]).unwrap();
        logits.push(s.logits().to_vec());
    }
    (ids, logits)
}

/// A request in flight in the batched run.
struct Live<'e> {
    req: usize,
    session: Session<'e>,
    sampler: Sampler,
    prompt_left: Vec<u32>,
    ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

/// Every request stepped together: a request joins at its arrival step, feeds its prompt in
/// slices of `slice` ids, then one id per step; the batch order is rotated every step.
fn batched(e: &Engine, reqs: &[Req], slice: usize) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut live: Vec<Live<'_>> = Vec::new();
    let mut out = vec![(Vec::new(), Vec::new()); reqs.len()];
    let mut step = 0;
    while live.len() + out.iter().filter(|o| !o.1.is_empty()).count() < reqs.len()
        || !live.is_empty()
    {
        for (i, r) in reqs.iter().enumerate().filter(|(_, r)| r.arrives == step) {
            live.push(Live {
                req: i,
                session: e.new_session(64).unwrap(),
                sampler: sampler(r),
                prompt_left: r.prompt.clone(),
                ids: Vec::new(),
                logits: Vec::new(),
            });
        }
        let n = live.len();
        if n > 0 {
            live.rotate_left(step % n);
        }
        let feeds_ids: Vec<Vec<u32>> = live
            .iter_mut()
            .map(|l| {
                if l.prompt_left.is_empty() {
                    vec![*l.ids.last().unwrap()]
                } else {
                    let k = slice.min(l.prompt_left.len());
                    l.prompt_left.drain(..k).collect()
                }
            })
            .collect();
        let mut feeds: Vec<BatchFeed<'_, '_>> = live
            .iter_mut()
            .zip(&feeds_ids)
            .map(|(l, ids)| BatchFeed {
                session: &mut l.session,
                ids,
            })
            .collect();
        if !feeds.is_empty() {
            e.feed_batch(&mut feeds).unwrap();
        }
        drop(feeds);
        for l in live.iter_mut().filter(|l| l.prompt_left.is_empty()) {
            l.logits.push(l.session.logits().to_vec());
            if l.ids.len() < reqs[l.req].new_tokens {
                let id = l.sampler.sample(l.session.logits(), l.session.history());
                l.ids.push(id);
            }
        }
        let (done, running): (Vec<_>, Vec<_>) = live
            .into_iter()
            .partition(|l| l.prompt_left.is_empty() && l.logits.len() > reqs[l.req].new_tokens);
        for l in done {
            out[l.req] = (l.ids, l.logits);
        }
        live = running;
        step += 1;
    }
    out
}

fn reqs() -> impl Strategy<Value = Vec<Req>> {
    let one = (
        proptest::collection::vec(0u32..700, 1..20),
        0usize..4,
        0usize..5,
        any::<u64>(),
        prop_oneof![Just(0.0f32), Just(0.8f32)],
    )
        .prop_map(|(prompt, arrives, new_tokens, seed, temperature)| Req {
            prompt,
            arrives,
            new_tokens,
            seed,
            temperature,
        });
    proptest::collection::vec(one, 1..5)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn any_mix_of_sessions_batched_equals_each_alone(
        reqs in reqs(),
        slice in 1usize..9,
        chunk in prop_oneof![Just(None), Just(Some(3usize))],
        stream in any::<bool>(),
    ) {
        let resident = open(None, None);
        let alone: Vec<_> = reqs.iter().map(|r| solo(&resident, r)).collect();
        let engine = if stream { open(Some(streaming()), chunk) } else { open(None, chunk) };
        let together = batched(&engine, &reqs, slice);
        for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
            prop_assert_eq!(&a.0, &b.0, "request {} ids", i);
            prop_assert!(a.1 == b.1, "request {} logits differ", i);
        }
    }
}

#[test]
fn a_batch_of_decode_steps_streams_the_trunk_once() {
    let e = open(Some(streaming()), None);
    let mut sessions: Vec<Session<'_>> = (0..4).map(|_| e.new_session(64).unwrap()).collect();
    for (i, s) in sessions.iter_mut().enumerate() {
        s.feed(&[1 + i as u32, 2, 3]).unwrap();
    }
    let before = e.stats();
    let ids = [[7u32], [8], [9], [10]];
    let mut feeds: Vec<BatchFeed<'_, '_>> = sessions
        .iter_mut()
        .zip(&ids)
        .map(|(session, ids)| BatchFeed { session, ids })
        .collect();
    e.feed_batch(&mut feeds).unwrap();
    let batch = e.stats().since(&before).trunk_bytes_read;
    let mut alone = e.new_session(64).unwrap();
    alone.feed(&[1, 2, 3]).unwrap();
    let before = e.stats();
    alone.feed(&[7]).unwrap();
    let one = e.stats().since(&before).trunk_bytes_read;
    assert!(one > 0, "the trunk streams at this budget");
    assert_eq!(
        batch, one,
        "four sessions' step reads the trunk as one session's"
    );
}

#[test]
fn a_bad_feed_refuses_the_batch_and_leaves_every_session_as_it_was() {
    let e = open(None, None);
    let mut a = e.new_session(8).unwrap();
    let mut b = e.new_session(8).unwrap();
    a.feed(&[1, 2]).unwrap();
    let logits = a.logits().to_vec();
    let too_long = [5u32; 9];
    let mut feeds = [
        BatchFeed {
            session: &mut a,
            ids: &[3],
        },
        BatchFeed {
            session: &mut b,
            ids: &too_long,
        },
    ];
    let err = e.feed_batch(&mut feeds).unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
    assert_eq!((a.tokens(), a.logits()), (vec![1, 2], &logits[..]));
    assert!(b.tokens().is_empty());
    let other = open(None, None);
    let mut c = other.new_session(8).unwrap();
    let mut feeds = [BatchFeed {
        session: &mut c,
        ids: &[1],
    }];
    let err = e.feed_batch(&mut feeds).unwrap_err();
    assert!(err.to_string().contains("another engine"), "{err}");
}
