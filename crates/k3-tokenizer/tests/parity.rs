//! Token-for-token parity with Python tiktoken (expected ids committed by
//! tools/tokenizer/gen_parity.py): o200k ranks with Kimi's regex and specials, and the tiny
//! fixture tokenizers.

mod common;

use common::*;
use k3_tokenizer::Tokenizer;
use serde_json::Value;

/// Checks every text, byte and corpus case of `doc` against `tok`; returns the case count.
fn check_parity(tok: &Tokenizer, doc: &Value) -> usize {
    assert_eq!(tok.num_ranks() as u64, doc["n_ranks"].as_u64().unwrap());
    let mut checked = 0;
    for case in doc["cases"].as_array().unwrap() {
        let (name, text) = (
            case["name"].as_str().unwrap(),
            case["text"].as_str().unwrap(),
        );
        assert_eq!(
            tok.encode_ordinary(text),
            ids(&case["ordinary"]),
            "ordinary: {name}"
        );
        let with = ids(&case["with_specials"]);
        assert_eq!(
            tok.encode_with_specials(text),
            with,
            "with specials: {name}"
        );
        assert_eq!(
            tok.decode(&with).unwrap(),
            text.as_bytes(),
            "decode: {name}"
        );
        checked += 1;
    }
    for case in doc["byte_cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let bytes = unhex(case["hex"].as_str().unwrap());
        let ordinary = ids(&case["ordinary"]);
        assert_eq!(tok.encode_bytes(&bytes, false), ordinary, "bytes: {name}");
        let with = ids(&case["with_specials"]);
        assert_eq!(
            tok.encode_bytes(&bytes, true),
            with,
            "bytes+specials: {name}"
        );
        assert_eq!(
            tok.decode(&ordinary).unwrap(),
            bytes,
            "decode bytes: {name}"
        );
        checked += 1;
    }
    checked
}

/// The ≥ 256 KiB corpus: same id count and checksum as tiktoken, and a byte-exact roundtrip.
fn check_corpus(tok: &Tokenizer, doc: &Value) {
    let cases = text_cases(doc);
    let texts: Vec<&str> = cases
        .iter()
        .take_while(|(n, _)| !n.starts_with("special_"))
        .map(|(_, t)| t.as_str())
        .collect();
    let spec = &doc["corpus"];
    let text = corpus(&texts, spec["min_bytes"].as_u64().unwrap() as usize);
    assert_eq!(
        text.len() as u64,
        spec["bytes"].as_u64().unwrap(),
        "corpus size"
    );
    let ids = tok.encode_ordinary(&text);
    assert_eq!(
        ids.len() as u64,
        spec["n_ids"].as_u64().unwrap(),
        "corpus id count"
    );
    assert_eq!(
        format!("{:016x}", fnv1a_ids(&ids)),
        spec["fnv1a64"].as_str().unwrap()
    );
    assert_eq!(
        tok.decode(&ids).unwrap(),
        text.as_bytes(),
        "corpus roundtrip"
    );
}

#[test]
fn o200k_kimi_parity_cases() {
    let doc = parity("parity_o200k.json");
    let n = check_parity(o200k(), &doc);
    assert!(n >= 40, "only {n} cases");
}

#[test]
fn o200k_kimi_corpus_parity_and_roundtrip() {
    check_corpus(o200k(), &parity("parity_o200k.json"));
}

#[test]
fn tiny_k3_parity() {
    let doc = parity("parity_tiny_k3.json");
    check_parity(tiny(), &doc);
    check_corpus(tiny(), &doc);
}

#[test]
fn tiny_k3_wide_parity() {
    let doc = parity("parity_tiny_k3_wide.json");
    check_parity(tiny_wide(), &doc);
    check_corpus(tiny_wide(), &doc);
}
