//! Embedding k3: open the bundled tiny model, feed a prompt, stream 16 greedy tokens.
//!
//! `cargo run -p k3-engine --example generate [MODEL_DIR]`

use k3_engine::{DecodeMode, Engine, EngineOptions};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3")
        });
    let engine = Engine::open(&dir, EngineOptions::default())?;
    println!(
        "{}",
        engine
            .config()
            .summary(&dir.join("config.json").display().to_string())
    );

    let prompt = [637, 229, 263, 638, 730, 42, 197];
    let mut session = engine.new_session(prompt.len() + 16)?;
    session.feed(&prompt)?;
    print!("generated:");
    let ids = session.generate(16, DecodeMode::Incremental, |id| {
        print!(" {id}");
        true // keep going
    })?;
    println!();
    assert_eq!(ids.len(), 16);
    Ok(())
}
