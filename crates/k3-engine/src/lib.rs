//! # k3-engine — the embeddable Kimi K3 API
//!
//! Open a model directory, create a [`Session`], feed token ids, step or generate with a
//! callback per token, read logits, drop.
//!
//! ```
//! use k3_engine::{DecodeMode, Engine, EngineOptions};
//! # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tiny-k3");
//! // let dir = "fixtures/tiny-k3";
//! let engine = Engine::open(dir.as_ref(), EngineOptions::default())?;
//! let tok = engine.tokenizer().expect("the model ships tiktoken.model");
//! let prompt = tok.encode("The train left at", false);
//! let mut session = engine.new_session(prompt.len() + 8)?;
//! session.feed(&prompt)?;
//! let ids = session.generate(8, DecodeMode::Incremental, |_id| true)?;
//! println!("{}", tok.decode_lossy(&ids).expect("ids from the vocabulary"));
//! assert_eq!(ids.len(), 8);
//! # Ok::<(), k3_engine::EngineError>(())
//! ```
//!
//! Without a budget the weights are used in place from the memory-mapped shards (the page
//! cache decides what stays in RAM). With a budget ([`EngineOptions::budget`]) the engine
//! follows a [`MemoryPlan`]: pinned trunk layers, a streaming ring, an expert cache — and
//! produces bit-identical logits.

#![forbid(unsafe_code)]
// Untrusted data must never reach an unwrap/expect (docs/RELIABILITY.md); tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod auto_budget;
mod batch;
pub mod block;
pub mod chat_template;
pub mod comm_stats;
pub mod config_file;
pub mod constraint;
mod decode;
pub mod draft;
pub mod dspark;
pub mod dspark_hold;
mod emit;
mod error;
mod gather;
mod generate;
mod group;
mod hybrid;
pub mod io_probe;
mod layer_view;
mod logprob;
mod open;
mod pieces;
pub mod planning;
pub mod rank_plan;
mod rank_share;
pub mod release_sizes;
mod resident;
pub mod run_report;
mod sampler;
mod session;
mod session_file;
mod spec_shares;
pub mod speculate;
pub mod stats;
mod stop;
mod streaming;
pub mod trunk_choice;

pub use batch::BatchFeed;
pub use block::{BlockDrafter, BlockPass, PassCost};
pub use comm_stats::{CommStats, CountingComm, RankFigures};
pub use constraint::{Constraint, ConstraintSpec, ReplyStart};
pub use error::{EngineError, EXIT_EXPERT, EXIT_RUNTIME, EXIT_USAGE};
pub use hybrid::{DraftModel, DraftStats};
pub use k3_format::K3Config;
pub use k3_model::dist::check_counts;
pub use k3_model::{Comm, CommError, LocalComm, Solo};
pub use k3_plan::{Budget, MemoryPlan, Preset};
pub use logprob::{token_logprob, TokenLogprob};
pub use planning::DraftChoice;
pub use sampler::{Sampler, SamplingParams};
pub use session::{argmax, DecodeMode, FeedProgress, Session};
pub use session_file::{write_atomic, SessionInfo, SESSION_MAGIC, SESSION_VERSION};
pub use speculate::{SpecStats, Speculation};
pub use stats::StoreStats;
pub use stop::{Generation, ScanStep, StopConditions, StopReason, StopScanner};

use k3_format::Checkpoint;
use k3_model::weights::{ExpertProvider, WeightProvider};
use k3_model::Model;
pub use k3_tokenizer::Tokenizer;
use resident::ResidentStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use streaming::StreamingStore;

