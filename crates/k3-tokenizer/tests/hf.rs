//! tokenizer.json interchange: the exported `tokenizers::Tokenizer` (loaded back through the
//! `tokenizers` crate, regex Split and all) reproduces tiktoken's ids, and re-importing the JSON
//! gives an identical tokenizer.

mod common;

use common::*;
use k3_tokenizer::{Tokenizer, TokenizerError};
use serde_json::Value;

/// Encodes every parity case through HF (specials are always matched there) and compares.
fn check_hf(tok: &Tokenizer, doc: &Value) {
    let json = tok.export_json(false).unwrap();
    let hf: k3_tokenizer::tokenizers::Tokenizer = json.parse().unwrap();
    for case in doc["cases"].as_array().unwrap() {
        let (name, text) = (
            case["name"].as_str().unwrap(),
            case["text"].as_str().unwrap(),
        );
        let enc = hf.encode(text, false).unwrap();
        assert_eq!(enc.get_ids(), ids(&case["with_specials"]), "hf: {name}");
    }
    let back = Tokenizer::from_tokenizer_json_str(&json, "exported").unwrap();
    assert_eq!(back.vocab_size(), tok.vocab_size());
    assert_eq!(back.specials(), tok.specials());
    assert_eq!(back.bos_id(), tok.bos_id());
    assert_eq!(back.eos_id(), tok.eos_id());
    for (name, text) in text_cases(doc) {
        assert_eq!(
            back.encode_ordinary(&text),
            tok.encode_ordinary(&text),
            "reimport: {name}"
        );
    }
}

#[test]
fn tiny_export_matches_tiktoken_through_hf() {
    check_hf(tiny(), &parity("parity_tiny_k3.json"));
}

#[test]
fn o200k_export_matches_tiktoken_through_hf() {
    check_hf(o200k(), &parity("parity_o200k.json"));
}

#[test]
fn from_dir_falls_back_to_tokenizer_json() {
    let dir = std::env::temp_dir().join(format!("k3tok-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        tiny().export_json(true).unwrap(),
    )
    .unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(
        tok.encode_ordinary("hello world"),
        tiny().encode_ordinary("hello world")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tokenizer_json_with_other_pattern_is_refused() {
    let json = tiny().export_json(false).unwrap();
    let mut value: Value = serde_json::from_str(&json).unwrap();
    value["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = Value::from(r"\w+|\s+");
    let err = Tokenizer::from_tokenizer_json_str(&value.to_string(), "other.json").unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnsupportedTokenizerJson { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("other.json: unsupported tokenizer.json"),
        "{err}"
    );
}

#[test]
fn tokenizer_json_syntax_error_has_line() {
    let err = Tokenizer::from_tokenizer_json_str("{\n  \"version\": \"1.0\",\n  oops\n}", "t.json")
        .unwrap_err();
    assert!(err.to_string().starts_with("t.json:3:"), "{err}");
}

/// Regression: a vocab giving one id to two strings used to be accepted: one string
/// was dropped (which one depended on hash order) and its id became an empty token.
#[test]
fn tokenizer_json_with_a_repeated_vocab_id_is_refused() {
    let json = tiny().export_json(false).unwrap();
    let mut v: Value = serde_json::from_str(&json).unwrap();
    let vocab = v["model"]["vocab"].as_object_mut().unwrap();
    let victim = vocab
        .iter()
        .find(|(_, id)| id.as_u64() == Some(300))
        .map(|(k, _)| k.clone())
        .unwrap();
    vocab.insert(victim, Value::from(5));
    let err = Tokenizer::from_tokenizer_json_str(&v.to_string(), "dup.json").unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, TokenizerError::UnsupportedTokenizerJson { .. }),
        "{msg}"
    );
    assert!(
        msg.contains("dup.json") && msg.contains("vocab id 5"),
        "{msg}"
    );
}
