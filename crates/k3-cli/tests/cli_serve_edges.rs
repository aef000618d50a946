//! Replies stay clean at the edges (docs/SERVER.md "Strict schemas", "Control tokens",
//! "Limits", and "Reply" under "Tools"), on the tiny model through raw HTTP, for OpenAI and
//! Anthropic, streamed and not:
//! * a strict schema with an open object is refused naming its path;
//! * a tool call cut by `max_tokens` is dropped: no markup reaches the text, and every call
//!   returned validates;
//! * control ids the model samples are left out of the text unless `--special`;
//! * an explicit `max_tokens` past the context is a 400 naming it, the context and the prompt.
//!
//! The property: random seeds, `max_tokens` from 1 to a whole call, either protocol, streamed
//! or not — no text, block or delta carries a control-token spelling, every call validates.

mod serve_common;

use proptest::prelude::*;
use serde_json::{json, Value};
use serve_common::{error_of, sse_events, Server};
use std::sync::OnceLock;

fn weather_params() -> Value {
    json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": false})
}

/// Every added token's spelling in the tiny model (control tokens and reserved ones).
fn spellings() -> &'static [String] {
    static SPELLINGS: OnceLock<Vec<String>> = OnceLock::new();
    SPELLINGS.get_or_init(|| {
        let path = format!("{}/tokenizer_config.json", serve_common::tiny());
        let config: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let added = config["added_tokens_decoder"].as_object().unwrap();
        let out: Vec<String> = added
            .values()
            .filter_map(|t| t["content"].as_str().map(str::to_string))
            .collect();
        assert!(out.iter().any(|s| s == "<|open|>"), "{out:?}");
        out
    })
}

/// The first control-token spelling `text` carries.
fn spelling_in(text: &str) -> Option<&'static str> {
    spellings()
        .iter()
        .find(|s| text.contains(s.as_str()))
        .map(String::as_str)
}

/// What a reply says, whichever protocol: every text piece (whole fields, blocks, deltas),
/// the calls (name, arguments), the finish reason in OpenAI's words, and the generated ids.
#[derive(Debug, Default, PartialEq)]
struct Reply {
    texts: Vec<String>,
    calls: Vec<(String, Value)>,
    finish: String,
}

impl Reply {
    fn text(&self) -> String {
        self.texts.concat()
    }

    /// No text carries a spelling; every call is of `get_weather` and validates.
    fn check_clean(&self, what: &str) -> Result<(), String> {
        for t in &self.texts {
            if let Some(sp) = spelling_in(t) {
                return Err(format!("{what}: {sp} in {t:?} ({self:?})"));
            }
        }
        let validator = jsonschema::validator_for(&weather_params()).unwrap();
        for (name, args) in &self.calls {
            let errors: Vec<String> = validator.iter_errors(args).map(|e| e.to_string()).collect();
            if name != "get_weather" || !errors.is_empty() {
                return Err(format!("{what}: call {name} {args}: {errors:?}"));
            }
        }
        Ok(())
    }
}

fn arguments(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("arguments {text:?}: {e}"))
}

fn openai(s: &Server, body: &Value) -> Reply {
    let r = s.post("/v1/chat/completions", body);
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().unwrap();
    let mut reply = Reply::default();
    if body["stream"] != json!(true) {
        let v: Value = serde_json::from_str(&text).unwrap();
        let m = &v["choices"][0]["message"];
        for field in ["content", "reasoning_content"] {
            if let Some(t) = m[field].as_str() {
                reply.texts.push(t.to_string());
            }
        }
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            let f = &c["function"];
            let args = arguments(f["arguments"].as_str().unwrap());
            reply.calls.push((f["name"].as_str().unwrap().into(), args));
        }
        reply.finish = v["choices"][0]["finish_reason"].as_str().unwrap().into();
        return reply;
    }
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in sse_events(&text).iter().filter(|e| *e != "[DONE]") {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let choice = &chunk["choices"][0];
        for field in ["content", "reasoning_content"] {
            if let Some(t) = choice["delta"][field].as_str() {
                reply.texts.push(t.to_string());
            }
        }
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = d["index"].as_u64().unwrap() as usize;
            if let Some(name) = d["function"]["name"].as_str() {
                assert_eq!(i, calls.len(), "{text}");
                calls.push((name.into(), String::new()));
            }
            calls[i].1 += d["function"]["arguments"].as_str().unwrap_or("");
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            reply.finish = f.into();
        }
    }
    reply.calls = calls.into_iter().map(|(n, a)| (n, arguments(&a))).collect();
    reply
}