/// How to open a model.
#[derive(Clone)]
pub struct EngineOptions {
    /// Let the plan stream layers in pieces where two whole-layer slots do not fit
    /// (docs/STREAMING.md#trunk-pieces); `false` plans whole layers only (benchmarks).
    pub trunk_pieces: bool,
    /// Compute threads (default: the physical cores this process may use).
    pub threads: Option<usize>,
    /// Memory budget; `None` uses the weights in place from the memory-mapped shards.
    pub budget: Option<Budget>,
    /// Context positions the plan reserves latent KV for (with a budget).
    pub ctx: usize,
    /// Use O_DIRECT reads where the filesystem supports them (streaming only).
    pub direct_io: bool,
    /// I/O threads for expert reads (streaming only).
    pub io_threads: usize,
    /// Replace the shard readers (fault-injection tests); `None` opens the shard files.
    pub readers: Option<streaming::Files>,
    /// Packed trunk directory (`trunk.bin` + `trunk.json` from `k3 pack`): trunk layers are
    /// read from it instead of the shards (streaming only).
    pub trunk_dir: Option<PathBuf>,
    /// Called with (pinned trunk bytes read, total to pin) while a budgeted open reads the
    /// pinned layers — for a progress bar.
    pub open_progress: Option<Arc<dyn Fn(u64, u64) + Send + Sync>>,
    /// Tokenizer directory (`tiktoken.model` + `tokenizer_config.json`, or `tokenizer.json`);
    /// `None` uses the model directory's when present.
    pub tokenizer_dir: Option<PathBuf>,
    /// Next-layer router lookahead: while a layer computes, read the experts the next
    /// layer's router predicts (streaming, pinned next layer only; same logits either way).
    /// Off by default: it won on one benchmark model and lost on the real-dims one
    /// (docs/PERFORMANCE.md "Router lookahead").
    pub lookahead: bool,
    /// At most this many tokens per prefill pass (`None`: the plan's chunk, or the whole call
    /// without a budget). Fewer tokens per pass use less scratch and read the unpinned trunk
    /// more often; the logits are the same.
    pub max_prefill_chunk: Option<usize>,
    /// Sessions whose carried state (KDA state + latent KV for `ctx`) the memory plan
    /// reserves at once (default 1; `k3 serve` passes `--parallel` plus its saved sessions).
    pub sessions: usize,
    /// Draft trunk directory (`k3 pack --draft-quant`) for hybrid drafting
    /// ([`DecodeMode::Hybrid`]); used as [`EngineOptions::draft_policy`] says.
    pub draft_trunk: Option<PathBuf>,
    /// Whether to load [`EngineOptions::draft_trunk`]; [`DraftPolicy::Off`] also leaves
    /// [`EngineOptions::draft_model`] out of the plan and memory (it is still checked).
    pub draft_policy: DraftPolicy,
    /// A DSpark draft model directory (docs/DSPARK.md) for block drafting
    /// ([`DecodeMode::Block`]); checked against the model at open (refused with the file and
    /// the key or tensor).
    pub draft_model: Option<PathBuf>,
    /// Most drafts one verifying pass carries, as planned (their journal is in the plan,
    /// docs/STREAMING.md#keeping-accepted-drafts; [`Engine::max_drafts`]); `None`: 4, or 7
    /// with a DSpark draft (`k3_plan::plan::DEFAULT_DRAFTS`, `BLOCK_DRAFTS`); `Some(0)`: no
    /// speculation (`--draft off`).
    pub max_drafts: Option<usize>,
    /// Run as one rank of a group (docs/DISTRIBUTED.md): trunk rows and routed experts are
    /// dealt across the group's ranks, logits stay bit-identical. `None`: one process. Every
    /// rank must open the same model and make the same calls in the same order.
    pub comm: Option<Arc<dyn k3_model::Comm>>,
}

/// When an engine loads its draft trunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DraftPolicy {
    /// Where [`planning::choose_draft`] predicts a gain (`--draft auto`).
    #[default]
    Auto,
    /// Always (`--draft hybrid`); refused when it does not fit the budget.
    On,
    /// Never (`--draft off` or an n-gram length).
    Off,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: None,
            budget: None,
            ctx: 4096,
            direct_io: true,
            io_threads: 4,
            readers: None,
            tokenizer_dir: None,
            trunk_dir: None,
            open_progress: None,
            lookahead: k3_model::LOOKAHEAD_DEFAULT,
            max_prefill_chunk: None,
            sessions: 1,
            draft_trunk: None,
            draft_policy: DraftPolicy::Auto,
            draft_model: None,
            max_drafts: None,
            comm: None,
            trunk_pieces: true,
        }
    }
}

/// The weight stores behind the model's two seams (one per engine, so the size difference
/// between the variants does not matter).
#[allow(clippy::large_enum_variant)]
enum Stores {
    Resident(ResidentStore),
    Streaming(StreamingStore),
}

