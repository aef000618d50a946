//! `cargo xtask gen-dspark --target MODEL_DIR OUT_DIR [--layers N] [--seed S]`: a DSpark
//! draft checkpoint with random weights in the published layout (docs/DSPARK.md), matched to
//! the target in MODEL_DIR — its hidden width, vocabulary and layer count, taps spread over
//! its layers — with the published draft geometry otherwise (5 layers, MLA 64 heads,
//! q_lora 1536, kv_lora 512, MLP 14336, block 7, Markov rank 256, confidence head with the
//! Markov input). Its proposals are near-random; `cargo xtask bench-dspark` replaces them by
//! the true continuation with a controlled probability, and pays for every draft pass.
//!
//! Matrices are uniform in ±1/sqrt(cols) (BF16), norm gains 1, the confidence head F32.

use clap::Args;
use half::bf16;
use k3_format::writer::{write_shard, TensorSpec};
use k3_format::{Dtype, K3Config};
use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `gen-dspark`.
#[derive(Args, Debug)]
pub struct GenDsparkArgs {
    /// The target checkpoint the draft is for.
    #[arg(long)]
    pub target: PathBuf,
    /// Output directory (created; config.json and model.safetensors are replaced).
    pub out_dir: PathBuf,
    /// Draft layers (published: 5).
    #[arg(long, default_value_t = 5)]
    pub layers: usize,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Runs the subcommand.
pub fn run(args: &GenDsparkArgs) -> ExitCode {
    match generate(args) {
        Ok(bytes) => {
            println!(
                "gen-dspark: wrote {} ({:.2} GB)",
                args.out_dir.display(),
                bytes as f64 / 1e9
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gen-dspark: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The draft's config.json for `target` (the published field set).
pub fn config_json(target: &K3Config, layers: usize) -> serde_json::Value {
    let n = target.num_hidden_layers;
    // five taps spread over the target's layers, the last one its last layer
    let taps: Vec<usize> = if n >= 5 {
        (1..=5).map(|i| (i * n).div_ceil(5) - 1).collect()
    } else {
        (0..n).collect()
    };
    let vocab = target.vocab_size;
    serde_json::json!({
        "architectures": ["K3DSparkModel"],
        "model_type": "k3_dspark",
        "hidden_size": target.hidden_size,
        "intermediate_size": 14336,
        "num_hidden_layers": layers,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "mla_use_nope": false,
        "mla_use_output_gate": false,
        "hidden_act": "silu",
        "vocab_size": vocab,
        "draft_vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        "rope_scaling": null,
        "num_target_layers": taps.len(),
        "target_hidden_size": target.hidden_size,
        "target_num_hidden_layers": n,
        "target_layer_ids": taps,
        "fc_norm": false,
        "aux_hidden_stream": "prefix",
        "mask_token_id": vocab - 3,
        "block_size": 7,
        "markov_rank": 256,
        "markov_head_type": "vanilla",
        "enable_confidence_head": true,
        "confidence_head_with_markov": true,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16"
    })
}

/// splitmix64.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the tensor's values: gains 1, matrices uniform in ±1/sqrt(cols).
fn fill(t: &TensorSpec, buf: &mut [u8], seed: u64) {
    let cols = *t.shape.last().unwrap_or(&1);
    let gain = t.shape.len() == 1 && t.name.ends_with("norm.weight");
    match t.dtype {
        Dtype::F32 => {
            let mut s = seed;
            for c in buf.chunks_exact_mut(4) {
                let u = (next(&mut s) >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                c.copy_from_slice(&(u * 0.1).to_le_bytes());
            }
        }
        _ if gain => {
            let one = bf16::from_f32(1.0).to_bits().to_le_bytes();
            buf.chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(&one));
        }
        _ => {
            let scale = 2.0 / (cols as f32).sqrt();
            let mut s = seed;
            for c in buf.chunks_exact_mut(8) {
                let r = next(&mut s);
                for (k, v) in c.chunks_exact_mut(2).enumerate() {
                    let u = ((r >> (16 * k)) & 0xFFFF) as f32 / 65536.0 - 0.5;
                    v.copy_from_slice(&bf16::from_f32(u * scale).to_bits().to_le_bytes());
                }
            }
        }
    }
}

fn generate(args: &GenDsparkArgs) -> Result<u64, String> {
    let target = K3Config::load(args.target.join("config.json")).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| format!("{}: {e}", args.out_dir.display()))?;
    let cfg = config_json(&target, args.layers);
    let cfg_path = args.out_dir.join("config.json");
    let text = serde_json::to_string_pretty(&cfg).map_err(|e| e.to_string())?;
    std::fs::write(&cfg_path, text).map_err(|e| format!("{}: {e}", cfg_path.display()))?;
    let parsed =
        k3_format::dspark::DsparkConfig::load(&cfg_path, &target).map_err(|e| e.to_string())?;
    let tensors: Vec<TensorSpec> = k3_format::dspark::expected_tensors(&parsed)
        .into_iter()
        .map(|(name, shape)| {
            let dtype = if name.starts_with("confidence_head.") {
                Dtype::F32
            } else {
                Dtype::BF16
            };
            TensorSpec::new(name, dtype, &shape)
        })
        .collect();
    let bytes = tensors.iter().filter_map(TensorSpec::nbytes).sum();
    let path = args.out_dir.join("model.safetensors");
    let seed = args.seed;
    write_shard(&path, &tensors, |i, t, buf| {
        fill(
            t,
            buf,
            seed ^ (i as u64).wrapping_mul(0xA24B_AED4_963E_E407),
        )
    })
    .map_err(|e| e.to_string())?;
    // the checkpoint must open against its target (every refusal checked)
    k3_format::DsparkCheckpoint::open(&args.out_dir, &target).map_err(|e| e.to_string())?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draft_for_the_tiny_model_opens_against_it() {
        let tiny = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-k3");
        let out = std::env::temp_dir().join(format!("k3-gen-dspark-{}", std::process::id()));
        let args = GenDsparkArgs {
            target: tiny.clone(),
            out_dir: out.clone(),
            layers: 1,
            seed: 1,
        };
        let bytes = generate(&args);
        let _ = std::fs::remove_dir_all(&out);
        let bytes = bytes.unwrap();
        let target = K3Config::load(tiny.join("config.json")).unwrap();
        // one layer at the published widths over tiny-k3's 64-wide hidden stream
        let cfg = config_json(&target, 1);
        assert_eq!(cfg["target_layer_ids"].as_array().unwrap().len(), 5);
        assert_eq!(cfg["target_layer_ids"][4], target.num_hidden_layers - 1);
        assert!(bytes > 0);
    }
}
