//! The released checkpoint's layout at full size, as sparse files (docs/PERFORMANCE.md#released-geometry).
//!
//! [`layout`] spreads the released model's tensors (docs/MODEL.md#real-model-sizing) over 96
//! shards: one per layer (its 5,376 expert tensors sorted before its trunk run), then the
//! model-level tensors, `lm_head`, and vision-tower filler up to 497,220 tensors.
//! [`write_sparse`] writes those shards as headers plus `set_len` (holes that read as zeros),
//! then writes only the bytes a zero would make degenerate ([`fill_of`]):
//!
//! - router gates (`block_sparse_moe.gate.weight`) and correction biases: random, so routing
//!   spreads over the experts and the expert cache sees a realistic miss rate;
//! - norm gains (every 1-D BF16 tensor, and the F32 `o_norm`): ones;
//! - the first [`DENSE_VOCAB_ROWS`] rows of `embed_tokens` and `lm_head`: random. With every
//!   other trunk matrix zero, each mixer and MoE adds nothing, so the hidden state at every
//!   layer is a multiple of the token's embedding row: a zero embedding would route every
//!   token identically (bias only), and a zero `lm_head` would make every logit 0 and every
//!   generated id the same. Random rows make the next id a pseudo-random function of the
//!   current one, so each token routes differently.
//!
//! Everything else stays a hole: zero BF16 matrices, zero MXFP4 codes (value 0 with any
//! scale), `A_log` 0 (A = 1), `dt_bias` 0, conv taps 0, `res_proj` 0 (a uniform attention-
//! residual mix); none of these divides by zero or makes a NaN.

use crate::bind::{model_tensors, LM_HEAD};
use crate::config::K3Config;
use crate::dtype::Dtype;
use crate::error::FormatError;
use crate::synth::{config_json, SplitMix};
use crate::writer::{create_sparse_shard, write_index, TensorSpec};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

/// Shards of the released checkpoint.
pub const SHARDS: usize = 96;
/// Tensors of the released checkpoint (vision tower included).
pub const TENSORS: usize = 497_220;
/// Rows of `embed_tokens` and `lm_head` that hold random values (ids below this).
pub const DENSE_VOCAB_ROWS: usize = 16_384;

/// Bytes generated per write.
const CHUNK: usize = 8 << 20;

/// The released model's tensors in 96 shards, named `model-0000N-of-00096.safetensors`.
pub fn layout(cfg: &K3Config) -> Vec<(String, Vec<TensorSpec>)> {
    let mut groups = model_tensors(cfg);
    let globals = groups.remove(0);
    let (lm_head, rest): (Vec<_>, Vec<_>) = globals.into_iter().partition(|t| t.name == LM_HEAD);
    let count: usize = groups.iter().map(Vec::len).sum::<usize>() + lm_head.len() + rest.len();
    let vision: Vec<TensorSpec> = (0..TENSORS.saturating_sub(count))
        .map(|i| {
            TensorSpec::new(
                format!("vision_tower.blocks.{}.param_{}.weight", i / 8, i % 8),
                Dtype::BF16,
                &[1152, 1152],
            )
        })
        .collect();
    groups.extend([rest, lm_head, vision]);
    let n = groups.len();
    groups
        .into_iter()
        .enumerate()
        .map(|(i, g)| (format!("model-{:05}-of-{n:05}.safetensors", i + 1), g))
        .collect()
}

/// What a tensor's bytes are in the sparse checkpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fill {
    /// Never written: reads as zeros.
    Hole,
    /// Every element 1 (a norm gain).
    Ones,
    /// The first `rows` rows uniform random with standard deviation `std`; the rest a hole.
    Random {
        /// Standard deviation.
        std: f32,
        /// Leading rows written (all rows when at least the tensor's).
        rows: usize,
    },
}

/// The fill rule of one tensor (module docs).
pub fn fill_of(t: &TensorSpec) -> Fill {
    let n = t.name.as_str();
    let fan_in = t.shape.last().copied().unwrap_or(1).max(1) as f32;
    if n.starts_with("vision_tower.") {
        Fill::Hole
    } else if n.ends_with("embed_tokens.weight") {
        Fill::Random {
            std: 1.0,
            rows: DENSE_VOCAB_ROWS,
        }
    } else if n == LM_HEAD {
        Fill::Random {
            std: 1.0 / fan_in.sqrt(),
            rows: DENSE_VOCAB_ROWS,
        }
    } else if n.ends_with("block_sparse_moe.gate.weight") {
        Fill::Random {
            std: 1.0 / fan_in.sqrt(),
            rows: usize::MAX,
        }
    } else if n.ends_with("e_score_correction_bias") {
        Fill::Random {
            std: 0.01,
            rows: usize::MAX,
        }
    } else if (t.dtype == Dtype::BF16 && t.shape.len() == 1) || n.ends_with("o_norm.weight") {
        Fill::Ones
    } else {
        Fill::Hole
    }
}

