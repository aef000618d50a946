//! Hostile headers never panic: they are either rejected with an error or yield an index whose
//! every tensor lies inside its file.

mod common;

use common::*;
use k3_format::{Checkpoint, ShardHeader};
use proptest::prelude::*;
use std::path::Path;

fn valid_shard() -> Vec<u8> {
    shard_bytes(&[
        t("model.embed.weight", "BF16", &[4, 6], 2),
        t("model.norm.weight", "F32", &[6], 4),
        t("experts.0.w1.weight_packed", "U8", &[3, 8], 1),
        t("scalar", "F16", &[], 2),
        t("empty", "F32", &[0, 3], 4),
    ])
}

/// Parses and, when accepted, checks every tensor lies inside the file.
fn check(bytes: &[u8]) {
    let p = Path::new("hostile.safetensors");
    if let Ok(h) = ShardHeader::parse(p, bytes) {
        for t in h.iter() {
            assert!(t.start <= t.end);
            assert!(t.offset + (t.end - t.start) <= bytes.len() as u64);
        }
    }
}

fn json_leaf() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        (-1e300f64..1e300).prop_map(serde_json::Value::from),
        prop_oneof![
            Just("F32"),
            Just("BF16"),
            Just("U8"),
            Just("F4"),
            Just("dtype"),
            Just("shape"),
            Just("data_offsets"),
            Just("__metadata__"),
            Just("")
        ]
        .prop_map(serde_json::Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    json_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("dtype"),
                        Just("shape"),
                        Just("data_offsets"),
                        Just("t"),
                        Just("u")
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|kv| serde_json::Value::Object(
                kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
            )),
        ]
    })
}

/// A structurally plausible entry with hostile numbers.
fn entry() -> impl Strategy<Value = String> {
    (
        prop_oneof![
            Just("F32"),
            Just("BF16"),
            Just("U8"),
            Just("I64"),
            Just("F8_E4M3"),
            Just("X")
        ],
        prop::collection::vec(prop_oneof![0u64..5, any::<u64>()], 0..4),
        prop_oneof![0u64..64, any::<u64>()],
        prop_oneof![0u64..64, any::<u64>()],
    )
        .prop_map(|(d, shape, a, b)| {
            format!("{{\"dtype\":\"{d}\",\"shape\":{shape:?},\"data_offsets\":[{a},{b}]}}")
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check(&bytes);
    }

    #[test]
    fn random_header_lengths(len in any::<u64>(), body in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend_from_slice(&body);
        check(&bytes);
    }

    #[test]
    fn mutated_valid_header(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = valid_shard();
        for (at, v) in edits {
            let i = at.index(bytes.len());
            bytes[i] = v;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        check(&bytes);
    }

    #[test]
    fn random_json_headers(v in json_value(), data in 0usize..128) {
        check(&raw_shard(&v.to_string(), &vec![0u8; data]));
        let wrapped = serde_json::json!({ "t": v });
        check(&raw_shard(&wrapped.to_string(), &vec![0u8; data]));
    }

    #[test]
    fn hostile_entries(entries in prop::collection::vec(entry(), 0..5), data in 0usize..128) {
        let body: Vec<String> =
            entries.iter().enumerate().map(|(i, e)| format!("\"t{i}\":{e}")).collect();
        check(&raw_shard(&format!("{{{}}}", body.join(",")), &vec![0u8; data]));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The same through the file-backed index: errors or in-bounds views, never a panic.
    #[test]
    fn mutated_files_through_checkpoint(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = valid_shard();
        for (at, v) in edits {
            let i = at.index(bytes.len());
            bytes[i] = v;
        }
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "m.safetensors", &bytes);
        if let Ok(ck) = Checkpoint::open(dir.path()) {
            for t in ck.iter() {
                prop_assert_eq!(t.bytes.len() as u64, t.nbytes());
                let _ = t.to_f32_vec();
                let _ = t.as_f32();
                let _ = t.as_bf16();
            }
        }
    }
}
