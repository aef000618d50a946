//! `cargo xtask <command>`: project automation (conformance, generators, benchmarks).

mod bench_codec;
mod bench_cold;
mod bench_compute;
mod bench_constraint;
mod bench_decode;
mod bench_draft;
mod bench_dspark;
mod bench_dspark_step;
mod bench_layers;
mod bench_lookahead;
mod bench_model_compute;
mod bench_prefill;
mod bench_serve;
mod bench_trunk_overlap;
mod bench_trunk_pack;
mod bench_util;
mod check_docs;
mod check_released;
mod conformance;
mod fuzz;
mod gen_bench;
mod gen_dspark;
mod gen_released;
mod pack_trunk;
mod predict_dist;
mod predict_dspark;
mod serve_client;
mod serve_process;
mod sim_cache;

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
        /// Directory holding the upstream fixtures (default: the repository's
        /// `fixtures/upstream`).
        #[arg(long)]
        upstream: Option<PathBuf>,
        /// Numeric mode to run every check in: v2, fast, amx-bf16x2 or amx-bf16x1
        /// (docs/NUMERICS.md#numeric-mode-fast); also prints the tiny models' figures in it.
        #[arg(long, value_name = "MODE", value_parser = conformance::parse_numerics)]
        numerics: Option<k3_kernels::fast::Numerics>,
    },
    /// Replay a recorded expert trace through every cache policy at a ladder of capacities.
    SimCache {
        /// Trace file (8-byte records: u32 layer, u32 expert, little-endian).
        trace: PathBuf,
        /// Capacities in experts, comma-separated (default: a ladder plus the presets).
        #[arg(long, value_delimiter = ',')]
        capacities: Vec<usize>,
        /// Policies, comma-separated (default: all; lru, lfu, lfu:HALF_LIFE, arc, layer-lru, opt).
        #[arg(long, value_delimiter = ',')]
        policies: Vec<k3_plan::PolicyKind>,
        /// Experts per token per layer.
        #[arg(long, default_value_t = 16)]
        top_k: usize,
    },
    /// Mutation-fuzz one input parser (safetensors, config, tiktoken, session, serve).
    Fuzz(fuzz::FuzzArgs),
    /// Next-layer router lookahead on vs off (trunk pinned, small expert cache), same run.
    BenchLookahead(bench_lookahead::BenchLookaheadArgs),
    /// Structured output: constraint mask µs per token (json_object, bounded json_schema,
    /// tool call) on a ~200k-id vocabulary.
    BenchConstraint(bench_constraint::BenchConstraintArgs),
    /// Plain vs n-gram vs hybrid drafting (draft trunks), streaming and resident.
    BenchDraft(bench_draft::BenchDraftArgs),
    /// Plain vs DSpark block drafts at controlled acceptance, streaming, same run.
    BenchDspark(bench_dspark::BenchDsparkArgs),
    /// One DSpark block pass at the published dims, layer by layer with random weights:
    /// bytes (bf16, q8, mxfp4) and ms (docs/PERFORMANCE.md#dspark-block-drafts).
    BenchDsparkStep(bench_dspark_step::BenchDsparkStepArgs),
    /// Greedy decode s/token at four budgets vs the I/O and compute floors, same run.
    BenchDecode(bench_decode::BenchDecodeArgs),
    /// f32 FMA peak and DRAM bandwidth, and every hot kernel as a share of them, same run.
    BenchCompute(bench_compute::BenchComputeArgs),
    /// KDA / MLA / MoE / dense layer 0 at real dims: ms per decode token and prefill chunk.
    BenchLayers(bench_layers::BenchLayersArgs),
    /// Expert bytes per prompt token: one-pass (chunk-union) prefill vs token by token.
    BenchPrefill(bench_prefill::BenchPrefillArgs),
    /// The released geometry at full size as a sparse checkpoint: plan every preset, run one
    /// laptop-preset token, check peak RSS ≤ 8 GiB and the forecast within 5 %.
    CheckReleased(check_released::CheckReleasedArgs),
    /// Trunk compression: exponent entropy per tensor class; zstd vs k3's Huffman codec,
    /// ratio and decode GB/s at 1 and 2 threads (docs/PERFORMANCE.md#trunk-compression).
    BenchCodec(bench_codec::BenchCodecArgs),
    /// Plain vs compressed packed trunk at the smallest budget: s/token, bytes read and
    /// decoded per token, same run, ids checked (docs/PERFORMANCE.md#trunk-compression).
    BenchTrunkPack(bench_trunk_pack::BenchTrunkPackArgs),
    /// Write a synthetic benchmark checkpoint (real per-layer dims, or --mid) into OUT_DIR.
    GenBench(gen_bench::GenBenchArgs),
    /// A DSpark draft with random weights matched to a target checkpoint (docs/DSPARK.md).
    GenDspark(gen_dspark::GenDsparkArgs),
    /// Kimi K3 as released with the published DSpark draft: bytes and s/token at an
    /// acceptance length, from the block drafter's cost model (docs/STREAMING.md).
    PredictDspark(predict_dspark::PredictDsparkArgs),
    /// Kimi K3 as released over N machines: predicted decode s/token per preset and network.
    PredictDist(predict_dist::PredictDistArgs),
    /// `k3 serve` on 127.0.0.1 under C concurrent clients vs the same requests one at a time:
    /// tokens/s, latency, 429s, bytes per token, every request's ids checked.
    BenchServe(bench_serve::BenchServeArgs),
    /// Check that every `docs/<NAME>.md#<anchor>` citation points at an existing heading, and
    /// that nothing cites the old outside spec or a path outside the repository.
    CheckDocs,
    /// Copy every layer's trunk run into OUT_DIR/trunk.bin + trunk.json (docs/FORMATS.md):
    /// k3-format's packer, as `k3 pack` runs it, for scripts that build a bench model.
    PackTrunk {
        /// Checkpoint directory (config.json + safetensors shards).
        model_dir: PathBuf,
        /// Output directory for trunk.bin and trunk.json.
        out_dir: PathBuf,
        /// Replace a pack already in OUT_DIR.
        #[arg(long)]
        overwrite: bool,
        /// Re-read trunk.bin afterwards and check every layer's checksum.
        #[arg(long)]
        verify: bool,
        /// Write a compressed pack (docs/FORMATS.md#compressed-trunk), as `k3 pack --compress`.
        #[arg(long)]
        compress: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Conformance { upstream, numerics } => conformance::run(
            &upstream.unwrap_or_else(|| fuzz::workspace_root().join("fixtures/upstream")),
            numerics,
        ),
        Cmd::SimCache {
            trace,
            capacities,
            policies,
            top_k,
        } => sim_cache::run(&sim_cache::Options {
            trace: &trace,
            capacities: &capacities,
            policies: &policies,
            top_k,
        }),
        Cmd::Fuzz(args) => fuzz::run(&args),
        Cmd::BenchLookahead(args) => bench_lookahead::run(&args),
        Cmd::BenchConstraint(args) => bench_constraint::run(&args),
        Cmd::BenchDraft(args) => bench_draft::run(&args),
        Cmd::BenchDspark(args) => bench_dspark::run(&args),
        Cmd::BenchDsparkStep(args) => bench_dspark_step::run(&args),
        Cmd::BenchDecode(args) => bench_decode::run(&args),
        Cmd::BenchCompute(args) => bench_compute::run(&args),
        Cmd::BenchLayers(args) => bench_layers::run(&args),
        Cmd::BenchPrefill(args) => bench_prefill::run(&args),
        Cmd::GenBench(args) => gen_bench::run(&args),
        Cmd::GenDspark(args) => gen_dspark::run(&args),
        Cmd::PredictDspark(args) => predict_dspark::run(&args),
        Cmd::BenchCodec(args) => bench_codec::run(&args),
        Cmd::BenchTrunkPack(args) => bench_trunk_pack::run(&args),
        Cmd::CheckReleased(args) => check_released::run(&args),
        Cmd::BenchServe(args) => bench_serve::run(&args),
        Cmd::PredictDist(args) => predict_dist::run(&args),
        Cmd::CheckDocs => check_docs::run(&fuzz::workspace_root()),
        Cmd::PackTrunk {
            model_dir,
            out_dir,
            overwrite,
            verify,
            compress,
        } => pack_trunk::run(&pack_trunk::Options {
            model_dir: &model_dir,
            out_dir: &out_dir,
            overwrite,
            verify,
            compress,
        }),
    }
}
