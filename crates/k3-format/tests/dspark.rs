//! DSpark checkpoint refusals (docs/DSPARK.md): each names the file and the key or tensor.

use k3_format::dspark::{expected_tensors, TapStream};
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
    let cases: [(&str, Option<serde_json::Value>, &str); 6] = [
        ("markov_rank", None, "DIR/config.json: key `markov_rank`: missing"),
        ("block_size", Some(0.into()), "DIR/config.json: key `block_size`: must be at least 1"),
        ("aux_hidden_stream", Some("final".into()), "DIR/config.json: key `aux_hidden_stream`: \"final\" is not \"prefix\" or \"attn_res\""),
        ("fc_norm", Some(true.into()), "DIR/config.json: key `fc_norm`: true (per-tap norms before context_proj) is not supported"),
        ("mla_use_output_gate", Some(true.into()), "DIR/config.json: key `mla_use_output_gate`: true is not supported: the published K3 DSpark layers have no output gate"),
        ("rope_scaling", Some(serde_json::json!({"rope_type": "yarn", "factor": 32})), "DIR/config.json: key `rope_scaling`: rope_type \"yarn\" is not supported (only plain RoPE: null or rope_type \"default\")"),
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
