//! The reply parser as the server reads a reply ([`ReplyStream::served`], docs/SERVER.md
//! "Tools"): no control-token spelling or template markup reaches the text, a call is
//! released whole when it closes, and a call that broke or was cut is dropped. The property:
//! any id sequence (valid markup, broken markup, stray control ids, text), cut anywhere.

use k3_engine::chat_template::{Channel, ReplyEvent, ReplyStream, Served, Template};
use k3_engine::Tokenizer;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::path::PathBuf;

fn tok() -> &'static Tokenizer {
    static TOK: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3");
        Tokenizer::from_dir(dir).unwrap()
    })
}

const HIDDEN: Served = Served {
    show_control: false,
};

/// Text and calls (name, arguments JSON text) that a served stream's events say, checking
/// on the way that every call's events arrive together, in one push, start to end.
fn served_events(batches: &[Vec<ReplyEvent>]) -> (String, Vec<(String, String)>) {
    let (mut text, mut calls) = (String::new(), Vec::new());
    for events in batches {
        let mut open: Option<(String, String)> = None;
        for e in events {
            match e {
                ReplyEvent::Reasoning(t) | ReplyEvent::Content(t) => {
                    assert!(open.is_none(), "text inside a call's events: {events:?}");
                    text.push_str(t);
                }
                ReplyEvent::CallStart { index, name } => {
                    assert_eq!(*index, calls.len(), "calls numbered in order");
                    open = Some((name.clone(), String::new()));
                }
                ReplyEvent::ArgumentsDelta { json_fragment, .. } => {
                    let call = open.as_mut().expect("arguments of a call that started");
                    call.1.push_str(json_fragment);
                }
                ReplyEvent::CallEnd { .. } => calls.push(open.take().expect("a call ends")),
                ReplyEvent::Done => {}
            }
        }
        assert!(
            open.is_none(),
            "a call released without its end: {events:?}"
        );
    }
    (text, calls)
}

/// A reply with a stray control id in its text and one complete call.
fn reply_with_a_call(t: &Template<'_>, stray: u32) -> Vec<u32> {
    let mut ids = t.text("Sure");
    ids.push(stray);
    ids.extend(t.text("."));
    ids.extend(t.close_tag("response"));
    ids.extend(t.tools_open());
    ids.extend(t.call_open("get_weather", 1));
    ids.extend(t.argument("city", &json!("Oslo")));
    ids.extend(t.argument("days", &json!(2)));
    ids.extend(t.call_close());
    ids.extend(t.tools_close());
    ids.extend(t.message_close());
    ids.push(t.end_ids()[0]);
    ids
}

fn spellings(k: &Tokenizer) -> Vec<String> {
    k.specials().iter().map(|s| s.content.clone()).collect()
}

#[test]
fn a_served_reply_hides_control_ids_unless_asked_and_releases_calls_whole() {
    let k = tok();
    let t = Template::new(k).unwrap();
    let stray = k.token_id("<|reserved_token_226|>").expect("a reserved id");
    let ids = reply_with_a_call(&t, stray);
    let run = |served| {
        let mut s = ReplyStream::served(&t, Channel::Response, served);
        let batches: Vec<_> = ids.iter().map(|&id| s.push(id)).collect();
        let parsed = s.finish();
        (served_events(&batches), parsed)
    };
    let ((text, calls), parsed) = run(HIDDEN);
    assert_eq!(text, "Sure.");
    assert_eq!(parsed.content, "Sure.");
    assert_eq!(parsed.control_ids, vec![stray], "still counted");
    assert_eq!(calls.len(), 1);
    let args: Value = serde_json::from_str(&calls[0].1).unwrap();
    assert_eq!(args, json!({"city": "Oslo", "days": 2}));
    let ((shown, _), _) = run(Served { show_control: true });
    assert_eq!(
        shown, "Sure<|reserved_token_226|>.",
        "--special prints the spelling"
    );
}

