//! Sampling through the engine: a fixed seed gives the same ids at every thread count and
//! memory budget on both tiny models; seeds matter; stop strings, end ids and the callback
//! end a generation with the right reason, text and pending-token invariant.

use k3_engine::planning::budget_extremes;
use k3_engine::{
    Budget, DecodeMode, Engine, EngineOptions, Generation, Sampler, SamplingParams, StopConditions,
    StopReason,
};
use std::path::PathBuf;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

/// A case of the fixture's expected.json: (prompt ids, greedy ids).
fn case(model: &str, name: &str) -> (Vec<u32>, Vec<u32>) {
    let text = std::fs::read_to_string(dir(model).join("expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let c = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap();
    let ids = |k: &str| {
        c[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    (ids("prompt_ids"), ids("greedy_ids"))
}

fn open(model: &str, budget: Option<Budget>, threads: usize) -> Engine {
    let options = EngineOptions {
        threads: Some(threads),
        budget,
        ctx: 64,
        ..EngineOptions::default()
    };
    Engine::open(&dir(model), options).unwrap()
}

fn sampled(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.01,
        repeat_penalty: 1.1,
        repeat_last_n: 16,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed,
    }
}

fn generate(
    engine: &Engine,
    prompt: &[u32],
    n: usize,
    params: SamplingParams,
    stop: &StopConditions,
) -> Generation {
    let mut s = engine.new_session(64).unwrap();
    s.feed(prompt).unwrap();
    let mut sampler = Sampler::new(params).unwrap();
    let g = s
        .generate_with(n, DecodeMode::Incremental, &mut sampler, stop, |_| true)
        .unwrap();
    let mut all = prompt.to_vec();
    all.extend(&g.ids);
    assert_eq!(
        s.tokens(),
        all,
        "the session holds the prompt and every generated id"
    );
    g
}

fn same_ids_everywhere(model: &str) {
    let (prompt, _) = case(model, "seven_ids");
    let params = sampled(0.9, 42);
    let none = StopConditions::none();
    let reference = generate(&open(model, None, 1), &prompt, 14, params.clone(), &none);
    assert_eq!(reference.ids.len(), 14);
    assert_eq!(reference.stop_reason, StopReason::Length);
    let (smallest, everything) = budget_extremes(&dir(model)).unwrap();
    for (budget, threads) in [
        (None, 2),
        (Some(smallest), 1),
        (Some(smallest), 2),
        (Some(everything), 2),
    ] {
        let got = generate(
            &open(model, budget, threads),
            &prompt,
            14,
            params.clone(),
            &none,
        );
        assert_eq!(
            got, reference,
            "{model}: seeded ids at {budget:?}, {threads} threads"
        );
    }
}

#[test]
fn tiny_k3_seeded_ids_same_at_every_budget_and_thread_count() {
    same_ids_everywhere("tiny-k3");
}

#[test]
fn tiny_k3_wide_seeded_ids_same_at_every_budget_and_thread_count() {
    same_ids_everywhere("tiny-k3-wide");
}

#[test]
fn greedy_sampler_matches_the_reference_and_generate() {
    for model in ["tiny-k3", "tiny-k3-wide"] {
        let (prompt, greedy) = case(model, "seven_ids");
        let engine = open(model, None, 2);
        let g = generate(
            &engine,
            &prompt,
            16,
            SamplingParams::greedy(),
            &StopConditions::none(),
        );
        assert_eq!(g.ids, greedy, "{model}");
        let mut s = engine.new_session(64).unwrap();
        s.feed(&prompt).unwrap();
        assert_eq!(
            s.generate(16, DecodeMode::Incremental, |_| true).unwrap(),
            greedy,
            "{model}"
        );
        // Recompute mode gives the same sampled ids as incremental decoding.
        let mut s = engine.new_session(64).unwrap();
        s.feed(&prompt).unwrap();
        let mut sampler = Sampler::new(sampled(0.9, 3)).unwrap();
        let rec = s
            .generate_with(
                8,
                DecodeMode::Recompute,
                &mut sampler,
                &StopConditions::none(),
                |_| true,
            )
            .unwrap();
        assert_eq!(
            rec.ids,
            generate(
                &engine,
                &prompt,
                8,
                sampled(0.9, 3),
                &StopConditions::none()
            )
            .ids
        );
    }
}

#[test]
fn different_seeds_give_different_ids() {
    let (prompt, greedy) = case("tiny-k3", "seven_ids");
    let engine = open("tiny-k3", None, 2);
    let plain = |seed| SamplingParams {
        temperature: 1.0,
        seed,
        ..SamplingParams::default()
    };
    let none = StopConditions::none();
    let a = generate(&engine, &prompt, 16, plain(1), &none).ids;
    let b = generate(&engine, &prompt, 16, plain(2), &none).ids;
    assert_ne!(a, b);
    assert_ne!(a, greedy);
    assert_eq!(
        a,
        generate(&engine, &prompt, 16, plain(1), &none).ids,
        "same seed, same ids"
    );
}

#[test]
fn end_ids_of_the_tokenizer_are_the_default() {
    let engine = open("tiny-k3", None, 1);
    let tok = engine.tokenizer().unwrap();
    let stop = StopConditions::for_engine(&engine);
    assert_eq!(stop.end_ids, tok.end_ids());
    assert_eq!(
        stop.end_ids,
        vec![
            tok.eos_id().unwrap(),
            tok.token_id("<|end_of_msg|>").unwrap()
        ]
    );
}

#[test]
fn an_end_id_stops_after_it_and_is_not_decoded() {
    let (prompt, greedy) = case("tiny-k3", "seven_ids");
    let engine = open("tiny-k3", None, 2);
    let tok = engine.tokenizer().unwrap();
    let end = greedy[5];
    let first = greedy.iter().position(|&id| id == end).unwrap();
    let stop = StopConditions {
        end_ids: vec![end],
        stop_strings: vec![],
    };
    let mut seen = Vec::new();
    let mut s = engine.new_session(64).unwrap();
    s.feed(&prompt).unwrap();
    let g = s
        .generate_with(
            16,
            DecodeMode::Incremental,
            &mut Sampler::greedy(),
            &stop,
            |id| {
                seen.push(id);
                true
            },
        )
        .unwrap();
    assert_eq!(g.ids, greedy[..=first].to_vec());
    assert_eq!(g.stop_reason, StopReason::EndToken(end));
    assert_eq!(seen, g.ids, "the callback sees the end id too");
    let text = String::from_utf8_lossy(&tok.decode(&greedy[..first]).unwrap()).into_owned();
    assert_eq!(g.text.as_deref(), Some(text.as_str()));
    // The end id is pending: feeding the next reference token feeds it first, and greedy
    // decoding resumes the reference sequence.
    s.feed(&greedy[first + 1..first + 2]).unwrap();
    let rest = s
        .generate(16 - first - 2, DecodeMode::Incremental, |_| true)
        .unwrap();
    assert_eq!(rest, greedy[first + 2..].to_vec());
}

#[test]
fn a_stop_string_spanning_tokens_ends_the_text_before_it() {
    let (prompt, greedy) = case("tiny-k3", "tiktoken_text");
    let engine = open("tiny-k3", None, 2);
    let tok = engine.tokenizer().unwrap();
    // Decoded pieces per greedy token; pick the last char of one non-empty piece and the first
    // of the next, so the stop string spans two tokens.
    let mut dec = tok.stream_decoder();
    let pieces: Vec<String> = greedy.iter().map(|&id| dec.push(id).unwrap()).collect();
    let k = (2..pieces.len() - 1)
        .find(|&k| !pieces[k].is_empty() && !pieces[k + 1].is_empty())
        .expect("two adjacent non-empty pieces");
    let stop_text = format!(
        "{}{}",
        pieces[k].chars().last().unwrap(),
        pieces[k + 1].chars().next().unwrap()
    );
    let full: String = pieces.concat();
    let cut = full.find(&stop_text).unwrap();
    // The token that first completes the stop string.
    let mut acc = String::new();
    let done = pieces.iter().position(|p| {
        acc.push_str(p);
        acc.contains(&stop_text)
    });
    let done = done.unwrap();

    let stop = StopConditions::none().with_stop_strings([stop_text.clone(), String::new()]);
    let mut s = engine.new_session(128).unwrap();
    s.feed(&prompt).unwrap();
    let g = s
        .generate_with(
            16,
            DecodeMode::Incremental,
            &mut Sampler::greedy(),
            &stop,
            |_| true,
        )
        .unwrap();
    assert_eq!(g.stop_reason, StopReason::StopText(stop_text.clone()));
    assert_eq!(g.ids, greedy[..=done].to_vec());
    assert_eq!(
        g.text.as_deref(),
        Some(&full[..cut]),
        "stops before {stop_text:?}"
    );
    assert!(!g.text.unwrap().contains(&stop_text));
    if done + 2 < greedy.len() {
        s.feed(&greedy[done + 1..done + 2]).unwrap();
        let rest = s
            .generate(greedy.len() - done - 2, DecodeMode::Incremental, |_| true)
            .unwrap();
        assert_eq!(
            rest,
            greedy[done + 2..].to_vec(),
            "the last id stayed pending"
        );
    }
}

#[test]
fn the_callback_and_the_length_limit_stop() {
    let (prompt, greedy) = case("tiny-k3", "seven_ids");
    let engine = open("tiny-k3", None, 1);
    let mut s = engine.new_session(64).unwrap();
    s.feed(&prompt).unwrap();
    let mut count = 0;
    let g = s
        .generate_with(
            16,
            DecodeMode::Incremental,
            &mut Sampler::greedy(),
            &StopConditions::none(),
            |_| {
                count += 1;
                count < 3
            },
        )
        .unwrap();
    assert_eq!(
        (g.ids.as_slice(), &g.stop_reason),
        (&greedy[..3], &StopReason::Callback)
    );
    assert!(s.logits().is_empty(), "the last id is pending");
    let g = s.generate_with(
        5,
        DecodeMode::Incremental,
        &mut Sampler::greedy(),
        &StopConditions::none(),
        |_| true,
    );
    assert!(g.is_err(), "no fresh logits after a generation ended");
    s.step(greedy[3], DecodeMode::Incremental).unwrap();
    let g = s
        .generate_with(
            0,
            DecodeMode::Incremental,
            &mut Sampler::greedy(),
            &StopConditions::none(),
            |_| true,
        )
        .unwrap();
    assert_eq!(
        (g.ids.len(), g.stop_reason, g.text),
        (0, StopReason::Length, Some(String::new()))
    );
}

#[test]
fn stop_strings_need_a_tokenizer() {
    // A copy of tiny-k3 without its tokenizer files (the weights are linked, not copied).
    let bare = std::env::temp_dir().join(format!("k3-sampling-bare-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&bare);
    std::fs::create_dir_all(&bare).unwrap();
    for entry in std::fs::read_dir(dir("tiny-k3")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".safetensors")
            || name.ends_with(".json") && !name.starts_with("tokenizer")
        {
            std::os::unix::fs::symlink(&path, bare.join(&name)).unwrap();
        }
    }
    let engine = Engine::open(
        &bare,
        EngineOptions {
            threads: Some(1),
            ..EngineOptions::default()
        },
    )
    .unwrap();
    assert!(engine.tokenizer().is_none());
    assert_eq!(StopConditions::for_engine(&engine), StopConditions::none());
    let mut s = engine.new_session(16).unwrap();
    s.feed(&[1, 2, 3]).unwrap();
    let stop = StopConditions::none().with_stop_strings(["x"]);
    let err = s
        .generate_with(
            4,
            DecodeMode::Incremental,
            &mut Sampler::greedy(),
            &stop,
            |_| true,
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("stop strings need a tokenizer"),
        "{err}"
    );
    let g = s.generate_with(
        4,
        DecodeMode::Incremental,
        &mut Sampler::greedy(),
        &StopConditions::none(),
        |_| true,
    );
    assert_eq!(g.unwrap().text, None);
    let _ = std::fs::remove_dir_all(&bare);
}
