//! Constraints walked without a model: at each step a seeded stream picks uniformly among
//! the allowed ids (the worst case a random-weight model can be), then the reply is decoded
//! and checked by an independent validator (the `jsonschema` crate) and a hand parser of
//! K3's tools channel written from docs/MODEL.md#chat-template.

use super::*;
use crate::chat_template::Template;
use serde_json::json;
#[path = "../../tests/support/xtml.rs"]
mod xtml;
use xtml::{parse_tool_reply, pieces};

fn tiny_tokenizer() -> Tokenizer {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tiny-k3");
    Tokenizer::from_dir(dir).unwrap()
}

/// Walks `c` for at most `limit` ids, each uniform among the allowed ones (splitmix-style
/// stream from `seed`), until the end id; returns the ids before it.
fn walk(c: &mut Constraint, vocab: usize, seed: u64, limit: usize) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut ids = Vec::new();
    for _ in 0..limit {
        let mut logits = vec![0.0f32; vocab];
        c.mask(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..vocab as u32)
            .filter(|&i| logits[i as usize].is_finite())
            .collect();
        assert!(!allowed.is_empty(), "nothing allowed after {ids:?}");
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let id = allowed[(state % allowed.len() as u64) as usize];
        if id == c.end_id() {
            assert!(
                c.is_finished(),
                "end id allowed before the grammar finished"
            );
            return ids;
        }
        c.advance(id).unwrap();
        ids.push(id);
    }
    panic!("no end id within {limit} ids: {ids:?}");
}

fn bounded_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "maxLength": 8 },
            "age": { "type": "integer", "minimum": 0, "maximum": 120 },
            "tags": { "type": "array", "items": { "type": "string", "maxLength": 4 }, "maxItems": 3 },
            "kind": { "enum": ["cat", "dog", "fish"] },
            "pos": {
                "type": "object",
                "properties": { "x": { "type": "integer", "minimum": -5, "maximum": 5 }, "ok": { "type": "boolean" } },
                "required": ["x", "ok"],
                "additionalProperties": false
            }
        },
        "required": ["name", "age", "kind", "pos"],
        "additionalProperties": false
    })
}

/// The response text of a JSON reply `ids` (everything before `close(response)`), after
/// checking the closing markers.
fn json_reply(tok: &Tokenizer, ids: &[u32]) -> String {
    let t = Template::new(tok).unwrap();
    let p = pieces(tok, ids);
    let expect = |i: usize| -> Result<u32, String> { p[i].clone() };
    let Err(body) = expect(0) else {
        panic!("reply starts with a control id: {p:?}")
    };
    let close = t.close_tag("response")[0];
    let sep = *t.close_tag("response").last().unwrap();
    assert_eq!(
        p[1..],
        [
            Ok(close),
            Err("response".into()),
            Ok(sep),
            Ok(close),
            Err("message".into()),
            Ok(sep)
        ]
    );
    body
}

#[test]
fn random_walks_of_a_bounded_schema_validate() {
    let tok = tiny_tokenizer();
    let schema = bounded_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let spec = ConstraintSpec::JsonSchema {
        schema: schema.clone(),
        strict: true,
    };
    for seed in 0..12 {
        let mut c = Constraint::new(&tok, &spec, ReplyStart::Response).unwrap();
        let ids = walk(&mut c, tok.vocab_size(), seed, 400);
        let text = json_reply(&tok, &ids);
        let value: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "seed {seed}: {text} → {errors:?}");
    }
}

