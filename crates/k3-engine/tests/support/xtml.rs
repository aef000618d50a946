//! An independent reader of K3 replies for the structured-output tests, written from
//! docs/MODEL.md#chat-template (not from the grammar that produced them): splits ids at
//! control ids and parses the tools channel into calls with JSON arguments.
#![allow(dead_code)]

// The includer has `Template` and `Tokenizer` in scope (unit tests and integration tests
// name the crate differently).
use super::{Template, Tokenizer};
use serde_json::Value;

/// Splits `ids` at control ids: `Ok(control id)` or `Err(text)` pieces (the text of a run
/// of ordinary ids, which must be valid UTF-8).
pub fn pieces(tok: &Tokenizer, ids: &[u32]) -> Vec<Result<u32, String>> {
    let mut out = Vec::new();
    let mut text: Vec<u8> = Vec::new();
    let flush = |text: &mut Vec<u8>, out: &mut Vec<Result<u32, String>>| {
        if !text.is_empty() {
            let s = String::from_utf8(std::mem::take(text)).expect("valid UTF-8 text");
            out.push(Err(s));
        }
    };
    for &id in ids {
        if tok.is_special(id) {
            flush(&mut text, &mut out);
            out.push(Ok(id));
        } else {
            text.extend_from_slice(tok.token_bytes(id).unwrap());
        }
    }
    flush(&mut text, &mut out);
    out
}

/// One parsed call: tool name, index, arguments as JSON.
pub type Call = (String, String, serde_json::Map<String, Value>);

/// A read position in a reply's pieces.
struct Cursor {
    p: Vec<Result<u32, String>>,
    i: usize,
}

impl Cursor {
    fn next(&mut self, what: &str) -> Result<u32, String> {
        let v = self.p.get(self.i).cloned();
        self.i += 1;
        v.unwrap_or_else(|| panic!("reply ends before {what}: {:?}", self.p))
    }

    fn peek_text(&self) -> Option<String> {
        match self.p.get(self.i) {
            Some(Err(t)) => Some(t.clone()),
            _ => None,
        }
    }

    /// `marker` text `<|sep|>`; returns the text.
    fn tag(&mut self, marker: u32, sep: u32, text: &str) -> String {
        assert_eq!(self.next(text), Ok(marker), "{text}");
        let got = self.next(text).expect_err("tag text");
        assert!(got.starts_with(text), "{got} vs {text}");
        assert_eq!(self.next(text), Ok(sep));
        got
    }
}

/// An attribute's value, unescaped.
fn attr(s: &str, k: &str) -> String {
    let start = s.find(&format!("{k}=\"")).unwrap() + k.len() + 2;
    let end = start + s[start..].find('"').unwrap();
    s[start..end].replace("&quot;", "\"").replace("&amp;", "&")
}

/// Parses the tools-channel reply `ids` (docs/MODEL.md#chat-template) independently of the
/// grammar: empty response, `tools` channel of calls, `close(message)`.
pub fn parse_tool_reply(tok: &Tokenizer, ids: &[u32]) -> Vec<Call> {
    let t = Template::new(tok).unwrap();
    let (open, close) = (t.open_tag("x")[0], t.close_tag("x")[0]);
    let sep = *t.close_tag("x").last().unwrap();
    let mut c = Cursor {
        p: pieces(tok, ids),
        i: 0,
    };
    c.tag(close, sep, "response");
    c.tag(open, sep, "tools");
    let mut calls = Vec::new();
    loop {
        let head = c.next("call or close(tools)");
        if head == Ok(close) {
            assert_eq!(c.next("tools"), Err("tools".into()));
            assert_eq!(c.next("sep"), Ok(sep));
            break;
        }
        assert_eq!(head, Ok(open));
        let attrs = c.next("call attrs").unwrap_err();
        assert_eq!(c.next("sep"), Ok(sep));
        assert!(attrs.starts_with("call "), "{attrs}");
        let mut args = serde_json::Map::new();
        loop {
            let m = c.next("argument or close(call)");
            let text = c.next("tag").unwrap_err();
            assert_eq!(c.next("sep"), Ok(sep));
            if m == Ok(close) {
                assert_eq!(text, "call");
                break;
            }
            assert!(text.starts_with("argument "), "{text}");
            let (key, ty) = (attr(&text, "key"), attr(&text, "type"));
            let raw = c.peek_text().unwrap_or_default();
            if !raw.is_empty() {
                c.i += 1;
            }
            let value = if ty == "string" {
                Value::String(raw)
            } else {
                serde_json::from_str(&raw).unwrap()
            };
            args.insert(key, value);
            assert_eq!(c.next("close"), Ok(close));
            assert_eq!(c.next("argument"), Err("argument".into()));
            assert_eq!(c.next("sep"), Ok(sep));
        }
        calls.push((attr(&attrs, "tool"), attr(&attrs, "index"), args));
    }
    c.tag(close, sep, "message");
    assert_eq!(c.i, c.p.len(), "trailing ids");
    calls
}
