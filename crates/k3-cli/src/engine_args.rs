//! Flags that open the engine, shared by `k3 run`, `k3 chat` and `k3 serve`.

use crate::budget::BudgetArgs;
use crate::CliError;
use clap::Args;
use k3_engine::config_file::FileConfig;
use k3_engine::{Engine, EngineOptions};
use k3_kernels::fast::Numerics;
use std::path::{Path, PathBuf};

/// The numeric modes `--numerics` offers (docs/NUMERICS.md#numeric-mode-fast).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NumericsArg {
    /// Contract v2: the same bits on every machine (the default).
    #[default]
    V2,
    /// bf16 and MXFP4 weight products on AMX tiles (opt-in; refused, exit 2, without AMX-BF16).
    Fast,
}

#[derive(Args, Clone, Debug, Default)]
pub struct EngineArgs {
    /// Compute threads (default: the physical cores this process may use).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Tokenizer directory (default: the model directory's tiktoken.model / tokenizer.json).
    #[arg(long)]
    pub tok: Option<PathBuf>,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Read trunk layers from a packed trunk (`k3 pack`) instead of the shards; needs a budget.
    #[arg(long)]
    pub trunk: Option<PathBuf>,
    /// A draft trunk (`k3 pack --draft-quant q8 MODEL_DIR DIR`) for hybrid drafting: a
    /// quantized copy of the trunk held in memory drafts tokens with cache-only experts and
    /// the exact model verifies them in one pass. Used where the plan predicts a gain
    /// (`--draft auto`) or always (`--draft hybrid`); the tokens are the same either way.
    #[arg(long, value_name = "DIR")]
    pub draft_trunk: Option<PathBuf>,
    /// A DSpark draft model (docs/DSPARK.md; alias -md): every pass it proposes a block of
    /// tokens from the model's own hidden states, and the exact model verifies as many as
    /// its confidence head and the cost model say pay (at most --draft-max). Checked against
    /// the model at open (refused with exit 2 naming the file and key or tensor); the tokens
    /// are the same with or without it. `--draft off` turns it off.
    #[arg(long, value_name = "DIR")]
    pub draft_model: Option<PathBuf>,
    /// Map the whole model with no memory plan even when it is larger than the memory this
    /// machine has (without a budget flag, a model that does not fit is planned as
    /// `--preset auto`; README "Memory budgets").
    #[arg(long, conflicts_with_all = ["preset", "mem_gb", "trunk_gb", "cache_gb"])]
    pub resident: bool,
    /// Read with the page cache instead of O_DIRECT (streaming only).
    #[arg(long)]
    pub no_direct_io: bool,
    /// Prefetch the experts the next layer's router predicts while a layer computes (only
    /// when the next layer is pinned; off by default, see docs/PERFORMANCE.md; the tokens
    /// are the same either way).
    #[arg(long)]
    pub lookahead: bool,
    /// Numeric mode: v2 (contract v2, the default) or fast (AMX tiles: other bits, refused
    /// with exit 2 where the CPU or OS has no AMX-BF16; docs/NUMERICS.md#numeric-mode-fast).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = NumericsArg::V2)]
    pub numerics: NumericsArg,
}

impl EngineArgs {
    /// Engine options from these flags over the config file, reserving `ctx` positions.
    pub fn options(
        &self,
        file: &FileConfig,
        ctx: usize,
        comm: Option<std::sync::Arc<dyn k3_engine::Comm>>,
    ) -> Result<EngineOptions, CliError> {
        Ok(EngineOptions {
            threads: self.threads.or(file.threads),
            budget: self.budget.budget_or_file(file)?,
            ctx,
            direct_io: !self.no_direct_io,
            tokenizer_dir: self.tok.clone(),
            trunk_dir: self.trunk.clone(),
            lookahead: self.lookahead,
            draft_trunk: self.draft_trunk.clone(),
            draft_model: self.draft_model.clone(),
            comm, // one rank of an MPI job, or one process
            ..EngineOptions::default()
        })
    }

