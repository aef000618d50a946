//! `k3 plan` (the memory forecast, reading no weights) and `k3 presets` (every preset's RAM
//! and I/O-floor speed).

use crate::budget::BudgetArgs;
use crate::CliError;
use clap::Args;
use k3_engine::planning::{choose_draft, forecast, forecast_pack, model_sizes};
use k3_engine::{Budget, Preset};
use k3_plan::plan::{fmt_bytes, plan as make_plan};
use k3_plan::PlanRequest;
use std::path::PathBuf;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  k3 plan --preset desktop --sessions 8   # Kimi K3 as released, before downloading\n  k3 plan fixtures/tiny-k3 --mem-gb 0.005\n  k3 plan /models/kimi-k3 --preset desktop --ctx 8192\n  k3 plan /models/kimi-k3 --mem-gb 32 --sessions 8   # k3 serve --parallel 4\n  k3 plan --ranks 4 --preset desktop   # each of 4 MPI ranks, desktop budget each"
)]
pub struct PlanArgs {
    /// Model directory or stored NAME (default: Kimi K3 as released, from its tensor shapes:
    /// a plan before downloading it).
    pub model_dir: Option<PathBuf>,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Context positions to reserve latent KV for.
    #[arg(short = 'c', long, visible_alias = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Sessions whose state to reserve: 1 for run/chat; `k3 serve` reserves `--parallel`
    /// plus 4 saved sessions (0 saved with `--no-reuse`).
    #[arg(long, default_value_t = 1)]
    pub sessions: usize,
    /// Also plan this draft trunk (`k3 pack --draft-quant`) for hybrid drafting: shows the
    /// split, the trunk streamed per pass with and without it, and what `--draft auto` picks.
    #[arg(long, value_name = "DIR")]
    pub draft_trunk: Option<PathBuf>,
    /// Also plan this DSpark draft model (docs/DSPARK.md; alias -md): its weights and context
    /// KV in memory, and the bytes read per generated token at acceptance lengths 1–7.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["draft_trunk", "ranks"])]
    pub draft_model: Option<PathBuf>,
    /// Plan each of N MPI ranks (docs/DISTRIBUTED.md#memory-per-rank): the budget is per
    /// rank; prints every rank's RAM, trunk and expert bytes read per token, and the
    /// collectives and bytes the ranks exchange per token.
    #[arg(long, value_name = "N")]
    pub ranks: Option<usize>,
    /// Print JSON instead of the table (each rank's with --ranks; else the plan's totals and
    /// the trunk compression forecast).
    #[arg(long)]
    pub json: bool,
    /// Drive read rate for the trunk compression forecast, GB/s (default: measured on the
    /// model's packed trunk, else 2 GB/s assumed; docs/PERFORMANCE.md#trunk-compression).
    #[arg(long, value_name = "R")]
    pub read_gbps: Option<f64>,
    /// The packed trunk (`k3 pack`, plain or `--compress`) to forecast, as `k3 run --trunk`
    /// (default: the packs in MODEL/trunk and MODEL/trunk-compressed).
    #[arg(long, value_name = "DIR")]
    pub trunk: Option<PathBuf>,
    /// Compute threads, which decode a compressed trunk (default: the physical cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

/// Prints the plan table; exits 2 (after printing it) when it does not fit this machine.
pub fn plan(args: PlanArgs) -> Result<(), CliError> {
    let budget = args
        .budget
        .budget()?
        .unwrap_or(Budget::Preset(Preset::Laptop));
    if args.sessions == 0 {
        return Err(CliError::usage("--sessions must be at least 1"));
    }
    if args.json
        && args.ranks.is_none()
        && (args.draft_trunk.is_some() || args.draft_model.is_some())
    {
        return Err(CliError::usage(
            "--json prints the plan of MODEL alone or of --ranks N; leave out --draft-trunk/--draft-model",
        ));
    }
    if let Some(ranks) = args.ranks {
        if ranks == 0 {
            return Err(CliError::usage("--ranks must be at least 1"));
        }
        if args.draft_trunk.is_some() {
            return Err(CliError::usage(
                "--draft-trunk is not planned over ranks: hybrid drafting does not run over MPI (docs/DISTRIBUTED.md)",
            ));
        }
        let dir = args
            .model_dir
            .as_deref()
            .map(k3_hub::store::resolve_model)
            .transpose()?;
        let req = PlanRequest::new(budget, args.ctx as u64).with_sessions(args.sessions as u64);
        return crate::plan_ranks::plan_ranks(dir.as_deref(), req, ranks, args.json);
    }
    let Some(model_dir) = args.model_dir.as_deref() else {
        if args.draft_model.is_some() {
            return Err(CliError::usage(
                "--draft-model needs the model directory it drafts for: k3 plan MODEL --draft-model DIR",
            ));
        }
        if args.draft_trunk.is_some() {
            return Err(CliError::usage(
                "--draft-trunk needs the model directory it was packed from: k3 plan MODEL --draft-trunk DIR",
            ));
        }
        return plan_released(budget, args.ctx, args.sessions, args.json);
    };
    let model_dir = k3_hub::store::resolve_model(model_dir)?;
    if let Some(dm) = &args.draft_model {
        return crate::plan_dspark::plan(&model_dir, dm, budget, args.ctx, args.sessions);
    }
    let Some(draft) = &args.draft_trunk else {
        let codec = crate::plan_codec::codec_plan(&model_dir, &args)?;
        let pack = crate::plan_codec::chosen_pack(&codec)?;
        let mut planned = forecast_pack(&model_dir, budget, args.ctx, args.sessions, pack.as_ref());
        // As a run does: when the chosen pack's plan is refused (a compressed pack's staging
        // does not fit), the other pack at hand is planned instead.
        if let (Err(refused), Some(other)) = (&planned, codec.candidates().get(1)) {
            let other_pack =
                k3_format::TrunkPack::open(other).map_err(|e| CliError::usage(e.to_string()))?;
            eprintln!(
                "k3: note: {refused}; planning the trunk from {} instead",
                other.display()
            );
            planned = forecast_pack(
                &model_dir,
                budget,
                args.ctx,
                args.sessions,
                Some(&other_pack),
            );
        }
        let (plan, available, fits) = planned?;
        let codec = (plan.trunk.streamed_per_token > 0).then_some(codec);
        match args.json {
            true => crate::plan_codec::print_json(&plan, codec.as_ref(), fits.is_ok()),
            false => {
                println!("{}", plan.table(Some(&available)).trim_end());
                if let Some(c) = &codec {
                    crate::plan_codec::print_lines(&model_dir, &plan, c);
                }
            }
        }
        return fits.map_err(CliError::from);
    };
    let bytes = k3_format::TrunkPack::open(draft)
        .map_err(|e| CliError::usage(e.to_string()))?
        .total_bytes();
    // The plain plan's streaming decides, whether or not it fits this machine itself.
    let (plain, _, _) = forecast(&model_dir, budget, args.ctx, args.sessions, 0)?;
    let (hybrid, available, fits) = forecast(&model_dir, budget, args.ctx, args.sessions, bytes)?;
    println!("{}", hybrid.table(Some(&available)).trim_end());
    let (s0, s1) = (
        plain.trunk.streamed_per_token,
        hybrid.trunk.streamed_per_token,
    );
    println!(
        "without the draft trunk: {} streamed per token, {} in all",
        fmt_bytes(s0),
        fmt_bytes(plain.total_bytes())
    );
    if s0 > 0 {
        println!(
            "hybrid drafting saves trunk reads when an exact pass yields more than {:.2} tokens (trunk bytes per generated token: {} / tokens per pass; rejected drafts' experts and the draft model's compute come on top, docs/PERFORMANCE.md#hybrid-drafting)",
            s1 as f64 / s0 as f64,
            fmt_bytes(s1)
        );
    }
    let choice = choose_draft(&plain, fits.as_ref().map(|_| &hybrid));
    println!(
        "--draft auto: hybrid drafting {}: {}",
        if choice.on { "on" } else { "off" },
        choice.why
    );
    fits.map_err(CliError::from)
}

/// `k3 plan` without a model: the release's shapes (docs/MODELS.md#sizing-the-release), the
/// same planner and the same fit check against this machine as with a directory.
fn plan_released(budget: Budget, ctx: usize, sessions: usize, json: bool) -> Result<(), CliError> {
    let (sizes, _) = k3_engine::release_sizes::released_sizes();
    let req = PlanRequest::new(budget, ctx as u64).with_sessions(sessions as u64);
    let plan = make_plan(&sizes, &req).map_err(|e| CliError::usage(e.to_string()))?;
    let available = k3_store::available_memory();
    let fits = plan.check(&sizes, &available);
    if json {
        crate::plan_codec::print_json(&plan, None, fits.is_ok());
    } else {
        println!("Kimi K3 as released (from its tensor shapes; no model directory given)");
        println!("{}", plan.table(Some(&available)).trim_end());
    }
    fits.map_err(|e| CliError::usage(e.to_string()))
}

#[derive(Args)]
#[command(
    after_help = "Examples:\n  k3 presets\n  k3 presets --sessions 8\n  k3 presets /models/kimi-k3 --read-gbps 6 -c 8192"
)]
pub struct PresetsArgs {
    /// Model directory or stored NAME to plan (default: Kimi K3 as released, from its
    /// tensor shapes).
    pub model_dir: Option<PathBuf>,
    /// Disk read rate the s/token floor assumes, GB/s (`k3 doctor MODEL` measures yours).
    #[arg(long, default_value_t = 3.0)]
    pub read_gbps: f64,
    /// Context positions to reserve latent KV for.
    #[arg(short = 'c', long, visible_alias = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Sessions whose state to reserve (as `k3 plan --sessions`; `k3 serve --parallel N`
    /// reserves N + 4).
    #[arg(long, default_value_t = 1)]
    pub sessions: usize,
}