/// An opened model: config, weights and the compute pool. Create sessions from it.
pub struct Engine {
    dir: PathBuf,
    config: K3Config,
    model: Model,
    stores: Stores,
    plan: Option<MemoryPlan>,
    max_prefill_chunk: Option<usize>,
    tokenizer: Option<Tokenizer>,
    /// Shared with a compressed trunk's decoder, which decodes chunk-parallel on it.
    pool: std::sync::Arc<rayon::ThreadPool>,
    /// The draft trunk, when hybrid drafting is on.
    draft: Option<draft::DraftTrunk>,
    /// What was decided about the draft trunk (`None`: none was given).
    draft_choice: Option<planning::DraftChoice>,
    /// The DSpark draft, when one was given.
    dspark: Option<dspark::DsparkDraft>,
    /// Bytes of one verifying pass (the block drafter's cost model).
    pass_cost: block::PassCost,
    /// The counting decorator around [`EngineOptions::comm`] (`None`: one process).
    comm_counter: Option<Arc<CountingComm>>,
    /// Scratch of ended sessions, for the next ones (never more than were alive at once).
    spare_scratch: std::sync::Mutex<Vec<k3_model::scratch::Scratch>>,
}

impl Engine {
    /// What was decided about the draft trunk given in [`EngineOptions::draft_trunk`]
    /// (`None` when none was given or `--draft` turned it off).
    pub fn draft_choice(&self) -> Option<&planning::DraftChoice> {
        self.draft_choice.as_ref()
    }

    /// The DSpark draft given in [`EngineOptions::draft_model`].
    pub fn dspark(&self) -> Option<&dspark::DsparkDraft> {
        self.dspark.as_ref()
    }

    /// Bytes of one verifying pass: the trunk (shared by its positions) and each position's
    /// routed experts (docs/STREAMING.md#dspark-block-drafts).
    pub fn pass_cost(&self) -> block::PassCost {
        self.pass_cost
    }

    /// `true` when a draft trunk is loaded ([`DecodeMode::Hybrid`] can run).
    pub fn has_draft(&self) -> bool {
        self.draft.is_some()
    }

    /// The loaded draft trunk: directory, quantization and bytes in memory.
    pub fn draft_info(&self) -> Option<(&Path, &'static str, u64)> {
        self.draft
            .as_ref()
            .map(|d| (d.dir(), d.quant().name(), d.bytes()))
    }

