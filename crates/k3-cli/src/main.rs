//! `k3`: the command-line front end. Thin: parses flags, calls the engine, reports errors once
//! and maps them to the documented exit codes (0 ok, 1 runtime failure, 2 usage/config/refusal,
//! 4 expert load failure ⇒ token ids unsound).

// Untrusted data must never reach an unwrap/expect (docs/RELIABILITY.md); tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod argv;
mod budget;
mod chat_args;
mod chat_input;
mod chat_ranks; // chat over MPI ranks (docs/DISTRIBUTED.md)
mod chat_repl;
mod chat_tools;
mod config_file;
mod context;
mod doctor;
mod download;
mod engine_args;
mod ids;
mod interrupt;
mod mpi_comm; // `--features mpi` (docs/DISTRIBUTED.md)
mod pack;
mod plan_cmd;
mod plan_codec;
mod plan_dspark;
mod plan_ranks;
mod ps;
mod release;
mod run;
mod run_args;
mod run_input;
mod run_output;
mod run_report;
mod run_structured;
mod sampling_args;
mod serve_cmd;
mod status;
mod store_cmd;
mod tokenize;
mod verify_cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "k3",
    version,
    about = "Run Kimi K3 on a CPU, in any memory budget, with the same tokens",
    after_help = "Examples:\n  k3 run fixtures/tiny-k3 --ids 1,2,3 -n 16\n  k3 run fixtures/tiny-k3 --ids 1,2,3 -n 16 --mem-gb 0.005 --json out.json\n  k3 plan fixtures/tiny-k3 --preset laptop\n  k3 presets\n  k3 pack fixtures/tiny-k3 /tmp/tiny-trunk && k3 run fixtures/tiny-k3 --ids 1,2 --mem-gb 0.005 --trunk /tmp/tiny-trunk\n  k3 tokenize fixtures/tiny-k3 --text 'Hello, world'\n  k3 tokenize fixtures/tiny-k3 --decode 341,464"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate tokens from a prompt (greedy by default; --temp/--top-k/--top-p/--min-p to sample).
    Run(run_args::RunArgs),
    /// Chat interactively with the model's chat template (/help inside for commands).
    Chat(chat_repl::ChatArgs),
    /// Print the memory plan for a model and budget without loading any weight.
    Plan(plan_cmd::PlanArgs),
    /// List the memory presets with the RAM and predicted s/token of each.
    Presets(plan_cmd::PresetsArgs),
    /// Copy the trunk into one aligned file (trunk.bin + trunk.json) for `run --trunk`.
    Pack(pack::PackArgs),
    /// Encode text to token ids, decode ids, or export tokenizer.json.
    Tokenize(tokenize::TokenizeArgs),
    /// Check a checkpoint: shard set, sizes, tensors, layout; --deep hashes every byte.
    Verify(verify_cmd::VerifyArgs),
    /// Machine facts, disk bandwidth, and the budget to run a model with.
    Doctor(doctor::DoctorArgs),
    /// Show the config file (~/.config/k3/config.toml) or where it is looked for.
    Config(config_file::ConfigArgs),
    /// Serve an OpenAI-compatible HTTP API (chat, completions, SSE) on 127.0.0.1.
    Serve(serve_cmd::ServeArgs),
    /// Download a model from the Hugging Face hub (resumable, hash-checked), then verify it.
    Download(download::DownloadArgs),
    // The model store (docs/MODELS.md): every MODEL_DIR above also takes a stored NAME.
    /// Download, verify and pack a hub model into the local store, as NAME.
    Pull(store_cmd::PullArgs),
    /// List the models in the local store.
    List(store_cmd::ListArgs),
    /// Show a stored model: where it is, where it came from, its config, how to run it.
    Show(store_cmd::ShowArgs),
    /// Remove a model from the local store.
    Rm(store_cmd::RmArgs),
    /// List the running `k3 serve` processes: pid, port, model, memory, plan.
    Ps(ps::PsArgs),
}

/// An error already formatted for the user, with its exit code.
pub struct CliError {
    pub code: u8,
    pub message: String,
}

impl CliError {
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            code: k3_engine::EXIT_USAGE,
            message: message.into(),
        }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        CliError {
            code: k3_engine::EXIT_RUNTIME,
            message: message.into(),
        }
    }
}

impl From<k3_hub::HubError> for CliError {
    fn from(e: k3_hub::HubError) -> Self {
        match e {
            k3_hub::HubError::Refused(m) => CliError::usage(m),
            k3_hub::HubError::Failed(m) => CliError::runtime(m),
        }
    }
}

impl From<k3_engine::EngineError> for CliError {
    fn from(e: k3_engine::EngineError) -> Self {
        let mut message = e.to_string();
        if e.exit_code() == k3_engine::EXIT_EXPERT {
            message.push_str("\nk3: a routed expert failed to load: the token ids are unsound");
        }
        CliError {
            code: e.exit_code(),
            message,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(argv::normalise(std::env::args_os()));
    // One rank of an MPI job under `--features mpi` + mpirun (docs/DISTRIBUTED.md).
    let (group, _mpi) = match mpi_comm::start() {
        Ok(started) => started,
        Err(e) => {
            eprintln!("k3: error: {}", e.message);
            return ExitCode::from(e.code);
        }
    };
    let result = match cli.cmd {
        Command::Run(args) => run::run(args, &group),
        Command::Chat(args) => chat_repl::chat(args, &group),
        Command::Plan(args) => plan_cmd::plan(args),
        Command::Presets(args) => plan_cmd::presets(args),
        Command::Pack(args) => pack::pack(args),
        Command::Tokenize(args) => tokenize::tokenize(args),
        Command::Verify(args) => verify_cmd::verify(args),
        Command::Doctor(args) => doctor::doctor(args),
        Command::Config(args) => config_file::config(args),
        Command::Serve(args) => serve_cmd::serve(args, group.comm()),
        Command::Download(args) => download::download(args),
        Command::Pull(args) => store_cmd::pull(args),
        Command::List(args) => store_cmd::list(args),
        Command::Show(args) => store_cmd::show(args),
        Command::Rm(args) => store_cmd::rm(args),
        Command::Ps(args) => ps::ps(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("k3: error: {}{}", group.rank_prefix(), e.message);
            group.end(e.code); // a failing rank ends every rank, no hang
            ExitCode::from(e.code)
        }
    }
}
