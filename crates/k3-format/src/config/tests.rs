//! Config tests on inline documents (no files outside the repository).

use super::*;
use serde_json::{json, Value};

/// The flat 13-layer tiny model (same content as upstream's flat fixture shape).
fn tiny_flat() -> Value {
    json!({
        "hidden_size": 128, "num_hidden_layers": 13, "vocab_size": 256, "rms_norm_eps": 1e-05,
        "tie_word_embeddings": false, "kda_num_heads": 4, "kda_head_dim": 16,
        "short_conv_kernel_size": 4, "gate_lower_bound": -5.0, "num_attention_heads": 4,
        "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 24, "qk_rope_head_dim": 8,
        "v_head_dim": 16, "mla_use_output_gate": true, "num_experts": 8,
        "num_experts_per_token": 2, "num_shared_experts": 2, "routed_expert_hidden_size": 64,
        "moe_intermediate_size": 48, "routed_scaling_factor": 1.0, "moe_renormalize": true,
        "latent_moe_use_norm": true, "first_k_dense_replace": 1, "intermediate_size": 96,
        "attn_res_block_size": 3, "situ_beta": 4.0, "situ_linear_beta": 25.0,
        "full_attn_layers": [4, 8, 12, 13]
    })
}

/// The same tiny model in the released nested layout.
fn tiny_nested() -> Value {
    serde_json::from_str(
        r#"{
        "model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
        "vocab_size": 256, "vision_config": {"hidden_size": 99},
        "text_config": {
            "model_type": "kimi_linear", "hidden_size": 128, "num_hidden_layers": 13,
            "vocab_size": 256, "rms_norm_eps": 1e-05, "num_attention_heads": 4,
            "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 24,
            "qk_rope_head_dim": 8, "v_head_dim": 16, "mla_use_output_gate": true,
            "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 2,
            "routed_expert_hidden_size": 64, "moe_intermediate_size": 48,
            "routed_scaling_factor": 1.0, "moe_renormalize": true, "latent_moe_use_norm": true,
            "first_k_dense_replace": 1, "intermediate_size": 96, "attn_res_block_size": 3,
            "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
            "head_dim": 999,
            "linear_attn_config": {
                "num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4,
                "gate_lower_bound": -5.0, "full_attn_layers": [4, 8, 12, 13],
                "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11]
            }
        }
    }"#,
    )
    .unwrap()
}

fn parse(v: &Value) -> Result<K3Config, ConfigError> {
    K3Config::from_json_str(&v.to_string(), "cfg/test.json")
}

fn with(mut v: Value, key: &str, val: Value) -> Value {
    v[key] = val;
    v
}

fn without(mut v: Value, keys: &[&str]) -> Value {
    for k in keys {
        v.as_object_mut().unwrap().remove(*k);
    }
    v
}

fn err(v: &Value) -> String {
    parse(v).unwrap_err().to_string()
}

#[test]
fn flat_tiny_parses() {
    let c = parse(&tiny_flat()).unwrap();
    assert_eq!(c.shape, ConfigShape::Flat);
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.vocab_size),
        (128, 13, 256)
    );
    assert_eq!((c.kda_num_heads, c.kda_head_dim), (4, 16));
    assert_eq!(
        (c.activation_situ_beta, c.activation_situ_linear_beta),
        (4.0, 25.0)
    );
    let map: String = (0..13)
        .map(|l| if c.is_mla(l) { 'M' } else { 'K' })
        .collect();
    assert_eq!(map, "KKKMKKKMKKKMM");
    assert_eq!(
        c.summary("cfg/test.json"),
        "config: cfg/test.json (flat shape) | hidden=128 layers=13 vocab=256 | 4 MLA + 9 KDA | experts 8 top2 shared2 | latent=64"
    );
}

#[test]
fn config_wrapper_is_unwrapped() {
    let doc = json!({"note": "oracle", "config": tiny_flat(), "prompt_ids": [1, 2]});
    assert_eq!(parse(&doc).unwrap(), parse(&tiny_flat()).unwrap());
}

#[test]
fn nested_and_flat_parse_equal() {
    let nested = parse(&tiny_nested()).unwrap();
    assert_eq!(nested.shape, ConfigShape::Nested);
    // linear_attn_config.head_dim wins over text_config.head_dim (docs/MODEL.md#config-key-lookup).
    assert_eq!(nested.kda_head_dim, 16);
    let flat = parse(&tiny_flat()).unwrap();
    assert_eq!(
        K3Config {
            shape: ConfigShape::Flat,
            ..nested
        },
        flat
    );
}

