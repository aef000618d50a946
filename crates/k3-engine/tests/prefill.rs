//! Prefill in planner-sized chunks: any chunk size gives the same logits as one pass, a
//! prompt that fits one chunk reads the unpinned trunk exactly once, and progress comes from
//! the engine layer by layer (not from chunking).

use k3_engine::planning::budget_extremes;
use k3_engine::{Budget, Engine, EngineOptions, FeedProgress};
use k3_format::K3Config;
use k3_model::scratch::Scratch;
use k3_model::Dims;
use k3_plan::plan::RELEASED_PREFILL_BYTES_PER_TOKEN;
use std::path::PathBuf;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

/// 40 ids of the tiny vocabulary (no specials), deterministic.
fn prompt() -> Vec<u32> {
    (0..40u32).map(|i| (i * 197 + 31) % 700).collect()
}

fn open(budget: Option<Budget>, max_chunk: Option<usize>) -> Engine {
    let options = EngineOptions {
        threads: Some(2),
        budget,
        ctx: 64,
        max_prefill_chunk: max_chunk,
        ..EngineOptions::default()
    };
    Engine::open(&dir("tiny-k3"), options).unwrap()
}

/// The smallest trunk budget (the trunk streams) with a 64 MB expert-cache budget (every
/// expert fits; an eighth of the budget holds the scratch of the whole 64-position context).
fn streaming() -> Budget {
    match budget_extremes(&dir("tiny-k3")).unwrap().0 {
        Budget::Split { trunk, .. } => Budget::Split {
            trunk,
            cache: 64 << 20,
        },
        other => panic!("the smallest budget is a split: {other:?}"),
    }
}

#[test]
fn released_prefill_estimate_matches_the_model() {
    let dims = Dims::new(&K3Config::released()).unwrap();
    assert_eq!(
        Scratch::bytes_per_token(&dims),
        RELEASED_PREFILL_BYTES_PER_TOKEN
    );
}

#[test]
fn every_chunk_size_gives_the_logits_of_one_pass() {
    let one_pass = open(None, None);
    let mut s = one_pass.new_session(64).unwrap();
    let all = s.feed_all_logits(&prompt()).unwrap();
    let mut s = one_pass.new_session(64).unwrap();
    s.feed(&prompt()).unwrap();
    let last = s.logits().to_vec();
    for chunk in [1, 7, 16, 39] {
        for budget in [None, Some(streaming())] {
            let engine = open(budget, Some(chunk));
            assert_eq!(engine.prefill_chunk(), chunk);
            let mut s = engine.new_session(64).unwrap();
            assert_eq!(s.feed_all_logits(&prompt()).unwrap(), all, "chunk {chunk}");
            let mut s = engine.new_session(64).unwrap();
            s.feed(&prompt()).unwrap();
            assert_eq!(s.logits(), &last[..], "chunk {chunk}, last row");
            assert_eq!(s.tokens(), prompt());
        }
    }
}

/// Trunk bytes read while feeding `ids` (the pinned reads at open excluded).
fn trunk_bytes_of_feed(engine: &Engine, ids: &[u32]) -> u64 {
    let before = engine.stats().trunk_bytes_read;
    let mut s = engine.new_session(64).unwrap();
    s.feed(ids).unwrap();
    engine.stats().trunk_bytes_read - before
}

#[test]
fn a_prompt_within_the_chunk_streams_the_trunk_once() {
    let engine = open(Some(streaming()), None);
    let plan = engine.plan().unwrap().clone();
    assert!(
        plan.prefill_chunk >= prompt().len() as u64,
        "the tiny model's plan chunk covers the prompt: {}",
        plan.prefill_chunk
    );
    // One pass: what a one-token call reads on a fresh engine.
    let per_pass = trunk_bytes_of_feed(&open(Some(streaming()), None), &prompt()[..1]);
    assert!(per_pass > 0, "the smallest trunk budget streams the trunk");
    assert_eq!(trunk_bytes_of_feed(&engine, &prompt()), per_pass);
    // Four chunks of 10: four passes.
    let engine = open(Some(streaming()), Some(10));
    assert_eq!(trunk_bytes_of_feed(&engine, &prompt()), 4 * per_pass);
}

#[test]
fn progress_reports_every_layer_of_every_chunk() {
    let engine = open(Some(streaming()), Some(16));
    let mut s = engine.new_session(64).unwrap();
    let mut seen: Vec<FeedProgress> = Vec::new();
    s.feed_with_progress(&prompt(), &mut |p| seen.push(p))
        .unwrap();
    let layers = engine.config().num_hidden_layers;
    assert_eq!(seen.len(), 3 * layers, "chunks of 16, 16, 8");
    assert_eq!(seen[0].chunk, 16);
    assert_eq!(seen[2 * layers].tokens_done, 32);
    assert_eq!(seen[2 * layers].chunk, 8);
    assert!(seen.windows(2).all(|w| w[0].fraction() < w[1].fraction()));
    assert_eq!(seen.last().unwrap().fraction(), 1.0);
}
