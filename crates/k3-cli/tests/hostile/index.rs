//! `model.safetensors.index.json` against the shards on disk.

use crate::common::*;
use crate::safetensors::NORM;
use serde_json::{json, Value};
use std::path::Path;

fn edit_index(d: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let p = d.join(INDEX);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(v["weight_map"].as_object_mut().unwrap());
    std::fs::write(&p, v.to_string()).unwrap();
}

fn cases() -> Vec<Case> {
    let r = run_args;
    vec![
        case(
            "missing-shard-file",
            "shard 2 deleted, the index still names it",
            |d| std::fs::remove_file(d.join(SHARD2)).unwrap(),
            r(),
            2,
            &[
                INDEX,
                "1 shard file(s) named in weight_map are missing",
                SHARD2,
            ],
        ),
        case(
            "tensor-missing-from-shard",
            "tensor dropped from shard 1, the index still lists it",
            |d| {
                rewrite(d, false, |docs| {
                    docs[0].tensors.retain(|t| t.spec.name != NORM)
                });
            },
            r(),
            2,
            &[
                INDEX,
                NORM,
                "is listed in weight_map under",
                SHARD1,
                "does not contain it",
            ],
        ),
        case(
            "tensor-in-other-shard",
            "the index assigns a shard-1 tensor to shard 2",
            |d| edit_index(d, |m| drop(m.insert(NORM.into(), json!(SHARD2)))),
            r(),
            2,
            &[INDEX, NORM, SHARD2, "(it is in", SHARD1],
        ),
        case(
            "unlisted-shard-tensor-verify",
            "a tensor present in shard 1 but absent from weight_map (k3 verify)",
            |d| edit_index(d, |m| drop(m.remove(NORM))),
            args(&["verify", "{dir}"]),
            0,
            &[
                "WARN  index entries",
                NORM,
                "is not listed in model.safetensors.index.json",
            ],
        ),
        case(
            "index-not-json",
            "index file is not JSON",
            |d| std::fs::write(d.join(INDEX), "weight_map: yes").unwrap(),
            r(),
            2,
            &[INDEX, "malformed index"],
        ),
        case(
            "index-no-weight-map",
            "index without a weight_map",
            |d| std::fs::write(d.join(INDEX), r#"{"metadata":{}}"#).unwrap(),
            r(),
            2,
            &[INDEX, "no \"weight_map\" object"],
        ),
        case(
            "index-empty-weight-map",
            "index with an empty weight_map",
            |d| std::fs::write(d.join(INDEX), r#"{"weight_map":{}}"#).unwrap(),
            r(),
            2,
            &[INDEX, "\"weight_map\" is empty"],
        ),
        case(
            "index-path-escape",
            "weight_map entry pointing at ../model-00001-of-00002.safetensors",
            |d| {
                edit_index(d, |m| {
                    drop(m.insert(NORM.into(), json!(format!("../{SHARD1}"))))
                })
            },
            r(),
            2,
            &[INDEX, NORM, "leaves the checkpoint directory"],
        ),
        case(
            "index-shard-not-string",
            "weight_map value is a number",
            |d| edit_index(d, |m| drop(m.insert(NORM.into(), json!(1)))),
            r(),
            2,
            &[INDEX, "malformed index", "invalid type: integer `1`"],
        ),
    ]
}

#[test]
fn index_and_shards_must_agree() {
    check_all("index", cases());
}

/// A tensor the index does not list is still found by name in its shard (the index is a
/// listing, not a filter): `k3 run` gives the clean ids. `k3 verify` reports it (case above).
#[test]
fn unlisted_shard_tensor_still_runs() {
    check_all(
        "index-unlisted",
        vec![case(
            "unlisted-shard-tensor-run",
            "a tensor present in shard 1 but absent from weight_map (k3 run)",
            |d| edit_index(d, |m| drop(m.remove(NORM))),
            args(&["run", "{dir}", "--ids", PROMPT, "-n", "4", "--print-ids"]),
            0,
            &[CLEAN_IDS],
        )],
    );
}
