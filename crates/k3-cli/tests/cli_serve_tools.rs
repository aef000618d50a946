//! Tool calling and structured output through `k3 serve` (docs/SERVER.md "Tools") on the
//! tiny model. Its weights are random, so only constrained decoding makes it call a tool or
//! write JSON: every call's arguments and every JSON reply is checked against its schema
//! with the `jsonschema` crate (an independent validator), on several seeds at temperature 1.

mod serve_common;

use serde_json::{json, Value};
use serve_common::{chat_body, error_of, sse_events, Server};
use std::sync::Arc;

/// A bounded schema: even random weights finish a call within a few hundred tokens.
fn weather_params() -> Value {
    json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": false})
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
            "parameters": weather_params()}},
        {"type": "function", "function": {"name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
                "required": ["zone"], "additionalProperties": false}}}])
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// `errors` of `value` against `schema`, empty when it validates.
fn invalid(schema: &Value, value: &Value) -> Vec<String> {
    let v = jsonschema::validator_for(schema).expect("the test schema compiles");
    v.iter_errors(value).map(|e| e.to_string()).collect()
}

/// The parameters schema of tool `name` in `tools()`.
fn params_of(name: &str) -> Value {
    tools()
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .map(|t| t["function"]["parameters"].clone())
        .unwrap_or_else(|| panic!("unknown tool `{name}`"))
}

/// Checks one OpenAI `tool_calls[]` entry: id, type, a declared name, arguments that parse
/// and validate. Returns (name, arguments).
fn check_call(call: &Value) -> (String, Value) {
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{call}"
    );
    assert_eq!(call["type"], "function", "{call}");
    let name = call["function"]["name"].as_str().unwrap().to_string();
    let text = call["function"]["arguments"].as_str().unwrap();
    let args: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let errors = invalid(&params_of(&name), &args);
    assert!(errors.is_empty(), "{name} {args}: {errors:?}");
    (name, args)
}

#[test]
fn required_and_named_tool_choice_return_calls_that_validate() {
    let s = Server::start(&[]);
    for seed in 1..=4 {
        for (choice, want) in [
            (json!("required"), None),
            (
                json!({"type": "function", "function": {"name": "get_time"}}),
                Some("get_time"),
            ),
        ] {
            let extra = json!({"tools": tools(), "tool_choice": choice, "parallel_tool_calls": false,
                               "max_tokens": 400, "temperature": 1, "seed": seed});
            let (st, v) = s.post_json("/v1/chat/completions", &chat_body(user("Weather?"), extra));
            assert_eq!(st, 200, "{v}");
            let c = &v["choices"][0];
            assert_eq!(c["finish_reason"], "tool_calls", "seed {seed}: {v}");
            let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
            assert_eq!(calls.len(), 1, "parallel_tool_calls false: {v}");
            let (name, _) = check_call(&calls[0]);
            if let Some(want) = want {
                assert_eq!(name, want);
            }
            assert_eq!(
                c["message"]["content"], "",
                "the call's reply has no text: {v}"
            );
        }
    }
}

#[test]
fn parallel_calls_are_numbered_and_each_validates() {
    let s = Server::start(&[]);
    let mut most = 0;
    for seed in 1..=6 {
        let extra = json!({"tools": tools(), "tool_choice": "required", "max_tokens": 1200,
                           "temperature": 1, "seed": seed});
        let (_, v) = s.post_json("/v1/chat/completions", &chat_body(user("Both?"), extra));
        let c = &v["choices"][0];
        if c["finish_reason"] != "tool_calls" {
            assert_eq!(c["finish_reason"], "length", "{v}");
            continue;
        }
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        let ids: std::collections::BTreeSet<&str> =
            calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), calls.len(), "unique ids: {v}");
        calls.iter().for_each(|c| drop(check_call(c)));
        most = most.max(calls.len());
    }
    assert!(most >= 2, "no seed made parallel calls within 1200 tokens");
}