    /// Switches this process to `--numerics` before the engine opens; a mode this machine
    /// cannot run is refused (exit 2) with the kernels' message.
    pub fn set_numerics(&self) -> Result<(), CliError> {
        let mode = match self.numerics {
            NumericsArg::V2 => Numerics::V2,
            NumericsArg::Fast => Numerics::FAST,
        };
        k3_kernels::fast::set_numerics(mode).map_err(|e| CliError::usage(e.to_string()))
    }
}

/// The model directory of `chat` and `serve`: `-m/--model` or the positional MODEL_DIR (not
/// both), else the config file's `model`; each may be a stored NAME (`crate::store`).
pub fn model_dir(
    flag: Option<&Path>,
    positional: Option<&Path>,
    file: &FileConfig,
) -> Result<PathBuf, CliError> {
    match (flag, positional) {
        (Some(f), Some(p)) => Err(CliError::usage(format!(
            "the model directory is given twice (-m {} and {}): give one",
            f.display(),
            p.display()
        ))),
        (Some(d), None) | (None, Some(d)) => Ok(k3_hub::store::resolve_model(d)?),
        (None, None) => Ok(k3_hub::store::resolve_model(
            &file.model.clone().ok_or_else(no_model)?,
        )?),
    }
}

/// The model directory of `chat` and `serve`: positional or `-m`, else the config file's.
#[derive(Args, Debug, Clone, Default)]
pub struct ModelArgs {
    /// Model directory (config.json + *.safetensors + tiktoken.model); or -m DIR; default:
    /// `model` from the config file.
    #[arg(value_name = "MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// Model directory (instead of the positional MODEL_DIR).
    #[arg(short = 'm', long = "model", value_name = "DIR")]
    pub model: Option<PathBuf>,
}

impl ModelArgs {
    /// The directory to open (refused when given twice or nowhere).
    pub fn resolve(&self, file: &FileConfig) -> Result<PathBuf, CliError> {
        model_dir(self.model.as_deref(), self.model_dir.as_deref(), file)
    }
}

/// The engine's tokenizer, or the refusal naming `dir` for commands that need text.
pub fn tokenizer_of<'e>(
    engine: &'e Engine,
    dir: &Path,
) -> Result<&'e k3_engine::Tokenizer, CliError> {
    engine.tokenizer().ok_or_else(|| {
        CliError::usage(format!(
            "{}: no tokenizer (tiktoken.model or tokenizer.json): pass --tok DIR",
            dir.display()
        ))
    })
}

/// The refusal when no model directory is given anywhere.
pub fn no_model() -> CliError {
    CliError::usage(
        "give the model directory (MODEL_DIR or -m DIR), or set `model` in the config file (see `k3 config path`)",
    )
}

/// Opens the engine; without a budget, plans one as `--preset auto` unless `resident`
/// (`k3_engine::auto_budget`). With `progress` (not `-q`): the choice and any thread warning on
/// stderr, and on a terminal a progress bar follows the pinned trunk layers being read
/// (minutes at real scale).
pub fn open_engine(
    dir: &std::path::Path,
    mut options: EngineOptions,
    resident: bool,
    progress: bool,
) -> Result<Engine, CliError> {
    use std::io::IsTerminal;
    if let Some(choice) = k3_engine::auto_budget::choose(dir, &options, resident)? {
        if progress {
            eprintln!("k3: {}", choice.why);
        }
        options.budget = choice.budget;
    }
    let other_packs = use_stored_trunk(dir, &mut options, progress);
    let bar =
        (progress && options.budget.is_some() && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "pinning trunk [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            std::sync::Arc::new(bar)
        });
    if let Some(b) = &bar {
        let b = b.clone();
        options.open_progress = Some(std::sync::Arc::new(move |done, total| {
            b.set_length(total);
            b.set_position(done);
        }));
    }
    let engine = open_with_fallback(dir, options, other_packs, progress);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let engine = engine?;
    if progress {
        warn_oversubscribed(engine.threads());
    }
    if let (true, Some(choice)) = (progress, engine.draft_choice()) {
        match engine.draft_info() {
            Some((d, quant, bytes)) => eprintln!(
                "hybrid drafting: on ({quant} draft trunk {}, {:.2} GB in memory): {}",
                d.display(),
                bytes as f64 / 1e9,
                choice.why
            ),
            None => eprintln!("hybrid drafting: off: {}", choice.why),
        }
    }
    Ok(engine)
}

