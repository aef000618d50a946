//! Opening an engine: the group's checks, the compute pool, the weight stores (in place, or
//! planned and streamed under a budget) and the drafts.

use crate::resident::ResidentStore;
use crate::streaming::StreamingStore;
use crate::{
    draft, dspark, dspark_hold, group, planning, rank_share, streaming, CountingComm, DraftPolicy,
    Engine, EngineError, EngineOptions, Stores, Tokenizer,
};
use k3_format::{bind_model, Checkpoint, K3Config};
use k3_model::Model;
use k3_plan::{Budget, MemoryPlan};
use std::path::Path;
use std::sync::Arc;

/// The stores an engine reads its weights from, the plan they follow (with a budget), the
/// checkpoint a streaming store reads and what was decided about the draft trunk.
type OpenedStores = (
    Stores,
    Option<MemoryPlan>,
    Option<Checkpoint>,
    Option<planning::DraftChoice>,
);

impl Engine {
    /// Opens `dir` (a checkpoint in the released format: `config.json` + safetensors shards),
    /// validates the config, binds every tensor by name and checks shapes and dtypes; with a
    /// budget, plans memory (refusing when it does not fit) and starts the streaming stores.
    pub fn open(dir: &Path, options: EngineOptions) -> Result<Engine, EngineError> {
        let comm = options.comm.clone();
        if let Some(c) = comm.as_ref().filter(|c| c.size() > 1) {
            // every rank sees every fingerprint and refuses alike (exit 2), no abort needed
            group::check_same_model(dir, c.as_ref())?;
        }
        let mut engine = Self::open_rank(dir, options).inspect_err(|err| {
            // one rank that cannot open its share ends the group (docs/DISTRIBUTED.md#faults)
            if let Some(c) = comm.as_ref().filter(|c| c.size() > 1) {
                c.abort(&format!("cannot open {}: {err}", dir.display()));
            }
        })?;
        if comm.is_some_and(|c| c.size() > 1) {
            engine.agree_prefill_chunk()?;
        }
        Ok(engine)
    }

    /// [`Engine::open`] on this rank.
    fn open_rank(dir: &Path, options: EngineOptions) -> Result<Engine, EngineError> {
        if !dir.is_dir() {
            return Err(EngineError::ModelDir {
                path: dir.to_path_buf(),
                what: "not a directory: pass the model directory (config.json + *.safetensors)"
                    .into(),
            });
        }
        let config = K3Config::load(dir.join("config.json"))?;
        let model = Model::new(&config)?.with_lookahead(options.lookahead);
        let (model, mut options, comm_counter) = join_group(model, options)?;
        let tokenizer = load_tokenizer(dir, options.tokenizer_dir.as_deref(), config.vocab_size)?;
        let pool = compute_pool(options.threads.unwrap_or_else(default_threads))?;
        let (use_trunk, use_dspark) = draft_uses(&options);
        // Opened once: its size goes into the plan, its layers into memory (when used).
        let draft_pack = match &options.draft_trunk {
            Some(d) if use_trunk => Some(k3_format::TrunkPack::open(d)?),
            _ => None,
        };
        // Checked whatever the policy (a bad draft is refused); planned and held only when
        // decoding drafts with it.
        let mut dspark = match &options.draft_model {
            Some(d) => Some(dspark::DsparkDraft::open(d, &config)?).filter(|_| use_dspark),
            None => None,
        };
        let (stores, plan, ckpt, draft_choice) = open_stores(
            dir,
            &config,
            &mut options,
            &pool,
            draft_pack.as_ref(),
            dspark.as_mut(),
        )?;
        let pass_cost = match &stores {
            Stores::Resident(s) => planning::pass_cost(&config, s.binding())?,
            Stores::Streaming(s) => planning::pass_cost(&config, s.binding())?,
        };
        let draft = load_draft(draft_pack, &draft_choice, &stores, ckpt.as_ref(), &config)?;
        Ok(Engine {
            dir: dir.to_path_buf(),
            config,
            model,
            stores,
            plan,
            max_prefill_chunk: options.max_prefill_chunk,
            tokenizer,
            pool,
            draft,
            draft_choice,
            dspark,
            pass_cost,
            comm_counter,
            spare_scratch: Default::default(),
        })
    }
}

/// With a group of more than one rank: wraps its communicator in the counting decorator and
/// hands it to the model, and turns the draft trunk off (refusing `--draft hybrid`).
#[allow(clippy::type_complexity)]
fn join_group(
    mut model: Model,
    mut options: EngineOptions,
) -> Result<(Model, EngineOptions, Option<Arc<CountingComm>>), EngineError> {
    let comm_counter = options
        .comm
        .clone()
        .filter(|c| c.size() > 1)
        .map(|c| Arc::new(CountingComm::new(c)));
    if let Some(counter) = &comm_counter {
        options.comm = Some(counter.clone());
    }
    if let Some(comm) = options.comm.clone().filter(|c| c.size() > 1) {
        // A draft trunk's cache-only experts differ per rank, so its proposals (and the
        // verify passes' lengths) would differ: not over ranks in this stage.
        if options.draft_policy == DraftPolicy::On {
            return Err(EngineError::Invalid(
                "--draft hybrid is not supported over MPI ranks (docs/DISTRIBUTED.md): use --draft off or an n-gram length".into(),
            ));
        }
        options.draft_policy = DraftPolicy::Off;
        model = model.with_comm(comm);
    }
    Ok((model, options, comm_counter))
}

