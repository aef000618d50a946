//! Property tests: lossless roundtrips on arbitrary input, the scanner split-for-split against
//! the regex engine tiktoken uses, and the streaming decoder against whole decoding.

mod common;

use common::{o200k, tiny};
use fancy_regex::Regex;
use k3_tokenizer::{Tokenizer, KIMI_PAT_STR};
use proptest::prelude::*;
use std::sync::OnceLock;

fn regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(KIMI_PAT_STR).expect("pattern compiles in fancy-regex"))
}

/// Chars that exercise every rule of the pattern and its class edges.
const ALPHABET: &[char] = &[
    'a',
    'Z',
    'é',
    'ǅ',
    'ʰ',
    'ſ',
    'K',
    'K',
    's',
    'S',
    't',
    'l',
    'L',
    'r',
    'e',
    'v',
    'm',
    'd',
    'D',
    '\'',
    '\u{301}',
    '\u{93f}',
    '中',
    '〇',
    '々',
    '、',
    'ア',
    'ー',
    '한',
    'ß',
    '1',
    '٣',
    '½',
    'Ⅻ',
    ' ',
    ' ',
    '\t',
    '\r',
    '\n',
    '\u{a0}',
    '\u{3000}',
    '\u{2028}',
    '\u{85}',
    '\u{b}',
    '.',
    '!',
    '/',
    '<',
    '|',
    '>',
    '😀',
    '\u{200d}',
    '\u{1f3fd}',
    '\u{fe0f}',
    '\0',
    '_',
    '-',
    '$',
];

fn tricky_string() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(ALPHABET), 0..40)
        .prop_map(|chars| chars.into_iter().collect())
}

fn roundtrip(tok: &Tokenizer, text: &str) {
    let ids = tok.encode_ordinary(text);
    assert_eq!(tok.decode(&ids).unwrap(), text.as_bytes());
    let ids = tok.encode_with_specials(text);
    assert_eq!(tok.decode(&ids).unwrap(), text.as_bytes());
}

#[test]
fn scanner_matches_fancy_regex_on_parity_texts() {
    let doc = common::parity("parity_o200k.json");
    let corpus_texts = common::text_cases(&doc);
    for (name, text) in &corpus_texts {
        let expected: Vec<&str> = regex()
            .find_iter(text)
            .map(|m| m.unwrap().as_str())
            .collect();
        assert_eq!(o200k().pieces(text).collect::<Vec<_>>(), expected, "{name}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        // PROPTEST_CASES=100000 for a long run.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn scanner_matches_fancy_regex(text in tricky_string()) {
        let expected: Vec<&str> =
            regex().find_iter(&text).map(|m| m.expect("regex runs").as_str()).collect();
        let got: Vec<&str> = tiny().pieces(&text).collect();
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn scanner_matches_fancy_regex_any_unicode(text in any::<String>()) {
        let expected: Vec<&str> =
            regex().find_iter(&text).map(|m| m.expect("regex runs").as_str()).collect();
        let got: Vec<&str> = tiny().pieces(&text).collect();
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn unicode_roundtrips(text in any::<String>(), tricky in tricky_string()) {
        roundtrip(tiny(), &text);
        roundtrip(o200k(), &text);
        roundtrip(o200k(), &tricky);
    }

    #[test]
    fn bytes_roundtrip_and_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        for tok in [tiny(), o200k()] {
            for allow in [false, true] {
                let ids = tok.encode_bytes(&bytes, allow);
                prop_assert_eq!(tok.decode(&ids).unwrap(), bytes.clone());
            }
        }
        if let Ok(text) = std::str::from_utf8(&bytes) {
            prop_assert_eq!(o200k().encode_bytes(&bytes, false), o200k().encode_ordinary(text));
        }
    }

    #[test]
    fn stream_decoder_equals_lossy_decode(ids in prop::collection::vec(0u32..(256 + 256 + 200), 0..60)) {
        let tok = tiny();
        let mut stream = tok.stream_decoder();
        let mut text = String::new();
        for &id in &ids {
            let piece = stream.push(id).unwrap();
            text.push_str(&piece);
        }
        text.push_str(&stream.finish());
        prop_assert_eq!(text, tok.decode_lossy(&ids).unwrap());
    }
}
