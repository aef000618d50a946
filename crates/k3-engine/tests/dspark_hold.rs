//! The DSpark draft in the engine's own plan (docs/DSPARK.md#memory): under a `--mem-gb`
//! total the draft's weights and context KV are planned beside the model, held BF16 when
//! that fits, quantized (q8, then mxfp4) when only that fits, refused (exit 2, naming the
//! flag) when nothing fits; the generated ids are plain decoding's in every form.

use k3_engine::dspark::DsparkDraft;
use k3_engine::dspark_hold::DraftHold;
use k3_engine::{
    Budget, DecodeMode, Engine, EngineOptions, Sampler, SamplingParams, StopConditions,
};
use k3_format::pack::DraftQuant;
use std::path::PathBuf;

const CTX: usize = 128;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

fn open(total: u64) -> Result<Engine, k3_engine::EngineError> {
    let options = EngineOptions {
        threads: Some(2),
        ctx: CTX,
        budget: Some(Budget::Total(total)),
        draft_model: Some(fixture("tiny-k3-dspark")),
        ..EngineOptions::default()
    };
    Engine::open(&fixture("tiny-k3"), options)
}

/// The smallest `--mem-gb` total whose plan holds a block draft of `bytes` (bisection: a
/// larger total never plans worse).
fn smallest_total(bytes: u64) -> u64 {
    let fits = |total: u64| {
        k3_engine::planning::forecast_block_draft(
            &fixture("tiny-k3"),
            Budget::Total(total),
            CTX,
            1,
            bytes,
        )
        .is_ok_and(|(_, _, fits)| fits.is_ok())
    };
    let (mut lo, mut hi) = (0u64, 1u64 << 32);
    assert!(fits(hi));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid
        } else {
            lo = mid
        }
    }
    hi
}

/// Generated ids with block drafts and plainly, on the same engine.
fn both_ways(engine: &Engine) -> (Vec<u32>, Vec<u32>) {
    let run = |mode| {
        let mut s = engine.new_session(CTX).unwrap();
        let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        s.feed(&[768, 17, 301, 44, 9, 512, 128, 77, 640]).unwrap();
        s.generate_with(24, mode, &mut sampler, &StopConditions::none(), |_| true)
            .unwrap()
            .ids
    };
    (run(DecodeMode::Block(7)), run(DecodeMode::Incremental))
}

#[test]
fn the_draft_is_held_in_the_form_the_budget_allows() {
    let cfg = k3_format::K3Config::load(fixture("tiny-k3/config.json")).unwrap();
    let draft = DsparkDraft::open(&fixture("tiny-k3-dspark"), &cfg).unwrap();
    let kv = draft.context_kv_bytes(CTX, 1);
    assert_eq!(kv, 3 * (32 + 8) * 4 * CTX as u64);
    let bytes = DraftHold::ALL.map(|h| draft.held_weight_bytes(h) + kv);
    assert!(bytes[0] > bytes[1] && bytes[1] > bytes[2], "{bytes:?}");
    let q8 = DraftHold::Quant(DraftQuant::Q8);
    let mxfp4 = DraftHold::Quant(DraftQuant::Mxfp4);
    let cases = [
        (smallest_total(bytes[0]), DraftHold::Bf16),
        (smallest_total(bytes[1]), q8),
        (smallest_total(bytes[2]), mxfp4),
    ];
    for (total, want) in cases {
        let engine = open(total).unwrap();
        let d = engine.dspark().unwrap();
        assert_eq!(d.hold(), want, "total {total}");
        assert_eq!(
            d.weight_bytes() + kv,
            bytes[DraftHold::ALL.iter().position(|h| *h == want).unwrap()]
        );
        let table = engine.plan().unwrap().table(None);
        let row = format!("weights ({}) + context KV", want.name());
        assert!(table.contains(&row), "{table}");
        let (drafted, plain) = both_ways(&engine);
        assert_eq!(drafted, plain, "held as {}", want.name());
    }
    let refused = open(smallest_total(bytes[2]) - 1).err().expect("refused");
    assert_eq!(refused.exit_code(), 2);
    let msg = refused.to_string();
    assert!(msg.contains("does not fit beside the model"), "{msg}");
    assert!(msg.contains("raise --mem-gb"), "{msg}");
    let q8 = format!("q8 {}", k3_plan::plan::fmt_bytes(bytes[1]));
    assert!(msg.contains(&q8), "{msg}");
}

#[test]
fn one_draft_is_held_when_both_are_given() {
    use k3_engine::DraftPolicy;
    let tmp = tempfile::tempdir().unwrap();
    let trunk = tmp.path().join("draft-q8");
    k3_engine::draft::write_draft_trunk(
        &fixture("tiny-k3"),
        &trunk,
        DraftQuant::Q8,
        false,
        &mut |_, _| {},
    )
    .unwrap();
    let open = |policy| {
        let options = EngineOptions {
            threads: Some(2),
            ctx: CTX,
            budget: Some(Budget::Total(1 << 30)),
            draft_model: Some(fixture("tiny-k3-dspark")),
            draft_trunk: Some(trunk.clone()),
            draft_policy: policy,
            ..EngineOptions::default()
        };
        Engine::open(&fixture("tiny-k3"), options).unwrap()
    };
    // `--draft auto`: block drafts, the DSpark draft in the plan, no draft trunk loaded.
    let auto = open(DraftPolicy::Auto);
    assert!(auto.dspark().is_some() && auto.draft_info().is_none());
    let table = auto.plan().unwrap().table(None);
    assert!(table.contains("weights (bf16) + context KV"), "{table}");
    let (drafted, plain) = both_ways(&auto);
    assert_eq!(drafted, plain);
    // `--draft hybrid`: the draft trunk, and no DSpark draft held beside it.
    let hybrid = open(DraftPolicy::On);
    assert!(hybrid.dspark().is_none() && hybrid.draft_info().is_some());
    let table = hybrid.plan().unwrap().table(None);
    assert!(!table.contains("DSpark draft"), "{table}");
    // `--draft off`: neither.
    let off = open(DraftPolicy::Off);
    assert!(off.dspark().is_none() && off.draft_info().is_none());
}
