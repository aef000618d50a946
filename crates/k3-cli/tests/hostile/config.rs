//! `config.json`: every required key missing, wrong JSON types, out-of-range values — each
//! refused with exit 2 naming config.json, the key and the value — and valid oddities that
//! must still run with the clean ids.

use crate::common::*;
use serde_json::{json, Value};
use std::path::Path;

/// Every key the reader requires (docs/MODEL.md#config-keys order), with no default.
const REQUIRED: [&str; 26] = [
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
    "num_heads",
    "head_dim",
    "short_conv_kernel_size",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "num_experts",
    "num_experts_per_token",
    "num_shared_experts",
    "routed_expert_hidden_size",
    "moe_intermediate_size",
    "first_k_dense_replace",
    "intermediate_size",
    "attn_res_block_size",
    "rms_norm_eps",
    "gate_lower_bound",
    "routed_scaling_factor",
    "activation_situ_beta",
    "activation_situ_linear_beta",
    "full_attn_layers",
];

/// The objects a key may live in: root, text_config, text_config.linear_attn_config.
fn objects(v: &mut Value, f: &mut dyn FnMut(&mut serde_json::Map<String, Value>)) {
    let root = v.as_object_mut().unwrap();
    f(root);
    if let Some(Value::Object(txt)) = root.get_mut("text_config") {
        f(txt);
        if let Some(Value::Object(lin)) = txt.get_mut("linear_attn_config") {
            f(lin);
        }
    }
}

/// Sets `key` to `value` wherever it is present.
fn set(key: &'static str, value: Value) -> impl Fn(&Path) {
    move |d: &Path| {
        edit_config(d, |v| {
            objects(v, &mut |o| {
                if let Some(slot) = o.get_mut(key) {
                    *slot = value.clone();
                }
            })
        })
    }
}

fn remove(key: &'static str) -> impl Fn(&Path) {
    move |d: &Path| edit_config(d, |v| objects(v, &mut |o| drop(o.remove(key))))
}

fn write(text: &'static str) -> impl Fn(&Path) {
    move |d: &Path| std::fs::write(d.join("config.json"), text).unwrap()
}