/// Anthropic's stop reason in OpenAI's words.
fn finish_of(stop_reason: &str) -> String {
    match stop_reason {
        "end_turn" | "stop_sequence" => "stop",
        "max_tokens" => "length",
        "tool_use" => "tool_calls",
        other => other,
    }
    .into()
}

fn anthropic(s: &Server, body: &Value) -> Reply {
    let r = s.post("/v1/messages", body);
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().unwrap();
    let mut reply = Reply::default();
    if body["stream"] != json!(true) {
        let v: Value = serde_json::from_str(&text).unwrap();
        for block in v["content"].as_array().unwrap() {
            match block["type"].as_str().unwrap() {
                "text" => reply.texts.push(block["text"].as_str().unwrap().into()),
                "thinking" => reply.texts.push(block["thinking"].as_str().unwrap().into()),
                "tool_use" => reply.calls.push((
                    block["name"].as_str().unwrap().into(),
                    block["input"].clone(),
                )),
                other => panic!("block {other}: {v}"),
            }
        }
        reply.finish = finish_of(v["stop_reason"].as_str().unwrap());
        return reply;
    }
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in sse_events(&text) {
        let ev: Value = serde_json::from_str(&e).unwrap();
        match ev["type"].as_str().unwrap() {
            "content_block_start" if ev["content_block"]["type"] == "tool_use" => {
                calls.push((
                    ev["content_block"]["name"].as_str().unwrap().into(),
                    String::new(),
                ));
            }
            "content_block_delta" => {
                let d = &ev["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => reply.texts.push(d["text"].as_str().unwrap().into()),
                    "thinking_delta" => reply.texts.push(d["thinking"].as_str().unwrap().into()),
                    "input_json_delta" => {
                        calls.last_mut().unwrap().1 += d["partial_json"].as_str().unwrap();
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                reply.finish = finish_of(ev["delta"]["stop_reason"].as_str().unwrap())
            }
            _ => {}
        }
    }
    reply.calls = calls
        .into_iter()
        .map(|(n, a)| {
            (
                n,
                if a.is_empty() {
                    json!({})
                } else {
                    arguments(&a)
                },
            )
        })
        .collect();
    reply
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Api {
    OpenAi,
    Anthropic,
}

/// A weather question with the tool declared; `required` forces one call (`any`).
fn ask(api: Api, required: bool, seed: u64, max_tokens: usize, stream: bool) -> Value {
    let user = json!([{"role": "user", "content": "Weather in Oslo?"}]);
    match api {
        Api::OpenAi => json!({"model": "tiny-k3", "messages": user, "max_tokens": max_tokens,
            "temperature": 1, "seed": seed, "stream": stream,
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "parameters": weather_params()}}],
            "tool_choice": if required { "required" } else { "auto" },
            "parallel_tool_calls": false}),
        Api::Anthropic => json!({"model": "tiny-k3", "messages": user, "max_tokens": max_tokens,
            "temperature": 1, "seed": seed, "stream": stream,
            "tools": [{"name": "get_weather", "input_schema": weather_params()}],
            "tool_choice": {"type": if required { "any" } else { "auto" },
                "disable_parallel_tool_use": true}}),
    }
}

fn reply(s: &Server, api: Api, body: &Value) -> Reply {
    match api {
        Api::OpenAi => openai(s, body),
        Api::Anthropic => anthropic(s, body),
    }
}