/// Opens the engine; when the plan refuses the budget with the pack chosen from the model
/// directory (a compressed pack's two staging buffers do not fit), opens it again with each
/// other matching pack in turn (the plain one needs no staging), saying so on stderr.
fn open_with_fallback(
    dir: &std::path::Path,
    options: EngineOptions,
    other_packs: Vec<std::path::PathBuf>,
    progress: bool,
) -> Result<Engine, k3_engine::EngineError> {
    let mut refused = match Engine::open(dir, options.clone()) {
        Err(e @ k3_engine::EngineError::Plan(_)) => e,
        done => return done,
    };
    for pack_dir in other_packs {
        if progress {
            eprintln!(
                "k3: note: {refused}; reading the trunk from {} instead",
                pack_dir.display()
            );
        }
        let mut retry = options.clone();
        retry.trunk_dir = Some(pack_dir);
        refused = match Engine::open(dir, retry) {
            Err(e @ k3_engine::EngineError::Plan(_)) => e,
            done => return done,
        };
    }
    Err(refused)
}

/// A streaming run of a model whose directory holds a packed trunk (`k3 pull` packs one into
/// `NAME/trunk`; `NAME/trunk-compressed` may hold a compressed one) reads the trunk from it
/// without `--trunk` (contiguous layer runs instead of scattered shard reads,
/// docs/MODELS.md#names-stand-for-directories), when the pack matches these very shards and
/// this config; otherwise the shards, saying why on stderr. With both a plain and a
/// compressed pack, the one `k3_engine::trunk_choice` forecasts faster is tried first
/// (docs/PERFORMANCE.md#trunk-compression). Returns the other packs that match, in order,
/// for [`open_with_fallback`].
fn use_stored_trunk(
    dir: &std::path::Path,
    options: &mut EngineOptions,
    progress: bool,
) -> Vec<std::path::PathBuf> {
    use k3_engine::trunk_choice::{default_decoding_cores, TrunkCodecPlan, TrunkPacks};
    if options.trunk_dir.is_some() || options.budget.is_none() {
        return Vec::new();
    }
    let packs = TrunkPacks::in_model_dir(dir);
    for (pack_dir, why) in packs.unreadable.iter().filter(|_| progress) {
        eprintln!(
            "k3: note: not using the packed trunk {}: {why}; repack with `k3 pack {} {}`",
            pack_dir.display(),
            dir.display(),
            pack_dir.display()
        );
    }
    // Only a choice between two packs needs the forecast (a 0.3 s read probe, a 60 ms
    // decode probe); `why` says what chose.
    let (candidates, why) = match (&packs.plain, &packs.compressed) {
        (Some(_), Some(_)) => {
            let cores = options.threads.unwrap_or_else(default_decoding_cores);
            let codec = TrunkCodecPlan::new(packs, None, cores, true);
            let order = codec.candidates().into_iter().map(Path::to_path_buf);
            (order.collect(), Some(codec.rates.decision()))
        }
        (Some(p), None) | (None, Some((p, _))) => (vec![p.clone()], None),
        (None, None) => (Vec::new(), None),
    };
    let mut matching = Vec::new();
    for pack_dir in candidates {
        match stored_trunk_matches(dir, &pack_dir) {
            Ok(()) if !matching.is_empty() => matching.push(pack_dir),
            Ok(()) => {
                match (&why, progress) {
                    (Some(why), true) => eprintln!(
                        "k3: reading the trunk from {} (as --trunk): {why}",
                        pack_dir.display()
                    ),
                    (None, true) => eprintln!(
                        "reading the trunk from the packed trunk {} (as --trunk)",
                        pack_dir.display()
                    ),
                    (_, false) => {}
                }
                options.trunk_dir = Some(pack_dir.clone());
                matching.push(pack_dir);
            }
            Err(why) if progress => eprintln!(
                "k3: note: not using the packed trunk {}: {why}; reading the shards (repack with `k3 pack {} {}`)",
                pack_dir.display(),
                dir.display(),
                pack_dir.display()
            ),
            Err(_) => {}
        }
    }
    matching.into_iter().skip(1).collect()
}

