//! The tool-call side of the reply parser (docs/MODEL.md#chat-template): events for a
//! rendered reply, malformed output coming back as content, the template's piece helpers,
//! the history rules with tools; and the property: a random assistant turn with calls,
//! rendered and fed back in any chunking, parses to the same calls, and text that spells a
//! marker never becomes one.

use k3_engine::chat_template::{
    self as chat, Channel, ChatMessage, ReplyEvent, ReplyStream, Template, Thinking, ToolCall,
};
use k3_engine::Tokenizer;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::path::PathBuf;

fn tok() -> Tokenizer {
    Tokenizer::from_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3"))
        .unwrap()
}

/// Builds ids from pieces: `@name` is a control token, anything else plain text.
fn pieces(tok: &Tokenizer, parts: &[&str]) -> Vec<u32> {
    let mut out = Vec::new();
    for p in parts {
        match p.strip_prefix('@') {
            Some(name) => out.push(tok.token_id(name).unwrap()),
            None => out.extend(tok.encode_ordinary(p)),
        }
    }
    out
}

/// What a stream of events says: reasoning, content, per call (name, arguments JSON text),
/// and how many `Done`s.
#[derive(Debug, Default, PartialEq)]
struct Seen {
    reasoning: String,
    content: String,
    calls: Vec<(String, String, bool)>,
    done: usize,
}

fn collect(events: &[ReplyEvent]) -> Seen {
    let mut s = Seen::default();
    for e in events {
        match e {
            ReplyEvent::Reasoning(t) => s.reasoning.push_str(t),
            ReplyEvent::Content(t) => s.content.push_str(t),
            ReplyEvent::CallStart { index, name } => {
                assert_eq!(*index, s.calls.len(), "calls numbered from 0 in order");
                s.calls.push((name.clone(), String::new(), false));
            }
            ReplyEvent::ArgumentsDelta {
                index,
                json_fragment,
            } => {
                let call = &mut s.calls[*index];
                assert!(!call.2, "no arguments after CallEnd");
                call.1.push_str(json_fragment);
            }
            ReplyEvent::CallEnd { index } => s.calls[*index].2 = true,
            ReplyEvent::Done => s.done += 1,
        }
    }
    s
}

/// A generated reply (after a thinking generation prompt) with two calls.
fn reply_ids(t: &Template<'_>) -> Vec<u32> {
    let mut ids = t.text("Let me check.");
    ids.extend(t.think_to_response());
    ids.extend(t.text("Sure."));
    ids.extend(t.close_tag("response"));
    ids.extend(t.tools_open());
    ids.extend(t.call_open("get_weather", 1));
    ids.extend(t.argument("city", &json!("Paris")));
    ids.extend(t.argument("days", &json!(3)));
    ids.extend(t.call_close());
    ids.extend(t.call_open("now", 2));
    ids.extend(t.call_close());
    ids.extend(t.tools_close());
    ids.extend(t.message_close());
    ids.push(t.end_of_msg());
    ids
}

#[test]
fn a_reply_with_calls_streams_openai_style_events() {
    let k = tok();
    let t = Template::new(&k).unwrap();
    let ids = reply_ids(&t);
    let mut stream = ReplyStream::new(&t, Channel::Think);
    let mut events = Vec::new();
    for &id in &ids {
        events.extend(stream.push(id));
    }
    assert_eq!(events.last(), Some(&ReplyEvent::Done));
    let seen = collect(&events);
    assert_eq!(seen.reasoning, "Let me check.");
    assert_eq!(seen.content, "Sure.");
    assert_eq!(
        seen.calls,
        vec![
            (
                "get_weather".to_string(),
                r#"{"city": "Paris", "days": 3}"#.to_string(),
                true
            ),
            ("now".to_string(), "{}".to_string(), true),
        ]
    );
    let parsed = stream.finish();
    assert!(parsed.complete);
    assert_eq!(parsed.tool_calls.len(), 2);
    assert_eq!(
        Value::Object(parsed.tool_calls[0].arguments.clone()),
        json!({"city": "Paris", "days": 3})
    );
    // parse_assistant sees the same reply (with its generation prompt in front).
    let mut whole = t.generation_prompt(Thinking::High);
    whole.extend(&ids);
    let p = chat::parse_assistant(&k, &whole).unwrap();
    assert_eq!(
        (p.reasoning.as_str(), p.content.as_str(), p.complete),
        ("Let me check.", "Sure.", true)
    );
    assert_eq!(p.tool_calls, parsed.tool_calls);
}

