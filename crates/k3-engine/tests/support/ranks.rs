//! What the in-process rank tests (distributed.rs, rank_plan.rs) share: the fixtures, the
//! engine options, and one run's trace (every logit's bits and the ids) to compare with one
//! process (docs/DISTRIBUTED.md#in-process).
#![allow(dead_code)]

use k3_engine::{Budget, Engine, EngineOptions, Sampler, SamplingParams};
use k3_model::Comm;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

pub const PROMPT: [u32; 7] = [637, 229, 263, 638, 730, 42, 197];
pub const NEW_TOKENS: usize = 5;

pub fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

pub fn options(
    threads: usize,
    budget: Option<Budget>,
    comm: Option<Arc<dyn Comm>>,
) -> EngineOptions {
    EngineOptions {
        threads: Some(threads),
        budget,
        ctx: 64,
        comm,
        ..EngineOptions::default()
    }
}

/// Everything one rank observed: every logit's bits, and the ids it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub logit_bits: Vec<u32>,
    pub ids: Vec<u32>,
}

pub fn bits(v: &[f32]) -> impl Iterator<Item = u32> + '_ {
    v.iter().map(|x| x.to_bits())
}

/// Teacher-forced prompt, then `NEW_TOKENS` sampled ids: rank 0 samples (temperature 0.8,
/// fixed seed) and broadcasts; every rank feeds the broadcast id.
pub fn trace(engine: &Engine, comm: &dyn Comm) -> Trace {
    let mut s = engine.new_session(64).unwrap();
    let mut logit_bits: Vec<u32> = bits(&s.feed_all_logits(&PROMPT).unwrap()).collect();
    let mut sampler = Sampler::new(SamplingParams {
        temperature: 0.8,
        top_k: 20,
        seed: 7,
        ..SamplingParams::default()
    })
    .unwrap();
    let mut ids = Vec::new();
    for _ in 0..NEW_TOKENS {
        let mut id = vec![sampler.sample(s.logits(), s.history())];
        comm.broadcast_u32(0, &mut id).unwrap();
        ids.push(id[0]);
        s.feed(&id).unwrap();
        logit_bits.extend(bits(s.logits()));
    }
    Trace { logit_bits, ids }
}

/// One process, resident, 2 threads: the reference every group must match.
pub fn reference(name: &str) -> Trace {
    static CACHE: OnceLock<Mutex<HashMap<String, Trace>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache.lock().unwrap().get(name) {
        return t.clone();
    }
    let engine = Engine::open(&dir(name), options(2, None, None)).unwrap();
    let t = trace(&engine, &k3_model::Solo);
    cache.lock().unwrap().insert(name.into(), t.clone());
    t
}
