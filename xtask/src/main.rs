//! `cargo xtask <command>`: project automation (conformance, generators, benchmarks).

mod conformance;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "xtask", about = "k3 project automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run every Rust-side check against the upstream fixtures and the tiny models.
    Conformance {
        /// Directory holding the upstream fixtures.
        #[arg(long, default_value = "../shared/fixtures/upstream")]
        upstream: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Conformance { upstream } => conformance::run(&upstream),
    }
}
