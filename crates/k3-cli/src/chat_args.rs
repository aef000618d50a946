//! `k3 chat`'s flags, their defaults over the config file, and the chat that `k3 run MODEL`
//! opens when it is given no prompt on a terminal.
//!
//! Defaults chosen for the released model on a CPU (tens of seconds per token, README
//! "Chat"): thinking effort `low` (`max` can think for hours before the first visible word),
//! the thinking shown dimmed on a terminal (`--hide-thinking` hides it), a status line on
//! stderr while the turn is prefilled or the thinking is hidden, and `-n 512`.

use crate::engine_args::EngineArgs;
use crate::sampling_args::SamplingArgs;
use clap::Args;
use k3_engine::config_file::FileConfig;

/// `k3 chat`'s thinking effort when `--thinking` is not given.
pub const DEFAULT_THINKING: &str = "low";
/// Most tokens of one reply when neither `-n` nor the config file's `n` is given.
pub const DEFAULT_MAX_NEW: usize = 512;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  k3 chat fixtures/tiny-k3 --thinking off -n 64\n  k3 chat fixtures/tiny-k3 --tools tools.json --tool-choice required\n  k3 chat -m /models/kimi-k3 --preset desktop -sys 'Be brief.' --temp 0.7 -c 8192"
)]
pub struct ChatArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub model: crate::engine_args::ModelArgs,
    /// System message (kept by /reset; llama.cpp's -sys works too).
    #[arg(long, allow_hyphen_values = true)]
    pub system: Option<String>,
    /// Thinking effort: off, low (the default), high or max.
    #[arg(long, default_value = DEFAULT_THINKING)]
    pub thinking: String,
    /// Print the think channel even when stdout is not a terminal (on a terminal it is shown
    /// dimmed by default).
    #[arg(long, conflicts_with = "hide_thinking")]
    pub show_thinking: bool,
    /// Do not print the think channel (a status line on stderr counts its tokens instead).
    #[arg(long)]
    pub hide_thinking: bool,
    /// Most tokens one reply may generate (default 512, or `n` from the config file; it must
    /// fit in -c/--ctx).
    #[arg(short = 'n', long = "max-new", visible_aliases = ["max-tokens", "n-predict"])]
    pub max_new: Option<usize>,
    /// Context positions for the whole conversation (default 4096, or `ctx` from the config
    /// file, or the model's trained context when smaller; past it only when given).
    #[arg(short = 'c', long, visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// History file for line editing on a terminal (default
    /// $XDG_STATE_HOME/k3/chat_history or ~/.local/state/k3/chat_history).
    #[arg(long, value_name = "FILE", conflicts_with = "no_history")]
    pub history: Option<std::path::PathBuf>,
    /// Keep no history file (history still works within the chat).
    #[arg(long)]
    pub no_history: bool,
    /// Tools the model may call: a JSON file holding an array of OpenAI tools
    /// (`{"type":"function","function":{name,description,parameters}}`) or bare
    /// `{name,description,parameters}` objects. Calls are shown, never executed; answer
    /// them with /tool RESULT.
    #[arg(long, value_name = "FILE")]
    pub tools: Option<std::path::PathBuf>,
    /// Make each reply to a user message call a tool: `required` (any declared tool) or a
    /// tool's NAME; `auto` (the default) leaves it to the model. Thinking stays free; the
    /// reply after /tool results is never forced.
    #[arg(long, value_name = "auto|required|NAME", requires = "tools")]
    pub tool_choice: Option<String>,
    /// Most tokens of the think channel per reply; at the limit the chat closes the think
    /// channel itself and the reply goes on in the response (default: no limit).
    #[arg(long, value_name = "N", visible_alias = "reasoning-budget")]
    pub think_budget: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

impl ChatArgs {
    /// The chat `k3 run MODEL` opens without a prompt: run's engine, sampling, `-n` and `-c`
    /// flags carried over, chat's defaults for the rest.
    pub fn from_run(run: crate::run_args::RunArgs) -> ChatArgs {
        let (model_dir, model) = (run.model_dir, run.model);
        ChatArgs {
            engine: run.engine,
            model: crate::engine_args::ModelArgs { model_dir, model },
            system: None,
            thinking: DEFAULT_THINKING.into(),
            show_thinking: false,
            hide_thinking: false,
            max_new: run.gen_flag,
            ctx: run.ctx,
            history: None,
            no_history: false,
            tools: None,
            tool_choice: None,
            think_budget: None,
            sampling: run.sampling,
        }
    }

    /// `-n` over the config file's `n` over the default.
    pub fn max_new(&self, file: &FileConfig) -> usize {
        self.max_new.or(file.n).unwrap_or(DEFAULT_MAX_NEW)
    }

    /// Whether the think channel is printed: on a terminal unless `--hide-thinking`, and
    /// anywhere with `--show-thinking`.
    pub fn shows_thinking(&self, stdout_tty: bool) -> bool {
        self.show_thinking || (stdout_tty && !self.hide_thinking)
    }
}
