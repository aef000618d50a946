//! Speculative decoding gives exactly the ids of one-token-per-pass decoding — greedy and
//! seeded sampling, resident and at the smallest streaming budget — whatever the drafts:
//! all right, all wrong, or wrong every few tokens (accept, reject + rollback, and the
//! settling pass when a generation stops inside accepted drafts). The session's state after
//! a speculative generation is bit-identical to the plain one's.

use k3_engine::planning::budget_extremes;
use k3_engine::speculate::draft;
use k3_engine::{
    Budget, DecodeMode, Engine, EngineOptions, Generation, Sampler, SamplingParams, Session,
    Speculation, StopConditions, StopReason,
};
use std::path::PathBuf;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

fn open(model: &str, budget: Option<Budget>) -> Engine {
    let options = EngineOptions {
        threads: Some(2),
        budget,
        ctx: 96,
        ..EngineOptions::default()
    };
    Engine::open(&dir(model), options).unwrap()
}

const PROMPT: [u32; 9] = [403, 17, 600, 17, 600, 17, 600, 5, 99];

fn seeded() -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.01,
        repeat_penalty: 1.1,
        repeat_last_n: 16,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
        seed: 7,
    }
}

fn plain(engine: &Engine, n: usize, params: &SamplingParams, stop: &StopConditions) -> Generation {
    let mut s = engine.new_session(96).unwrap();
    s.feed(&PROMPT).unwrap();
    let mut sampler = Sampler::new(params.clone()).unwrap();
    s.generate_with(n, DecodeMode::Incremental, &mut sampler, stop, |_| true)
        .unwrap()
}

/// Logits after feeding `probe` to a session that generated `g` (its pending id goes first).
fn logits_after(s: &mut Session<'_>, probe: u32) -> Vec<f32> {
    s.feed(&[probe]).unwrap();
    s.logits().to_vec()
}

/// A drafter that knows the right continuation `truth` and corrupts the drafted token at
/// every absolute position `p` with `p % every == 0` (never, with `every == 0`). It also
/// checks that the context it is handed is the true prefix.
/// Drafts the true continuation, except that every `every`-th drafted token (counted over
/// the whole generation, so a small prefill chunk that caps drafts per pass still meets
/// them) is wrong; `every == 0`: never wrong.
fn oracle(truth: Vec<u32>, every: usize) -> impl FnMut(&[u32], usize) -> Vec<u32> {
    let mut drafted = 0usize;
    move |ctx: &[u32], limit: usize| {
        assert_eq!(
            ctx,
            &truth[..ctx.len()],
            "the drafter sees the true history"
        );
        (ctx.len()..(ctx.len() + limit).min(truth.len()))
            .map(|p| {
                drafted += 1;
                let wrong = every > 0 && drafted.is_multiple_of(every);
                if wrong {
                    (truth[p] + 1) % 512
                } else {
                    truth[p]
                }
            })
            .collect()
    }
}

fn check_model(model: &str, budget: Option<Budget>) {
    let engine = open(model, budget);
    let none = StopConditions::none();
    for params in [SamplingParams::greedy(), seeded()] {
        let want = plain(&engine, 24, &params, &none);
        let mut truth = PROMPT.to_vec();
        truth.extend(&want.ids);
        let mut reference = engine.new_session(96).unwrap();
        reference.feed(&PROMPT).unwrap();
        let mut sampler = Sampler::new(params.clone()).unwrap();
        reference
            .generate_with(24, DecodeMode::Incremental, &mut sampler, &none, |_| true)
            .unwrap();
        let want_logits = logits_after(&mut reference, 3);
        for every in [0, 1, 3] {
            let mut s = engine.new_session(96).unwrap();
            s.feed(&PROMPT).unwrap();
            let mut sampler = Sampler::new(params.clone()).unwrap();
            let got = s
                .generate_with_drafter(
                    24,
                    &mut sampler,
                    &none,
                    oracle(truth.clone(), every),
                    |_| true,
                )
                .unwrap();
            let ctx = format!("{model} {budget:?} T={} every={every}", params.temperature);
            assert_eq!(got, want, "{ctx}: ids");
            assert_eq!(s.tokens(), truth, "{ctx}: session tokens");
            let st = s.spec_stats();
            assert!(st.passes < 24, "{ctx}: drafts saved passes ({st:?})");
            if every == 0 {
                assert_eq!(st.rollbacks, 0, "{ctx}: {st:?}");
                assert_eq!(st.accepted, st.drafted, "{ctx}: {st:?}");
            } else if every > 1 {
                assert!(st.rollbacks > 0 && st.accepted > 0, "{ctx}: {st:?}");
            } else {
                assert_eq!(st.accepted, 0, "{ctx}: {st:?}");
            }
            assert_eq!(logits_after(&mut s, 3), want_logits, "{ctx}: state after");
        }
    }
}