#[test]
fn released_values_roundtrip_through_nested_json() {
    let r = K3Config::released();
    assert_eq!(r.num_mla_layers(), 24);
    assert!(r.is_mla(3) && r.is_mla(91) && r.is_mla(92) && r.is_kda(0) && r.is_kda(90));
    let mut doc = tiny_nested();
    let t = &mut doc["text_config"];
    for (k, v) in [
        ("hidden_size", json!(7168)),
        ("num_hidden_layers", json!(93)),
        ("vocab_size", json!(163840)),
        ("num_attention_heads", json!(96)),
        ("q_lora_rank", json!(1536)),
        ("kv_lora_rank", json!(512)),
        ("qk_nope_head_dim", json!(128)),
        ("qk_rope_head_dim", json!(64)),
        ("v_head_dim", json!(128)),
        ("num_experts", json!(896)),
        ("num_experts_per_token", json!(16)),
        ("routed_expert_hidden_size", json!(3584)),
        ("moe_intermediate_size", json!(3072)),
        ("intermediate_size", json!(33792)),
        ("attn_res_block_size", json!(12)),
        ("head_dim", json!(128)),
    ] {
        t[k] = v;
    }
    t["linear_attn_config"]["num_heads"] = json!(96);
    t["linear_attn_config"]["head_dim"] = json!(128.0);
    t["linear_attn_config"]["full_attn_layers"] = json!(r.full_attn_layers);
    let c = parse(&doc).unwrap();
    assert_eq!(c, r);
    assert!(c
        .summary("config.json")
        .contains("| 24 MLA + 69 KDA | experts 896 top16 shared2 | latent=3584"));
}

#[test]
fn no_layermap_is_missing() {
    let e = parse(&without(tiny_flat(), &["full_attn_layers"])).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(&e, ConfigError::Missing { count: 1, keys, .. } if keys == &["full_attn_layers"])
    );
    assert!(
        msg.starts_with("cfg/test.json is missing 1 required field(s):"),
        "{msg}"
    );
    assert!(msg.contains("full_attn_layers") && msg.contains("refusing to substitute defaults"));
    for empty in [json!([]), json!("4,8"), json!(null)] {
        let e = parse(&with(tiny_flat(), "full_attn_layers", empty)).unwrap_err();
        assert!(matches!(e, ConfigError::Missing { count: 1, .. }), "{e}");
    }
}

#[test]
fn bad_layer_index_is_refused() {
    let msg = err(&with(
        tiny_flat(),
        "full_attn_layers",
        json!([4, 8, 999, 13]),
    ));
    assert_eq!(
        msg,
        "cfg/test.json: full_attn_layers[2] = 999 is outside 1..13 (the list is ONE-based)"
    );
    let msg = err(&with(tiny_flat(), "full_attn_layers", json!([0, 4])));
    assert!(
        msg.contains("full_attn_layers[0] = 0 is outside 1..13"),
        "{msg}"
    );
}

#[test]
fn bad_topk_is_refused() {
    let msg = err(&with(tiny_flat(), "num_experts_per_token", json!(128)));
    assert_eq!(
        msg,
        "cfg/test.json: num_experts_per_token selects top-128, but this build supports at most 64"
    );
    let msg = err(&with(tiny_flat(), "num_experts_per_token", json!(9)));
    assert!(msg.contains("selects 9 of 8 experts"), "{msg}");
}

