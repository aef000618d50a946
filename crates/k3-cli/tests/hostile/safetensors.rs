//! The safetensors container: every damage to a shard's bytes or header is refused with exit 2
//! naming the shard file (and the tensor where one is involved).

use crate::common::*;
use serde_json::{json, Value};
use std::path::Path;

pub const NORM: &str = "language_model.model.layers.1.input_layernorm.weight"; // BF16 [64]
pub const KPROJ: &str = "language_model.model.layers.1.self_attn.k_proj.weight"; // BF16 [64,64]
pub const QPROJ: &str = "language_model.model.layers.1.self_attn.q_proj.weight"; // BF16 [64,64]

fn set_prefix(dir: &Path, len: u64) {
    let p = dir.join(SHARD1);
    let mut b = std::fs::read(&p).unwrap();
    b[..8].copy_from_slice(&len.to_le_bytes());
    std::fs::write(&p, b).unwrap();
}

fn offsets(h: &serde_json::Map<String, Value>, name: &str) -> (u64, u64) {
    let o = &h[name]["data_offsets"];
    (o[0].as_u64().unwrap(), o[1].as_u64().unwrap())
}

fn set_field(name: &'static str, field: &'static str, v: Value) -> impl Fn(&Path) {
    move |d: &Path| edit_header(d, SHARD1, |h| h[name][field] = v.clone())
}

fn drop_field(name: &'static str, field: &'static str) -> impl Fn(&Path) {
    move |d: &Path| {
        edit_header(d, SHARD1, |h| {
            drop(h[name].as_object_mut().unwrap().remove(field))
        })
    }
}

/// In shard 1's header text, replaces the first `from` after tensor `name`'s key by `to`
/// (for values a JSON number cannot hold, such as 2^64).
fn edit_entry_text(name: &'static str, from: &'static str, to: &'static str) -> impl Fn(&Path) {
    move |d: &Path| {
        let path = d.join(SHARD1);
        let (h, data) = split_shard(&path);
        let text = h.to_string();
        let at = text.find(&format!("\"{name}\":{{")).unwrap();
        let off = at + text[at..].find(from).unwrap();
        let text = format!("{}{to}{}", &text[..off], &text[off + from.len()..]);
        join_shard(&path, &text, &data);
    }
}

/// The start of every per-tensor header message: `<shard>: tensor "<name>": `.
fn at(tensor: &str) -> String {
    format!("{SHARD1}: tensor \"{tensor}\": ")
}