#[test]
fn streamed_tool_call_deltas_reassemble_to_the_same_calls() {
    let s = Server::start(&[]);
    let extra = json!({"tools": tools(), "tool_choice": "required", "parallel_tool_calls": false,
                       "max_tokens": 400, "temperature": 1, "seed": 7});
    let (_, whole) = s.post_json(
        "/v1/chat/completions",
        &chat_body(user("Weather?"), extra.clone()),
    );
    let mut streamed = extra;
    streamed["stream"] = json!(true);
    let body = s
        .post(
            "/v1/chat/completions",
            &chat_body(user("Weather?"), streamed),
        )
        .text()
        .unwrap();
    let events = sse_events(&body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (mut id, mut name, mut args) = (String::new(), String::new(), String::new());
    for c in &chunks {
        for d in c["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert_eq!(d["index"], 0, "one call: {d}");
            if let Some(i) = d["id"].as_str() {
                assert!(id.is_empty(), "the id comes once: {d}");
                id = i.to_string();
                name = d["function"]["name"].as_str().unwrap().to_string();
            }
            args.push_str(d["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert!(chunks.len() > 3, "the arguments come in fragments: {body}");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{body}");
    let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
    check_call(&call);
    let want = &whole["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(
        (&json!(name), &json!(args)),
        (&want["name"], &want["arguments"]),
        "streamed and whole replies are the same draw"
    );
}

#[test]
fn json_schema_and_json_object_replies_validate_on_a_dozen_seeds() {
    let s = Server::start(&[]);
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["name", "tags", "score"], "additionalProperties": false});
    for seed in 0..12 {
        let format = json!({"type": "json_schema", "json_schema": {"name": "card", "strict": true, "schema": schema}});
        let extra =
            json!({"response_format": format, "max_tokens": 300, "temperature": 1, "seed": seed});
        let (st, v) = s.post_json("/v1/chat/completions", &chat_body(user("A card"), extra));
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "seed {seed}: {v}");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(invalid(&schema, &value).is_empty(), "seed {seed}: {text}");
    }
    let extra =
        json!({"response_format": {"type": "json_object"}, "max_tokens": 200, "temperature": 0});
    let (_, v) = s.post_json("/v1/chat/completions", &chat_body(user("Any"), extra));
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    // JSON syntax (any exponent: JSON bounds none, though f64 overflows past 1e308).
    serde_json::from_str::<serde::de::IgnoredAny>(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(text.starts_with('{') && text.ends_with('}'), "{text}");
    // A schema the grammar cannot enforce is refused before anything is queued.
    let bad = json!({"type": "json_schema", "json_schema": {"name": "b", "strict": true,
        "schema": {"type": "integer", "minimum": 5, "maximum": 1}}});
    let (st, v) = s.post_json(
        "/v1/chat/completions",
        &chat_body(user("x"), json!({"response_format": bad})),
    );
    assert_eq!((st, error_of(&v).1), (400, Some("response_format")), "{v}");
}

#[test]
fn tool_results_are_rendered_in_call_order_and_answered() {
    let s = Server::start(&[]);
    let call = |id: &str, city: &str| {
        json!({"id": id, "type": "function",
        "function": {"name": "get_weather", "arguments": json!({"city": city, "days": 1}).to_string()}})
    };
    let result =
        |id: &str, text: &str| json!({"role": "tool", "tool_call_id": id, "content": text});
    let history = |results: Vec<Value>| {
        let mut m = vec![
            json!({"role": "user", "content": "Oslo and Rome?"}),
            json!({"role": "assistant", "content": null,
                   "tool_calls": [call("call_a", "Oslo"), call("call_b", "Rome")]}),
        ];
        m.extend(results);
        Value::Array(m)
    };
    let ask = |messages: Value| {
        let extra = json!({"tools": tools(), "max_tokens": 1, "logprobs": true, "top_logprobs": 5});
        let (st, v) = s.post_json("/v1/chat/completions", &chat_body(messages, extra));
        assert_eq!(st, 200, "{v}");
        v
    };
    let in_order = ask(history(vec![
        result("call_a", "rain"),
        result("call_b", "sun"),
    ]));
    let reversed = ask(history(vec![
        result("call_b", "sun"),
        result("call_a", "rain"),
    ]));
    let swapped = ask(history(vec![
        result("call_a", "sun"),
        result("call_b", "rain"),
    ]));
    // The first reply token's distribution: bit-equal for equal prompts.
    let first = |v: &Value| v["choices"][0]["logprobs"]["content"][0].clone();
    assert!(first(&in_order)["top_logprobs"].is_array(), "{in_order}");
    // Results map to their calls by id (K3's `index`), so their order in the body does not
    // matter; what they say does.
    assert_eq!(in_order["usage"], reversed["usage"]);
    assert_eq!(first(&in_order), first(&reversed));
    assert_ne!(
        first(&in_order),
        first(&swapped),
        "the results reach the model"
    );
}

#[test]
fn tool_choice_none_declares_no_tools_and_auto_declares_them() {
    let s = Server::start(&[]);
    let ask = |extra: Value| {
        let (st, v) = s.post_json("/v1/chat/completions", &chat_body(user("Hi"), extra));
        assert_eq!(st, 200, "{v}");
        v
    };
    let plain = ask(json!({"max_tokens": 4}));
    let none = ask(json!({"tools": tools(), "tool_choice": "none", "max_tokens": 4}));
    let auto = ask(json!({"tools": tools(), "max_tokens": 4}));
    let prompt = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(prompt(&none), prompt(&plain));
    assert!(prompt(&auto) > prompt(&plain) + 50, "{auto}");
    assert_eq!(
        none["choices"][0]["message"],
        plain["choices"][0]["message"]
    );
    assert!(none["choices"][0]["message"]["tool_calls"].is_null());
}

#[test]
fn anthropic_any_and_tool_choice_return_tool_use_blocks_that_validate() {
    let s = Server::start(&[]);
    let tools = json!([{"name": "get_weather", "description": "Weather", "input_schema": weather_params()}]);
    for seed in 1..=3 {
        let body = json!({"model": "x", "max_tokens": 400, "temperature": 1, "seed": seed,
            "messages": user("Weather?"), "tools": tools,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true}});
        let (st, v) = s.post_json("/v1/messages", &body);
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["stop_reason"], "tool_use", "{v}");
        let blocks = v["content"].as_array().unwrap();
        let uses: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "tool_use").collect();
        assert_eq!(uses.len(), 1, "{v}");
        assert!(uses[0]["id"].as_str().unwrap().starts_with("toolu_"));
        assert_eq!(uses[0]["name"], "get_weather");
        assert!(
            invalid(&weather_params(), &uses[0]["input"]).is_empty(),
            "{v}"
        );
        // The follow-up with its tool_result is rendered and answered; the blocks are sent
        // back as the official SDK resends them (with its `caller` field).
        let mut resent = v["content"].clone();
        for b in resent.as_array_mut().unwrap() {
            b["caller"] = Value::Null;
        }
        let follow = json!({"model": "x", "max_tokens": 8, "tools": tools, "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": resent},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0]["id"], "content": "rain"}]}]});
        let (st, answer) = s.post_json("/v1/messages", &follow);
        assert_eq!(st, 200, "{answer}");
        assert!(answer["stop_reason"].is_string(), "{answer}");
    }
    // Streamed: message_start, then the tool_use block's start, its input_json_deltas and
    // stop, then message_delta (stop_reason tool_use) and message_stop.
    let body = json!({"model": "x", "max_tokens": 400, "temperature": 1, "stream": true,
        "messages": user("Weather?"), "tools": tools,
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}});
    let text = s.post("/v1/messages", &body).text().unwrap();
    let events: Vec<Value> = sse_events(&text)
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .filter(|k| *k != "ping")
        .collect();
    let mut expect = vec!["message_start", "content_block_start"];
    let deltas = kinds
        .iter()
        .filter(|k| **k == "content_block_delta")
        .count();
    assert!(deltas >= 2, "{text}");
    expect.extend(std::iter::repeat_n("content_block_delta", deltas));
    expect.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(kinds, expect, "{text}");
    let input: String = events
        .iter()
        .filter_map(|e| e["delta"]["partial_json"].as_str())
        .collect();
    let input: Value = serde_json::from_str(&input).unwrap_or_else(|e| panic!("{e}: {input}"));
    assert!(invalid(&weather_params(), &input).is_empty(), "{input}");
    let stop = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(stop["delta"]["stop_reason"], "tool_use", "{stop}");
}