    /// The group this engine runs in (docs/DISTRIBUTED.md; rank 0 of 1 unless
    /// [`EngineOptions::comm`]).
    pub fn comm(&self) -> &Arc<dyn k3_model::Comm> {
        self.model.comm()
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The model's configuration.
    pub fn config(&self) -> &K3Config {
        &self.config
    }

    /// The tokenizer, when the model directory (or `tokenizer_dir`) has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// Number of compute threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Tokens per prefill pass: the plan's chunk (docs/STREAMING.md "Prefill chunks"), or
    /// the whole call when weights are used in place from the maps; capped by
    /// [`EngineOptions::max_prefill_chunk`].
    pub fn prefill_chunk(&self) -> usize {
        let planned = self
            .plan
            .as_ref()
            .map_or(usize::MAX, |p| p.prefill_chunk as usize);
        planned
            .min(self.max_prefill_chunk.unwrap_or(usize::MAX))
            .max(1)
    }

    /// Most drafts one verifying pass may carry: the plan's (its draft journal is planned for
    /// them, docs/STREAMING.md#keeping-accepted-drafts); unbounded without a plan.
    pub fn max_drafts(&self) -> usize {
        self.plan
            .as_ref()
            .map_or(usize::MAX, |p| p.request.drafts as usize)
    }

    /// The memory plan in force (`None` when weights are used in place from the maps).
    pub fn plan(&self) -> Option<&MemoryPlan> {
        self.plan.as_ref()
    }

    /// `true` when a forward pass reads trunk layers from disk (some layer is not pinned).
    pub fn streams_trunk(&self) -> bool {
        self.plan
            .as_ref()
            .is_some_and(|p| p.trunk.streamed_per_token > 0)
    }

    /// The decode mode `--draft auto` picks: hybrid drafting when a draft trunk is loaded
    /// (the engine loads one only where it predicts a gain), else speculative (prompt lookup) when the trunk
    /// streams — one pass then serves every accepted draft — else plain incremental, where
    /// a rejected draft would only cost compute (measurements: docs/PERFORMANCE.md).
    pub fn auto_decode_mode(&self) -> DecodeMode {
        if let Some(d) = &self.dspark {
            DecodeMode::Block(d.graph().config().block_size)
        } else if self.draft.is_some() {
            DecodeMode::Hybrid(Speculation::default())
        } else if self.streams_trunk() {
            DecodeMode::Speculative(Speculation::default())
        } else {
            DecodeMode::Incremental
        }
    }

    /// I/O counters of the streaming stores (zeros for the resident store).
    pub fn stats(&self) -> StoreStats {
        match &self.stores {
            Stores::Resident(_) => StoreStats::default(),
            Stores::Streaming(s) => s.stats(),
        }
    }

    /// Starts (`true`) or stops recording routed-expert requests (streaming only).
    pub fn record_expert_trace(&self, on: bool) {
        if let Stores::Streaming(s) = &self.stores {
            s.expert_store().set_trace(on);
        }
    }

    /// The recorded `(layer, expert)` requests since recording started.
    pub fn take_expert_trace(&self) -> Vec<(u32, u32)> {
        match &self.stores {
            Stores::Streaming(s) => s.expert_store().take_trace(),
            Stores::Resident(_) => Vec::new(),
        }
    }

    fn weights(&self) -> &dyn WeightProvider {
        match &self.stores {
            Stores::Resident(s) => s,
            Stores::Streaming(s) => s,
        }
    }

    fn experts(&self) -> &dyn ExpertProvider {
        match &self.stores {
            Stores::Resident(s) => s,
            Stores::Streaming(s) => s,
        }
    }

    /// Runs `f` with the weight and expert seams of the exact model, or (`draft`) of the
    /// draft model: the draft trunk's layers, the exact embedding and head, cache-only
    /// experts.
    pub(crate) fn with_seams<R>(
        &self,
        draft: bool,
        f: impl FnOnce(&dyn WeightProvider, &dyn ExpertProvider) -> R,
    ) -> Result<R, EngineError> {
        if !draft {
            return Ok(f(self.weights(), self.experts()));
        }
        let trunk = self.draft.as_ref().ok_or_else(|| {
            EngineError::Invalid(
                "hybrid drafting needs a draft trunk: pass --draft-trunk DIR (made by `k3 pack --draft-quant q8 MODEL_DIR DIR`)".into(),
            )
        })?;
        let (binding, experts) = match &self.stores {
            Stores::Resident(s) => (s.binding(), draft::CacheOnlyExperts::Resident(s)),
            Stores::Streaming(s) => (s.binding(), draft::CacheOnlyExperts::Streaming(s)),
        };
        let weights = draft::DraftWeights {
            trunk,
            binding,
            exact: self.weights(),
        };
        Ok(f(&weights, &experts))
    }

    /// An ended session's scratch, if any is kept.
    pub(crate) fn take_spare_scratch(&self) -> Option<k3_model::scratch::Scratch> {
        self.spare_scratch.lock().ok()?.pop()
    }
    /// Keeps an ended session's scratch for the next session. The pool only ever holds
    /// scratch that a live session held before, so it never outgrows the most sessions alive
    /// at once.
    pub(crate) fn give_back_scratch(&self, scratch: k3_model::scratch::Scratch) {
        if let Ok(mut spare) = self.spare_scratch.lock() {
            spare.push(scratch);
        }
    }

    /// A new conversation state able to hold `max_ctx` positions.
    pub fn new_session(&self, max_ctx: usize) -> Result<Session<'_>, EngineError> {
        if let Some(plan) = &self.plan {
            if max_ctx as u64 > plan.request.ctx {
                return Err(EngineError::Invalid(format!(
                    "a session of {max_ctx} positions exceeds the {} the memory plan reserved latent KV for: raise --ctx",
                    plan.request.ctx
                )));
            }
        }
        Session::new(self, max_ctx)
    }
}
/// Shard readers to use instead of the files (fault injection); one per shard, in order.
pub fn shard_readers(
    dir: &Path,
    direct: bool,
) -> Result<Vec<Arc<dyn k3_store::io::ReadAt>>, EngineError> {
    streaming::open_files(&Checkpoint::open(dir)?, direct)
}