#[test]
fn all_missing_keys_reported_at_once() {
    let doc = without(
        tiny_flat(),
        &[
            "hidden_size",
            "kda_head_dim",
            "situ_beta",
            "full_attn_layers",
        ],
    );
    let doc = with(doc, "num_experts", json!(true));
    let e = parse(&doc).unwrap_err();
    let ConfigError::Missing { count, keys, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(*count, 5);
    for k in [
        "hidden_size",
        "head_dim",
        "num_experts",
        "activation_situ_beta",
        "full_attn_layers",
    ] {
        assert!(keys.iter().any(|x| x == k), "{k} not in {keys:?}");
    }
    let msg = e.to_string();
    assert!(msg.contains("is missing 5 required field(s)"), "{msg}");
    assert!(
        msg.contains("`num_experts` is true (a bool), not a number"),
        "{msg}"
    );
    assert!(
        msg.contains("head_dim (alias kda_head_dim): absent"),
        "{msg}"
    );
}

#[test]
fn integer_fields_accept_integral_floats_only() {
    let c = parse(&with(tiny_flat(), "hidden_size", json!(128.0))).unwrap();
    assert_eq!(c.hidden_size, 128);
    let msg = err(&with(tiny_flat(), "hidden_size", json!(128.5)));
    assert!(
        msg.contains("`hidden_size` = 128.5 is not an integer"),
        "{msg}"
    );
    let msg = err(&with(tiny_flat(), "kda_num_heads", json!(1e30)));
    assert!(
        msg.contains("`kda_num_heads`") && msg.contains("not an integer"),
        "{msg}"
    );
    let msg = err(&with(tiny_flat(), "full_attn_layers", json!([4, 8.5])));
    assert!(
        msg.contains("full_attn_layers[1] is not a number: found 8.5"),
        "{msg}"
    );
    let c = parse(&with(tiny_flat(), "full_attn_layers", json!([4.0, 13]))).unwrap();
    assert_eq!(c.full_attn_layers, vec![4, 13]);
}

#[test]
fn validation_rules_name_key_and_value() {
    let cases: Vec<(Value, &str)> = vec![
        (
            with(tiny_flat(), "hidden_size", json!(0)),
            "`hidden_size` = 0 must be at least 1",
        ),
        (
            with(tiny_flat(), "num_hidden_layers", json!(-3)),
            "`num_hidden_layers` = -3 must be at least 1",
        ),
        (
            with(tiny_flat(), "vocab_size", json!(0)),
            "`vocab_size` = 0",
        ),
        (
            with(tiny_flat(), "kda_head_dim", json!(0)),
            "`head_dim` = 0 must be at least 1",
        ),
        (
            with(
                tiny_flat(),
                "full_attn_layers",
                json!((1..=13).collect::<Vec<_>>()),
            ),
            "marks 13 of 13 layers as full attention, leaving no KDA layers",
        ),
        (
            with(tiny_flat(), "full_attn_layers", json!([4, 8, 4])),
            "full_attn_layers[2] = 4 repeats full_attn_layers[0]",
        ),
        (
            with(tiny_flat(), "full_attn_layers", json!([4, "8"])),
            "full_attn_layers[1] is not a number: found \"8\"",
        ),
        (
            with(tiny_flat(), "full_attn_layers", json!([4, true])),
            "full_attn_layers[1] is not a number: found true",
        ),
        (
            with(tiny_flat(), "attn_res_block_size", json!(0)),
            "attn_res_block_size = 0: layer_idx % 0 would divide by zero",
        ),
        (
            with(tiny_flat(), "short_conv_kernel_size", json!(0)),
            "has short_conv_kernel_size 0",
        ),
        (
            with(tiny_flat(), "first_k_dense_replace", json!(14)),
            "first_k_dense_replace = 14 exceeds num_hidden_layers = 13",
        ),
        (
            with(tiny_flat(), "rms_norm_eps", json!(0.0)),
            "`rms_norm_eps` = 0 must be greater than 0",
        ),
        (
            with(tiny_flat(), "situ_beta", json!(-4.0)),
            "`activation_situ_beta` = -4 must be greater than 0",
        ),
    ];
    for (doc, want) in cases {
        let msg = err(&doc);
        assert!(msg.starts_with("cfg/test.json"), "{msg}");
        assert!(msg.contains(want), "wanted {want:?} in {msg:?}");
    }
}

#[test]
fn bools_default_and_accept_numbers() {
    let c = parse(&without(
        tiny_flat(),
        &["mla_use_output_gate", "moe_renormalize"],
    ))
    .unwrap();
    assert!(c.mla_use_output_gate && c.moe_renormalize && c.latent_moe_use_norm);
    let c = parse(&with(tiny_flat(), "mla_use_output_gate", json!(false))).unwrap();
    assert!(!c.mla_use_output_gate);
    let c = parse(&with(tiny_flat(), "moe_renormalize", json!(0))).unwrap();
    assert!(!c.moe_renormalize);
    let c = parse(&with(tiny_flat(), "latent_moe_use_norm", json!("no"))).unwrap();
    assert!(c.latent_moe_use_norm);
}

#[test]
fn lookup_order_and_aliases() {
    // Primary before alias in the same object.
    let doc = with(tiny_flat(), "activation_situ_beta", json!(3.0));
    assert_eq!(parse(&doc).unwrap().activation_situ_beta, 3.0);
    // text_config beats root for ordinary keys.
    let mut doc = tiny_nested();
    doc["hidden_size"] = json!(4096);
    assert_eq!(parse(&doc).unwrap().hidden_size, 128);
    // A key only at root is still found in the nested shape.
    let mut doc = tiny_nested();
    doc["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("vocab_size");
    assert_eq!(parse(&doc).unwrap().vocab_size, 256);
    // Unknown extra keys are fine.
    let doc = with(tiny_flat(), "rope_theta_never_read", json!({"x": [1, 2]}));
    assert!(parse(&doc).is_ok());
}

#[test]
fn not_json_or_not_object() {
    let e = K3Config::from_json_str("{\"hidden_size\": ", "x.json").unwrap_err();
    assert!(
        matches!(e, ConfigError::Json { .. })
            && e.to_string().starts_with("x.json: not valid JSON")
    );
    let e = K3Config::from_json_str("[1, 2]", "x.json").unwrap_err();
    assert_eq!(
        e.to_string(),
        "x.json: the config must be a JSON object, found an array"
    );
}

#[test]
fn load_reads_files_and_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config.json");
    std::fs::write(&p, tiny_nested().to_string()).unwrap();
    assert_eq!(K3Config::load(&p).unwrap().shape, ConfigShape::Nested);
    std::fs::write(&p, without(tiny_flat(), &["vocab_size"]).to_string()).unwrap();
    let msg = K3Config::load(&p).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!("{} is missing 1 required field(s)", p.display())),
        "{msg}"
    );
    let missing = dir.path().join("nope.json");
    let msg = K3Config::load(&missing).unwrap_err().to_string();
    assert!(msg.contains("nope.json: cannot read config"), "{msg}");
}