/// Whether the pack in `pack_dir` was made from `dir`'s shards for its config.
fn stored_trunk_matches(dir: &std::path::Path, pack_dir: &std::path::Path) -> Result<(), String> {
    let ckpt = k3_format::Checkpoint::open(dir).map_err(|e| e.to_string())?;
    let config = k3_format::K3Config::load(dir.join("config.json")).map_err(|e| e.to_string())?;
    let binding = k3_format::bind_model(&ckpt, &config).map_err(|e| e.to_string())?;
    let pack = k3_format::TrunkPack::open(pack_dir).map_err(|e| e.to_string())?;
    pack.check_against(&binding, &config)
        .map_err(|e| e.to_string())?;
    pack.check_source(&ckpt).map_err(|e| e.to_string())
}

/// Warns when `-t` asks for more threads than the CPUs this process may use: they take turns
/// on the cores and every step waits for the slowest (measured 10× slower at `-t 64` on 2).
fn warn_oversubscribed(threads: usize) {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    if cpus > 0 && threads > cpus {
        eprintln!(
            "k3: warning: {threads} threads on the {cpus} CPUs this process may use: expect it to be several times slower; leave out -t/--threads for the default (the physical cores)"
        );
    }
}

/// Prints the memory plan on stderr (`run`, `chat` and `serve` at start), when there is one.
pub fn print_plan(engine: &Engine) {
    if let Some(plan) = engine.plan() {
        eprintln!(
            "{}",
            plan.table(Some(&k3_store::available_memory())).trim_end()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k3_engine::{Budget, EngineError};
    use k3_format::pack::{write_compressed_pack, PackOptions};
    use k3_format::{bind_model, write_trunk_pack, Checkpoint, K3Config};

    /// The tiny model copied into a scratch directory with a plain and a compressed pack.
    fn tiny_with_both_packs() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3");
        let dir = tempfile::tempdir().expect("scratch dir");
        for entry in std::fs::read_dir(&tiny).expect("fixtures/tiny-k3") {
            let p = entry.expect("entry").path();
            std::fs::copy(&p, dir.path().join(p.file_name().expect("name"))).expect("copy");
        }
        let ck = Checkpoint::open(dir.path()).expect("open");
        let cfg = K3Config::load(dir.path().join("config.json")).expect("config");
        let binding = bind_model(&ck, &cfg).expect("bind");
        let (plain, comp) = (
            dir.path().join("trunk"),
            dir.path().join("trunk-compressed"),
        );
        let opts = PackOptions::default();
        write_trunk_pack(&ck, &binding, &cfg, &plain, &opts, &mut |_, _| {}).expect("pack");
        write_compressed_pack(&ck, &binding, &cfg, &comp, &opts, &mut |_, _| {}).expect("pack");
        (dir, plain, comp)
    }

    #[test]
    fn a_refused_compressed_pack_falls_back_to_the_plain_one() {
        let (dir, plain, comp) = tiny_with_both_packs();
        // The smallest budget of the plain pack: the compressed pack's staging does not fit.
        let options = EngineOptions {
            budget: Some(Budget::Total(3_000_000)),
            trunk_dir: Some(comp),
            ..EngineOptions::default()
        };
        let alone = open_with_fallback(dir.path(), options.clone(), Vec::new(), false);
        assert!(matches!(alone, Err(EngineError::Plan(_))), "refused alone");
        let engine = open_with_fallback(dir.path(), options.clone(), vec![plain.clone()], false)
            .expect("the plain pack fits");
        let mut by_plain = options;
        by_plain.trunk_dir = Some(plain);
        let direct = Engine::open(dir.path(), by_plain).expect("the plain pack");
        let scratch = |e: &Engine| e.plan().map(|p| p.scratch_bytes);
        assert_eq!(
            scratch(&engine),
            scratch(&direct),
            "planned as the plain pack"
        );
    }
}
