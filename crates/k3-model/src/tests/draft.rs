//! Cache-only expert stores (a draft model's): undelivered experts are dropped from the
//! top-k with the rest renormalised, and a store that delivers everything changes nothing.

use crate::testing::*;
use crate::weights::{ExpertFetchError, ExpertProvider, ExpertWeights};
use crate::*;

/// Delivers the experts of `inner` for which `keep(layer, expert)` holds; drops the rest.
struct CacheOnly<'a> {
    inner: &'a OwnedExperts,
    keep: fn(usize, u32) -> bool,
}

impl ExpertProvider for CacheOnly<'_> {
    fn fetch(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &ExpertWeights<'_>),
    ) -> Result<(), ExpertFetchError> {
        for (i, &e) in experts.iter().enumerate() {
            if (self.keep)(layer, e) {
                on_ready(i, &self.inner.experts[layer][e as usize].view());
            }
        }
        Ok(())
    }
    fn drops_missing(&self) -> bool {
        true
    }
}

const IDS: [u32; 6] = [5, 17, 3, 96, 0, 42];

fn run(m: &Model, w: &OwnedWeights, x: &dyn ExpertProvider) -> Vec<f32> {
    let mut st = m.new_state(16);
    m.forward(w, x, &IDS, &mut st, LogitsMode::All)
        .unwrap()
        .data
}

#[test]
fn a_cache_only_store_that_has_everything_changes_no_bit() {
    let cfg = tiny_config();
    let (w, x) = random_model(&cfg, 11, Storage::Bf16, Storage::Mxfp4);
    let m = Model::new(&cfg).unwrap();
    let all = CacheOnly {
        inner: &x,
        keep: |_, _| true,
    };
    assert_eq!(run(&m, &w, &x), run(&m, &w, &all));
}

#[test]
fn dropping_every_expert_equals_experts_that_output_zero() {
    let cfg = tiny_config();
    let (w, x) = random_model(&cfg, 12, Storage::Bf16, Storage::Mxfp4);
    let m = Model::new(&cfg).unwrap();
    let none = CacheOnly {
        inner: &x,
        keep: |_, _| false,
    };
    let mut zero = OwnedExperts::new(x.experts.clone());
    for e in zero.experts.iter_mut().flatten() {
        let (rows, cols) = (e.w2.view().rows, e.w2.view().cols);
        e.w2 = OwnedMatrix::f32(rows, cols, vec![0.0; rows * cols]);
    }
    let dropped = run(&m, &w, &none);
    assert_eq!(dropped, run(&m, &w, &zero));
    assert_ne!(dropped, run(&m, &w, &x), "the routed experts matter here");
}

#[test]
fn dropping_some_experts_renormalises_the_rest_and_is_reproducible() {
    let cfg = tiny_config();
    let (w, x) = random_model(&cfg, 13, Storage::Bf16, Storage::Mxfp4);
    let m = Model::new(&cfg).unwrap();
    let even = CacheOnly {
        inner: &x,
        keep: |_, e| e % 2 == 0,
    };
    let a = run(&m, &w, &even);
    assert!(a.iter().all(|v| v.is_finite()));
    assert_eq!(a, run(&m, &w, &even), "same cache, same draft");
    assert_ne!(a, run(&m, &w, &x));
    // An exact store that loses an expert is an error, never a silent drop.
    let mut failing = OwnedExperts::new(x.experts.clone());
    failing.fail = Some((1, 0));
    let mut st = m.new_state(16);
    let all_ids: Vec<u32> = (0..40).collect();
    assert!(m
        .forward(&w, &failing, &all_ids, &mut st, LogitsMode::Last)
        .is_err());
}