/// What [`write_sparse`] wrote.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SparseSummary {
    /// Shard files.
    pub n_shards: usize,
    /// Tensors in all shards.
    pub n_tensors: usize,
    /// Sum of the shard file lengths (the apparent size).
    pub apparent_bytes: u64,
    /// Bytes written: headers plus the filled tensors (not the index or config).
    pub written_bytes: u64,
    /// Wall seconds.
    pub seconds: f64,
}

/// Writes `config.json`, the 96 sparse shards and `model.safetensors.index.json` of the
/// released model into `dir` (created). With `fill` false only headers are written (every
/// tensor a hole): enough to open, bind and plan, not to run.
pub fn write_sparse(dir: &Path, seed: u64, fill: bool) -> Result<SparseSummary, FormatError> {
    let t0 = Instant::now();
    std::fs::create_dir_all(dir).map_err(|e| FormatError::io(dir, e))?;
    let cfg = K3Config::released();
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, config_json(&cfg)).map_err(|e| FormatError::io(&cfg_path, e))?;
    let shards = layout(&cfg);
    let mut sum = SparseSummary {
        n_shards: shards.len(),
        n_tensors: 0,
        apparent_bytes: 0,
        written_bytes: 0,
        seconds: 0.0,
    };
    for (name, tensors) in &shards {
        let (len, written) = write_shard(&dir.join(name), tensors, seed, fill)?;
        sum.apparent_bytes += len;
        sum.written_bytes += written;
        sum.n_tensors += tensors.len();
    }
    let pairs = shards
        .iter()
        .flat_map(|(f, ts)| ts.iter().map(move |t| (t.name.as_str(), f.as_str())));
    write_index(&dir.join(crate::index::INDEX_FILE), pairs)?;
    sum.seconds = t0.elapsed().as_secs_f64();
    Ok(sum)
}

/// One shard: header, `set_len`, then the filled tensors. Returns (file length, bytes written).
fn write_shard(
    path: &Path,
    tensors: &[TensorSpec],
    seed: u64,
    fill: bool,
) -> Result<(u64, u64), FormatError> {
    let io = |e| FormatError::io(path, e);
    let (f, head_len, len) = create_sparse_shard(path, tensors)?;
    let mut written = head_len;
    let mut off = head_len;
    let mut buf = Vec::new();
    for t in tensors {
        let n = t.nbytes().unwrap_or(0);
        if fill {
            written += fill_tensor(&f, off, t, seed, &mut buf).map_err(io)?;
        }
        off += n;
    }
    Ok((len, written))
}

/// Writes tensor `t` (data at file offset `at`) by its [`fill_of`] rule; returns bytes written.
fn fill_tensor(
    f: &File,
    at: u64,
    t: &TensorSpec,
    seed: u64,
    buf: &mut Vec<u8>,
) -> std::io::Result<u64> {
    let total = t.nbytes().unwrap_or(0);
    let row_bytes = total / t.shape.first().copied().unwrap_or(1).max(1) as u64;
    let (bytes, mut value): (u64, Box<dyn FnMut() -> f32>) = match fill_of(t) {
        Fill::Hole => return Ok(0),
        Fill::Ones => (total, Box::new(|| 1.0)),
        Fill::Random { std, rows } => {
            let mut rng = SplitMix::for_tensor(seed, &t.name);
            let half_width = std * 3f32.sqrt();
            let bytes = total.min(row_bytes.saturating_mul(rows as u64));
            (bytes, Box::new(move || half_width * rng.unit()))
        }
    };
    let elem = t.dtype.size() as u64;
    let mut done = 0u64;
    while done < bytes {
        let step = (bytes - done).min(CHUNK as u64);
        buf.clear();
        for _ in 0..step / elem {
            let v = value();
            match t.dtype {
                Dtype::BF16 => buf.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
                _ => buf.extend_from_slice(&v.to_le_bytes()),
            }
        }
        f.write_all_at(buf, at + done)?;
        done += step;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_the_release() {
        let l = layout(&K3Config::released());
        assert_eq!(l.len(), SHARDS);
        assert_eq!(l.iter().map(|(_, t)| t.len()).sum::<usize>(), TENSORS);
        assert_eq!(l[0].0, "model-00001-of-00096.safetensors");
    }

    #[test]
    fn fill_rules() {
        let t = |n: &str, d: Dtype, s: &[usize]| fill_of(&TensorSpec::new(n, d, s));
        let p = "language_model.model.layers.5.";
        assert_eq!(
            t(&format!("{p}input_layernorm.weight"), Dtype::BF16, &[7168]),
            Fill::Ones
        );
        assert_eq!(
            t(&format!("{p}self_attn.o_norm.weight"), Dtype::F32, &[128]),
            Fill::Ones
        );
        assert_eq!(
            t(&format!("{p}self_attn.A_log"), Dtype::F32, &[128]),
            Fill::Hole
        );
        assert!(matches!(
            t(
                &format!("{p}block_sparse_moe.gate.weight"),
                Dtype::BF16,
                &[896, 7168]
            ),
            Fill::Random { .. }
        ));
        assert_eq!(
            t(
                &format!("{p}self_attention_res_proj.weight"),
                Dtype::BF16,
                &[1, 7168]
            ),
            Fill::Hole
        );
    }
}