/// Lists the presets with what each needs in RAM and the I/O floor of a decoded token
/// (trunk streamed + expected expert misses, at `--read-gbps`; docs/QUICKSTART.md#presets).
pub fn presets(args: PresetsArgs) -> Result<(), CliError> {
    if !(args.read_gbps.is_finite() && args.read_gbps > 0.0) {
        return Err(CliError::usage(format!(
            "--read-gbps must be positive, got {}",
            args.read_gbps
        )));
    }
    if args.sessions == 0 {
        return Err(CliError::usage("--sessions must be at least 1"));
    }
    use k3_engine::trunk_choice::{TrunkPacks, MEASURED_STORED_RATIO};
    let mut packs = TrunkPacks::default();
    let (sizes, what, moe_layers) = match &args.model_dir {
        None => {
            let (sizes, moe) = k3_engine::release_sizes::released_sizes();
            (sizes, "Kimi K3 as released".to_string(), moe)
        }
        Some(dir) => {
            let dir = &k3_hub::store::resolve_model(dir)?;
            packs = TrunkPacks::in_model_dir(dir);
            let cfg = k3_format::K3Config::load(dir.join("config.json"))
                .map_err(|e| CliError::usage(e.to_string()))?;
            let ck =
                k3_format::Checkpoint::open(dir).map_err(|e| CliError::usage(e.to_string()))?;
            let binding =
                k3_format::bind_model(&ck, &cfg).map_err(|e| CliError::usage(e.to_string()))?;
            let moe = cfg
                .num_hidden_layers
                .saturating_sub(cfg.first_k_dense_replace) as f64;
            (model_sizes(&cfg, &binding)?, dir.display().to_string(), moe)
        }
    };
    let read = args.read_gbps * 1e9;
    // The trunk read from a compressed pack (the model's own ratio when it has one): an I/O
    // floor like the others, reached when decoding keeps up, which `k3 plan MODEL` forecasts
    // for this machine (the table depends on the planner alone, not on the machine).
    let ratio = packs.compressed.map_or(MEASURED_STORED_RATIO, |c| c.1);
    println!(
        "{:<12} {:>9} {:>9} {:>10} {:>7} {:>11} {:>10} {:>12}",
        "preset", "trunk GB", "cache GB", "RAM", "hit", "read/token", "s/token", "compressed"
    );
    for p in Preset::ALL {
        let (t, c) = p.gb();
        let req = PlanRequest::new(Budget::Preset(p), args.ctx as u64)
            .with_sessions(args.sessions as u64);
        let plan = make_plan(&sizes, &req).map_err(|e| CliError::usage(e.to_string()))?;
        let hit = k3_plan::forecast::hit_rate(p, &plan, &sizes);
        let trunk = plan.trunk.streamed_per_token as f64;
        let experts = moe_layers * f64::from(sizes.top_k) * (1.0 - hit) * sizes.expert_bytes as f64;
        let secs = (trunk + experts) / read;
        let compressed = (ratio * trunk + experts) / read;
        println!(
            "{:<12} {:>9} {:>9} {:>10} {:>6.1}% {:>11} {:>10} {:>12}",
            p.name(),
            t,
            c,
            fmt_bytes(plan.total_bytes()),
            hit * 100.0,
            fmt_bytes((trunk + experts) as u64),
            format!("≥ {secs:.2}"),
            format!("≥ {compressed:.2}")
        );
    }
    let sessions = match args.sessions {
        1 => String::new(),
        n => format!(", {n} sessions"),
    };
    println!(
        "\n{what}, ctx {}{sessions}: RAM is the plan's total; s/token is the I/O floor at {} GB/s (compute not included; hit rates: docs/PERFORMANCE.md decode view).",
        args.ctx, args.read_gbps
    );
    println!(
        "compressed: the same floor with the trunk read from a compressed pack (stored ratio {ratio:.3}), when decoding keeps up; `k3 plan MODEL_DIR` says whether it does here (docs/PERFORMANCE.md#trunk-compression)."
    );
    println!("--mem-gb TOTAL splits a total trunk-first; --trunk-gb X --cache-gb Y sets both.");
    Ok(())
}
