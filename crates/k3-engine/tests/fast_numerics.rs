//! Numeric mode `fast` (docs/NUMERICS.md#numeric-mode-fast) on the committed tiny checkpoints,
//! in a test binary of its own because the mode is process-wide. On every machine, on the
//! emulated tiles (`set_numerics_emulated`): the mode's logits stay within the oracle
//! tolerance of the float64 reference (`expected.json`), its teacher-forced argmax and
//! greedy ids are the reference's, and its logits are bit-identical across thread counts,
//! budgets (everything resident vs the smallest), prefill chunkings and one-pass vs
//! token-by-token feeding. Where AMX runs, the hardware tiles give the emulation's logits bit
//! for bit; elsewhere `set_numerics` refuses the mode.

use k3_engine::planning::budget_extremes;
use k3_engine::{argmax, Budget, DecodeMode, Engine, EngineOptions};

#[path = "support/trace.rs"]
mod support;
use k3_kernels::fast::{amx_usable, numerics, set_numerics, set_numerics_emulated, Numerics};
use serde_json::Value;
use std::path::PathBuf;
use support::trace;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

fn open(name: &str, threads: usize, budget: Option<Budget>, chunk: Option<usize>) -> Engine {
    let options = EngineOptions {
        threads: Some(threads),
        budget,
        max_prefill_chunk: chunk,
        ..EngineOptions::default()
    };
    Engine::open(&dir(name), options).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The worst `|logit − reference| / tolerance` over the cases (≤ 1 passes), after checking
/// the ids.
fn oracle_ratio(name: &str) -> f64 {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(dir(name).join("expected.json")).unwrap())
            .unwrap();
    let rel = doc["tolerance"]["logits_rel_to_max"].as_f64().unwrap();
    let abs = doc["tolerance"]["logits_abs"].as_f64().unwrap();
    let engine = open(name, 2, None, None);
    let vocab = engine.config().vocab_size;
    let mut worst = 0f64;
    for case in doc["cases"].as_array().unwrap() {
        let (prompt, greedy) = (ids(&case["prompt_ids"]), ids(&case["greedy_ids"]));
        let mut s = engine.new_session(prompt.len() + greedy.len()).unwrap();
        let all = s.feed_all_logits(&prompt).unwrap();
        let tf: Vec<u32> = all.chunks(vocab).map(argmax).collect();
        assert_eq!(
            tf,
            ids(&case["tf_argmax"]),
            "{name}: teacher-forced argmax under fast"
        );
        let want: Vec<f64> = case["last_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let tol = rel * want.iter().fold(0f64, |m, v| m.max(v.abs())) + abs;
        for (g, w) in s.logits().iter().zip(&want) {
            worst = worst.max((*g as f64 - w).abs() / tol);
        }
        let got = s
            .generate(greedy.len(), DecodeMode::Incremental, |_| true)
            .unwrap();
        assert_eq!(got, greedy, "{name}: greedy ids under fast");
    }
    worst
}

#[test]
fn fast_mode_meets_the_oracle_and_keeps_its_bits_everywhere() {
    if amx_usable() {
        eprintln!("AMX-BF16 usable: the hardware tiles are checked against the emulation");
    } else {
        let err = set_numerics(Numerics::FAST).unwrap_err();
        assert!(err.to_string().contains("AMX"), "{err}");
        assert_eq!(numerics(), Numerics::V2, "a refused switch changes nothing");
    }
    let prompt: Vec<u32> = vec![403, 17, 600, 5, 88, 1021, 7, 300, 12, 9, 450];
    for name in ["tiny-k3", "tiny-k3-wide"] {
        set_numerics(Numerics::V2).unwrap();
        let v2 = trace(&open(name, 2, None, None), &prompt, true);
        set_numerics_emulated(Numerics::FAST).unwrap();
        let ratio = oracle_ratio(name);
        eprintln!("{name}: fast mode's worst logit error / oracle tolerance = {ratio:.4}");
        assert!(
            ratio <= 1.0,
            "{name}: fast mode leaves the oracle tolerance ({ratio})"
        );
        let base = trace(&open(name, 2, None, None), &prompt, true);
        assert_ne!(base, v2, "{name}: the fast mode's bits are not v2's");
        let smallest = budget_extremes(&dir(name)).unwrap().0;
        assert_eq!(
            base,
            trace(&open(name, 1, None, None), &prompt, true),
            "{name}: 1 thread"
        );
        assert_eq!(
            base,
            trace(&open(name, 3, None, None), &prompt, true),
            "{name}: 3 threads"
        );
        assert_eq!(
            base,
            trace(&open(name, 2, Some(smallest), None), &prompt, true),
            "{name}: smallest budget"
        );
        assert_eq!(
            base,
            trace(&open(name, 2, None, Some(3)), &prompt, true),
            "{name}: prefill chunks of 3"
        );
        assert_eq!(
            base,
            trace(&open(name, 2, None, None), &prompt, false),
            "{name}: token by token"
        );
        if amx_usable() {
            set_numerics(Numerics::FAST).unwrap();
            assert_eq!(
                base,
                trace(&open(name, 2, None, None), &prompt, true),
                "{name}: AMX vs emulated tiles"
            );
            assert_eq!(
                base,
                trace(&open(name, 2, Some(smallest), Some(3)), &prompt, true),
                "{name}: AMX, smallest budget, chunks of 3"
            );
            let hw_ratio = oracle_ratio(name);
            assert_eq!(hw_ratio, ratio, "{name}: AMX oracle ratio");
        }
    }
    set_numerics(Numerics::V2).unwrap();
}
