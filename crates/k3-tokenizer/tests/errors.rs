//! Every load error names the file and line and says what is wrong.

use k3_tokenizer::{Tokenizer, TokenizerError};

/// A valid 256-byte `tiktoken.model` body plus `extra` lines.
fn model(extra: &str) -> String {
    let mut s = String::new();
    for b in 0..=255u8 {
        s.push_str(&format!("{} {}\n", b64(&[b]), b));
    }
    s + extra
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

const CONFIG: &str = r#"{
  "added_tokens_decoder": {
    "257": {"content": "[BOS]", "special": true},
    "258": {"content": "[EOS]", "special": true}
  },
  "bos_token": "[BOS]",
  "eos_token": {"content": "[EOS]"}
}"#;

fn load(model: &str, config: &str) -> Result<Tokenizer, TokenizerError> {
    Tokenizer::from_tiktoken_data(model.as_bytes(), "m/tiktoken.model", config, "m/cfg.json")
}

fn err(model: &str, config: &str) -> String {
    load(model, config).expect_err("load must fail").to_string()
}

#[test]
fn valid_files_load() {
    let tok = load(&model(&format!("{} 256\n", b64(b"ab"))), CONFIG).unwrap();
    assert_eq!(tok.vocab_size(), 257 + 256);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(257), Some(258)));
    assert_eq!(tok.token_id("<|reserved_token_300|>"), Some(300));
}

#[test]
fn malformed_base64() {
    let e = err(&model("a$b= 256\n"), CONFIG);
    assert!(
        e.starts_with("m/tiktoken.model:257: malformed base64 token `a$b=`"),
        "{e}"
    );
}

#[test]
fn missing_rank() {
    let e = err(&model(&format!("{} 257\n", b64(b"ab"))), CONFIG);
    assert!(
        e.starts_with("m/tiktoken.model:257: missing rank 256"),
        "{e}"
    );
}

#[test]
fn duplicate_rank() {
    let e = err(&model(&format!("{} 255\n", b64(b"ab"))), CONFIG);
    assert_eq!(
        e,
        "m/tiktoken.model:257: duplicate rank 255 (first at line 256)"
    );
}

#[test]
fn duplicate_token_bytes() {
    let e = err(&model(&format!("{} 256\n", b64(b"a"))), CONFIG);
    assert_eq!(
        e,
        "m/tiktoken.model:257: duplicate token bytes (first at line 98)"
    );
}

#[test]
fn rank_out_of_range() {
    let e = err(&model(&format!("{} 99999999\n", b64(b"ab"))), CONFIG);
    assert_eq!(
        e,
        "m/tiktoken.model:257: rank 99999999 out of range [0, 16777216)"
    );
}

#[test]
fn overlong_base64_field() {
    let field = "A".repeat(684);
    let e = err(&model(&format!("{field} 256\n")), CONFIG);
    assert!(
        e.starts_with("m/tiktoken.model:257: base64 token field is 684 chars"),
        "{e}"
    );
    // 680 chars (510 bytes) is still fine.
    let ok = format!("{} 256\n", b64(&[7u8; 510]));
    assert!(load(&model(&ok), CONFIG).is_ok());
}

#[test]
fn malformed_line() {
    let e = err(&model("YWI=\t256\n"), CONFIG);
    assert!(e.starts_with("m/tiktoken.model:257: malformed line"), "{e}");
    let e = err(&model("YWI= -3\n"), CONFIG);
    assert!(e.starts_with("m/tiktoken.model:257: malformed line"), "{e}");
}

#[test]
fn missing_single_byte() {
    // Rank 0 is "zz" instead of the byte 0x00.
    let body = model("").replacen(&b64(&[0]), &b64(b"zz"), 1);
    let e = err(&body, CONFIG);
    assert!(e.contains("no token for the single byte 0x00"), "{e}");
}

#[test]
fn crlf_and_blank_lines_are_accepted() {
    let body = model("").replace('\n', "\r\n") + "\r\n\n";
    assert!(load(&body, CONFIG).is_ok());
}

#[test]
fn unreadable_config() {
    let e = err(
        &model(""),
        "{\n  \"added_tokens_decoder\": {\n    \"256\": oops\n}",
    );
    assert!(e.starts_with("m/cfg.json:3:"), "{e}");
    assert!(e.contains("unreadable JSON"), "{e}");
    let missing = Tokenizer::from_tiktoken_files(
        std::path::Path::new("/nonexistent/tiktoken.model"),
        std::path::Path::new("/nonexistent/cfg.json"),
    );
    let e = missing.unwrap_err().to_string();
    assert!(
        e.starts_with("/nonexistent/tiktoken.model: cannot read"),
        "{e}"
    );
}

#[test]
fn special_colliding_with_rank() {
    let config = "{\n  \"added_tokens_decoder\": {\n    \"255\": {\"content\": \"[X]\"}\n  }\n}";
    let e = err(&model(""), config);
    assert_eq!(
        e,
        "m/cfg.json:3: added token 255 `[X]` collides with a BPE rank (ranks are 0..256)"
    );
}

#[test]
fn special_outside_slots() {
    let config = "{\"added_tokens_decoder\": {\n\"512\": {\"content\": \"[X]\"}}}";
    let e = err(&model(""), config);
    assert_eq!(
        e,
        "m/cfg.json:2: added token 512 `[X]` is outside the special slots [256, 512)"
    );
}

#[test]
fn bos_naming_unknown_token() {
    let config = "{\n\"added_tokens_decoder\": {},\n\"bos_token\": \"[NOPE]\"\n}";
    let e = err(&model(""), config);
    assert_eq!(
        e,
        "m/cfg.json:3: `bos_token` names `[NOPE]`, which is not an added token"
    );
}

#[test]
fn bad_added_token_entries() {
    let e = err(
        &model(""),
        "{\"added_tokens_decoder\": {\"x\": {\"content\": \"a\"}}}",
    );
    assert!(e.contains("added token key `x` is not an id"), "{e}");
    let e = err(
        &model(""),
        "{\"added_tokens_decoder\": {\"300\": {\"content\": \"\"}}}",
    );
    assert!(
        e.contains("added token 300 has no non-empty `content`"),
        "{e}"
    );
}