/// The compute pool of `threads` threads (at least one).
fn compute_pool(threads: usize) -> Result<Arc<rayon::ThreadPool>, EngineError> {
    if threads == 0 {
        return Err(EngineError::Invalid("--threads must be at least 1".into()));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("k3-compute-{i}"))
        .build()
        .map(std::sync::Arc::new)
        .map_err(|e| EngineError::Invalid(format!("cannot start {threads} compute threads: {e}")))
}

/// The weight stores: the memory-mapped shards in place without a budget, else the planned
/// streaming stores ([`open_streaming`]).
fn open_stores(
    dir: &Path,
    config: &K3Config,
    options: &mut EngineOptions,
    pool: &Arc<rayon::ThreadPool>,
    draft_pack: Option<&k3_format::TrunkPack>,
    dspark: Option<&mut dspark::DsparkDraft>,
) -> Result<OpenedStores, EngineError> {
    match options.budget {
        None if options.trunk_dir.is_some() => Err(EngineError::Invalid(
            "--trunk streams the trunk from a pack: give a budget flag too (--preset, --mem-gb or --trunk-gb/--cache-gb)".into(),
        )),
        None => {
            let choice = draft_pack.map(|p| match options.draft_policy {
                DraftPolicy::On => planning::DraftChoice::forced(p.dir(), None),
                _ => planning::DraftChoice::no_budget(),
            });
            let store = ResidentStore::open(dir, config)?;
            Ok((Stores::Resident(store), None, None, choice))
        }
        Some(budget) => open_streaming(dir, config, budget, options, pool, draft_pack, dspark),
    }
}

/// The streaming stores under `budget`: this rank's binding, the packed trunk (checked
/// against the checkpoint) when given, the memory plan (with the draft trunk when chosen),
/// and the pinned layers read in (reporting to [`EngineOptions::open_progress`]).
fn open_streaming(
    dir: &Path,
    config: &K3Config,
    budget: Budget,
    options: &mut EngineOptions,
    pool: &Arc<rayon::ThreadPool>,
    draft_pack: Option<&k3_format::TrunkPack>,
    dspark: Option<&mut dspark::DsparkDraft>,
) -> Result<OpenedStores, EngineError> {
    let ckpt = Checkpoint::open(dir)?;
    let whole = bind_model(&ckpt, config)?;
    let (binding, mut sizes) = rank_binding(config, whole, options)?;
    let pack = match &options.trunk_dir {
        Some(d) => {
            let pack = k3_format::TrunkPack::open(d)?;
            pack.check_against(&binding, config)?;
            pack.check_source(&ckpt)?;
            Some(pack)
        }
        None => None,
    };
    // A compressed trunk is read through two staging buffers (each the largest stored run:
    // the next run is read into one while the other decodes) before it is decoded into its
    // slot; the slots hold decoded runs (docs/STREAMING.md#overlapped-decode).
    sizes.scratch_bytes += pack.as_ref().map_or(0, planning::staging_bytes);
    let (plan, choice) = match (dspark, draft_pack) {
        // A DSpark draft is planned in the form that fits (docs/DSPARK.md#memory); never
        // beside a draft trunk (`draft_uses`).
        (Some(d), _) => {
            let (plan, hold) = dspark_hold::plan_block_draft(&sizes, budget, options, d)?;
            d.hold_as(hold)?;
            (plan, None)
        }
        _ => plan_with_draft(&sizes, budget, options, draft_pack)?,
    };
    let mut files = match options.readers.take() {
        Some(r) => r,
        None => streaming::open_files(&ckpt, options.direct_io)?,
    };
    if let Some(p) = &pack {
        files.push(streaming::open_file(
            &p.path(),
            options.direct_io && p.direct_io_ok(),
        )?);
    }
    let progress = options.open_progress.clone();
    let mut report = |done: u64, total: u64| {
        if let Some(p) = &progress {
            p(done, total)
        }
    };
    let store = StreamingStore::new(
        binding,
        files,
        &plan,
        options.io_threads.max(1),
        pack.as_ref().map(|p| (p, std::sync::Arc::clone(pool))),
        &mut report,
    )?;
    Ok((Stores::Streaming(store), Some(plan), Some(ckpt), choice))
}

