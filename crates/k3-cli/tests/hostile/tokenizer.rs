//! Tokenizer files (`tiktoken.model`, `tokenizer_config.json`): each defect is refused with exit
//! 2 naming the file and line (and the token id for special tokens).

use crate::common::*;
use serde_json::{json, Value};
use std::path::Path;

/// Rewrites line `n` (1-based) of tiktoken.model with `f`; `None` deletes it.
fn line(n: usize, f: impl Fn(&str) -> Option<String> + 'static) -> impl Fn(&Path) {
    move |d: &Path| {
        let p = d.join("tiktoken.model");
        let text = std::fs::read_to_string(&p).unwrap();
        let out: Vec<String> = text
            .lines()
            .enumerate()
            .filter_map(|(i, l)| {
                if i + 1 == n {
                    f(l)
                } else {
                    Some(l.to_string())
                }
            })
            .collect();
        std::fs::write(&p, out.join("\n") + "\n").unwrap();
    }
}

fn rank_of(l: &str) -> &str {
    l.split(' ').nth(1).unwrap()
}

fn added(id: &'static str, content: &'static str) -> impl Fn(&Path) {
    move |d: &Path| {
        let p = d.join("tokenizer_config.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        v["added_tokens_decoder"][id] = json!({"content": content, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true});
        std::fs::write(&p, v.to_string()).unwrap();
    }
}

fn cases() -> Vec<Case> {
    let tok = || args(&["tokenize", "{dir}", "--text", "The train left at"]);
    vec![
        case(
            "bad-base64",
            "line 100's token field is `!!!`",
            line(100, |l| Some(format!("!!! {}", rank_of(l)))),
            tok(),
            2,
            &["tiktoken.model:100: malformed base64 token `!!!`"],
        ),
        case(
            "over-long-field",
            "line 300's token field is 700 base64 chars",
            line(300, |l| {
                Some(format!("{} {}", "QUFB".repeat(175), rank_of(l)))
            }),
            tok(),
            2,
            &["tiktoken.model:300: base64 token field is 700 chars; the limit is 682"],
        ),
        case(
            "duplicate-rank",
            "line 401 has rank 399 (as line 400)",
            line(401, |l| {
                Some(format!("{} 399", l.split(' ').next().unwrap()))
            }),
            tok(),
            2,
            &["tiktoken.model:401: duplicate rank 399 (first at line 400)"],
        ),
        case(
            "rank-hole",
            "the line with rank 500 deleted",
            line(501, |_| None),
            tok(),
            2,
            &["tiktoken.model", "missing rank 500"],
        ),
        case(
            "rank-out-of-range",
            "rank 16777216 (2^24)",
            line(600, |l| {
                Some(format!("{} 16777216", l.split(' ').next().unwrap()))
            }),
            tok(),
            2,
            &["tiktoken.model:600: rank 16777216 out of range [0, 16777216)"],
        ),
        case(
            "rank-not-decimal",
            "rank field `-7`",
            line(10, |l| Some(format!("{} -7", l.split(' ').next().unwrap()))),
            tok(),
            2,
            &[
                "tiktoken.model:10: malformed line",
                "rank is not a decimal integer",
            ],
        ),
        case(
            "line-without-space",
            "a line with no rank",
            line(20, |l| Some(l.split(' ').next().unwrap().to_string())),
            tok(),
            2,
            &["tiktoken.model:20: malformed line", "exactly one space"],
        ),
        case(
            "duplicate-token-bytes",
            "line 2 holds line 1's token bytes",
            line(2, |_| Some("AA== 1".into())),
            tok(),
            2,
            &["tiktoken.model:2: duplicate token bytes (first at line 1)"],
        ),
        case(
            "missing-single-byte",
            "rank 5 is the 5-byte token 0x05 x5 instead of the byte 0x05",
            line(6, |_| Some("BQUFBQU= 5".into())),
            tok(),
            2,
            &["tiktoken.model", "no token for the single byte 0x05"],
        ),
        case(
            "empty-tiktoken",
            "tiktoken.model is empty",
            |d| std::fs::write(d.join("tiktoken.model"), "").unwrap(),
            tok(),
            2,
            &["tiktoken.model"],
        ),
        case(
            "special-collides-with-rank",
            "tokenizer_config.json adds special id 5 (a BPE rank)",
            added("5", "<|hostile|>"),
            tok(),
            2,
            &[
                "tokenizer_config.json",
                "added token 5 `<|hostile|>` collides with a BPE rank (ranks are 0..768)",
            ],
        ),
        case(
            "special-outside-slots",
            "tokenizer_config.json adds special id 5000",
            added("5000", "<|far|>"),
            tok(),
            2,
            &[
                "tokenizer_config.json",
                "added token 5000 `<|far|>` is outside the special slots",
            ],
        ),
        case(
            "tokenizer-config-not-json",
            "tokenizer_config.json is not JSON",
            |d| {
                std::fs::write(
                    d.join("tokenizer_config.json"),
                    "{\"added_tokens_decoder\": [",
                )
                .unwrap()
            },
            tok(),
            2,
            &["tokenizer_config.json", "unreadable JSON"],
        ),
        case(
            "run-ids-with-bad-tokenizer",
            "k3 run --ids with a damaged tiktoken.model (loaded at open)",
            line(100, |l| Some(format!("!!! {}", rank_of(l)))),
            run_args(),
            2,
            &["tiktoken.model:100: malformed base64 token"],
        ),
    ]
}

#[test]
fn damaged_tokenizer_files_are_refused_by_line() {
    check_all("tokenizer", cases());
}

#[test]
fn crlf_tokenizer_still_runs() {
    check_all(
        "tokenizer-valid",
        vec![case(
            "crlf-line-ends",
            "tiktoken.model with CRLF line ends",
            |d| {
                let p = d.join("tiktoken.model");
                let t = std::fs::read_to_string(&p).unwrap().replace('\n', "\r\n");
                std::fs::write(&p, t).unwrap();
            },
            args(&["tokenize", "{dir}", "--text", "The train left at"]),
            0,
            &["341,464,269,421,116,337"],
        )],
    );
}
