//! Sampling flags shared by `k3 run` and `k3 chat`, merged over the config file's values.

use crate::CliError;
use clap::Args;
use k3_engine::config_file::FileConfig;
use k3_engine::{DecodeMode, DraftPolicy, Engine, SamplingParams, Speculation};

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
    /// How many recent tokens (prompt included) the repeat, presence and frequency penalties
    /// look at (default 64; 0 = off).
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_last_n: Option<usize>,
    /// Subtract P from the logit of every token seen in the last --repeat-last-n, in [-2, 2]
    /// (0 = off, the default; OpenAI's presence_penalty).
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// Subtract F × (times seen in the last --repeat-last-n) from a token's logit, in [-2, 2]
    /// (0 = off, the default; OpenAI's frequency_penalty).
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// Seed of the sampler's random stream (splitmix64; default 0); the same seed gives the
    /// same tokens at every budget and thread count. Unused when --temp is 0.
    #[arg(short = 's', long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Speculative decoding: `auto` (the default: with --draft-trunk, hybrid drafting where
    /// the plan predicts a gain; otherwise prompt-lookup drafts when the trunk streams from
    /// disk, where one pass serves every accepted draft), `hybrid` (always use the
    /// --draft-trunk's draft model), `off`, or N = prompt-lookup drafts of at most N tokens
    /// per pass (1–16). The generated tokens are the same either way.
    #[arg(long, value_name = "auto|hybrid|off|N", value_parser = parse_draft)]
    pub draft: Option<Draft>,
    /// Most DSpark block drafts verified per pass (1–16; default: the draft model's block).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=16))]
    pub draft_max: Option<u16>,
}

/// The `--draft` setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draft {
    Auto,
    Hybrid,
    Off,
    Tokens(usize),
}

fn parse_draft(s: &str) -> Result<Draft, String> {
    match s {
        "auto" => Ok(Draft::Auto),
        "hybrid" => Ok(Draft::Hybrid),
        "off" | "0" => Ok(Draft::Off),
        n => match n.parse::<usize>() {
            Ok(k @ 1..=16) => Ok(Draft::Tokens(k)),
            _ => Err(format!(
                "'{n}' is not auto, hybrid, off or a draft length from 1 to 16"
            )),
        },
    }
}

impl SamplingArgs {
    /// The decode mode `--draft` asks for on `engine`.
    pub fn decode_mode(&self, engine: &Engine) -> DecodeMode {
        match self.draft.unwrap_or(Draft::Auto) {
            Draft::Auto => match engine.auto_decode_mode() {
                DecodeMode::Block(block) => {
                    DecodeMode::Block(self.draft_max.map_or(block, usize::from))
                }
                mode => mode,
            },
            Draft::Hybrid => DecodeMode::Hybrid(Speculation::default()),
            Draft::Off => DecodeMode::Incremental,
            Draft::Tokens(k) => DecodeMode::Speculative(Speculation {
                max_draft: k,
                ..Speculation::default()
            }),
        }
    }
}

impl SamplingArgs {
    /// The drafts a verifying pass is planned for (`EngineOptions::max_drafts`): none with
    /// `--draft off`, N with `--draft N`, `--draft-max` for DSpark blocks, else the
    /// planner's default for the drafter.
    pub fn planned_drafts(&self) -> Option<usize> {
        match self.draft.unwrap_or(Draft::Auto) {
            Draft::Off => Some(0),
            Draft::Tokens(k) => Some(k),
            Draft::Auto => self.draft_max.map(usize::from),
            Draft::Hybrid => None,
        }
    }

    /// Whether the engine loads `--draft-trunk`: `--draft hybrid` always (refused without
    /// one), `auto` where the plan predicts a gain, never with `off` or an n-gram length.
    pub fn draft_policy(
        &self,
        draft_trunk: Option<&std::path::Path>,
    ) -> Result<DraftPolicy, CliError> {
        match (self.draft.unwrap_or(Draft::Auto), draft_trunk) {
            (Draft::Hybrid, None) => Err(CliError::usage(
                "--draft hybrid needs --draft-trunk DIR (make one with `k3 pack --draft-quant q8 MODEL_DIR DIR`)",
            )),
            (Draft::Hybrid, Some(_)) => Ok(DraftPolicy::On),
            (Draft::Auto, _) => Ok(DraftPolicy::Auto),
            (Draft::Off | Draft::Tokens(_), _) => Ok(DraftPolicy::Off),
        }
    }

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
            presence_penalty: self
                .presence_penalty
                .or(file.presence_penalty.map(|v| v as f32))
                .unwrap_or(d.presence_penalty),
            frequency_penalty: self
                .frequency_penalty
                .or(file.frequency_penalty.map(|v| v as f32))
                .unwrap_or(d.frequency_penalty),
            seed: self.seed.or(file.seed).unwrap_or(d.seed),
        };
        params
            .validate()
            .map_err(|e| CliError::usage(e.to_string()))?;
        Ok(params)
    }
}