/// Which drafts an engine plans and holds: `(draft trunk, DSpark draft)`. One at most:
/// `--draft off` (or an n-gram length) neither; `--draft hybrid` the draft trunk (a DSpark
/// draft then has no use); `--draft auto` the DSpark draft when given (block drafts win over
/// hybrid ones, docs/DSPARK.md#using-it), else the draft trunk where the plan predicts a gain.
fn draft_uses(options: &EngineOptions) -> (bool, bool) {
    let (trunk, dspark) = (options.draft_trunk.is_some(), options.draft_model.is_some());
    match options.draft_policy {
        DraftPolicy::Off => (false, false),
        DraftPolicy::On => (trunk, dspark && !trunk),
        DraftPolicy::Auto => (trunk && !dspark, dspark),
    }
}

/// The draft trunk's layers, loaded when the choice turned it on.
fn load_draft(
    draft_pack: Option<k3_format::TrunkPack>,
    draft_choice: &Option<planning::DraftChoice>,
    stores: &Stores,
    ckpt: Option<&Checkpoint>,
    config: &K3Config,
) -> Result<Option<draft::DraftTrunk>, EngineError> {
    match (draft_pack, draft_choice) {
        (Some(pack), Some(c)) if c.on => {
            let (binding, ckpt) = match stores {
                Stores::Resident(s) => (s.binding(), s.checkpoint()),
                Stores::Streaming(s) => (
                    s.binding(),
                    ckpt.ok_or_else(|| {
                        EngineError::Invalid("streaming store without its checkpoint".into())
                    })?,
                ),
            };
            Ok(Some(draft::DraftTrunk::load(pack, binding, config, ckpt)?))
        }
        _ => Ok(None),
    }
}

/// Loads the tokenizer from `explicit`, else from `model_dir` when it has one.
fn load_tokenizer(
    model_dir: &Path,
    explicit: Option<&Path>,
    vocab: usize,
) -> Result<Option<Tokenizer>, EngineError> {
    let dir = match explicit {
        Some(d) => d,
        None if model_dir.join("tiktoken.model").is_file()
            || model_dir.join("tokenizer.json").is_file() =>
        {
            model_dir
        }
        None => return Ok(None),
    };
    let tok = Tokenizer::from_dir(dir)?;
    if tok.vocab_size() > vocab {
        return Err(EngineError::Invalid(format!(
            "{}: the tokenizer has {} ids but the model's vocab_size is {vocab}: wrong tokenizer for this model",
            dir.display(),
            tok.vocab_size()
        )));
    }
    Ok(Some(tok))
}

/// The binding this rank's streaming stores read and the planner's sizes for it: with a
/// group and no packed trunk, the rank's share (`rank_share`, docs/DISTRIBUTED.md#memory-per-rank);
/// otherwise the whole model (a packed trunk holds whole layers, which every rank streams).
fn rank_binding(
    config: &K3Config,
    whole: k3_format::ModelBinding,
    options: &EngineOptions,
) -> Result<(k3_format::ModelBinding, k3_plan::ModelSizes), EngineError> {
    let (rank, size) = options
        .comm
        .as_ref()
        .map_or((0, 1), |c| (c.rank(), c.size()));
    if size <= 1 || options.trunk_dir.is_some() {
        let mut sizes = planning::model_sizes(config, &whole)?;
        if !options.trunk_pieces {
            sizes.layer_piece_bytes.clear();
        }
        return Ok((whole, sizes));
    }
    let sizes = planning::rank_sizes(config, &whole, rank, size)?;
    Ok((rank_share::share_binding(&whole, rank, size)?, sizes))
}

/// The memory plan for `budget`, with the draft trunk `draft` when the policy and
/// [`planning::choose_draft`] say so; the choice is `None` without a draft trunk.
fn plan_with_draft(
    sizes: &k3_plan::ModelSizes,
    budget: Budget,
    options: &EngineOptions,
    draft: Option<&k3_format::TrunkPack>,
) -> Result<(MemoryPlan, Option<planning::DraftChoice>), EngineError> {
    let plan = |draft: u64| planning::plan_checked(sizes, budget, options, draft);
    let Some(pack) = draft else {
        return Ok((plan(0)?, None));
    };
    let hybrid = plan(pack.total_bytes());
    if options.draft_policy == DraftPolicy::On {
        let hybrid = hybrid?;
        let streamed = Some(hybrid.trunk.streamed_per_token);
        return Ok((
            hybrid,
            Some(planning::DraftChoice::forced(pack.dir(), streamed)),
        ));
    }
    let plain = plan(0)?;
    let choice = planning::choose_draft(&plain, hybrid.as_ref());
    match (choice.on, hybrid) {
        (true, Ok(h)) => Ok((h, Some(choice))),
        _ => Ok((plain, Some(choice))),
    }
}

/// Default compute threads: the physical cores, but no more than this process may use
/// (affinity, cgroup quota). Hyper-threads share a core's FMA pipes and its cache, which the
/// mat-vec kernels already saturate per core (docs/PERFORMANCE.md "Kernels").
pub(crate) fn default_threads() -> usize {
    let usable = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    num_cpus::get_physical().clamp(1, usable)
}
