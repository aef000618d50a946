//! DSpark draft checkpoints (docs/DSPARK.md): `config.json` + safetensors, every tensor bound
//! by its published name and checked before anything runs.
//!
//! [`DsparkCheckpoint::open`] refuses, naming the file and the key or tensor: a config that
//! does not match the target (hidden size, vocabulary, layer count, a tapped layer out of
//! range), a missing or unexpected tensor, a wrong shape or dtype. The shipped
//! `embed_tokens.weight` copy is optional and ignored (the target's embedding is used).

mod config;
mod rope;

pub use config::{config_path, DraftAct, DsparkConfig, TapStream, MAX_BLOCK};
pub use rope::{DraftRope, Yarn};

use crate::{Checkpoint, Dtype, FormatError, K3Config, TensorView};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why a DSpark checkpoint was refused.
#[derive(Debug, thiserror::Error)]
pub enum DsparkError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A config.json key is missing, malformed or unsupported.
    #[error("{file}: key `{key}`: {detail}")]
    Config {
        /// The config file.
        file: PathBuf,
        /// The key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// The draft was made for another target.
    #[error("{file}: key `{key}` is {draft} but the target's {what} is {target}: this draft was made for another model")]
    Target {
        /// The config file.
        file: PathBuf,
        /// The key.
        key: String,
        /// The draft's value.
        draft: usize,
        /// The target's value.
        target: usize,
        /// What is compared.
        what: String,
    },
    /// A value that indexes the target (a layer, a token id) lies past it.
    #[error("{file}: key `{key}` holds {value}, out of range: the target has {limit} {what}")]
    OutOfRange {
        /// The config file.
        file: PathBuf,
        /// The key.
        key: String,
        /// The offending value.
        value: usize,
        /// The target's count.
        limit: usize,
        /// What is counted.
        what: String,
    },
    /// A published tensor is absent.
    #[error(
        "{dir}: tensor `{tensor}` is missing: not a complete DSpark checkpoint for this config"
    )]
    Missing {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The tensor name.
        tensor: String,
    },
    /// A tensor that the config does not call for.
    #[error(
        "{file}: unexpected tensor `{tensor}`: not part of a DSpark checkpoint with this config"
    )]
    Extra {
        /// The shard holding it.
        file: PathBuf,
        /// The tensor name.
        tensor: String,
    },
    /// A tensor of the wrong shape.
    #[error("{file}: tensor `{tensor}` has shape {got:?}, expected {want:?} from config.json")]
    Shape {
        /// The shard holding it.
        file: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Its shape.
        got: Vec<usize>,
        /// The expected shape.
        want: Vec<usize>,
    },
    /// A tensor of the wrong element type.
    #[error("{file}: tensor `{tensor}` is {got}, expected {want}")]
    Dtype {
        /// The shard holding it.
        file: PathBuf,
        /// The tensor name.
        tensor: String,
        /// Its dtype.
        got: &'static str,
        /// The accepted dtype(s).
        want: &'static str,
    },
    /// The safetensors files themselves are damaged.
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// The suffixes under `layers.{i}.` and their shapes.
fn layer_tensors(c: &DsparkConfig) -> [(&'static str, Vec<usize>); 12] {
    let (e, h) = (c.hidden_size, c.num_attention_heads);
    let qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    [
        ("input_layernorm.weight", vec![e]),
        ("post_attention_layernorm.weight", vec![e]),
        ("self_attn.q_a_proj.weight", vec![c.q_lora_rank, e]),
        ("self_attn.q_a_layernorm.weight", vec![c.q_lora_rank]),
        ("self_attn.q_b_proj.weight", vec![h * qk, c.q_lora_rank]),
        ("self_attn.kv_a_proj_with_mqa.weight", vec![c.kv_width(), e]),
        ("self_attn.kv_a_layernorm.weight", vec![c.kv_lora_rank]),
        (
            "self_attn.kv_b_proj.weight",
            vec![h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank],
        ),
        ("self_attn.o_proj.weight", vec![e, h * c.v_head_dim]),
        ("mlp.gate_proj.weight", vec![c.intermediate_size, e]),
        ("mlp.up_proj.weight", vec![c.intermediate_size, e]),
        ("mlp.down_proj.weight", vec![e, c.intermediate_size]),
    ]
}

/// Accepted dtypes of a tensor: the confidence head is float32 in vLLM, everything else BF16.
fn accepted(name: &str) -> (&'static [Dtype], &'static str) {
    if name.starts_with("confidence_head.") {
        (&[Dtype::F32, Dtype::BF16], "F32 or BF16")
    } else {
        (&[Dtype::BF16], "BF16")
    }
}

/// Every published tensor name of a checkpoint with config `c`, with its shape.
pub fn expected_tensors(c: &DsparkConfig) -> BTreeMap<String, Vec<usize>> {
    let e = c.hidden_size;
    let mut m = BTreeMap::new();
    m.insert(
        "context_proj.weight".into(),
        vec![e, c.target_layer_ids.len() * e],
    );
    m.insert("context_norm.weight".into(), vec![e]);
    if c.fc_norm {
        for i in 0..c.target_layer_ids.len() {
            m.insert(format!("fc_norm.{i}.weight"), vec![e]);
        }
    }
    for i in 0..c.num_hidden_layers {
        for (suffix, shape) in layer_tensors(c) {
            m.insert(format!("layers.{i}.{suffix}"), shape);
        }
    }
    m.insert("final_norm.weight".into(), vec![e]);
    m.insert(
        "markov_head.markov_w1.weight".into(),
        vec![c.vocab_size, c.markov_rank],
    );
    m.insert(
        "markov_head.markov_w2.weight".into(),
        vec![c.vocab_size, c.markov_rank],
    );
    if c.confidence_head {
        let width = e + if c.confidence_with_markov {
            c.markov_rank
        } else {
            0
        };
        m.insert("confidence_head.proj.weight".into(), vec![1, width]);
        m.insert("confidence_head.proj.bias".into(), vec![1]);
    }
    m
}

/// Optional tensors that are read past and never used.
const IGNORED: &[&str] = &["embed_tokens.weight"];

/// An opened, fully checked DSpark checkpoint.
pub struct DsparkCheckpoint {
    config: DsparkConfig,
    checkpoint: Checkpoint,
}

impl DsparkCheckpoint {
    /// Opens the draft in `dir` for the target whose config is `target`; refuses before
    /// anything runs (see the module docs).
    pub fn open(dir: &Path, target: &K3Config) -> Result<DsparkCheckpoint, DsparkError> {
        let config = DsparkConfig::load(&config_path(dir), target)?;
        let checkpoint = Checkpoint::open(dir)?;
        let expected = expected_tensors(&config);
        for view in checkpoint.iter() {
            let file = view.shard_path.to_path_buf();
            let tensor = view.name.to_string();
            if IGNORED.contains(&view.name) {
                continue;
            }
            let Some(want) = expected.get(view.name) else {
                return Err(DsparkError::Extra { file, tensor });
            };
            let (dtypes, names) = accepted(view.name);
            if !dtypes.contains(&view.dtype) {
                let got = view.dtype.name();
                return Err(DsparkError::Dtype {
                    file,
                    tensor,
                    got,
                    want: names,
                });
            }
            if view.shape != want.as_slice() {
                let got = view.shape.to_vec();
                return Err(DsparkError::Shape {
                    file,
                    tensor,
                    got,
                    want: want.clone(),
                });
            }
        }
        if let Some(name) = expected.keys().find(|n| !checkpoint.contains(n)) {
            return Err(DsparkError::Missing {
                dir: dir.to_path_buf(),
                tensor: name.clone(),
            });
        }
        Ok(DsparkCheckpoint { config, checkpoint })
    }

    /// The checked config.
    pub fn config(&self) -> &DsparkConfig {
        &self.config
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        self.checkpoint.dir()
    }

    /// A bound tensor (every published name of [`expected_tensors`] is present, checked).
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, FormatError> {
        self.checkpoint.tensor(name)
    }

    /// Bytes of the tensors the draft uses (the ignored `embed_tokens` copy left out).
    pub fn weight_bytes(&self) -> u64 {
        self.checkpoint
            .iter()
            .filter(|v| !IGNORED.contains(&v.name))
            .map(|v| v.nbytes())
            .sum()
    }
}