#[test]
fn tiny_k3_speculative_ids_equal_plain_resident_and_streaming() {
    let (smallest, _) = budget_extremes(&dir("tiny-k3")).unwrap();
    check_model("tiny-k3", None);
    check_model("tiny-k3", Some(smallest));
}

#[test]
fn tiny_k3_wide_speculative_ids_equal_plain_resident_and_streaming() {
    let (smallest, _) = budget_extremes(&dir("tiny-k3-wide")).unwrap();
    check_model("tiny-k3-wide", None);
    check_model("tiny-k3-wide", Some(smallest));
}

#[test]
fn stopping_inside_accepted_drafts_settles_the_state() {
    let engine = open("tiny-k3", None);
    let free = plain(
        &engine,
        20,
        &SamplingParams::greedy(),
        &StopConditions::none(),
    );
    let mut truth = PROMPT.to_vec();
    truth.extend(&free.ids);
    // An end id that first appears a few tokens in: generation stops inside a drafted run.
    let end = free.ids[6];
    let first = free.ids.iter().position(|&t| t == end).unwrap();
    let stop = StopConditions {
        end_ids: vec![end],
        ..StopConditions::none()
    };
    let want = plain(&engine, 20, &SamplingParams::greedy(), &stop);
    assert_eq!(want.stop_reason, StopReason::EndToken(end));
    assert_eq!(want.ids.len(), first + 1);
    let mut reference = engine.new_session(96).unwrap();
    reference.feed(&PROMPT).unwrap();
    let mut greedy = Sampler::greedy();
    reference
        .generate_with(20, DecodeMode::Incremental, &mut greedy, &stop, |_| true)
        .unwrap();
    let want_logits = logits_after(&mut reference, 11);
    for (every, n) in [(0, 20), (3, 20), (0, first + 1), (0, 3)] {
        let mut s = engine.new_session(96).unwrap();
        s.feed(&PROMPT).unwrap();
        let mut sampler = Sampler::greedy();
        let got = s
            .generate_with_drafter(n, &mut sampler, &stop, oracle(truth.clone(), every), |_| {
                true
            })
            .unwrap();
        let want_n = plain(&engine, n, &SamplingParams::greedy(), &stop);
        assert_eq!(got, want_n, "every={every} n={n}");
        if n == 20 {
            assert_eq!(got, want);
            assert_eq!(logits_after(&mut s, 11), want_logits, "every={every}");
        }
        // the stop's pass keeps its accepted drafts from the pass's journal (no settling
        // pass), and no pass feeds an id twice (each pass: its own token + its drafts)
        let st = s.spec_stats();
        assert_eq!(st.positions, st.passes + st.drafted, "{st:?}");
        if every == 0 && n == 20 {
            assert!(
                st.rollbacks > 0,
                "the stop rejects the drafts after it: {st:?}"
            );
        }
    }
}