fn refusals() -> Vec<Case> {
    let r = run_args;
    let mut cases: Vec<Case> = REQUIRED
        .iter()
        .map(|&key| {
            case(
                &format!("missing-{key}"),
                &format!("`{key}` removed from every level"),
                remove(key),
                r(),
                2,
                &[
                    &format!("  {key}"),
                    "config.json is missing 1 required field",
                    "refusing to substitute defaults",
                ],
            )
        })
        .collect();
    cases.extend([
        case(
            "string-for-number",
            "hidden_size: \"64\"",
            set("hidden_size", json!("64")),
            r(),
            2,
            &[
                "config.json",
                "`hidden_size` is \"64\" (a string), not a number",
            ],
        ),
        case(
            "bool-for-number",
            "num_experts: true",
            set("num_experts", json!(true)),
            r(),
            2,
            &[
                "config.json",
                "`num_experts` is true (a bool), not a number",
            ],
        ),
        case(
            "null-for-number",
            "rms_norm_eps: null",
            set("rms_norm_eps", json!(null)),
            r(),
            2,
            &["config.json", "`rms_norm_eps` is null"],
        ),
        case(
            "fractional-integer",
            "num_experts: 8.5",
            set("num_experts", json!(8.5)),
            r(),
            2,
            &["config.json", "`num_experts` = 8.5 is not an integer"],
        ),
        case(
            "huge-integer",
            "hidden_size: 1e300",
            set("hidden_size", json!(1e300)),
            r(),
            2,
            &["config.json", "`hidden_size`", "is not an integer"],
        ),
        case(
            "zero-hidden",
            "hidden_size: 0",
            set("hidden_size", json!(0)),
            r(),
            2,
            &["config.json", "`hidden_size` = 0 must be at least 1"],
        ),
        case(
            "negative-layers",
            "num_hidden_layers: -13",
            set("num_hidden_layers", json!(-13)),
            r(),
            2,
            &["`num_hidden_layers` = -13 must be at least 1"],
        ),
        case(
            "negative-eps",
            "rms_norm_eps: -1e-5",
            set("rms_norm_eps", json!(-1e-5)),
            r(),
            2,
            &[
                "config.json",
                "`rms_norm_eps` = -0.00001 must be greater than 0",
            ],
        ),
        case(
            "full-attn-out-of-range",
            "full_attn_layers: [4, 8, 12, 14] (13 layers)",
            set("full_attn_layers", json!([4, 8, 12, 14])),
            r(),
            2,
            &["config.json", "full_attn_layers[3] = 14 is outside 1..13"],
        ),
        case(
            "full-attn-zero",
            "full_attn_layers: [0, 8] (ONE-based)",
            set("full_attn_layers", json!([0, 8])),
            r(),
            2,
            &["full_attn_layers[0] = 0 is outside 1..13"],
        ),
        case(
            "full-attn-duplicate",
            "full_attn_layers: [4, 8, 8, 13]",
            set("full_attn_layers", json!([4, 8, 8, 13])),
            r(),
            2,
            &[
                "config.json",
                "full_attn_layers[2] = 8 repeats full_attn_layers[1]",
            ],
        ),
        case(
            "full-attn-string-entry",
            "full_attn_layers: [\"4\"]",
            set("full_attn_layers", json!(["4"])),
            r(),
            2,
            &["full_attn_layers[0] is not a number: found \"4\""],
        ),
        case(
            "full-attn-empty",
            "full_attn_layers: []",
            set("full_attn_layers", json!([])),
            r(),
            2,
            &["full_attn_layers: an empty array"],
        ),
        case(
            "full-attn-all-layers",
            "full_attn_layers lists all 13 layers",
            set("full_attn_layers", json!((1..=13).collect::<Vec<_>>())),
            r(),
            2,
            &["marks 13 of 13 layers as full attention"],
        ),
        case(
            "zero-attn-res-block",
            "attn_res_block_size: 0",
            set("attn_res_block_size", json!(0)),
            r(),
            2,
            &["config.json", "attn_res_block_size = 0"],
        ),
        case(
            "zero-conv-kernel",
            "short_conv_kernel_size: 0",
            set("short_conv_kernel_size", json!(0)),
            r(),
            2,
            &["config.json", "short_conv_kernel_size 0"],
        ),
        case(
            "topk-exceeds-experts",
            "num_experts_per_token: 9 with 8 experts",
            set("num_experts_per_token", json!(9)),
            r(),
            2,
            &["config.json", "selects 9 of 8 experts"],
        ),
        case(
            "topk-over-64",
            "num_experts_per_token: 65 (num_experts 128)",
            |d| {
                set("num_experts", json!(128))(d);
                set("num_experts_per_token", json!(65))(d);
            },
            r(),
            2,
            &["config.json", "top-65", "at most 64"],
        ),
        case(
            "first-dense-too-large",
            "first_k_dense_replace: 14",
            set("first_k_dense_replace", json!(14)),
            r(),
            2,
            &["first_k_dense_replace = 14 exceeds num_hidden_layers = 13"],
        ),
        case(
            "config-disagrees-with-shards",
            "hidden_size: 128 (shards are 64 wide)",
            set("hidden_size", json!(128)),
            r(),
            2,
            &[
                "language_model.model.embed_tokens.weight",
                "has shape [1024, 64]",
            ],
        ),
        case(
            "not-json",
            "config.json is not JSON",
            write("{\"hidden_size\": 64,"),
            r(),
            2,
            &["config.json: not valid JSON", "EOF"],
        ),
        case(
            "json-array",
            "config.json is a JSON array",
            write("[1, 2]"),
            r(),
            2,
            &["config.json: the config must be a JSON object, found an array"],
        ),
        case(
            "empty-config",
            "config.json is empty",
            write(""),
            r(),
            2,
            &["config.json: not valid JSON"],
        ),
        case(
            "no-config",
            "config.json absent",
            |d| std::fs::remove_file(d.join("config.json")).unwrap(),
            r(),
            2,
            &["config.json", "cannot read config"],
        ),
    ]);
    cases
}

#[test]
fn bad_configs_are_refused_naming_the_key() {
    check_all("config", refusals());
}

#[test]
fn valid_config_oddities_still_run() {
    let run = args(&["run", "{dir}", "--ids", PROMPT, "-n", "4", "--print-ids"]);
    let flat = fixtures().join("config-shapes/tiny-k3.flat.json");
    check_all(
        "config-valid",
        vec![
            case(
                "flat-shape",
                "config.json in the flat fixture shape",
                move |d| {
                    std::fs::copy(&flat, d.join("config.json")).unwrap();
                },
                run.clone(),
                0,
                &[CLEAN_IDS],
            ),
            case(
                "unknown-extra-keys",
                "unknown keys at every level",
                |d| {
                    edit_config(d, |v| {
                        objects(v, &mut |o| {
                            o.insert("k3_future_knob".into(), json!({"x": [1, 2]}));
                            o.insert("rope_scaling".into(), json!(null));
                        })
                    })
                },
                run.clone(),
                0,
                &[CLEAN_IDS],
            ),
            case(
                "integers-as-floats",
                "every integer field written as 96.0-style floats",
                |d| {
                    edit_config(d, |v| {
                        objects(v, &mut |o| {
                            for (k, val) in o.iter_mut() {
                                if let Some(i) =
                                    val.as_i64().filter(|_| REQUIRED.contains(&k.as_str()))
                                {
                                    *val = json!(i as f64);
                                }
                            }
                        })
                    })
                },
                run.clone(),
                0,
                &[CLEAN_IDS],
            ),
        ],
    );
}
