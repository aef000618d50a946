//! DSpark block drafts (docs/DSPARK.md) on tiny-k3 with fixtures/tiny-k3-dspark: the draft's
//! logits, proposals and confidences against the float64 reference's expected.json, and
//! generation with block drafts giving exactly the ids of plain decoding (greedy and
//! sampled, every draft budget, 1 and 2 threads, resident and streaming).

use k3_engine::{
    Budget, DecodeMode, Engine, EngineOptions, Sampler, SamplingParams, StopConditions,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

fn open(draft: &Path, threads: usize, budget: Option<Budget>) -> Engine {
    let options = EngineOptions {
        threads: Some(threads),
        ctx: 128,
        budget,
        draft_model: Some(draft.to_path_buf()),
        ..EngineOptions::default()
    };
    Engine::open(&fixture("tiny-k3"), options).unwrap()
}

fn expected(fixture_dir: &str) -> Value {
    let text = std::fs::read_to_string(fixture(fixture_dir).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A draft directory holding tiny-k3-dspark's weights and the files of the `variant`
/// fixture (its config.json, any extra shard), as tools/reference/make_dspark_fixture.py
/// computed the variant's expected.json.
fn assemble(variant: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("tiny-k3-dspark/model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    for entry in std::fs::read_dir(fixture(variant)).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() != "expected.json" {
            std::fs::copy(&path, tmp.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    tmp
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The block after the context of `fixture_dir`'s expected.json, checked against its
/// `stream` case.
///
/// Tolerance, as the tiny-model tests' (`1e-4·max|ref| + 1e-5` per logit): the engine runs
/// in f32 (bf16 weights widened exactly, f64 only inside dot products and norms) through 13
/// target layers, the context projection and 3 draft layers; f32 rounding (2^-24 relative
/// per op) compounded over a few hundred sequential ops stays near 1e-5 relative, so 1e-4
/// of the largest logit leaves 10× headroom while still catching any wrong term (a
/// misplaced norm, RoPE pair, tap or Markov row moves logits by O(0.1–1)). Proposals are
/// compared exactly: every row's top1−top2 margin is ≥ 0.099 (each expected.json's `min_margin`).
fn check_block(draft: &Path, fixture_dir: &str, stream: &str) {
    let doc = expected(fixture_dir);
    let case = &doc["streams"][stream];
    let engine = open(draft, 2, None);
    let mut s = engine.new_session(64).unwrap();
    s.feed(&u32s(&doc["context"])).unwrap();
    let block = s
        .dspark_block(doc["anchor"].as_u64().unwrap() as u32)
        .unwrap();
    assert_eq!(block.ids, u32s(&case["proposed"]), "{stream}: proposals");
    let want: Vec<f64> = case["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
        .collect();
    assert_eq!(block.logits.len(), want.len());
    let max = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    let tol = 1e-4 * max + 1e-5;
    let worst = block
        .logits
        .iter()
        .zip(&want)
        .map(|(&g, &w)| (g as f64 - w).abs())
        .fold(0f64, f64::max);
    assert!(
        worst <= tol,
        "{stream}: worst logit error {worst:e} > {tol:e}"
    );
    for (g, w) in block
        .confidence
        .iter()
        .zip(case["confidence"].as_array().unwrap())
    {
        let w = w.as_f64().unwrap();
        assert!(
            (*g as f64 - w).abs() <= 1e-5,
            "{stream}: confidence {g} vs {w}"
        );
    }
    assert_eq!(block.confidence.len(), 7);
}

#[test]
fn block_matches_the_reference_on_the_attn_res_stream() {
    check_block(&fixture("tiny-k3-dspark"), "tiny-k3-dspark", "attn_res");
}

/// DeepSeek YaRN RoPE (docs/DSPARK.md#rope): the same weights, rope_scaling `yarn` with
/// factor 8, mscale 0.707, mscale_all_dim 1 (logits move up to 1.9 from the plain-RoPE
/// draft's, far outside the tolerance).
#[test]
fn block_matches_the_reference_with_yarn_rope() {
    let dir = assemble("tiny-k3-dspark-yarn");
    check_block(dir.path(), "tiny-k3-dspark-yarn", "attn_res");
}

/// `fc_norm: true`: per-tap RMSNorm gains (`fc_norm.{i}.weight`, an extra shard) before
/// `context_proj` (logits move up to 2.6 from the base draft's).
#[test]
fn block_matches_the_reference_with_fc_norm() {
    let dir = assemble("tiny-k3-dspark-fcnorm");
    check_block(dir.path(), "tiny-k3-dspark-fcnorm", "attn_res");
}

#[test]
fn block_matches_the_reference_on_the_prefix_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("tiny-k3-dspark");
    std::fs::copy(
        src.join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
    let cfg = cfg.replace(
        "\"aux_hidden_stream\": \"attn_res\"",
        "\"aux_hidden_stream\": \"prefix\"",
    );
    assert!(cfg.contains("\"prefix\""));
    std::fs::write(tmp.path().join("config.json"), cfg).unwrap();
    check_block(tmp.path(), "tiny-k3-dspark", "prefix");
}

const PROMPT: [u32; 9] = [768, 17, 301, 44, 9, 512, 128, 77, 640];
const MORE: [u32; 3] = [3, 250, 199];

fn seeded() -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
        seed: 7,
        ..SamplingParams::default()
    }
}

/// Two generations of one conversation; returns every id and the session's passes.
fn conversation(engine: &Engine, mode: DecodeMode, params: &SamplingParams) -> (Vec<u32>, u64) {
    let mut s = engine.new_session(128).unwrap();
    let stop = StopConditions::none();
    let mut sampler = Sampler::new(params.clone()).unwrap();
    s.feed(&PROMPT).unwrap();
    let mut ids = s
        .generate_with(20, mode, &mut sampler, &stop, |_| true)
        .unwrap()
        .ids;
    s.feed(&MORE).unwrap();
    ids.extend(
        s.generate_with(17, mode, &mut sampler, &stop, |_| true)
            .unwrap()
            .ids,
    );
    if let DecodeMode::Block(_) = mode {
        let passes = s.block_passes().expect("block passes recorded");
        assert!(!passes.is_empty());
        let kept: usize = passes.iter().map(|p| p.kept).sum();
        assert_eq!(
            kept as u64,
            s.spec_stats().accepted,
            "kept = accepted drafts"
        );

        for p in passes {
            assert_eq!((p.proposed.len(), p.confidence.len()), (7, 7));
            assert!(p.kept <= p.verified && p.verified <= 7);
        }
    }
    (ids, s.spec_stats().passes)
}

#[test]
fn block_drafts_give_the_ids_of_plain_decoding() {
    let draft = fixture("tiny-k3-dspark");
    for threads in [1, 2] {
        let engine = open(&draft, threads, None);
        for params in [SamplingParams::greedy(), seeded()] {
            let (plain, _) = conversation(&engine, DecodeMode::Incremental, &params);
            for max in [1, 3, 7] {
                let (ids, _) = conversation(&engine, DecodeMode::Block(max), &params);
                assert_eq!(ids, plain, "threads {threads}, draft max {max}, {params:?}");
            }
        }
    }
}

#[test]
fn yarn_and_fc_norm_drafts_give_the_ids_of_plain_decoding() {
    for variant in ["tiny-k3-dspark-yarn", "tiny-k3-dspark-fcnorm"] {
        let dir = assemble(variant);
        let engine = open(dir.path(), 2, None);
        for params in [SamplingParams::greedy(), seeded()] {
            let (plain, _) = conversation(&engine, DecodeMode::Incremental, &params);
            let (ids, _) = conversation(&engine, DecodeMode::Block(7), &params);
            assert_eq!(ids, plain, "{variant}, {params:?}");
        }
    }
}

#[test]
fn block_drafts_give_the_same_ids_while_streaming() {
    let draft = fixture("tiny-k3-dspark");
    let (smallest, _) = k3_engine::planning::budget_extremes(&fixture("tiny-k3")).unwrap();
    let resident = open(&draft, 2, None);
    let streaming = open(&draft, 2, Some(smallest));
    for params in [SamplingParams::greedy(), seeded()] {
        let (plain, _) = conversation(&resident, DecodeMode::Incremental, &params);
        let (ids, _) = conversation(&streaming, DecodeMode::Block(7), &params);
        assert_eq!(ids, plain, "{params:?}");
    }
}

/// With proposals replaced by the true continuation (probability p), most drafts are
/// accepted: the ids are still those of plain decoding, and every pass's confidences —
/// computed from context rows kept across passes, rollbacks and re-fed positions — equal
/// bit for bit those of the same block computed from scratch.
#[test]
fn accepted_block_drafts_keep_the_ids_and_the_draft_context() {
    let draft = fixture("tiny-k3-dspark");
    let engine = open(&draft, 2, None);
    for params in [SamplingParams::greedy(), seeded()] {
        let stop = StopConditions::none();
        let mut plain = engine.new_session(128).unwrap();
        let mut sampler = Sampler::new(params.clone()).unwrap();
        plain.feed(&PROMPT).unwrap();
        plain
            .generate_with(30, DecodeMode::Incremental, &mut sampler, &stop, |_| true)
            .unwrap();
        let truth = plain.tokens();
        for p in [0.6, 0.95] {
            let mut s = engine.new_session(128).unwrap();
            s.set_block_truth(truth.clone(), p, 5).unwrap();
            let mut sampler = Sampler::new(params.clone()).unwrap();
            s.feed(&PROMPT).unwrap();
            s.generate_with(30, DecodeMode::Block(7), &mut sampler, &stop, |_| true)
                .unwrap();
            assert_eq!(s.tokens(), truth, "p {p}, {params:?}");
            let st = s.spec_stats();
            // independent replacement: a run of k accepted drafts has probability p^k
            assert!(st.accepted >= 8, "p {p}: {st:?}");
            assert!(p < 0.9 || st.accepted * 2 > st.drafted, "p {p}: {st:?}");
            assert!(st.rollbacks > 0, "p {p}: some pass must reject: {st:?}");
            for pass in s.block_passes().unwrap() {
                let mut fresh = engine.new_session(128).unwrap();
                fresh.feed(&truth[..pass.position - 1]).unwrap();
                let block = fresh.dspark_block(truth[pass.position - 1]).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&block.confidence),
                    bits(&pass.confidence),
                    "pass at {}",
                    pass.position
                );
            }
        }
    }
}

/// Tapping the target's hidden streams changes no bit of its logits.
#[test]
fn taps_leave_the_target_logits_unchanged() {
    let plain = Engine::open(
        &fixture("tiny-k3"),
        EngineOptions {
            threads: Some(2),
            ctx: 64,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let tapped = open(&fixture("tiny-k3-dspark"), 2, None);
    let mut a = plain.new_session(64).unwrap();
    let mut b = tapped.new_session(64).unwrap();
    let all_a = a.feed_all_logits(&PROMPT).unwrap();
    let all_b = b.feed_all_logits(&PROMPT).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&all_a), bits(&all_b));
}

/// A batch of one is the session's own feed: same logits, and the taps kept, so a session
/// the server feeds alone drafts the same block; a real batch keeps no taps (no draft).
#[test]
fn a_batch_of_one_keeps_the_draft_context_and_a_batch_of_two_does_not() {
    let doc = expected("tiny-k3-dspark");
    let (context, anchor) = (
        u32s(&doc["context"]),
        doc["anchor"].as_u64().unwrap() as u32,
    );
    let engine = open(&fixture("tiny-k3-dspark"), 2, None);
    let mut alone = engine.new_session(64).unwrap();
    alone.feed(&context).unwrap();
    let mut batched = engine.new_session(64).unwrap();
    engine
        .feed_batch(&mut [k3_engine::BatchFeed {
            session: &mut batched,
            ids: &context,
        }])
        .unwrap();
    assert_eq!(batched.logits(), alone.logits());
    let want = alone.dspark_block(anchor).unwrap();
    assert_eq!(batched.dspark_block(anchor).unwrap().ids, want.ids);
    assert_eq!(
        batched.propose_block(&[anchor], 7).len(),
        alone.propose_block(&[anchor], 7).len()
    );
    let (mut a, mut b) = (
        engine.new_session(64).unwrap(),
        engine.new_session(64).unwrap(),
    );
    engine
        .feed_batch(&mut [
            k3_engine::BatchFeed {
                session: &mut a,
                ids: &context,
            },
            k3_engine::BatchFeed {
                session: &mut b,
                ids: &context,
            },
        ])
        .unwrap();
    assert_eq!(a.logits(), alone.logits());
    assert!(
        a.dspark_block(anchor).is_err(),
        "a batched pass records no taps"
    );
    assert!(a.propose_block(&[anchor], 7).is_empty());
}
