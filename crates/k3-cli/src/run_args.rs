//! `k3 run`'s flags (the command itself is `crate::run`).

use crate::engine_args::EngineArgs;
use crate::sampling_args::SamplingArgs;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args)]
#[command(group(clap::ArgGroup::new("prompt_source").multiple(false).args(["ids", "prompt", "prompt_file"])))]
#[command(
    after_help = "Examples:\n  k3 run fixtures/tiny-k3 'The train left at' -n 16\n  k3 run -m fixtures/tiny-k3 -p 'Hello' -n 4 -t 2 -c 64\n  echo 'Hello' | k3 run fixtures/tiny-k3 -f -\n  k3 run fixtures/tiny-k3 --ids 637,229,263 -n 16 --mem-gb 0.005 --json out.json --print-ids\n  k3 run fixtures/tiny-k3 -p 'Hello' --temp 0.8 --top-p 0.95 --seed 7 --stop '.'\n  k3 run fixtures/tiny-k3 --ids 1,2,3 -n 4 --save-session s.k3ss && k3 run fixtures/tiny-k3 --load-session s.k3ss --ids 4 -n 4"
)]
pub struct RunArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Model directory (config.json + *.safetensors [+ tiktoken.model]); or -m DIR; default:
    /// `model` from the config file (`k3 config path`).
    #[arg(value_name = "MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// Prompt text, as with -p (with -m DIR, the first positional is the prompt).
    #[arg(value_name = "PROMPT")]
    pub prompt_pos: Option<String>,
    /// Model directory (instead of the positional MODEL_DIR).
    #[arg(short = 'm', long = "model", value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Prompt as raw token ids, comma-separated (the reproducible channel).
    #[arg(long)]
    pub ids: Option<String>,
    /// Prompt text (needs a tokenizer in the model directory or --tok).
    #[arg(short = 'p', long, allow_hyphen_values = true)]
    pub prompt: Option<String>,
    /// Prompt read verbatim from a file, `-` for stdin (needs a tokenizer).
    #[arg(short = 'f', long, visible_alias = "file", value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// Let control-token text in the prompt (e.g. `<|im_end|>`) become control tokens.
    #[arg(long)]
    pub allow_special: bool,
    /// Tokens to generate at most (default 16, or `n` from the config file; prompt + N must
    /// fit in -c/--ctx and the model's trained context).
    #[arg(
        short = 'n',
        long = "gen",
        visible_aliases = ["max-tokens", "n-predict"],
        value_name = "GEN",
        allow_negative_numbers = true
    )]
    pub gen_flag: Option<usize>,
    /// `-n` resolved over the config file.
    #[arg(skip)]
    pub gen: usize,
    /// Process escapes in the prompt (-p or the positional PROMPT): \n \r \t \\ \' \"
    /// and \xNN (llama.cpp's -e).
    #[arg(short = 'e', long)]
    pub escape: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop when the generated text contains TEXT (repeatable; not printed). Needs a tokenizer.
    #[arg(
        short = 'r',
        long = "stop",
        visible_alias = "reverse-prompt",
        value_name = "TEXT",
        allow_hyphen_values = true
    )]
    pub stop: Vec<String>,
    /// Structured output: render the prompt as a chat user message (thinking off) and
    /// constrain the reply to one JSON value valid for the JSON Schema in FILE; stdout is the
    /// JSON. Bound strings and arrays (maxLength, maxItems) so it finishes within -n.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// Structured output: as --json-schema, for any JSON object.
    #[arg(long)]
    pub json_object: bool,
    /// Keep generating past the model's end ids (EOS, <|end_of_msg|>).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Re-run the whole sequence every step instead of carrying state (for testing).
    #[arg(long)]
    pub recompute: bool,
    /// Context positions to allocate (default: prompt + -n; 4096 with --load-session; `ctx`
    /// from the config file). Past the model's trained context only when given explicitly.
    #[arg(short = 'c', long, visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// Write a JSON report (prompt_ids, generated_ids, seconds_per_token, peak_rss_bytes…);
    /// `-` writes it to stdout instead of the streamed text (the text is in the report).
    #[arg(long, allow_hyphen_values = true)]
    pub json: Option<PathBuf>,
    /// Also print `generated ids: 1,2,3` on stderr after the text (even with -q).
    #[arg(long)]
    pub print_ids: bool,
    /// Write the logits at the last prompt position as raw little-endian f32.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
    /// Print only the generated text (no plan, statistics or I/O report on stderr).
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// One line per generated token on stderr (time; bytes read and hit rates when streaming),
    /// held until the text ends when stdout and stderr are the same terminal.
    #[arg(short, long)]
    pub verbose: bool,
    /// Resume a conversation saved with --save-session: its tokens are not prefilled again;
    /// the prompt continues it.
    #[arg(long)]
    pub load_session: Option<PathBuf>,
    /// Save the conversation (tokens, KDA state, latent KV) after generating, for
    /// --load-session (versioned, fingerprinted, checksummed, atomic).
    #[arg(long)]
    pub save_session: Option<PathBuf>,
    /// Record routed-expert requests to DIR/expert_trace.bin (u32 LE layer, u32 LE expert per
    /// request; the layout of upstream's trace). Needs a budget flag.
    #[arg(long)]
    pub dump_cache_trace: Option<PathBuf>,
}

/// `--json -`: the report goes to stdout in place of the streamed text.
pub fn json_to_stdout(args: &RunArgs) -> bool {
    args.json.as_deref() == Some(Path::new("-"))
}
