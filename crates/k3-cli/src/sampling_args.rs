//! Sampling flags shared by `k3 run` and `k3 chat`, merged over the config file's values.

use crate::config_file::FileConfig;
use crate::CliError;
use clap::Args;
use k3_engine::SamplingParams;

#[derive(Args, Clone, Debug, Default)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy (argmax, ties → lowest id), the default.
    #[arg(long = "temp", allow_negative_numbers = true)]
    pub temp: Option<f32>,
    /// Keep only the K most probable tokens (0 = off, the default).
    #[arg(long, allow_negative_numbers = true)]
    pub top_k: Option<usize>,
    /// Nucleus sampling: keep the smallest set of most probable tokens reaching P, in (0, 1]
    /// (1 = off, the default).
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Drop tokens less probable than P × the most probable one, in [0, 1] (0 = off, the default).
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Penalise tokens seen in the last --repeat-last-n (> 0; 1 = off, the default; applies to
    /// greedy too).
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
    /// How many recent tokens (prompt included) the repeat penalty looks at (default 64; 0 = off).
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_last_n: Option<usize>,
    /// Seed of the sampler's random stream (splitmix64; default 0); the same seed gives the
    /// same tokens at every budget and thread count. Unused when --temp is 0.
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// Flags over the config file over the defaults, validated (errors name the flag).
    pub fn params(&self, file: &FileConfig) -> Result<SamplingParams, CliError> {
        let d = SamplingParams::default();
        let params = SamplingParams {
            temperature: self
                .temp
                .or(file.temp.map(|v| v as f32))
                .unwrap_or(d.temperature),
            top_k: self.top_k.or(file.top_k).unwrap_or(d.top_k),
            top_p: self
                .top_p
                .or(file.top_p.map(|v| v as f32))
                .unwrap_or(d.top_p),
            min_p: self
                .min_p
                .or(file.min_p.map(|v| v as f32))
                .unwrap_or(d.min_p),
            repeat_penalty: self
                .repeat_penalty
                .or(file.repeat_penalty.map(|v| v as f32))
                .unwrap_or(d.repeat_penalty),
            repeat_last_n: self.repeat_last_n.unwrap_or(d.repeat_last_n),
            seed: self.seed.or(file.seed).unwrap_or(d.seed),
        };
        params
            .validate()
            .map_err(|e| CliError::usage(e.to_string()))?;
        Ok(params)
    }
}
