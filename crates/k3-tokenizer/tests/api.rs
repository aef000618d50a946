//! The public API on the tiny fixture tokenizer: lookups, special modes, decoding, streaming.

mod common;

use common::{o200k, tiny};
use k3_tokenizer::TokenizerError;

#[test]
fn special_lookup_and_sizes() {
    let tok = tiny();
    let n = tok.num_ranks() as u32;
    assert_eq!(tok.vocab_size(), n as usize + 256);
    assert_eq!(tok.token_id("[BOS]"), Some(n));
    assert_eq!(tok.token_id("<|open|>"), Some(n + 3));
    assert_eq!(tok.token_id("<|im_end|>"), Some(n + 6));
    assert_eq!(tok.token_id("no such token"), None);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(n), Some(n + 1)));
    assert_eq!(tok.end_ids(), vec![n + 1, n + 2]);
    assert!(tok.is_special(n + 255) && !tok.is_special(n - 1) && !tok.is_special(n + 256));
    assert_eq!(tok.specials().len(), 256);
    assert_eq!(tok.token_bytes(n + 5), Some(&b"<|sep|>"[..]));
}

#[test]
fn o200k_layout_fills_unlisted_slots() {
    let tok = o200k();
    assert_eq!(tok.num_ranks(), 199_998);
    assert_eq!(tok.vocab_size(), 200_254);
    assert_eq!(tok.eos_id(), Some(199_999)); // {"content": "[EOS]"} form
    assert_eq!(tok.token_id("<|reserved_token_200100|>"), Some(200_100));
    assert_eq!(tok.end_ids(), vec![199_999, 200_000]);
}

#[test]
fn specials_plain_vs_control() {
    let tok = tiny();
    let open = tok.token_id("<|open|>").unwrap();
    let text = "<|open|>hi<|im_end|>";
    let plain = tok.encode_ordinary(text);
    assert!(plain.iter().all(|&id| !tok.is_special(id)));
    let control = tok.encode_with_specials(text);
    assert_eq!(control[0], open);
    assert_eq!(
        *control.last().unwrap(),
        tok.token_id("<|im_end|>").unwrap()
    );
    assert_eq!(tok.encode(text, false), plain);
    assert_eq!(tok.encode(text, true), control);
}

#[test]
fn decode_rejects_unknown_ids() {
    let tok = tiny();
    let bad = tok.vocab_size() as u32;
    let err = tok.decode(&[1, bad]).unwrap_err();
    assert!(matches!(err, TokenizerError::UnknownId { .. }));
    assert_eq!(
        err.to_string(),
        format!("token id {bad} is not in the vocabulary (size {bad})")
    );
    assert!(tok.stream_decoder().push(bad).is_err());
}

#[test]
fn stream_holds_partial_characters() {
    let tok = o200k();
    // Byte-level tokens for "é😀" one byte at a time.
    let bytes = "é😀!".as_bytes();
    let ids: Vec<u32> = bytes
        .iter()
        .map(|b| tok.encode_bytes(&[*b], false)[0])
        .collect();
    let mut stream = tok.stream_decoder();
    let outs: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    assert_eq!(outs, ["", "é", "", "", "", "😀", "!"]);
    assert!(stream.pending().is_empty());
    assert_eq!(stream.finish(), "");
}

#[test]
fn stream_flushes_incomplete_tail_lossily_or_raw() {
    let tok = o200k();
    let first = tok.encode_bytes(&[0xE4], false)[0];
    let second = tok.encode_bytes(&[0xB8], false)[0];
    let mut stream = tok.stream_decoder();
    assert_eq!(stream.push(first).unwrap(), "");
    assert_eq!(stream.push(second).unwrap(), "");
    assert_eq!(stream.pending(), &[0xE4, 0xB8]);
    assert_eq!(stream.finish(), "\u{FFFD}");
    let mut stream = tok.stream_decoder();
    stream.push(first).unwrap();
    assert_eq!(stream.finish_bytes(), vec![0xE4]);
}

#[test]
fn stream_emits_hopeless_bytes_at_once() {
    let tok = o200k();
    let ff = tok.encode_bytes(&[0xFF], false)[0];
    let e4 = tok.encode_bytes(&[0xE4], false)[0];
    let a = tok.encode_ordinary("a")[0];
    let mut stream = tok.stream_decoder();
    assert_eq!(stream.push(ff).unwrap(), "\u{FFFD}");
    assert_eq!(stream.push(e4).unwrap(), "");
    assert_eq!(stream.push(a).unwrap(), "\u{FFFD}a");
}

#[test]
fn invalid_utf8_is_lossless_and_local() {
    let tok = o200k();
    let ids = tok.encode_bytes(b"hello \xff\xfe world", false);
    assert_eq!(tok.decode(&ids).unwrap(), b"hello \xff\xfe world");
    // The valid text around the invalid run encodes as it would alone.
    let mut expected = tok.encode_ordinary("hello ");
    expected.extend(tok.encode_bytes(b"\xff\xfe", false));
    expected.extend(tok.encode_ordinary(" world"));
    assert_eq!(ids, expected);
}

#[test]
fn pieces_follow_the_kimi_rules() {
    let tok = o200k();
    let pieces: Vec<&str> = tok.pieces("中文English混合 I'M  ok\r\n  x 12345").collect();
    assert_eq!(
        pieces,
        ["中文", "English", "混合", " I'M", " ", " ok", "\r\n", " ", " x", " ", "123", "45"]
    );
}

#[test]
fn tokenizer_is_shareable() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<k3_tokenizer::Tokenizer>();
}