#[test]
fn json_object_gives_an_object() {
    let tok = tiny_tokenizer();
    let mut c = Constraint::new(&tok, &ConstraintSpec::JsonObject, ReplyStart::Response).unwrap();
    // Force the shortest object: `{` `}` spelled through the mask.
    let open = tok.encode_ordinary("{}");
    for &id in &open {
        let mut logits = vec![0.0f32; tok.vocab_size()];
        c.mask(&mut logits).unwrap();
        assert!(logits[id as usize].is_finite());
        c.advance(id).unwrap();
    }
    let mut logits = vec![0.0f32; tok.vocab_size()];
    c.mask(&mut logits).unwrap();
    let digit = tok.encode_ordinary("7")[0];
    assert!(
        logits[digit as usize].is_infinite(),
        "text after the object"
    );
    let t = Template::new(&tok).unwrap();
    assert!(logits[t.close_tag("response")[0] as usize].is_finite());
    let ids = walk(&mut c, tok.vocab_size(), 1, 50);
    let mut all = open.clone();
    all.extend(ids);
    assert_eq!(json_reply(&tok, &all), "{}");
}

#[test]
fn think_is_free_until_it_closes_then_the_grammar_applies() {
    let tok = tiny_tokenizer();
    let t = Template::new(&tok).unwrap();
    let spec = ConstraintSpec::JsonSchema {
        schema: json!({"type": "boolean"}),
        strict: true,
    };
    let mut c = Constraint::new(&tok, &spec, ReplyStart::Think).unwrap();
    let mut logits = vec![0.0f32; tok.vocab_size()];
    c.mask(&mut logits).unwrap();
    let finite = logits.iter().filter(|l| l.is_finite()).count();
    assert_eq!(
        finite,
        tok.vocab_size() - tok.end_ids().len(),
        "think masks only the end ids"
    );
    // Thinking text, a stray `<|close|>` that is not `think`, then close(think) open(response).
    let mut ids = t.text("hmm, maybe true");
    ids.extend(t.close_tag("thinking"));
    ids.extend(t.close_tag("think"));
    for &id in &ids {
        assert!(c.in_think());
        c.advance(id).unwrap();
    }
    assert!(!c.in_think());
    for id in t.open_tag("response") {
        let mut logits = vec![0.0f32; tok.vocab_size()];
        c.mask(&mut logits).unwrap();
        assert!(logits[id as usize].is_finite(), "open(response) is allowed");
        c.advance(id).unwrap();
    }
    let reply = walk(&mut c, tok.vocab_size(), 3, 50);
    let text = json_reply(&tok, &reply);
    assert!(text == "true" || text == "false", "{text}");
}

fn weather_tools() -> Vec<(String, Value)> {
    vec![
        (
            "get_weather".into(),
            json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 10},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["c", "f"]}
            }, "required": ["city", "days"]}),
        ),
        (
            "say \"hi\" & go".into(),
            json!({"type": "object", "properties": {"loud": {"type": "boolean"}}, "required": ["loud"]}),
        ),
    ]
}

#[test]
fn tool_calls_parse_and_their_arguments_validate() {
    let tok = tiny_tokenizer();
    let tools = weather_tools();
    for (named, parallel) in [(None, false), (Some("get_weather"), false), (None, true)] {
        let spec = ConstraintSpec::ToolCalls {
            tools: tools.clone(),
            named: named.map(String::from),
            parallel,
        };
        for seed in 0..12 {
            let mut c = Constraint::new(&tok, &spec, ReplyStart::Response).unwrap();
            let ids = walk(&mut c, tok.vocab_size(), seed, 2000);
            let calls = parse_tool_reply(&tok, &ids);
            assert!(!calls.is_empty());
            assert!(parallel || calls.len() == 1, "{calls:?}");
            for (n, (name, index, args)) in calls.iter().enumerate() {
                assert_eq!(index, &(n + 1).to_string());
                if let Some(want) = named {
                    assert_eq!(name, want);
                }
                let schema = &tools
                    .iter()
                    .find(|(t, _)| t == name)
                    .expect("a declared tool")
                    .1;
                let v = jsonschema::validator_for(schema).unwrap();
                let value = Value::Object(args.clone());
                assert!(v.is_valid(&value), "seed {seed}: {name} {value}");
            }
        }
    }
}

