//! DSpark checkpoint refusals (docs/DSPARK.md): each names the file and the key or tensor.

use k3_format::dspark::{expected_tensors, DraftRope, TapStream, Yarn};
use k3_format::writer::{write_shard, TensorSpec};
use k3_format::{Checkpoint, DsparkCheckpoint, Dtype, K3Config};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn target() -> K3Config {
    K3Config::load(fixtures().join("tiny-k3/config.json")).unwrap()
}

/// A copy of fixtures/tiny-k3-dspark whose config.json is `edit`ed.
fn with_config(
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixtures().join("tiny-k3-dspark");
    std::fs::copy(
        src.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(cfg.as_object_mut().unwrap());
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    dir
}

/// A copy of the fixture whose tensors are rewritten by `edit` (zero data).
fn with_tensors(edit: impl FnOnce(&mut Vec<TensorSpec>)) -> tempfile::TempDir {
    let dir = with_config(|_| {});
    let ck = Checkpoint::open(fixtures().join("tiny-k3-dspark")).unwrap();
    let mut specs: Vec<TensorSpec> = ck
        .iter()
        .map(|v| TensorSpec::new(v.name, v.dtype, v.shape))
        .collect();
    edit(&mut specs);
    let path = dir.path().join("model.safetensors");
    write_shard(&path, &specs, |_, _, _| {}).unwrap();
    dir
}

fn refusal(dir: &Path) -> String {
    match DsparkCheckpoint::open(dir, &target()) {
        Ok(_) => panic!("{} was accepted", dir.display()),
        Err(e) => e.to_string().replace(&dir.display().to_string(), "DIR"),
    }
}

#[test]
fn the_fixture_opens_with_every_published_tensor() {
    let ck = DsparkCheckpoint::open(&fixtures().join("tiny-k3-dspark"), &target()).unwrap();
    let c = ck.config();
    assert_eq!(
        (c.num_hidden_layers, c.block_size, c.markov_rank),
        (3, 7, 8)
    );
    assert_eq!(c.target_layer_ids, [1, 6, 12]);
    assert_eq!(c.stream, TapStream::AttnRes);
    assert!(c.confidence_head && c.confidence_with_markov);
    assert_eq!(expected_tensors(c).len(), 2 + 3 * 12 + 1 + 2 + 2);
}

#[test]
fn an_embed_tokens_copy_is_accepted_and_ignored() {
    let dir = with_tensors(|t| {
        t.push(TensorSpec::new(
            "embed_tokens.weight",
            Dtype::BF16,
            &[1024, 64],
        ))
    });
    let ck = DsparkCheckpoint::open(dir.path(), &target()).unwrap();
    let fixture = DsparkCheckpoint::open(&fixtures().join("tiny-k3-dspark"), &target()).unwrap();
    assert_eq!(ck.weight_bytes(), fixture.weight_bytes());
}

#[test]
fn target_mismatches_are_refused_naming_the_key() {
    let cases: [(&str, serde_json::Value, &str); 5] = [
        ("hidden_size", 80.into(), "DIR/config.json: key `hidden_size` is 80 but the target's hidden size is 64: this draft was made for another model"),
        ("vocab_size", 2048.into(), "DIR/config.json: key `vocab_size` is 2048 but the target's vocabulary is 1024: this draft was made for another model"),
        ("target_num_hidden_layers", 93.into(), "DIR/config.json: key `target_num_hidden_layers` is 93 but the target's layer count is 13: this draft was made for another model"),
        ("target_layer_ids", serde_json::json!([1, 6, 13]), "DIR/config.json: key `target_layer_ids` holds 13, out of range: the target has 13 layers (0-based ids)"),
        ("mask_token_id", 4096.into(), "DIR/config.json: key `mask_token_id` holds 4096, out of range: the target has 1024 token ids"),
    ];
    for (key, value, want) in cases {
        let dir = with_config(|c| {
            c.insert(key.into(), value);
        });
        assert_eq!(refusal(dir.path()), want, "{key}");
    }
}

#[test]
fn malformed_or_unsupported_config_keys_are_refused() {
    let yarn = |extra: serde_json::Value| {
        let mut m = serde_json::json!({"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 4096});
        for (k, v) in extra.as_object().unwrap() {
            m.as_object_mut().unwrap().insert(k.clone(), v.clone());
        }
        Some(m)
    };
    let cases: [(&str, Option<serde_json::Value>, &str); 9] = [
        ("markov_rank", None, "DIR/config.json: key `markov_rank`: missing"),
        ("block_size", Some(0.into()), "DIR/config.json: key `block_size`: must be at least 1"),
        ("aux_hidden_stream", Some("final".into()), "DIR/config.json: key `aux_hidden_stream`: \"final\" is not \"prefix\" or \"attn_res\""),
        ("rope_scaling", Some(serde_json::json!({"rope_type": "linear", "factor": 2})), "DIR/config.json: key `rope_scaling`: rope_type \"linear\" is not supported (plain RoPE: null or \"default\"; YaRN: \"yarn\" or \"deepseek_yarn\")"),
        ("rope_scaling", Some(serde_json::json!({"type": "yarn", "original_max_position_embeddings": 4096})), "DIR/config.json: key `rope_scaling`: factor is missing"),
        ("rope_scaling", Some(serde_json::json!({"rope_type": "deepseek_yarn", "factor": 8})), "DIR/config.json: key `rope_scaling`: original_max_position_embeddings is missing (YaRN needs it)"),
        ("rope_scaling", yarn(serde_json::json!({"type": "linear"})), "DIR/config.json: key `rope_scaling`: rope_type \"yarn\" and type \"linear\" disagree: give one of them"),
        ("rope_scaling", yarn(serde_json::json!({"apply_yarn_scaling": false})), "DIR/config.json: key `rope_scaling`: apply_yarn_scaling is not supported (vLLM's K3 paths disagree on it)"),
        ("rope_parameters", yarn(serde_json::json!({"rope_theta": 10000.0})), "DIR/config.json: key `rope_theta`: 50000.0 but rope_parameters.rope_theta is 10000.0: give one value"),
    ];
    for (key, value, want) in cases {
        let dir = with_config(|c| match value {
            Some(v) => {
                c.insert(key.into(), v);
            }
            None => {
                c.remove(key);
            }
        });
        assert_eq!(refusal(dir.path()), want, "{key}");
    }
}

/// `rope_parameters` (or `rope_scaling`) YaRN with vLLM's defaults filled in; `rope_theta`
/// may live in the dictionary; `original_max_position_embeddings` at the top level.
#[test]
fn yarn_rope_is_read_with_vllm_defaults() {
    let dir = with_config(|c| {
        c.remove("rope_theta");
        c.insert("original_max_position_embeddings".into(), 4096.into());
        c.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "deepseek_yarn", "factor": 32, "rope_theta": 50000.0, "mscale_all_dim": 1.0}),
        );
    });
    let ck = DsparkCheckpoint::open(dir.path(), &target()).unwrap();
    let want = Yarn {
        factor: 32.0,
        original_max_position_embeddings: 4096.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        mscale: 1.0,
        mscale_all_dim: 1.0,
        extrapolation_factor: 1.0,
        attn_factor: 1.0,
    };
    assert_eq!(ck.config().rope, DraftRope::Yarn(want));
    assert_eq!(ck.config().rope_theta, 50000.0);
    let plain = DsparkCheckpoint::open(&fixtures().join("tiny-k3-dspark"), &target()).unwrap();
    assert_eq!(plain.config().rope, DraftRope::Plain);
}

