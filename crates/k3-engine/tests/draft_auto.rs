//! Why `--draft auto` drafts only where the trunk streams (docs/PERFORMANCE.md#speculative-decoding):
//! a verifying pass reads the streamed trunk once for all the tokens it accepts, so accepted
//! drafts cut the trunk bytes of a generation by the passes they save; with every layer pinned
//! no pass reads the trunk and a draft has nothing to save. Byte counters, not timings: the
//! same bytes on every machine.

use k3_engine::planning::budget_extremes;
use k3_engine::{
    Budget, DecodeMode, Engine, EngineOptions, Sampler, Speculation, StopConditions, StoreStats,
};
use std::path::PathBuf;

const PROMPT: [u32; 6] = [403, 17, 600, 5, 99, 250];
const TOKENS: usize = 24;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3")
}

fn open(budget: Budget) -> Engine {
    let options = EngineOptions {
        threads: Some(2),
        budget: Some(budget),
        ctx: 64,
        ..EngineOptions::default()
    };
    Engine::open(&dir(), options).unwrap()
}

/// Greedy ids and the I/O of generating them (after the prompt): one token per pass, or with
/// a drafter that always drafts the right continuation `truth`.
fn generate(engine: &Engine, truth: Option<&[u32]>) -> (Vec<u32>, StoreStats) {
    let mut s = engine.new_session(64).unwrap();
    s.feed(&PROMPT).unwrap();
    let mut sampler = Sampler::greedy();
    let none = StopConditions::none();
    let before = engine.stats();
    let g = match truth {
        None => s.generate_with(TOKENS, DecodeMode::Incremental, &mut sampler, &none, |_| {
            true
        }),
        Some(truth) => {
            let drafter = |ctx: &[u32], limit: usize| -> Vec<u32> {
                truth[ctx.len()..(ctx.len() + limit).min(truth.len())].to_vec()
            };
            s.generate_with_drafter(TOKENS, &mut sampler, &none, drafter, |_| true)
        }
    }
    .unwrap();
    if truth.is_some() {
        let st = s.spec_stats();
        assert!(
            st.drafted > 0 && st.accepted == st.drafted,
            "every draft right: {st:?}"
        );
    }
    (g.ids, engine.stats().since(&before))
}

/// Both runs' ids and I/O at `budget`, the drafted one checked to give the plain one's ids.
fn plain_and_drafted(budget: Budget) -> (Engine, StoreStats, StoreStats) {
    let engine = open(budget);
    let (ids, plain) = generate(&engine, None);
    let mut truth = PROMPT.to_vec();
    truth.extend(&ids);
    let (drafted_ids, drafted) = generate(&engine, Some(&truth));
    assert_eq!(drafted_ids, ids, "drafting changed the ids");
    (engine, plain, drafted)
}

#[test]
fn accepted_drafts_save_trunk_reads_where_the_trunk_streams() {
    let (smallest, _) = budget_extremes(&dir()).unwrap();
    let (engine, plain, drafted) = plain_and_drafted(smallest);
    let streamed = engine.plan().unwrap().trunk.streamed_per_token;
    assert!(streamed > 0, "the smallest legal budget streams the trunk");
    assert!(plain.trunk_bytes_read > 0 && drafted.trunk_bytes_read > 0);
    // Every pass binds each layer once and reads the same streamed bytes; drafting only
    // changes how many passes there are.
    assert_eq!(
        plain.trunk_bytes_read * drafted.trunk_binds,
        drafted.trunk_bytes_read * plain.trunk_binds,
        "trunk bytes per bind differ: plain {plain:?}, drafted {drafted:?}"
    );
    // A pass verifies as many drafts as the plan's prefill chunk leaves room for (the
    // smallest budget's chunk is small): here about half the passes, half the trunk bytes.
    assert!(
        5 * drafted.trunk_bytes_read <= 3 * plain.trunk_bytes_read,
        "trunk bytes: drafted {} vs plain {}",
        drafted.trunk_bytes_read,
        plain.trunk_bytes_read
    );
    assert_eq!(
        engine.auto_decode_mode(),
        DecodeMode::Speculative(Speculation::default())
    );
}

#[test]
fn with_every_layer_pinned_drafts_save_no_read_and_auto_stays_plain() {
    let (_, everything) = budget_extremes(&dir()).unwrap();
    let (engine, plain, drafted) = plain_and_drafted(everything);
    assert_eq!(engine.plan().unwrap().trunk.streamed_per_token, 0);
    assert_eq!((plain.trunk_bytes_read, drafted.trunk_bytes_read), (0, 0));
    assert_eq!(engine.auto_decode_mode(), DecodeMode::Incremental);
}
