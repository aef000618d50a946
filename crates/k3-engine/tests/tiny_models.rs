//! Gates on the committed tiny checkpoints (`fixtures/tiny-k3`, `fixtures/tiny-k3-wide`),
//! whose `expected.json` comes from the float64 numpy reference (`tools/reference`):
//! teacher-forced argmax at every prompt position, greedy ids (incremental and recompute),
//! last-position logits within `1e-4·max|ref| + 1e-5`, and bit-identical logits across thread
//! counts and kernel paths.

use k3_engine::{argmax, DecodeMode, Engine, EngineOptions};

#[path = "support/trace.rs"]
mod support;
use serde_json::Value;
use std::path::PathBuf;
use support::trace;

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

struct Case {
    name: String,
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    tf_argmax: Vec<u32>,
    last_logits: Vec<f64>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn load_cases(name: &str) -> (Vec<Case>, f64, f64) {
    let text =
        std::fs::read_to_string(model_dir(name).join("expected.json")).expect("expected.json");
    let doc: Value = serde_json::from_str(&text).expect("expected.json parses");
    let rel = doc["tolerance"]["logits_rel_to_max"]
        .as_f64()
        .expect("rel tolerance");
    let abs = doc["tolerance"]["logits_abs"]
        .as_f64()
        .expect("abs tolerance");
    let cases = doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().expect("name").to_string(),
            prompt: ids(&c["prompt_ids"]),
            greedy: ids(&c["greedy_ids"]),
            tf_argmax: ids(&c["tf_argmax"]),
            last_logits: c["last_logits"]
                .as_array()
                .expect("logits")
                .iter()
                .map(|x| x.as_f64().expect("f"))
                .collect(),
        })
        .collect();
    (cases, rel, abs)
}

fn open(name: &str, threads: usize) -> Engine {
    Engine::open(
        &model_dir(name),
        EngineOptions {
            threads: Some(threads),
            ..EngineOptions::default()
        },
    )
    .expect("tiny model opens")
}

fn teacher_forcing_and_logits(name: &str) {
    let engine = open(name, 2);
    let (cases, rel, abs) = load_cases(name);
    assert!(
        cases.len() >= 3,
        "{name}: expected.json has {} cases",
        cases.len()
    );
    let vocab = engine.config().vocab_size;
    for case in &cases {
        let mut s = engine.new_session(case.prompt.len()).unwrap();
        let all = s.feed_all_logits(&case.prompt).unwrap();
        let got: Vec<u32> = all.chunks(vocab).map(argmax).collect();
        assert_eq!(
            got, case.tf_argmax,
            "{name}/{}: teacher-forced argmax",
            case.name
        );
        let last = s.logits();
        let max_ref = case.last_logits.iter().fold(0f64, |m, v| m.max(v.abs()));
        let tol = rel * max_ref + abs;
        for (i, (&g, &w)) in last.iter().zip(&case.last_logits).enumerate() {
            let err = (g as f64 - w).abs();
            assert!(
                err <= tol,
                "{name}/{}: logit {i}: got {g}, want {w}, err {err:e} > tol {tol:e}",
                case.name
            );
        }
        // Prefill in one pass gives the same last logits, bit for bit, as the teacher-forced run.
        let mut p = engine.new_session(case.prompt.len()).unwrap();
        p.feed(&case.prompt).unwrap();
        assert_eq!(
            p.logits(),
            last,
            "{name}/{}: prefill vs teacher forcing",
            case.name
        );
    }
}

fn greedy(name: &str, mode: DecodeMode) {
    let engine = open(name, 2);
    let (cases, _, _) = load_cases(name);
    for case in &cases {
        let mut s = engine
            .new_session(case.prompt.len() + case.greedy.len())
            .unwrap();
        s.feed(&case.prompt).unwrap();
        let got = s.generate(case.greedy.len(), mode, |_| true).unwrap();
        assert_eq!(
            got, case.greedy,
            "{name}/{}: greedy ids ({mode:?})",
            case.name
        );
    }
}

fn bit_identical_across_threads_and_paths(name: &str) {
    let (cases, _, _) = load_cases(name);
    let prompt = &cases.iter().max_by_key(|c| c.prompt.len()).unwrap().prompt;
    let one = trace(&open(name, 1), prompt, true);
    let two = trace(&open(name, 2), prompt, true);
    let three = trace(&open(name, 3), prompt, true);
    assert_eq!(one, two, "{name}: 1 vs 2 threads");
    assert_eq!(one, three, "{name}: 1 vs 3 threads");
    k3_kernels::simd::set_force_scalar(true);
    let scalar = trace(&open(name, 2), prompt, true);
    k3_kernels::simd::set_force_scalar(false);
    assert_eq!(
        one,
        scalar,
        "{name}: scalar vs {} kernels",
        k3_kernels::simd::simd_level()
    );
}

#[test]
fn tiny_k3_teacher_forcing_and_logits() {
    teacher_forcing_and_logits("tiny-k3");
}

#[test]
fn tiny_k3_wide_teacher_forcing_and_logits() {
    teacher_forcing_and_logits("tiny-k3-wide");
}

#[test]
fn tiny_k3_greedy_incremental() {
    greedy("tiny-k3", DecodeMode::Incremental);
}

#[test]
fn tiny_k3_wide_greedy_incremental() {
    greedy("tiny-k3-wide", DecodeMode::Incremental);
}

#[test]
fn tiny_k3_greedy_recompute() {
    greedy("tiny-k3", DecodeMode::Recompute);
}

#[test]
fn tiny_k3_wide_greedy_recompute() {
    greedy("tiny-k3-wide", DecodeMode::Recompute);
}

#[test]
fn tiny_k3_bit_identical_across_threads_and_kernel_paths() {
    bit_identical_across_threads_and_paths("tiny-k3");
}

#[test]
fn tiny_k3_wide_bit_identical_across_threads_and_kernel_paths() {
    bit_identical_across_threads_and_paths("tiny-k3-wide");
}