/// vLLM's K3 DSpark layer builds its MLA with RoPE and no output gate whatever
/// `mla_use_output_gate` / `mla_use_nope` say (a config copied from the target carries both
/// `true`): accepted; a `g_proj` tensor stays unexpected.
#[test]
fn output_gate_and_nope_flags_are_accepted_but_a_gate_tensor_is_not() {
    let dir = with_config(|c| {
        c.insert("mla_use_output_gate".into(), true.into());
        c.insert("mla_use_nope".into(), true.into());
    });
    DsparkCheckpoint::open(dir.path(), &target()).unwrap();
    let dir = with_tensors(|t| {
        t.push(TensorSpec::new(
            "layers.0.self_attn.g_proj.weight",
            Dtype::BF16,
            &[64, 64],
        ))
    });
    assert_eq!(
        refusal(dir.path()),
        "DIR/model.safetensors: unexpected tensor `layers.0.self_attn.g_proj.weight`: not part of a DSpark checkpoint with this config"
    );
}

/// `fc_norm: true` calls for one `[E]` gain per tap (`fc_norm.{i}.weight`).
#[test]
fn fc_norm_needs_its_per_tap_gains() {
    let dir = with_config(|c| {
        c.insert("fc_norm".into(), true.into());
    });
    assert_eq!(
        refusal(dir.path()),
        "DIR: tensor `fc_norm.0.weight` is missing: not a complete DSpark checkpoint for this config"
    );
    let ck = DsparkCheckpoint::open(&fixtures().join("tiny-k3-dspark"), &target()).unwrap();
    assert!(!ck.config().fc_norm);
    let mut with = ck.config().clone();
    with.fc_norm = true;
    assert_eq!(expected_tensors(&with)["fc_norm.2.weight"], [64]);
}

#[test]
fn missing_extra_misshapen_and_mistyped_tensors_are_refused() {
    let dir = with_tensors(|t| t.retain(|s| s.name != "layers.2.self_attn.kv_b_proj.weight"));
    assert_eq!(
        refusal(dir.path()),
        "DIR: tensor `layers.2.self_attn.kv_b_proj.weight` is missing: not a complete DSpark checkpoint for this config"
    );
    let dir = with_tensors(|t| {
        t.push(TensorSpec::new(
            "layers.3.mlp.up_proj.weight",
            Dtype::BF16,
            &[96, 64],
        ))
    });
    assert_eq!(
        refusal(dir.path()),
        "DIR/model.safetensors: unexpected tensor `layers.3.mlp.up_proj.weight`: not part of a DSpark checkpoint with this config"
    );
    let dir = with_tensors(|t| {
        let s = t
            .iter_mut()
            .find(|s| s.name == "context_proj.weight")
            .unwrap();
        s.shape = vec![64, 128];
    });
    assert_eq!(
        refusal(dir.path()),
        "DIR/model.safetensors: tensor `context_proj.weight` has shape [64, 128], expected [64, 192] from config.json"
    );
    let dir = with_tensors(|t| {
        let s = t
            .iter_mut()
            .find(|s| s.name == "markov_head.markov_w2.weight")
            .unwrap();
        s.dtype = Dtype::F32;
    });
    assert_eq!(
        refusal(dir.path()),
        "DIR/model.safetensors: tensor `markov_head.markov_w2.weight` is F32, expected BF16"
    );
}
