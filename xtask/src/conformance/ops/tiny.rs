//! End-to-end check of the whole engine (`k3-format` loading + `k3-model` forward) on k3's own
//! tiny checkpoints (`fixtures/tiny-k3*`, written by `tools/reference`): teacher-forced argmax
//! at every prompt position, last-position logits within `abs + rel·max|ref|`, and 16 greedy
//! ids by incremental decode and by full recompute — ids exact. Every expectation comes from
//! the float64 reference, none from contract v2's bits: each holds in every numeric mode.

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

/// What the model check measured on one tiny checkpoint, whether it passed or not (the
/// figures of docs/NUMERICS.md#numeric-mode-fast's table under `--numerics`).
pub struct Figures {
    /// Cases in `expected.json`.
    pub cases: usize,
    /// Worst `|logit − reference| / tolerance` over every case's last-position logits.
    pub worst: f64,
    /// Cases whose teacher-forced argmax all equal the reference's.
    pub tf_cases: usize,
    /// Teacher-forced argmax positions equal to the reference's, of all positions.
    pub tf_ids: (usize, usize),
    /// Cases whose greedy ids all equal the reference's, by incremental decode and recompute.
    pub greedy_cases: usize,
    /// Greedy ids equal to the reference's up to the first difference, by incremental decode
    /// and by recompute, of all.
    pub greedy_ids: (usize, usize),
    /// The first failure, in the order the check runs.
    pub failure: Option<String>,
}

impl Figures {
    /// The check's one-line summary, or its first failure.
    pub fn verdict(&self) -> R<String> {
        match &self.failure {
            Some(why) => Err(why.clone()),
            None => Ok(format!(
                "{} cases: tf argmax + {} greedy ids exact (incremental and recompute), logits worst ratio {:.4}",
                self.cases, 16, self.worst
            )),
        }
    }
}

/// Runs every case of `dir/expected.json` to the end, recording the first failure.
pub fn measure(dir: &Path) -> R<Figures> {
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
    let (mut worst, mut tf_n, mut greedy_n) = (0f64, (0, 0), (0, 0));
    let (mut tf_cases, mut greedy_cases) = (0, 0);
    let mut failure = None;
    let mut fail = |why: String| {
        failure.get_or_insert(why);
    };
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
        tf_n.0 += got_tf.iter().zip(&tf).filter(|(g, w)| g == w).count();
        tf_n.1 += tf.len();
        if got_tf == tf {
            tf_cases += 1;
        } else {
            fail(format!(
                "{name}: teacher-forced argmax {got_tf:?} != {tf:?}"
            ));
        }
        let max_ref = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let tol = abs + rel * max_ref;
        for (i, (&g, &w)) in s.logits().iter().zip(&want).enumerate() {
            let ratio = (g as f64 - w).abs() / tol;
            worst = worst.max(ratio);
            if ratio > 1.0 {
                fail(format!(
                    "{name}: logit {i} = {g}, reference {w}: {ratio:.2}× tolerance"
                ));
            }
        }
        let mut exact = true;
        for mode in [DecodeMode::Incremental, DecodeMode::Recompute] {
            let mut s = engine
                .new_session(prompt.len() + greedy.len())
                .map_err(|e| e.to_string())?;
            s.feed(&prompt).map_err(|e| e.to_string())?;
            let got = s
                .generate(greedy.len(), mode, |_| true)
                .map_err(|e| e.to_string())?;
            greedy_n.0 += got.iter().zip(&greedy).take_while(|(g, w)| g == w).count();
            greedy_n.1 += greedy.len();
            if got != greedy {
                exact = false;
                fail(format!("{name}: greedy ({mode:?}) {got:?} != {greedy:?}"));
            }
        }
        greedy_cases += usize::from(exact);
    }
    Ok(Figures {
        cases: cases.len(),
        worst,
        tf_cases,
        tf_ids: tf_n,
        greedy_cases,
        greedy_ids: greedy_n,
        failure,
    })
}
