//! Unit tests of each sampling stage on hand-made logits.

use super::*;

fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams {
        temperature: 1.0,
        ..SamplingParams::default()
    };
    f(&mut p);
    p
}

fn ids(c: &[(f64, u32)]) -> Vec<u32> {
    c.iter().map(|&(_, id)| id).collect()
}

/// Logits whose softmax (temperature 1) is exactly proportional to `probs`.
fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

#[test]
fn default_is_greedy_and_valid() {
    let p = SamplingParams::default();
    assert!(p.is_greedy());
    assert_eq!(p.top_k, 0);
    assert_eq!(p.top_p, 1.0);
    assert_eq!(p.repeat_penalty, 1.0);
    p.validate().unwrap();
}

#[test]
fn temperature_zero_is_argmax_with_lowest_id_on_ties() {
    let logits = [0.5, 3.0, -1.0, 3.0, 2.9];
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    assert_eq!(s.sample(&logits, &[]), 1);
    assert_eq!(s.sample(&logits, &[]), crate::argmax(&logits));
    // Pseudo-random logits: greedy always equals argmax, whatever the history.
    let mut rng = SplitMix64 { state: 7 };
    for _ in 0..50 {
        let l: Vec<f32> = (0..97)
            .map(|_| (rng.next_f64() * 8.0 - 4.0) as f32)
            .collect();
        assert_eq!(s.sample(&l, &[1, 2, 3]), crate::argmax(&l));
    }
    // A tiny positive temperature converges on the argmax of a unique maximum.
    let mut cold = Sampler::new(params(|p| p.temperature = 1e-3)).unwrap();
    for _ in 0..20 {
        assert_eq!(cold.sample(&[0.1, 2.0, 1.99, -5.0], &[]), 1);
    }
}

#[test]
fn top_k_keeps_exactly_k_most_probable_ties_to_lower_id() {
    let logits = [1.0, 4.0, 3.0, 3.0, 0.0, 2.0];
    let s = Sampler::new(params(|p| p.top_k = 3)).unwrap();
    assert_eq!(ids(&s.candidates(&logits)), vec![1, 2, 3]);
    let s = Sampler::new(params(|p| p.top_k = 2)).unwrap();
    assert_eq!(
        ids(&s.candidates(&logits)),
        vec![1, 2],
        "tie at the boundary goes to the lower id"
    );
    let s = Sampler::new(params(|p| p.top_k = 1)).unwrap();
    assert_eq!(ids(&s.candidates(&logits)), vec![1]);
    let all = Sampler::new(params(|p| p.top_k = 0))
        .unwrap()
        .candidates(&logits);
    assert_eq!(ids(&all), vec![1, 2, 3, 5, 0, 4]);
    let big = Sampler::new(params(|p| p.top_k = 100))
        .unwrap()
        .candidates(&logits);
    assert_eq!(big, all);
    let sum: f64 = Sampler::new(params(|p| p.top_k = 3))
        .unwrap()
        .candidates(&logits)
        .iter()
        .map(|c| c.0)
        .sum();
    assert!((sum - 1.0).abs() < 1e-12, "renormalised: {sum}");
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let logits = logits_of(&[0.2, 0.5, 0.3]);
    let kept = |top_p: f32| {
        ids(&Sampler::new(params(|p| p.top_p = top_p))
            .unwrap()
            .candidates(&logits))
    };
    assert_eq!(kept(0.3), vec![1]);
    assert_eq!(kept(0.49), vec![1]);
    assert_eq!(kept(0.51), vec![1, 2]);
    assert_eq!(kept(0.79), vec![1, 2]);
    assert_eq!(kept(0.81), vec![1, 2, 0]);
    assert_eq!(kept(1.0), vec![1, 2, 0]);
    // top-p applies to the probabilities renormalised after top-k.
    let s = Sampler::new(params(|p| {
        p.top_k = 2;
        p.top_p = 0.62; // 0.5/0.8 = 0.625 ≥ 0.62
    }))
    .unwrap();
    assert_eq!(ids(&s.candidates(&logits)), vec![1]);
}