#[test]
fn a_call_cut_anywhere_is_dropped_and_no_markup_is_left() {
    let k = tok();
    let t = Template::new(k).unwrap();
    let ids = reply_with_a_call(&t, t.control_ids()[0]);
    let call_end = ids.len() - t.tools_close().len() - t.message_close().len() - 1;
    for cut in 0..=ids.len() {
        let mut s = ReplyStream::served(&t, Channel::Response, HIDDEN);
        let mut batches: Vec<_> = ids[..cut].iter().map(|&id| s.push(id)).collect();
        batches.push(s.flush());
        let (text, calls) = served_events(&batches);
        for sp in spellings(k) {
            assert!(!text.contains(&sp), "cut {cut}: {sp} in {text:?}");
        }
        assert!("Sure.".starts_with(&text), "cut {cut}: {text:?}");
        assert_eq!(calls.len(), usize::from(cut >= call_end), "cut {cut}");
    }
}

#[test]
fn a_broken_tools_channel_is_dropped_not_returned_as_content() {
    let k = tok();
    let t = Template::new(k).unwrap();
    let mut ids = t.text("Hi");
    ids.extend(t.close_tag("response"));
    ids.extend(t.tools_open());
    ids.extend(t.call_open("f", 1));
    ids.extend(t.argument_open("a", "string"));
    ids.extend(t.text("x"));
    ids.extend(t.open_tag("oops")); // breaks the argument
    ids.extend(t.text(" and more"));
    ids.extend(t.message_close());
    let mut s = ReplyStream::served(&t, Channel::Response, HIDDEN);
    let batches = vec![s.push_all(&ids), s.flush()];
    let (text, calls) = served_events(&batches);
    assert_eq!((text.as_str(), calls.len()), ("Hi", 0));
    // The plain parser, for `k3 chat`, still returns what it read.
    let mut plain = ReplyStream::new(&t, Channel::Response);
    plain.push_all(&ids);
    assert!(plain.finish().content.contains("<|open|>oops"));
}

/// Pieces a reply is drawn from: valid markup, broken markup, text, stray control ids.
fn piece(t: &Template<'_>, k: &Tokenizer, which: usize, text: &str) -> Vec<u32> {
    match which {
        0 => t.text(text),
        1 => t.think_to_response(),
        2 => t.close_tag("response"),
        3 => t.tools_open(),
        4 => t.call_open("f", 1),
        5 => t.argument_open("a", "string"),
        6 => t.argument_open("n", "integer"),
        7 => t.argument_close(),
        8 => t.call_close(),
        9 => t.tools_close(),
        10 => t.message_close(),
        11 => t.open_tag(text),
        12 => vec![t.control_ids()[text.len() % 3]],
        13 => vec![k.specials()[text.len() % k.specials().len()].id],
        _ => vec![t.end_ids()[0]],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn no_served_text_carries_markup_and_every_call_is_whole(
        parts in prop::collection::vec((0usize..15, "[a-z \"{}<|>]{0,6}"), 0..24),
        cut_at in 0usize..400,
        think in any::<bool>(),
    ) {
        let k = tok();
        let t = Template::new(k).unwrap();
        let mut ids: Vec<u32> = parts.iter().flat_map(|(w, s)| piece(&t, k, *w, s)).collect();
        ids.truncate(cut_at);
        let start = if think { Channel::Think } else { Channel::Response };
        let mut s = ReplyStream::served(&t, start, HIDDEN);
        let mut batches: Vec<_> = ids.iter().map(|&id| s.push(id)).collect();
        batches.push(s.flush());
        let (text, calls) = served_events(&batches);
        for sp in spellings(k) {
            prop_assert!(!text.contains(&sp), "{} in {:?}", sp, text);
        }
        for (name, args) in &calls {
            prop_assert_eq!(name, "f");
            let v: Value = serde_json::from_str(args).map_err(|e| {
                TestCaseError::fail(format!("{e}: {args}"))
            })?;
            prop_assert!(v.is_object(), "{}", args);
        }
    }
}