#[test]
fn malformed_tool_output_comes_back_as_content() {
    let k = tok();
    let t = Template::new(&k).unwrap();
    // A tools channel with text where a call should be.
    let mut ids = t.text("Hi.");
    ids.extend(t.close_tag("response"));
    ids.extend(t.tools_open());
    ids.extend(t.text("oops"));
    ids.extend(t.message_close());
    ids.push(t.end_of_msg());
    let mut s = ReplyStream::new(&t, Channel::Response);
    let seen = collect(&s.push_all(&ids));
    assert!(seen.calls.is_empty());
    assert_eq!(
        seen.content,
        "Hi.<|open|>tools<|sep|>oops<|close|>message<|sep|>"
    );
    let p = s.finish();
    assert!(!p.complete && p.tool_calls.is_empty());
    assert_eq!(p.content, seen.content);

    // A call without a `tool` attribute, then a good one: nothing parses as a call.
    let mut ids = t.close_tag("response");
    ids.extend(t.tools_open());
    ids.extend(t.open_with("call", &[("index", "1")]));
    ids.extend(t.call_close());
    let p = chat::parse_assistant(&k, &ids).unwrap();
    assert!(p.tool_calls.is_empty() && !p.complete);
    assert!(
        p.content.contains("<|open|>call index=\"1\"<|sep|>"),
        "{}",
        p.content
    );

    // A non-string argument that is not JSON keeps its text as a string.
    let mut ids = t.close_tag("response");
    ids.extend(t.tools_open());
    ids.extend(t.call_open("f", 1));
    ids.extend(t.argument_open("n", "number"));
    ids.extend(t.text("three"));
    ids.extend(t.argument_close());
    ids.extend(t.call_close());
    ids.extend(t.tools_close());
    ids.extend(t.message_close());
    ids.push(t.end_of_msg());
    let mut s = ReplyStream::new(&t, Channel::Response);
    let seen = collect(&s.push_all(&ids));
    assert_eq!(seen.calls[0].1, r#"{"n": "three"}"#);
    let p = s.finish();
    assert!(p.complete);
    assert_eq!(p.tool_calls[0].arguments["n"], json!("three"));
}

#[test]
fn a_call_cut_short_still_closes_its_json() {
    let k = tok();
    let t = Template::new(&k).unwrap();
    let mut ids = t.close_tag("response");
    ids.extend(t.tools_open());
    ids.extend(t.call_open("write", 1));
    ids.extend(t.argument_open("text", "string"));
    ids.extend(t.text("half \"a\" é"));
    let mut s = ReplyStream::new(&t, Channel::Response);
    let mut events = s.push_all(&ids);
    events.extend(s.flush());
    let seen = collect(&events);
    assert_eq!(seen.calls.len(), 1);
    let args: Value = serde_json::from_str(&seen.calls[0].1).unwrap();
    assert_eq!(args, json!({"text": "half \"a\" é"}));
    assert!(seen.calls[0].2);
    let p = s.finish();
    assert!(!p.complete);
    assert_eq!(p.tool_calls[0].arguments["text"], json!("half \"a\" é"));
}

#[test]
fn piece_helpers_are_the_documented_markers() {
    let k = tok();
    let t = Template::new(&k).unwrap();
    let (o, c, s) = ("@<|open|>", "@<|close|>", "@<|sep|>");
    assert_eq!(t.tools_open(), pieces(&k, &[o, "tools", s]));
    assert_eq!(t.tools_close(), pieces(&k, &[c, "tools", s]));
    assert_eq!(t.call_close(), pieces(&k, &[c, "call", s]));
    assert_eq!(t.argument_close(), pieces(&k, &[c, "argument", s]));
    assert_eq!(
        t.call_open("a&\"b", 2),
        pieces(
            &k,
            &[
                o,
                "call",
                " tool",
                "=\"",
                "a&amp;&quot;b",
                "\"",
                " index",
                "=\"",
                "2",
                "\"",
                s
            ]
        )
    );
    assert_eq!(
        t.argument_open("k", "object"),
        pieces(
            &k,
            &[o, "argument", " key", "=\"", "k", "\"", " type", "=\"", "object", "\"", s]
        )
    );
    assert_eq!(chat::argument_type(&json!(1.5)), "number");
    assert_eq!(
        chat::argument_text(&json!({"a": [1, null], "b": "é"})),
        r#"{"a": [1, null], "b": "é"}"#
    );
}

#[test]
fn history_rules_with_tools() {
    let call = ToolCall {
        id: Some("c1".into()),
        name: "f".into(),
        arguments: Map::new(),
    };
    let asks = ChatMessage {
        tool_calls: vec![call],
        ..ChatMessage::new("assistant", "")
    };
    let ok = vec![
        ChatMessage::new("system", "s"),
        ChatMessage::new("user", "u"),
        asks.clone(),
        ChatMessage::tool_result("c1", "f", "r"),
        ChatMessage::new("assistant", "done"),
        ChatMessage::new("user", "again"),
    ];
    chat::validate_history(&ok).unwrap();
    let text = chat::history_jsonl(&ok).unwrap();
    assert!(text.contains(r#""tool_calls":[{"id":"c1","name":"f","arguments":{}}]"#));
    assert_eq!(chat::parse_history(&text, "h.jsonl").unwrap(), ok);
    // Lines written before tools existed still load.
    let old = "{\"role\":\"user\",\"content\":\"hi\"}\n{\"role\":\"assistant\",\"content\":\"yo\",\"reasoning_content\":\"r\"}\n";
    assert_eq!(chat::parse_history(old, "old.jsonl").unwrap().len(), 2);

    let bad = |msgs: &[ChatMessage], what: &str| {
        let e = chat::validate_history(msgs).unwrap_err().to_string();
        assert!(e.contains(what), "{e}");
    };
    let u = ChatMessage::new("user", "u");
    let result = ChatMessage::tool_result("c1", "f", "r");
    bad(
        &[
            u.clone(),
            ChatMessage::new("assistant", "a"),
            result.clone(),
        ],
        "message 3: role `tool`",
    );
    bad(&[u.clone(), asks.clone(), u.clone()], "with tool calls");
    let misplaced = ChatMessage {
        tool_call_id: Some("c1".into()),
        ..u.clone()
    };
    bad(&[misplaced], "tool_call_id");
    // A tool result nobody can name is a render error, not a panic.
    let k = tok();
    let bare = ChatMessage::new("tool", "r");
    let e = chat::render(
        &k,
        &[u, ChatMessage::new("assistant", ""), bare],
        Thinking::Off,
        false,
    );
    assert!(e.unwrap_err().to_string().contains("message 3"));
}

/// A JSON value for an argument: any type, strings full of attribute and marker syntax.
fn value() -> impl Strategy<Value = Value> {
    let text = "[a-z &\"<|>é😀\n]{0,12}|<\\|open\\|>|<\\|close\\|>argument<\\|sep\\|>";
    let leaf = prop_oneof![
        text.prop_map(Value::String),
        any::<i64>().prop_map(Value::from),
        (-4000i32..4000).prop_map(|i| Value::from(f64::from(i) / 8.0)),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z\"&]{1,4}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn tool_call() -> impl Strategy<Value = ToolCall> {
    (
        "[a-z_][a-z0-9_&\".]{0,10}",
        prop::collection::vec(("[a-zA-Z_&\" <|>]{1,8}", value()), 0..4),
    )
        .prop_map(|(name, args)| ToolCall {
            id: None,
            name,
            arguments: args.into_iter().collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn rendered_calls_parse_back_in_any_chunking(
        calls in prop::collection::vec(tool_call(), 1..4),
        content in "[a-zA-Z <|>\"&é]{0,16}",
        reasoning in "[a-zA-Z <|>\"&é]{0,16}",
        thinking in any::<bool>(),
        cuts in prop::collection::vec(1usize..9, 1..40),
    ) {
        let k = tok();
        let t = Template::new(&k).unwrap();
        let effort = if thinking { Thinking::High } else { Thinking::Off };
        let m = ChatMessage {
            reasoning_content: Some(reasoning.clone()),
            tool_calls: calls.clone(),
            ..ChatMessage::new("assistant", content.clone())
        };
        let ids = t.message(&m, effort).unwrap();
        // Only the template's markers are control ids, whatever the text spells.
        let args: usize = calls.iter().map(|c| c.arguments.len()).sum();
        let want_specials = 2 + if thinking { 4 } else { 0 } + 4 + 4 + 4 * calls.len() + 4 * args + 3;
        prop_assert_eq!(ids.iter().filter(|&&id| k.is_special(id)).count(), want_specials);

        let prompt = t.generation_prompt(effort);
        prop_assert!(ids.starts_with(&prompt));
        let start = if thinking { Channel::Think } else { Channel::Response };
        let mut s = ReplyStream::new(&t, start);
        let mut events = Vec::new();
        let mut rest = &ids[prompt.len()..];
        for n in cuts.iter().cycle() {
            if rest.is_empty() { break; }
            let n = (*n).min(rest.len());
            events.extend(s.push_all(&rest[..n]));
            rest = &rest[n..];
        }
        let seen = collect(&events);
        let want_reasoning = if thinking && !reasoning.trim().is_empty() { reasoning.as_str() } else { "" };
        prop_assert_eq!(seen.reasoning.as_str(), want_reasoning);
        prop_assert_eq!(seen.content.as_str(), content.as_str());
        prop_assert_eq!(seen.done, 1);
        prop_assert_eq!(seen.calls.len(), calls.len());
        for ((name, json_text, ended), call) in seen.calls.iter().zip(&calls) {
            prop_assert_eq!(name, &call.name);
            prop_assert!(ended);
            let streamed: Map<String, Value> = serde_json::from_str(json_text).unwrap();
            prop_assert_eq!(&streamed, &call.arguments);
        }
        let parsed = s.finish();
        prop_assert!(parsed.complete);
        prop_assert_eq!(parsed.tool_calls, calls.clone());
        // And the parsed turn renders back to the same ids.
        let back = ChatMessage {
            reasoning_content: Some(parsed.reasoning),
            tool_calls: calls,
            ..ChatMessage::new("assistant", parsed.content)
        };
        prop_assert_eq!(t.message(&back, effort).unwrap(), ids);
    }
}

#[test]
fn tolerated_shapes_parse_but_are_not_complete() {
    let k = tok();
    let t = Template::new(&k).unwrap();
    // open(response) without close(think); newlines between calls; no close(response).
    let mut ids = t.text("hmm");
    ids.extend(t.open_with("response", &[]));
    ids.extend(t.text("ok"));
    ids.extend(t.tools_open());
    ids.extend(t.text("\n"));
    ids.extend(t.call_open("f", 1));
    ids.extend(t.argument("x", &json!(true)));
    ids.extend(t.call_close());
    ids.extend(t.text("\n"));
    ids.extend(t.tools_close());
    ids.extend(t.message_close());
    ids.push(t.end_of_msg());
    let mut s = ReplyStream::new(&t, Channel::Think);
    let seen = collect(&s.push_all(&ids));
    assert_eq!(
        (seen.reasoning.as_str(), seen.content.as_str()),
        ("hmm", "ok")
    );
    assert_eq!(
        seen.calls,
        vec![("f".to_string(), r#"{"x": true}"#.to_string(), true)]
    );
    let p = s.finish();
    assert!(!p.complete);
    assert_eq!(p.tool_calls.len(), 1);

    // Bad tool input is a clear error, not a panic.
    let nameless = ChatMessage {
        tool_calls: vec![ToolCall::default()],
        ..ChatMessage::new("assistant", "")
    };
    let e = chat::render(&k, &[nameless], Thinking::Off, false).unwrap_err();
    assert!(e.to_string().contains("tool call 1: empty name"), "{e}");
    let tool = chat::ToolSpec {
        name: String::new(),
        description: None,
        parameters: Value::Null,
    };
    let e = chat::render_with_tools(&k, &[], &[tool], Thinking::Off, false).unwrap_err();
    assert!(e.to_string().contains("tool 1: empty name"), "{e}");
}