fn cases() -> Vec<Case> {
    let r = run_args;
    let (norm, kproj) = (at(NORM), at(KPROJ));
    vec![
        case(
            "truncated-in-data",
            "shard cut 1000 bytes before its end (inside tensor data)",
            |d| {
                let p = d.join(SHARD1);
                let b = std::fs::read(&p).unwrap();
                std::fs::write(&p, &b[..b.len() - 1000]).unwrap();
            },
            r(),
            2,
            &[SHARD1, "truncated", "1000 bytes missing"],
        ),
        case(
            "truncated-in-header",
            "shard cut in the middle of its JSON header",
            |d| {
                let p = d.join(SHARD1);
                let b = std::fs::read(&p).unwrap();
                std::fs::write(&p, &b[..4000]).unwrap();
            },
            r(),
            2,
            &[SHARD1, "header length 56064 does not fit"],
        ),
        case(
            "empty-file",
            "shard file of 0 bytes",
            |d| std::fs::write(d.join(SHARD1), b"").unwrap(),
            r(),
            2,
            &[SHARD1, "file is 0 bytes"],
        ),
        case(
            "five-byte-file",
            "shard file of 5 bytes (no full length prefix)",
            |d| std::fs::write(d.join(SHARD1), b"\x10\0\0\0\0").unwrap(),
            r(),
            2,
            &[SHARD1, "file is 5 bytes"],
        ),
        case(
            "header-len-zero",
            "header length prefix 0",
            |d| set_prefix(d, 0),
            r(),
            2,
            &[SHARD1, "malformed JSON header (0 bytes)"],
        ),
        case(
            "header-len-beyond-file",
            "header length prefix = file length",
            |d| set_prefix(d, std::fs::metadata(d.join(SHARD1)).unwrap().len()),
            r(),
            2,
            &[
                SHARD1,
                "header length 947016 does not fit in the 947016-byte file",
            ],
        ),
        case(
            "header-len-u64-max",
            "header length prefix 2^64-1",
            |d| set_prefix(d, u64::MAX),
            r(),
            2,
            &[SHARD1, "header length 18446744073709551615"],
        ),
        case(
            "non-json-header",
            "header bytes replaced by same-length non-JSON text",
            |d| {
                let p = d.join(SHARD1);
                let mut b = std::fs::read(&p).unwrap();
                let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
                b[8..8 + n].fill(b'x');
                std::fs::write(&p, b).unwrap();
            },
            r(),
            2,
            &[
                SHARD1,
                "malformed JSON header (56064 bytes)",
                "line 1 column 1",
            ],
        ),
        case(
            "header-is-array",
            "header is the JSON array []",
            |d| {
                let (_, data) = split_shard(&d.join(SHARD1));
                join_shard(&d.join(SHARD1), "[]", &data);
            },
            r(),
            2,
            &[
                SHARD1,
                "malformed JSON header",
                "a JSON object mapping tensor names",
            ],
        ),
        case(
            "non-utf8-header",
            "byte 0xFF inside a tensor name in the header",
            |d| {
                let p = d.join(SHARD1);
                let mut b = std::fs::read(&p).unwrap();
                let at = 8 + b[8..]
                    .windows(11)
                    .position(|w| w == b"embed_token")
                    .unwrap();
                b[at] = 0xFF;
                std::fs::write(&p, b).unwrap();
            },
            r(),
            2,
            &[SHARD1, "is not UTF-8", "invalid byte at header offset"],
        ),
        case(
            "unknown-dtype",
            "tensor dtype \"F4\"",
            set_field(NORM, "dtype", json!("F4")),
            r(),
            2,
            &[&norm, "unknown dtype \"F4\""],
        ),
        case(
            "dtype-not-string",
            "tensor dtype is the number 7",
            set_field(NORM, "dtype", json!(7)),
            r(),
            2,
            &[
                &norm,
                "`dtype`: invalid type: integer `7`, expected a dtype string",
            ],
        ),
        case(
            "dtype-null",
            "tensor dtype is null",
            set_field(NORM, "dtype", json!(null)),
            r(),
            2,
            &[&norm, "`dtype`: invalid type: null"],
        ),
        case(
            "missing-dtype",
            "tensor entry without dtype",
            drop_field(NORM, "dtype"),
            r(),
            2,
            &[&norm, "missing field `dtype`"],
        ),
        case(
            "missing-shape",
            "tensor entry without shape",
            drop_field(KPROJ, "shape"),
            r(),
            2,
            &[&kproj, "missing field `shape`"],
        ),
        case(
            "shape-not-array",
            "shape is the string \"64\"",
            set_field(NORM, "shape", json!("64")),
            r(),
            2,
            &[
                &norm,
                "`shape`: invalid type: string \"64\", expected a shape",
            ],
        ),
        case(
            "shape-dim-string",
            "shape [\"64\"]",
            set_field(NORM, "shape", json!(["64"])),
            r(),
            2,
            &[&norm, "expected a non-negative integer for dimension 0"],
        ),
        case(
            "entry-not-object",
            "a tensor's entry is the number 1",
            |d| edit_header(d, SHARD1, |h| drop(h.insert(NORM.into(), json!(1)))),
            r(),
            2,
            &[&norm, "invalid type: integer `1`, expected an object"],
        ),
        case(
            "negative-shape",
            "shape [-1, 64]",
            set_field(KPROJ, "shape", json!([-1, 64])),
            r(),
            2,
            &[
                &kproj,
                "`shape`: dimension 0 is -1: it must be a non-negative integer",
            ],
        ),
        case(
            "fractional-shape",
            "shape [64.5]",
            set_field(NORM, "shape", json!([64.5])),
            r(),
            2,
            &[
                &norm,
                "`shape`: dimension 0 is 64.5: not a non-negative integer",
            ],
        ),
        case(
            "overflowing-shape",
            "shape [2^62, 2^62] (element count overflows u64)",
            set_field(KPROJ, "shape", json!([1u64 << 62, 1u64 << 62])),
            r(),
            2,
            &[SHARD1, KPROJ, "overflows 64 bits"],
        ),
        case(
            "wrapping-shape",
            "BF16 shape [2^63+64]: 2 bytes x count wraps to the true 128-byte span",
            set_field(NORM, "shape", json!([(1u64 << 63) + 64])),
            r(),
            2,
            &[SHARD1, NORM, "overflows 64 bits"],
        ),
        case(
            "shape-beyond-u64",
            "shape [18446744073709551616] (does not fit u64)",
            edit_entry_text(NORM, "\"shape\":[64]", "\"shape\":[18446744073709551616]"),
            r(),
            2,
            &[
                &norm,
                "dimension 0 is 1.8446744073709552e19: larger than 2^64 - 1",
            ],
        ),
        case(
            "dtype-size-mismatch",
            "BF16 [64] norm relabelled F32 (needs 256 bytes, span 128)",
            set_field(NORM, "dtype", json!("F32")),
            r(),
            2,
            &[SHARD1, NORM, "needs 256 bytes", "span 128 bytes"],
        ),
        case(
            "overlapping-offsets",
            "q_proj's data_offsets moved to overlap k_proj by 4096 bytes",
            |d| {
                edit_header(d, SHARD1, |h| {
                    let (s, e) = offsets(h, KPROJ);
                    h[QPROJ]["data_offsets"] = json!([s + 4096, e + 4096]);
                })
            },
            r(),
            2,
            &[SHARD1, KPROJ, QPROJ, "overlap by 4096 bytes"],
        ),
        case(
            "negative-offset",
            "data_offsets [-128, 0]",
            set_field(NORM, "data_offsets", json!([-128, 0])),
            r(),
            2,
            &[&norm, "`data_offsets`: start is -128"],
        ),
        case(
            "reversed-offsets",
            "data_offsets [end, start] (start > end)",
            |d| {
                edit_header(d, SHARD1, |h| {
                    let (s, e) = offsets(h, NORM);
                    h[NORM]["data_offsets"] = json!([e, s]);
                })
            },
            r(),
            2,
            &[SHARD1, NORM, "start > end"],
        ),
        case(
            "offsets-beyond-file",
            "one tensor's data_offsets moved 1 MB past the data section",
            |d| {
                edit_header(d, SHARD1, |h| {
                    let (s, e) = offsets(h, NORM);
                    h[NORM]["data_offsets"] = json!([s + (1 << 20), e + (1 << 20)]);
                })
            },
            r(),
            2,
            &[SHARD1, NORM, "beyond the 890944-byte data section"],
        ),
        case(
            "offsets-u64-max",
            "data_offsets [2^64-128, 2^64-1]",
            set_field(NORM, "data_offsets", json!([u64::MAX - 128, u64::MAX])),
            r(),
            2,
            &[
                SHARD1,
                NORM,
                "data_offsets end 18446744073709551615 is beyond the 890944-byte data section",
            ],
        ),
        case(
            "three-offsets",
            "data_offsets with three numbers",
            set_field(NORM, "data_offsets", json!([0, 128, 256])),
            r(),
            2,
            &[&norm, "`data_offsets`: more than two numbers"],
        ),
        case(
            "one-offset",
            "data_offsets with one number",
            set_field(NORM, "data_offsets", json!([0])),
            r(),
            2,
            &[&norm, "`data_offsets`: fewer than two numbers"],
        ),
        case(
            "missing-data-offsets",
            "tensor entry without data_offsets",
            drop_field(NORM, "data_offsets"),
            r(),
            2,
            &[&norm, "missing field `data_offsets`"],
        ),
        case(
            "duplicate-in-one-header",
            "the same tensor name twice in one header",
            |d| {
                let path = d.join(SHARD1);
                let (h, data) = split_shard(&path);
                let entry = h[NORM].to_string();
                let text = h.to_string();
                let text = format!("{{\"{NORM}\":{entry},{}", &text[1..]);
                join_shard(&path, &text, &data);
            },
            r(),
            2,
            &[NORM, "appears in both", SHARD1],
        ),
        case(
            "duplicate-across-shards",
            "a shard-1 tensor also present in shard 2",
            |d| {
                rewrite(d, true, |docs| {
                    let t = find(docs, NORM);
                    let copy = T {
                        spec: t.spec.clone(),
                        data: t.data.clone(),
                    };
                    docs[1].tensors.push(copy);
                })
            },
            r(),
            2,
            &[NORM, "appears in both", SHARD1, SHARD2],
        ),
    ]
}