#[test]
fn a_strict_schema_with_an_open_object_is_refused_by_its_path() {
    let s = &Server::start(&[]);
    let open = json!({"type": "object", "properties": {
        "text": {"type": "string", "maxLength": 24},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2}},
        "required": ["text"]});
    let user = json!([{"role": "user", "content": "A note"}]);
    let format = |strict: bool| {
        json!({"type": "json_schema",
        "json_schema": {"name": "note", "strict": strict, "schema": open}})
    };
    let body = json!({"messages": user, "max_tokens": 8, "response_format": format(true)});
    let (st, v) = s.post_json("/v1/chat/completions", &body);
    assert_eq!(
        (st, error_of(&v).1),
        (400, Some("response_format.json_schema.schema")),
        "{v}"
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("additionalProperties"), "{message}");
    // Closed but incomplete: `tags` is not required.
    let mut closed = open.clone();
    closed["additionalProperties"] = json!(false);
    let body = json!({"messages": user, "max_tokens": 8, "response_format":
        {"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": closed}}});
    let (st, v) = s.post_json("/v1/chat/completions", &body);
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`tags`"),
        "{v}"
    );
    // A strict tool: the same rule, named by the tool's path.
    let tools = json!([{"type": "function", "function": {"name": "note", "strict": true,
        "parameters": {"type": "object", "properties": {"n": {"type": "object",
            "properties": {}, "additionalProperties": true}}, "required": ["n"],
            "additionalProperties": false}}}]);
    let body = json!({"messages": user, "max_tokens": 8, "tools": tools});
    let (st, v) = s.post_json("/v1/chat/completions", &body);
    assert_eq!(
        (st, error_of(&v).1),
        (400, Some("tools[0].function.parameters")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(".properties.n:"),
        "{v}"
    );
    // Without strict the schema is the client's to bound.
    let body = json!({"messages": user, "max_tokens": 8, "response_format": format(false)});
    assert_eq!(s.post_json("/v1/chat/completions", &body).0, 200);
}

#[test]
fn a_tool_call_cut_by_max_tokens_is_dropped_and_leaks_no_markup() {
    let s = &Server::start(&[]);
    let mut cut_without_calls = 0;
    for api in [Api::OpenAi, Api::Anthropic] {
        for max_tokens in (40..=96).step_by(8) {
            let whole = reply(s, api, &ask(api, true, 6, max_tokens, false));
            whole
                .check_clean(&format!("{api:?} max_tokens {max_tokens}"))
                .unwrap();
            let streamed = reply(s, api, &ask(api, true, 6, max_tokens, true));
            streamed
                .check_clean(&format!("{api:?} streamed {max_tokens}"))
                .unwrap();
            assert_eq!(
                (whole.text(), &whole.calls, &whole.finish),
                (streamed.text(), &streamed.calls, &streamed.finish),
                "streamed and whole agree"
            );
            assert!(
                ["length", "tool_calls"].contains(&whole.finish.as_str()),
                "{whole:?}"
            );
            // A cut may fall after the call closed, before the reply's end: then it is whole.
            assert!(
                whole.finish == "length" || whole.calls.len() == 1,
                "{whole:?}"
            );
            cut_without_calls += usize::from(whole.calls.is_empty());
        }
    }
    assert!(cut_without_calls > 0, "some max_tokens cut the call");
}

/// Free replies at temperature 1 whose ids include control ids (found with `return_tokens`).
fn replies_with_control_ids(s: &Server, seeds: std::ops::Range<u64>) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for seed in seeds {
        let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 48,
            "temperature": 1, "seed": seed, "return_tokens": true, "ignore_eos": true});
        let (st, v) = s.post_json("/v1/chat/completions", &body);
        assert_eq!(st, 200, "{v}");
        let content = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        let specials = v["choices"][0]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|id| id.as_u64().unwrap() >= 768) // the tiny model's added ids
            .count();
        if specials > 0 {
            out.push((seed, content));
        }
    }
    out
}

