//! One session's logits for bit-identity checks (tiny_models.rs, fast_numerics.rs).

use k3_engine::{argmax, DecodeMode, Engine};

/// Logits of the last prompt position and of 4 greedy decode steps; the prompt is fed in one
/// pass or (`one_pass = false`) a token at a time.
pub fn trace(engine: &Engine, prompt: &[u32], one_pass: bool) -> Vec<Vec<f32>> {
    let mut s = engine.new_session(prompt.len() + 5).unwrap();
    if one_pass {
        s.feed(prompt).unwrap();
    } else {
        for &id in prompt {
            s.feed(&[id]).unwrap();
        }
    }
    let mut out = vec![s.logits().to_vec()];
    for _ in 0..4 {
        let id = argmax(s.logits());
        s.step(id, DecodeMode::Incremental).unwrap();
        out.push(s.logits().to_vec());
    }
    out
}
