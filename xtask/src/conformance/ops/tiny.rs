//! End-to-end check of the whole engine (`k3-format` loading + `k3-model` forward) on k3's own
//! tiny checkpoints (`fixtures/tiny-k3*`, written by `tools/reference`): teacher-forced argmax
//! at every prompt position, last-position logits within `abs + rel·max|ref|`, and 16 greedy
//! ids by incremental decode and by full recompute — ids exact.

use super::fixture::R;
use k3_engine::{argmax, DecodeMode, Engine, EngineOptions};
use serde_json::Value;
use std::path::Path;

fn ids(v: &Value) -> R<Vec<u32>> {
    v.as_array()
        .ok_or("expected an id array")?
        .iter()
        .map(|x| {
            x.as_u64()
                .map(|i| i as u32)
                .ok_or_else(|| "non-integer id".to_string())
        })
        .collect()
}

/// Runs every case of `dir/expected.json`; returns a one-line summary or the first failure.
pub fn check(dir: &Path) -> R<String> {
    let text = std::fs::read_to_string(dir.join("expected.json"))
        .map_err(|e| format!("expected.json: {e}"))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("expected.json: {e}"))?;
    let rel = doc["tolerance"]["logits_rel_to_max"]
        .as_f64()
        .ok_or("no rel tolerance")?;
    let abs = doc["tolerance"]["logits_abs"]
        .as_f64()
        .ok_or("no abs tolerance")?;
    let engine = Engine::open(dir, EngineOptions::default()).map_err(|e| e.to_string())?;
    let vocab = engine.config().vocab_size;
    let cases = doc["cases"].as_array().ok_or("no cases")?;
    let mut worst = 0f64;
    for c in cases {
        let name = c["name"].as_str().unwrap_or("?");
        let prompt = ids(&c["prompt_ids"])?;
        let greedy = ids(&c["greedy_ids"])?;
        let tf = ids(&c["tf_argmax"])?;
        let want: Vec<f64> = c["last_logits"]
            .as_array()
            .ok_or("no logits")?
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        let mut s = engine
            .new_session(prompt.len() + greedy.len())
            .map_err(|e| e.to_string())?;
        let all = s.feed_all_logits(&prompt).map_err(|e| e.to_string())?;
        let got_tf: Vec<u32> = all.chunks(vocab).map(argmax).collect();
        if got_tf != tf {
            return Err(format!(
                "{name}: teacher-forced argmax {got_tf:?} != {tf:?}"
            ));
        }
        let max_ref = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let tol = abs + rel * max_ref;
        for (i, (&g, &w)) in s.logits().iter().zip(&want).enumerate() {
            let ratio = (g as f64 - w).abs() / tol;
            worst = worst.max(ratio);
            if ratio > 1.0 {
                return Err(format!(
                    "{name}: logit {i} = {g}, reference {w}: {ratio:.2}× tolerance"
                ));
            }
        }
        for mode in [DecodeMode::Incremental, DecodeMode::Recompute] {
            let mut s = engine
                .new_session(prompt.len() + greedy.len())
                .map_err(|e| e.to_string())?;
            s.feed(&prompt).map_err(|e| e.to_string())?;
            let got = s
                .generate(greedy.len(), mode, |_| true)
                .map_err(|e| e.to_string())?;
            if got != greedy {
                return Err(format!("{name}: greedy ({mode:?}) {got:?} != {greedy:?}"));
            }
        }
    }
    Ok(format!(
        "{} cases: tf argmax + {} greedy ids exact (incremental and recompute), logits worst ratio {worst:.4}",
        cases.len(),
        16
    ))
}
