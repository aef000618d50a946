//! What a synthetic checkpoint is made of: the model config, the seed, the shard size and
//! the weight magnitudes. A leaf below the planner, the writer and the fillers.

use crate::config::K3Config;

/// How large the random weights are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WeightScale {
    /// Multiplier on the `1 / sqrt(fan_in)` standard deviation of every matrix and expert.
    pub matrix_gain: f32,
    /// Standard deviation of the embedding rows.
    pub embed_std: f32,
    /// Half-width of the uniform jitter of norm gains around 1.
    pub norm_jitter: f32,
    /// How BF16 matrix elements are drawn.
    pub matrices: MatrixDist,
}

/// How BF16 matrix elements are drawn (the spread is `gain / sqrt(fan_in)` either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatrixDist {
    /// Uniform over a 256-level table, one random byte per element: fast, but a value carries
    /// at most 8 bits (exponent ~2.1 of them, a uniform's octave mix), unlike trained weights.
    #[default]
    Table,
    /// Like trained weights: Gaussian elements, each row with its own scale (log-normal,
    /// σ = 0.35 octaves around the tensor's) and each tensor's scale log-normal around the
    /// nominal one (σ = 0.25 octaves), rounded to BF16 (docs/PERFORMANCE.md#trunk-compression).
    Trained,
}

impl Default for WeightScale {
    fn default() -> Self {
        WeightScale {
            matrix_gain: 1.0,
            embed_std: 1.0,
            norm_jitter: 0.1,
            matrices: MatrixDist::Table,
        }
    }
}

/// What to generate: the model config (its `vocab_size` sets the embedding and head rows),
/// the seed, the shard size target and the weight scales.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    /// Model hyper-parameters; written as the nested `config.json`.
    pub config: K3Config,
    /// Seed of every tensor's random stream.
    pub seed: u64,
    /// Target shard file size in bytes; a shard is closed before an item (a global tensor, a
    /// layer's trunk run or one expert) would overflow it, so a single larger item gets a
    /// shard of its own.
    pub shard_bytes: u64,
    /// Weight magnitudes.
    pub weights: WeightScale,
}

impl SynthSpec {
    /// A spec with seed 0, 2 GB shards and the default weight scales.
    pub fn new(config: K3Config) -> SynthSpec {
        SynthSpec {
            config,
            seed: 0,
            shard_bytes: 2_000_000_000,
            weights: WeightScale::default(),
        }
    }

    /// Embedding / head rows (`config.vocab_size`).
    pub fn vocab(&self) -> usize {
        self.config.vocab_size
    }
}