#[test]
fn damaged_shards_are_refused_by_name() {
    check_all("safetensors", cases());
}

/// Bytes after the last tensor's data are refused when the shard is opened (`k3 run`: exit 2
/// naming the shard, the byte counts and "re-download"), and `k3 verify` fails its shard-size
/// check with the same message (it used to be accepted by `run`).
#[test]
fn trailing_bytes_are_refused() {
    let append = |d: &Path| {
        let p = d.join(SHARD1);
        let mut b = std::fs::read(&p).unwrap();
        b.extend_from_slice(&[0xAB; 4096]);
        std::fs::write(&p, b).unwrap();
    };
    let run = vec!["run", "{dir}", "--ids", PROMPT, "-n", "4"];
    check_all(
        "safetensors-trailing",
        vec![
            case(
                "trailing-garbage-run",
                "4096 bytes appended after the data section (k3 run)",
                append,
                args(&run),
                2,
                &[
                    SHARD1,
                    "4096 extra bytes",
                    "re-download",
                    "file has 951112 bytes",
                    "ends at file offset 947016",
                ],
            ),
            case(
                "trailing-garbage-verify",
                "4096 bytes appended after the data section (k3 verify)",
                append,
                args(&["verify", "{dir}"]),
                1,
                &[SHARD1, "FAIL  shard sizes", "4096 extra bytes"],
            ),
        ],
    );
}