#[test]
fn ngram_mode_equals_plain_and_accepts_on_a_loop() {
    for model in ["tiny-k3", "tiny-k3-wide"] {
        let engine = open(model, None);
        let none = StopConditions::none();
        let want = plain(&engine, 40, &SamplingParams::greedy(), &none);
        let mut s = engine.new_session(96).unwrap();
        s.feed(&PROMPT).unwrap();
        let spec = Speculation {
            max_draft: 4,
            max_ngram: 3,
            min_ngram: 1,
        };
        let mut sampler = Sampler::greedy();
        let got = s
            .generate_with(
                40,
                DecodeMode::Speculative(spec),
                &mut sampler,
                &none,
                |_| true,
            )
            .unwrap();
        assert_eq!(got, want, "{model}");
        let st = s.spec_stats();
        assert!(
            st.drafted > 0,
            "{model}: the prompt's loop gives drafts ({st:?})"
        );
    }
}

#[test]
fn callback_stop_and_zero_tokens_behave_like_plain() {
    let engine = open("tiny-k3", None);
    let none = StopConditions::none();
    let want = plain(&engine, 12, &SamplingParams::greedy(), &none);
    let mut truth = PROMPT.to_vec();
    truth.extend(&want.ids);
    let mut s = engine.new_session(96).unwrap();
    s.feed(&PROMPT).unwrap();
    let mut seen = 0;
    let g = s
        .generate_with_drafter(
            12,
            &mut Sampler::greedy(),
            &none,
            oracle(truth.clone(), 0),
            |_| {
                seen += 1;
                seen < 5
            },
        )
        .unwrap();
    assert_eq!(g.ids, want.ids[..5]);
    assert_eq!(g.stop_reason, StopReason::Callback);
    assert_eq!(s.tokens(), truth[..PROMPT.len() + 5]);
    let g = s
        .generate_with_drafter(0, &mut Sampler::greedy(), &none, oracle(truth, 0), |_| true)
        .unwrap();
    assert!(g.ids.is_empty());
}

#[test]
fn drafter_finds_the_longest_recent_match() {
    let spec = Speculation {
        max_draft: 3,
        max_ngram: 3,
        min_ngram: 1,
    };
    // ... 1 2 3 [9 9] ... 2 3 [7 8] ... 1 2 3 → the 3-gram "1 2 3" matched most recently: 9 9.
    let ctx = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 1, 2, 3];
    assert_eq!(draft(&ctx, &spec, 8), vec![9, 9, 5]);
    assert_eq!(draft(&ctx, &spec, 1), vec![9]);
    assert_eq!(draft(&ctx, &spec, 0), Vec::<u32>::new());
    // Only a 1-gram matches: the most recent earlier "4" is followed by 6.
    assert_eq!(draft(&[4, 5, 4, 6, 4], &spec, 2), vec![6, 4]);
    let strict = Speculation {
        min_ngram: 2,
        ..spec
    };
    assert_eq!(draft(&[4, 5, 4, 6, 4], &strict, 2), Vec::<u32>::new());
    assert_eq!(draft(&[], &spec, 4), Vec::<u32>::new());
    assert_eq!(draft(&[7], &spec, 4), Vec::<u32>::new());
}

/// A verifying pass whose drafts outnumber its ids, or that would not fit one pass, is a
/// caller's error: refused with what was asked, exit 2, the session unchanged.
#[test]
fn a_verifying_pass_that_cannot_be_one_pass_is_refused() {
    let engine = open("tiny-k3", None);
    let mut s = engine.new_session(96).unwrap();
    s.feed(&PROMPT).unwrap();
    let before = s.tokens();
    let err = s.feed_verify(&[5, 6], 3).unwrap_err();
    assert!(
        err.to_string()
            .contains("a verifying pass of 2 ids with 3 drafts does not fit one pass of"),
        "{err}"
    );
    assert_eq!(err.exit_code(), 2);
    assert_eq!(s.tokens(), before);
    assert_eq!(s.spec_stats().passes, 0, "a refused pass is not counted");
    // the same session verifies normally afterwards
    let rows = s.feed_verify(&[5, 6], 1).unwrap();
    assert_eq!(rows.len(), 2 * engine.config().vocab_size);
    s.keep_verified(&[6], false).unwrap();
    assert_eq!(s.tokens(), [&before[..], &[5, 6]].concat());
}