#[test]
fn a_constrained_job_batched_with_others_gives_its_solo_ids() {
    let s = Arc::new(Server::start(&["--parallel", "4", "--queue", "8"]));
    let constrained = |seed: u64| {
        chat_body(
            user("Weather?"),
            json!({"tools": tools(), "tool_choice": "required", "parallel_tool_calls": false,
                   "max_tokens": 300, "temperature": 1, "seed": seed, "return_tokens": true}),
        )
    };
    let plain = |seed: u64| {
        chat_body(
            user("Talk"),
            json!({"max_tokens": 40, "temperature": 1, "seed": seed, "return_tokens": true,
                   "ignore_eos": true}),
        )
    };
    let bodies = vec![constrained(1), plain(2), constrained(3), plain(4)];
    let ids = |v: &Value| v["choices"][0]["tokens"].clone();
    let solo: Vec<Value> = bodies
        .iter()
        .map(|b| ids(&s.post_json("/v1/chat/completions", b).1))
        .collect();
    let handles: Vec<_> = bodies
        .into_iter()
        .map(|b| {
            let s = s.clone();
            std::thread::spawn(move || s.post_json("/v1/chat/completions", &b).1)
        })
        .collect();
    let batched: Vec<Value> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, v) in batched.iter().enumerate() {
        assert_eq!(ids(v), solo[i], "request {i}: {v}");
    }
    assert!(
        batched
            .iter()
            .any(|v| v["timings"]["mean_batch"].as_f64() > Some(1.0)),
        "the requests shared steps"
    );
    assert_eq!(batched[0]["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn thinking_stays_free_and_a_spent_budget_hands_over_to_the_constraint() {
    let s = Server::start(&[]);
    for seed in 1..=3 {
        let extra = json!({"tools": tools(), "tool_choice": "required", "parallel_tool_calls": false,
                           "thinking": {"type": "enabled", "budget_tokens": 6},
                           "max_tokens": 400, "temperature": 1, "seed": seed});
        let (st, v) = s.post_json("/v1/chat/completions", &chat_body(user("Weather?"), extra));
        assert_eq!(st, 200, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "seed {seed}: {v}");
        assert!(
            !c["message"]["reasoning_content"]
                .as_str()
                .unwrap_or("")
                .is_empty(),
            "the think channel ran first: {v}"
        );
        check_call(&c["message"]["tool_calls"][0]);
    }
}

#[test]
fn auto_returns_whatever_the_model_writes_and_never_fails() {
    // Random weights under `auto`: free text, stray markers, broken tools channels. Whatever
    // does not parse as a call is content; every reply is a 200 with a known finish reason,
    // and any call it does hold has JSON arguments.
    let s = Server::start(&[]);
    for seed in 0..6 {
        for stream in [false, true] {
            let extra = json!({"tools": tools(), "max_tokens": 60, "temperature": 1,
                               "seed": seed, "stream": stream});
            let r = s.post("/v1/chat/completions", &chat_body(user("Hm"), extra));
            assert_eq!(r.status().as_u16(), 200);
            let text = r.text().unwrap();
            if stream {
                assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
                assert!(!text.contains("\"error\""), "{text}");
                continue;
            }
            let v: Value = serde_json::from_str(&text).unwrap();
            let c = &v["choices"][0];
            let finish = c["finish_reason"].as_str().unwrap();
            assert!(["stop", "length", "tool_calls"].contains(&finish), "{v}");
            for call in c["message"]["tool_calls"].as_array().into_iter().flatten() {
                let args = call["function"]["arguments"].as_str().unwrap();
                assert!(serde_json::from_str::<Value>(args).is_ok(), "{args}");
            }
        }
    }
}