#[test]
fn control_ids_are_left_out_of_the_text_unless_special() {
    let s = &Server::start(&[]);
    let sampled = replies_with_control_ids(s, 0..8);
    assert!(!sampled.is_empty(), "the tiny model samples control ids");
    for (seed, content) in &sampled {
        assert_eq!(spelling_in(content), None, "seed {seed}: {content:?}");
    }
    for api in [Api::OpenAi, Api::Anthropic] {
        for stream in [false, true] {
            for seed in 0..4 {
                let r = reply(s, api, &ask(api, false, seed, 48, stream));
                r.check_clean(&format!("{api:?} stream {stream} seed {seed}"))
                    .unwrap();
            }
        }
    }
    let body = json!({"prompt": "Once", "max_tokens": 48, "temperature": 1, "seed": 1,
        "ignore_eos": true});
    let (st, v) = s.post_json("/v1/completions", &body);
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(spelling_in(text), None, "{text:?}");
    // `--special` prints them.
    let special = Server::start(&["--special"]);
    let shown = replies_with_control_ids(&special, 0..8);
    assert!(
        shown.iter().any(|(_, c)| spelling_in(c).is_some()),
        "--special shows control tokens: {shown:?}"
    );
}

#[test]
fn max_tokens_past_the_context_is_refused_on_every_endpoint() {
    let s = Server::start(&["--ctx", "256"]);
    let user = json!([{"role": "user", "content": "Hi"}]);
    let (_, v) = s.post_json(
        "/v1/messages/count_tokens",
        &json!({"model": "tiny-k3", "messages": user}),
    );
    let prompt = v["input_tokens"].as_u64().unwrap();
    let room = 256 - prompt;
    for stream in [false, true] {
        let chat = |n: u64| json!({"messages": user, "max_tokens": n, "stream": stream});
        let messages = |n: u64| {
            json!({"model": "k3", "messages": user, "max_tokens": n,
            "stream": stream})
        };
        let completion = |n: u64| json!({"prompt": "Hi", "max_tokens": n, "stream": stream});
        for (path, body) in [
            ("/v1/chat/completions", chat(1_000_000_000)),
            ("/v1/chat/completions", chat(room + 1)),
            ("/v1/messages", messages(1_000_000_000)),
            ("/v1/messages", messages(room + 1)),
            ("/v1/completions", completion(1_000_000_000)),
        ] {
            let (st, v) = s.post_json(path, &body);
            assert_eq!(st, 400, "{path} {body}: {v}");
            let message = if path == "/v1/messages" {
                assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
                v["error"]["message"].as_str().unwrap()
            } else {
                assert_eq!(error_of(&v).1, Some("max_tokens"), "{v}");
                assert_eq!(error_of(&v).2, Some("context_length_exceeded"), "{v}");
                v["error"]["message"].as_str().unwrap()
            };
            assert!(message.starts_with("max_tokens"), "{message}");
            assert!(message.contains("256 tokens"), "{message}");
            if path != "/v1/completions" {
                assert!(
                    message.contains(&format!("({prompt} in the prompt")),
                    "{message}"
                );
            }
        }
        // Exactly the room is served.
        assert_eq!(
            s.post("/v1/chat/completions", &chat(room))
                .status()
                .as_u16(),
            200
        );
        assert_eq!(
            s.post("/v1/messages", &messages(room)).status().as_u16(),
            200
        );
    }
}

/// Random seed, `max_tokens` from 1 to a whole call, either protocol, streamed or not, a
/// required or a free tool choice: no text carries a spelling, every call validates.
#[test]
fn no_reply_leaks_markup_and_every_call_validates() {
    use proptest::test_runner::{Config, TestRunner};
    let s = Server::start(&[]);
    let config = Config {
        cases: 16,
        failure_persistence: None,
        ..Config::default()
    };
    let cases = (
        0u64..10_000,
        1usize..=160,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    );
    let mut runner = TestRunner::new(config);
    let result = runner.run(
        &cases,
        |(seed, max_tokens, anthropic_api, stream, required)| {
            let api = if anthropic_api {
                Api::Anthropic
            } else {
                Api::OpenAi
            };
            let r = reply(&s, api, &ask(api, required, seed, max_tokens, stream));
            let what = format!("{api:?} seed {seed} max_tokens {max_tokens} stream {stream}");
            r.check_clean(&what).map_err(TestCaseError::fail)?;
            prop_assert!(r.calls.len() <= 1, "{}: {:?}", what, r);
            prop_assert!(
                r.calls.is_empty() || r.finish != "stop",
                "{}: {:?}",
                what,
                r
            );
            Ok(())
        },
    );
    result.unwrap();
}
