//! Next-layer router lookahead changes which experts are read early, never a result: logits
//! are bit-identical with it on and off, with the trunk fully pinned (where the next layer's
//! router is in memory) and a small expert cache (where predictions cause real reads), and
//! at the smallest budget (where nothing is pinned and lookahead stays idle).

use k3_engine::planning::budget_extremes;
use k3_engine::{Budget, Engine, EngineOptions, StoreStats};
use std::path::PathBuf;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

/// Logits after the prompt and after each of 6 greedy steps, plus the run's I/O counters.
fn run(model: &str, budget: Budget, lookahead: bool) -> (Vec<Vec<f32>>, StoreStats) {
    let options = EngineOptions {
        threads: Some(2),
        budget: Some(budget),
        ctx: 32,
        lookahead,
        ..EngineOptions::default()
    };
    let engine = Engine::open(&dir(model), options).unwrap();
    let mut s = engine.new_session(32).unwrap();
    s.feed(&[403, 17, 600, 5]).unwrap();
    let mut all = vec![s.logits().to_vec()];
    for _ in 0..6 {
        let id = k3_engine::argmax(s.logits());
        s.step(id, k3_engine::DecodeMode::Incremental).unwrap();
        all.push(s.logits().to_vec());
    }
    (all, engine.stats())
}

fn check(model: &str) {
    let (smallest, everything) = budget_extremes(&dir(model)).unwrap();
    let (
        Budget::Split {
            trunk: all_trunk, ..
        },
        Budget::Split {
            cache: min_cache, ..
        },
    ) = (everything, smallest)
    else {
        unreachable!("budget_extremes gives splits")
    };
    // Trunk pinned, expert cache twice the minimum: predictions read real bytes.
    let pinned_small_cache = Budget::Split {
        trunk: all_trunk,
        cache: 2 * min_cache,
    };
    for budget in [pinned_small_cache, smallest] {
        let (off, off_stats) = run(model, budget, false);
        let (on, on_stats) = run(model, budget, true);
        assert_eq!(
            on, off,
            "{model} {budget:?}: logits with and without lookahead"
        );
        assert_eq!(off_stats.lookahead_requested, 0, "{model}: off means off");
        assert_eq!(off_stats.lookahead_reads, 0, "{model}: off means off");
        if budget == smallest {
            // Nothing pinned: the next layer's router is never in memory, nothing predicted.
            assert_eq!(on_stats.lookahead_requested, 0, "{model}: {on_stats:?}");
        } else {
            assert!(on_stats.lookahead_requested > 0, "{model}: {on_stats:?}");
            assert!(on_stats.lookahead_reads > 0, "{model}: {on_stats:?}");
            assert!(
                on_stats.lookahead_correct <= on_stats.lookahead_requested
                    && on_stats.lookahead_useful_reads <= on_stats.lookahead_reads,
                "{model}: {on_stats:?}"
            );
            eprintln!(
                "{model}: lookahead recall {:.3}, {} of {} early reads used",
                on_stats.lookahead_recall(),
                on_stats.lookahead_useful_reads,
                on_stats.lookahead_reads
            );
        }
    }
}

#[test]
fn tiny_k3_lookahead_keeps_logits_bit_identical() {
    check("tiny-k3");
}

#[test]
fn tiny_k3_wide_lookahead_keeps_logits_bit_identical() {
    check("tiny-k3-wide");
}
