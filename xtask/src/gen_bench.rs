//! `cargo xtask gen-bench OUT_DIR [--mid] [--layers N] [--experts E] [--vocab V] [--seed S]
//! [--hidden H] [--shard-gb G] [--trained-weights] [--dry-run]` (or `--released-sparse OUT_DIR`: the full released
//! geometry as sparse files, `crate::gen_released`): write a synthetic benchmark checkpoint in the
//! released format (k3_format::synth; docs/PERFORMANCE.md "Benchmark models").
//!
//! Default (`--real-dims`): the released per-layer dimensions (hidden 7168, KDA 96×128, MLA 96
//! heads, latent 3584, 17,547,264-byte experts, dense layer 0 with inter 33,792, top-16) with
//! 5 layers (KDA, KDA, KDA, MLA, MLA: the released map scaled down, last two MLA), 32 experts
//! per MoE layer and vocab 32,768: ≈ 9.7 GB. `--mid`: the smaller-width shape used by the
//! peak-RSS test (hidden 1024, 8 layers, 64 experts, top-4, vocab 16,384): ≈ 0.37 GB.

use clap::Args;
use k3_format::synth::{self, SynthSpec};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `gen-bench`.
#[derive(Args, Debug)]
pub struct GenBenchArgs {
    /// Output directory (created; files of the same names are replaced).
    pub out_dir: PathBuf,
    /// Smaller widths (hidden 1024, …): a few-hundred-MB model.
    #[arg(long, conflicts_with = "real_dims")]
    pub mid: bool,
    /// The released per-layer dimensions (the default).
    #[arg(long)]
    pub real_dims: bool,
    /// The whole released geometry (93 layers, 896 experts, vocab 163,840, 96 shards,
    /// 497,220 tensors, 1.56 TB apparent) as sparse files with a tokenizer; only routers,
    /// norm gains and 16,384 embedding / head rows are written (a few GB on disk).
    #[arg(long, conflicts_with_all = ["mid", "real_dims", "layers", "experts", "vocab", "hidden", "dry_run"])]
    pub released_sparse: bool,
    /// Decoder layers (default 5 real-dims, 8 mid).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Routed experts per MoE layer (default 32 real-dims, 64 mid).
    #[arg(long)]
    pub experts: Option<usize>,
    /// Vocabulary rows of embed_tokens and lm_head (default 32768 real-dims, 16384 mid).
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Override the hidden width of the chosen preset.
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Target shard size in GB (10^9 bytes).
    #[arg(long, default_value_t = 2.0)]
    pub shard_gb: f64,
    /// Draw BF16 matrices like trained weights (Gaussian rows, row and tensor scales varying;
    /// `synth::MatrixDist::Trained`) instead of the 256-level uniform table: slower to write,
    /// needed to measure trunk compression (`cargo xtask bench-codec`).
    #[arg(long)]
    pub trained_weights: bool,
    /// Print the layout and size, write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs the subcommand.
pub fn run(args: &GenBenchArgs) -> ExitCode {
    match generate(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gen-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The spec the flags describe.
pub fn spec(args: &GenBenchArgs) -> Result<SynthSpec, String> {
    let (layers, experts, vocab) = if args.mid {
        (8, 64, 16_384)
    } else {
        (5, 32, 32_768)
    };
    let (layers, experts, vocab) = (
        args.layers.unwrap_or(layers),
        args.experts.unwrap_or(experts),
        args.vocab.unwrap_or(vocab),
    );
    if layers < 2 || experts == 0 || vocab == 0 {
        return Err(format!(
            "need at least 2 layers, 1 expert and 1 vocab row (got {layers}, {experts}, {vocab})"
        ));
    }
    let mut cfg = if args.mid {
        synth::mid_config(layers, experts, vocab)
    } else {
        synth::real_dims_config(layers, experts, vocab)
    };
    if let Some(h) = args.hidden {
        if h == 0 || h % 2 != 0 {
            return Err(format!("--hidden must be a positive even width, got {h}"));
        }
        cfg.hidden_size = h;
    }
    if !(args.shard_gb.is_finite() && args.shard_gb > 0.0) {
        return Err(format!(
            "--shard-gb must be a positive number, got {}",
            args.shard_gb
        ));
    }
    let mut s = SynthSpec::new(cfg);
    s.seed = args.seed;
    if args.trained_weights {
        s.weights.matrices = synth::MatrixDist::Trained;
    }
    s.shard_bytes = (args.shard_gb * 1e9) as u64;
    Ok(s)
}

fn gb(b: u64) -> f64 {
    b as f64 / 1e9
}

fn generate(args: &GenBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.released_sparse {
        let w = crate::gen_released::write(&args.out_dir, args.seed)?;
        crate::gen_released::print(&args.out_dir, &w);
        return Ok(());
    }
    let spec = spec(args)?;
    let cfg = &spec.config;
    let plan = synth::plan(&spec)?;
    println!("{}", cfg.summary("config.json"));
    let expert_bytes = plan.expert_bytes
        / (cfg.num_hidden_layers - cfg.first_k_dense_replace).max(1) as u64
        / cfg.num_experts as u64;
    println!(
        "checkpoint: {:.3} GB in {} shards = trunk {:.3} GB + experts {:.3} GB ({} × {} B) + embed/head {:.3} GB",
        gb(plan.total_bytes),
        plan.shards.len(),
        gb(plan.trunk_bytes),
        gb(plan.expert_bytes),
        plan.expert_bytes / expert_bytes.max(1),
        expert_bytes,
        gb(plan.global_bytes),
    );
    if args.dry_run {
        return Ok(());
    }
    let t0 = Instant::now();
    let mut last = 0.0f64;
    let sum = synth::write_checkpoint(&args.out_dir, &spec, |p| {
        let t = t0.elapsed().as_secs_f64();
        if t - last >= 1.0 || p.bytes_written == p.total_bytes {
            last = t;
            eprint!(
                "\r  shard {}/{}  {:.2}/{:.2} GB  {:.0} MB/s   ",
                p.shard + 1,
                p.n_shards,
                gb(p.bytes_written),
                gb(p.total_bytes),
                p.bytes_written as f64 / 1e6 / t.max(1e-9)
            );
            let _ = std::io::stderr().flush();
        }
    })?;
    eprintln!();
    println!(
        "wrote {:.3} GB ({} tensors, {} shards) to {} in {:.1} s = {:.0} MB/s",
        gb(sum.total_bytes),
        sum.n_tensors,
        sum.n_shards,
        args.out_dir.display(),
        sum.seconds,
        sum.total_bytes as f64 / 1e6 / sum.seconds.max(1e-9)
    );
    Ok(())
}