#[test]
fn min_p_is_relative_to_the_most_probable() {
    let logits = logits_of(&[0.1, 0.5, 0.3, 0.04, 0.06]);
    let kept = |min_p: f32| {
        ids(&Sampler::new(params(|p| p.min_p = min_p))
            .unwrap()
            .candidates(&logits))
    };
    assert_eq!(kept(0.0), vec![1, 2, 0, 4, 3]);
    assert_eq!(kept(0.15), vec![1, 2, 0]); // floor 0.075
    assert_eq!(kept(0.5), vec![1, 2]); // floor 0.25
    assert_eq!(kept(0.7), vec![1]); // floor 0.35
    assert_eq!(kept(1.0), vec![1]);
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative_once_per_id() {
    let s = Sampler::new(params(|p| {
        p.repeat_penalty = 2.0;
        p.repeat_last_n = 3;
    }))
    .unwrap();
    let logits = [2.0, -2.0, 1.0, 4.0, 0.0];
    // Window = last 3 of history: [1, 0, 1] → ids 0 and 1, each penalised once; 3 is too old.
    assert_eq!(
        s.penalise(&logits, &[3, 1, 0, 1]),
        vec![1.0, -4.0, 1.0, 4.0, 0.0]
    );
    // Ids beyond the vocabulary are ignored.
    assert_eq!(s.penalise(&logits, &[99]), logits.to_vec());
    // Greedy with a penalty moves off a repeated winner.
    let mut g = Sampler::new(SamplingParams {
        repeat_penalty: 2.0,
        ..SamplingParams::greedy()
    })
    .unwrap();
    assert_eq!(g.sample(&[3.0, 2.0], &[]), 0);
    assert_eq!(g.sample(&[3.0, 2.0], &[0]), 1);
    // A penalty below 1 favours repeats; last_n 0 turns it off.
    let mut fav = Sampler::new(SamplingParams {
        repeat_penalty: 0.5,
        ..SamplingParams::greedy()
    })
    .unwrap();
    assert_eq!(fav.sample(&[3.0, 2.0], &[1]), 1);
    let mut off = Sampler::new(SamplingParams {
        repeat_penalty: 2.0,
        repeat_last_n: 0,
        ..SamplingParams::greedy()
    })
    .unwrap();
    assert_eq!(off.sample(&[3.0, 2.0], &[0]), 0);
}

#[test]
fn validation_names_the_flag_and_value() {
    let cases: [(SamplingParams, &str); 13] = [
        (
            params(|p| p.presence_penalty = 3.0),
            "--presence-penalty (presence_penalty) = 3",
        ),
        (
            params(|p| p.presence_penalty = f32::NAN),
            "presence_penalty",
        ),
        (
            params(|p| p.frequency_penalty = -2.5),
            "--frequency-penalty (frequency_penalty) = -2.5",
        ),
        (
            params(|p| p.frequency_penalty = f32::INFINITY),
            "frequency_penalty",
        ),
        (
            params(|p| p.temperature = -0.5),
            "--temp (temperature) = -0.5",
        ),
        (params(|p| p.temperature = f32::NAN), "--temp"),
        (params(|p| p.top_p = 0.0), "--top-p (top_p) = 0"),
        (params(|p| p.top_p = 1.5), "--top-p (top_p) = 1.5"),
        (params(|p| p.min_p = -0.1), "--min-p (min_p) = -0.1"),
        (params(|p| p.min_p = 1.1), "--min-p"),
        (
            params(|p| p.repeat_penalty = 0.0),
            "--repeat-penalty (repeat_penalty) = 0",
        ),
        (params(|p| p.repeat_penalty = -1.0), "--repeat-penalty"),
        (
            params(|p| p.repeat_penalty = f32::INFINITY),
            "--repeat-penalty",
        ),
    ];
    for (p, needle) in cases {
        match Sampler::new(p.clone()) {
            Err(e @ EngineError::Invalid(_)) => {
                assert!(e.to_string().contains(needle), "{e} lacks {needle}");
                assert_eq!(e.exit_code(), crate::EXIT_USAGE);
            }
            other => panic!("{p:?} accepted: {other:?}"),
        }
    }
}

#[test]
fn seeded_stream_is_reproducible_and_seed_dependent() {
    let logits: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let run = |seed: u64| {
        let mut s = Sampler::new(params(|p| p.seed = seed)).unwrap();
        (0..40).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
    let mut s = Sampler::new(params(|p| p.seed = 5)).unwrap();
    let first: Vec<u32> = (0..40).map(|_| s.sample(&logits, &[])).collect();
    s.reset();
    let again: Vec<u32> = (0..40).map(|_| s.sample(&logits, &[])).collect();
    assert_eq!(first, again);
}

#[test]
fn draws_follow_the_distribution_and_skip_non_finite() {
    let logits = logits_of(&[0.75, 0.25]);
    let mut s = Sampler::new(params(|p| p.seed = 1)).unwrap();
    let zeros = (0..20_000).filter(|_| s.sample(&logits, &[]) == 0).count();
    let frac = zeros as f64 / 20_000.0;
    assert!((frac - 0.75).abs() < 0.02, "{frac}");
    let mut s = Sampler::new(params(|_| {})).unwrap();
    for _ in 0..100 {
        assert_eq!(s.sample(&[f32::NAN, 1.0, f32::NEG_INFINITY], &[]), 1);
    }
    assert_eq!(draw(&[(0.5, 3), (0.5, 9)], 0.0), 3);
    assert_eq!(draw(&[(0.5, 3), (0.5, 9)], 0.5), 9);
}

#[test]
fn presence_and_frequency_penalties_follow_openai() {
    let pf = |presence: f32, frequency: f32| SamplingParams {
        presence_penalty: presence,
        frequency_penalty: frequency,
        ..SamplingParams::greedy()
    };
    let s = Sampler::new(pf(0.5, 0.25)).unwrap();
    let logits = [1.0f32, 1.0, 1.0, 1.0];
    // Id 1 seen twice: 2 × 0.25 + 0.5; id 2 once: 0.25 + 0.5; ids 0 and 3 unseen.
    assert_eq!(s.penalise(&logits, &[1, 2, 1]), vec![1.0, 0.0, 0.25, 1.0]);
    // Only the last repeat_last_n tokens count; ids beyond the vocabulary are ignored.
    let short = Sampler::new(SamplingParams {
        repeat_last_n: 2,
        ..pf(0.5, 0.25)
    })
    .unwrap();
    assert_eq!(
        short.penalise(&logits, &[1, 1, 2, 9]),
        vec![1.0, 1.0, 0.25, 1.0]
    );
    // After the repeat penalty: (4 / 2) − (2 × 0.25 + 0.5) = 1.
    let both = Sampler::new(SamplingParams {
        repeat_penalty: 2.0,
        ..pf(0.5, 0.25)
    })
    .unwrap();
    assert_eq!(both.penalise(&[4.0, 0.0], &[0, 0]), vec![1.0, 0.0]);
    // Greedy moves off a repeated winner; negative values favour repeats.
    let mut g = Sampler::new(pf(0.0, 1.0)).unwrap();
    assert_eq!(
        g.sample(&[3.0, 2.0], &[0]),
        0,
        "3 − 1 = 2 ties; lowest id wins"
    );
    assert_eq!(g.sample(&[3.0, 2.0], &[0, 0]), 1, "3 − 2 < 2");
    let mut fav = Sampler::new(pf(-1.5, 0.0)).unwrap();
    assert_eq!(fav.sample(&[3.0, 2.0], &[1]), 1);
    let mut off = Sampler::new(SamplingParams {
        repeat_last_n: 0,
        ..pf(2.0, 2.0)
    })
    .unwrap();
    assert_eq!(off.sample(&[3.0, 2.0], &[0, 0]), 0);
}