#[test]
fn unsatisfiable_and_unsupported_schemas_are_refused_by_name() {
    let tok = tiny_tokenizer();
    let refuse = |spec: ConstraintSpec, needle: &str| {
        let e = Constraint::new(&tok, &spec, ReplyStart::Response)
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{e} lacks {needle}");
    };
    let schema = |s: Value| ConstraintSpec::JsonSchema {
        schema: s,
        strict: true,
    };
    refuse(
        schema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
        "structured output",
    );
    refuse(schema(json!(true)).clone(), "structured output");
    let tools = weather_tools();
    refuse(
        ConstraintSpec::ToolCalls {
            tools: tools.clone(),
            named: Some("nope".into()),
            parallel: false,
        },
        "`nope`",
    );
    let bad = vec![(
        "t".to_string(),
        json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}}),
    )];
    refuse(
        ConstraintSpec::ToolCalls {
            tools: bad,
            named: None,
            parallel: false,
        },
        "argument `a`",
    );
    let missing = vec![(
        "t".to_string(),
        json!({"type": "object", "required": ["q"]}),
    )];
    refuse(
        ConstraintSpec::ToolCalls {
            tools: missing,
            named: None,
            parallel: false,
        },
        "`q`",
    );
    refuse(
        ConstraintSpec::ToolCalls {
            tools: vec![],
            named: None,
            parallel: false,
        },
        "no tools",
    );
}

#[test]
fn strict_refuses_a_keyword_it_cannot_enforce_and_lenient_ignores_it() {
    let tok = tiny_tokenizer();
    let schema =
        json!({"type": "array", "items": {"type": "integer"}, "maxItems": 3, "uniqueItems": true});
    let strict = ConstraintSpec::JsonSchema {
        schema: schema.clone(),
        strict: true,
    };
    let e = Constraint::new(&tok, &strict, ReplyStart::Response)
        .unwrap_err()
        .to_string();
    assert!(e.contains("uniqueItems"), "{e}");
    let lenient = ConstraintSpec::JsonSchema {
        schema,
        strict: false,
    };
    let mut c = Constraint::new(&tok, &lenient, ReplyStart::Response).unwrap();
    let ids = walk(&mut c, tok.vocab_size(), 5, 200);
    let value: Value = serde_json::from_str(&json_reply(&tok, &ids)).unwrap();
    assert!(value.as_array().is_some_and(|a| a.len() <= 3), "{value}");
}

#[test]
fn a_sampler_advanced_past_forced_ids_keeps_its_grammar_in_step() {
    // The server's thinking budget feeds close(think) open(response) without sampling
    // (docs/SERVER.md "Tools"): `Sampler::advance_constraint` moves the grammar past them.
    let tok = tiny_tokenizer();
    let t = Template::new(&tok).unwrap();
    let spec = ConstraintSpec::JsonSchema {
        schema: json!({"type": "boolean"}),
        strict: true,
    };
    let c = Constraint::new(&tok, &spec, ReplyStart::Think).unwrap();
    let mut s = crate::Sampler::greedy().with_constraint(c);
    for id in t.text("so").into_iter().chain(t.think_to_response()) {
        s.advance_constraint(id).unwrap();
    }
    assert!(!s.constraint().unwrap().in_think());
    let mut reply = Vec::new();
    let logits = vec![0.0f32; tok.vocab_size()];
    for _ in 0..20 {
        let id = s.try_sample(&logits, &[]).unwrap();
        if id == s.constraint().unwrap().end_id() {
            break;
        }
        reply.push(id);
    }
    assert!(s.constraint().unwrap().is_finished());
    let text = json_reply(&tok, &reply);
    assert!(text == "true" || text == "false", "{text}");
    // An id the grammar does not allow is an error, not a silent skip.
    let c = Constraint::new(&tok, &spec, ReplyStart::Response).unwrap();
    let mut s = crate::Sampler::greedy().with_constraint(c);
    assert!(s.advance_constraint(t.text("x")[0]).is_err());
}
