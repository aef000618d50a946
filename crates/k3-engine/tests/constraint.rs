//! Structured output through the engine on tiny-k3 (random weights) at temperature 1: a
//! bounded JSON schema's replies parse and validate (the `jsonschema` crate) on a dozen
//! seeds, tool-call replies parse (an independent reader, tests/support/xtml.rs) and their
//! arguments validate, and a constraint gives the same ids on every decode path and thread
//! count.

use k3_engine::chat_template::{self as chat, ChatMessage, Template, Thinking};
use k3_engine::{
    Constraint, ConstraintSpec, DecodeMode, Engine, EngineOptions, Generation, ReplyStart, Sampler,
    SamplingParams, Speculation, StopConditions, StopReason, Tokenizer,
};
use serde_json::{json, Value};
use std::path::PathBuf;

#[path = "support/xtml.rs"]
mod xtml;

fn open(threads: usize) -> Engine {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3");
    let options = EngineOptions {
        threads: Some(threads),
        ctx: 512,
        ..EngineOptions::default()
    };
    Engine::open(&dir, options).unwrap()
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed,
        ..SamplingParams::default()
    }
}

fn prompt(tok: &Tokenizer) -> Vec<u32> {
    let user = ChatMessage::new("user", "Answer in the requested format.");
    chat::render(tok, &[user], Thinking::Off, true).unwrap()
}

/// A reply to the prompt (thinking off) under `spec`, at most `n` ids.
fn reply(
    engine: &Engine,
    spec: &ConstraintSpec,
    seed: u64,
    n: usize,
    mode: DecodeMode,
) -> Generation {
    reply_drafted(engine, spec, seed, n, mode, None)
}

/// [`reply`], drafted by `truth` (the plain reply) with every third draft wrong, when given.
fn reply_drafted(
    engine: &Engine,
    spec: &ConstraintSpec,
    seed: u64,
    n: usize,
    mode: DecodeMode,
    truth: Option<&[u32]>,
) -> Generation {
    let tok = engine.tokenizer().unwrap();
    let prompt = prompt(tok);
    let constraint = Constraint::new(tok, spec, ReplyStart::Response).unwrap();
    let mut sampler = Sampler::new(sampled(seed))
        .unwrap()
        .with_constraint(constraint);
    let mut s = engine.new_session(512).unwrap();
    s.feed(&prompt).unwrap();
    let stop = StopConditions::for_engine(engine);
    let g = match truth {
        None => s
            .generate_with(n, mode, &mut sampler, &stop, |_| true)
            .unwrap(),
        Some(truth) => {
            let mut drafted = 0usize;
            let drafter = |ctx: &[u32], limit: usize| -> Vec<u32> {
                let at = ctx.len() - prompt.len();
                let end = (at + limit).min(truth.len());
                (at..end)
                    .map(|p| {
                        drafted += 1;
                        if drafted.is_multiple_of(3) {
                            truth[p] ^ 1
                        } else {
                            truth[p]
                        }
                    })
                    .collect()
            };
            s.generate_with_drafter(n, &mut sampler, &stop, drafter, |_| true)
                .unwrap()
        }
    };
    assert!(
        sampler.constraint().unwrap().is_finished(),
        "seed {seed}: unfinished {:?}",
        g.ids
    );
    let eom = Template::new(tok).unwrap().end_of_msg();
    assert_eq!(g.stop_reason, StopReason::EndToken(eom), "seed {seed}");
    g
}

fn bounded_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "title": { "type": "string", "minLength": 1, "maxLength": 12 },
            "year": { "type": "integer", "minimum": 1900, "maximum": 2100 },
            "score": { "type": "integer", "minimum": -3, "maximum": 3 },
            "genres": { "type": "array", "items": { "enum": ["drama", "comedy", "noir"] }, "maxItems": 3 },
            "cast": {
                "type": "array", "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": { "name": { "type": "string", "maxLength": 6 }, "lead": { "type": "boolean" } },
                    "required": ["name", "lead"], "additionalProperties": false
                }
            }
        },
        "required": ["title", "year", "genres", "cast"],
        "additionalProperties": false
    })
}

/// The response channel's text: the ordinary ids before the first control id.
fn response_text(tok: &Tokenizer, ids: &[u32]) -> String {
    match xtml::pieces(tok, ids).first() {
        Some(Err(text)) => text.clone(),
        other => panic!("no response text: {other:?}"),
    }
}

#[test]
fn json_schema_replies_validate_on_a_dozen_seeds() {
    let engine = open(2);
    let tok = engine.tokenizer().unwrap();
    let schema = bounded_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let spec = ConstraintSpec::JsonSchema {
        schema,
        strict: true,
    };
    for seed in 0..12 {
        let g = reply(&engine, &spec, seed, 400, DecodeMode::Incremental);
        let text = response_text(tok, &g.ids);
        let value: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "seed {seed}: {text}: {errors:?}");
    }
}

#[test]
fn tool_calls_required_or_named_validate_on_a_dozen_seeds() {
    let engine = open(2);
    let tok = engine.tokenizer().unwrap();
    let tools = vec![
        (
            "search".to_string(),
            json!({"type": "object", "properties": {
            "query": {"type": "string", "maxLength": 16},
            "limit": {"type": "integer", "minimum": 1, "maximum": 10},
            "filters": {"type": "object", "properties": {"lang": {"enum": ["en", "fr"]}}, "required": ["lang"], "additionalProperties": false}
        }, "required": ["query", "filters"]}),
        ),
        (
            "stop".to_string(),
            json!({"type": "object", "properties": {}}),
        ),
    ];
    for named in [None, Some("search")] {
        let spec = ConstraintSpec::ToolCalls {
            tools: tools.clone(),
            named: named.map(String::from),
            parallel: false,
        };
        for seed in 0..12 {
            let g = reply(&engine, &spec, seed, 400, DecodeMode::Incremental);
            let calls = xtml::parse_tool_reply(tok, &g.ids[..g.ids.len() - 1]);
            assert_eq!(calls.len(), 1, "seed {seed}: {calls:?}");
            let (name, index, args) = &calls[0];
            assert_eq!(index, "1");
            if let Some(want) = named {
                assert_eq!(name, want);
            }
            let schema = &tools
                .iter()
                .find(|(t, _)| t == name)
                .expect("a declared tool")
                .1;
            let value = Value::Object(args.clone());
            assert!(
                jsonschema::is_valid(schema, &value),
                "seed {seed}: {name} {value}"
            );
        }
    }
}

#[test]
fn a_constraint_gives_the_same_ids_on_every_path_and_thread_count() {
    let spec = ConstraintSpec::JsonSchema {
        schema: bounded_schema(),
        strict: true,
    };
    let one = open(1);
    let two = open(2);
    for seed in [3, 4] {
        let plain = reply(&one, &spec, seed, 400, DecodeMode::Incremental).ids;
        assert_eq!(
            reply(&two, &spec, seed, 400, DecodeMode::Incremental).ids,
            plain,
            "threads"
        );
        let spec_mode = DecodeMode::Speculative(Speculation::default());
        assert_eq!(
            reply(&two, &spec, seed, 400, spec_mode).ids,
            plain,
            "speculative"
        );
        let drafted = reply_drafted(&two, &spec, seed, 400, spec_mode, Some(&plain));
        assert_eq!(drafted.ids, plain, "drafted, with rejections");
    }
}
