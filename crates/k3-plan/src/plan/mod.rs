//! The memory planner: from a budget (preset, explicit trunk/cache sizes, or a total) and
//! the model's sizes to a [`MemoryPlan`] — pinned layers, ring, expert-cache slots, fixed
//! costs — checked against the memory actually available.

mod avail;
mod codec;
mod error;
mod k3;
mod pin;
mod table;

pub use avail::{cgroup_v1_headroom, cgroup_v2_headroom, parse_meminfo, Available};
pub use codec::{CodecForecast, CodecRates};
pub use error::PlanError;
pub use k3::RELEASED_PREFILL_BYTES_PER_TOKEN;
pub use pin::{min_trunk_budget, plan_trunk, plan_trunk_with, LayerCost, PinStrategy, TrunkPlan};
pub use table::{fmt_bytes, fmt_seconds};

use std::fmt;
use std::str::FromStr;

/// Bytes per GB in every flag and report (decimal, like the upstream reports).
pub const GB: u64 = 1_000_000_000;

/// Rounds up to a multiple of 4096 (O_DIRECT granularity).
pub fn align4096(x: u64) -> u64 {
    x.div_ceil(4096) * 4096
}

/// Everything the planner needs to know about the model, as plain numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSizes {
    /// Per-layer packed trunk run, bytes (93 for the released model).
    pub layer_run_bytes: Vec<u64>,
    /// Per-layer widen area (wide f32 copies of bf16 vectors and the router gate), bytes.
    pub widen_bytes: Vec<u64>,
    /// Per-layer `[token-mixer piece, channel-mixer piece]` bytes when every layer's run
    /// splits into the two (docs/STREAMING.md#trunk-pieces); empty: whole layers only.
    pub layer_piece_bytes: Vec<[u64; 2]>,
    /// One routed expert's bytes (17,547,264).
    pub expert_bytes: u64,
    /// Experts per token per layer (16).
    pub top_k: u32,
    /// Routed experts in the whole model (for "% of the pool").
    pub n_routed_experts: u64,
    /// The head held in memory: `lm_head` and the final norms, bytes. The embedding is not
    /// held: a pass reads its tokens' rows (a few KB each) on demand.
    pub head_bytes: u64,
    /// Recurrent (KDA) state for all layers, bytes.
    pub kda_state_bytes: u64,
    /// Latent KV for all MLA layers per position, bytes.
    pub latent_kv_bytes_per_pos: u64,
    /// Activations, read buffers and other scratch of a one-token call, bytes.
    pub scratch_bytes: u64,
    /// Activation scratch each further token of a prefill chunk adds, bytes (every per-token
    /// buffer of every op, which all live at once).
    pub prefill_bytes_per_token: u64,
    /// What each draft of a verifying pass keeps until it is judged: its KDA journal rows
    /// over every KDA layer (`6·P + H` f32 a layer), bytes (docs/STREAMING.md#keeping-accepted-drafts).
    pub journal_bytes_per_draft: u64,
    /// One KDA layer's state, the copy a verifying pass's drafts run on, bytes.
    pub tentative_state_bytes: u64,
}

impl ModelSizes {
    /// Bytes a verifying pass of up to `drafts` drafts keeps (0 without drafts).
    pub fn draft_journal_bytes(&self, drafts: u64) -> u64 {
        match drafts {
            0 => 0,
            n => self.tentative_state_bytes + n * self.journal_bytes_per_draft,
        }
    }
    /// Per-layer costs for the pinning choice.
    pub fn layer_costs(&self) -> Vec<LayerCost> {
        let pieces = self.layer_piece_bytes.len() == self.layer_run_bytes.len();
        self.layer_run_bytes
            .iter()
            .zip(&self.widen_bytes)
            .enumerate()
            .map(|(l, (&r, &w))| match pieces {
                true => {
                    let [mixer, channel] = self.layer_piece_bytes[l];
                    LayerCost::with_pieces(r, w, mixer, channel)
                }
                false => LayerCost::new(r, w),
            })
            .collect()
    }

    /// Bytes of one expert-cache slot: the expert plus a 4096-byte margin at each end for
    /// O_DIRECT reads of an unaligned run, rounded to 4096.
    pub fn expert_slot_bytes(&self) -> u64 {
        align4096(self.expert_bytes + 2 * 4096)
    }

    /// Fewest legal expert-cache slots: top-k + 1.
    pub fn min_expert_slots(&self) -> u64 {
        u64::from(self.top_k) + 1
    }

    /// Trunk bytes that pin every layer.
    pub fn trunk_full_bytes(&self) -> u64 {
        self.layer_costs().iter().map(|l| l.pinned).sum()
    }
}

/// Longest prefill chunk the planner ever chooses, tokens. Past a few thousand tokens the
/// trunk read per chunk is a small share of the chunk's compute, so more scratch buys little.
pub const MAX_PREFILL_CHUNK: u64 = 4096;

/// Share of the budget a prefill chunk's scratch may take: 1/8. At released dims
/// (1.96 MB of scratch per token, docs/STREAMING.md "Prefill chunks") the laptop preset
/// then prefills 256 tokens per trunk pass and `--mem-gb 16` 1,023.
pub const PREFILL_SHARE_DIVISOR: u64 = 8;

/// The prefill chunk for a budget and a context of `ctx`: the most tokens whose further
/// scratch fits an eighth of the budget (trunk + cache for a preset or split, the total for
/// `--mem-gb`, where it also never takes what the smallest plan needs), at least 1, at most
/// `ctx` and [`MAX_PREFILL_CHUNK`].
pub fn prefill_chunk(sizes: &ModelSizes, budget: Budget, ctx: u64) -> u64 {
    prefill_chunk_for(sizes, &PlanRequest::new(budget, ctx))
}

/// The smallest plan's bytes for `req` without a draft journal: fixed costs, one ring slot
/// and the minimum expert cache.
fn smallest_without_journal(sizes: &ModelSizes, req: &PlanRequest) -> u64 {
    let (kda_state, kv) = req.session_bytes(sizes);
    sizes.head_bytes
        + req.draft_trunk_bytes
        + kda_state
        + kv
        + sizes.scratch_bytes
        + min_trunk_budget(&sizes.layer_costs())
        + sizes.min_expert_slots() * sizes.expert_slot_bytes()
}

/// The drafts a verifying pass is planned for: `req.drafts`, or under a `--mem-gb` total
/// too small for their journal as many as it holds (down to none: a tight total drafts less
/// rather than being refused).
pub fn fitted_drafts(sizes: &ModelSizes, req: &PlanRequest) -> u64 {
    let Budget::Total(total) = req.budget else {
        return req.drafts;
    };
    let slack = total.saturating_sub(smallest_without_journal(sizes, req));
    let room = slack.saturating_sub(sizes.tentative_state_bytes);
    req.drafts.min(room / sizes.journal_bytes_per_draft.max(1))
}

/// [`prefill_chunk`] for a whole request (its sessions' state counts as fixed cost).
pub fn prefill_chunk_for(sizes: &ModelSizes, req: &PlanRequest) -> u64 {
    let (budget, ctx) = (req.budget, req.ctx);
    let req = &req.with_drafts(fitted_drafts(sizes, req));
    let journal = sizes.draft_journal_bytes(req.drafts);
    let share = match budget {
        Budget::Preset(p) => (p.gb().0 + p.gb().1) * GB / PREFILL_SHARE_DIVISOR,
        Budget::Split { trunk, cache } => trunk.saturating_add(cache) / PREFILL_SHARE_DIVISOR,
        Budget::Total(total) => {
            let smallest = smallest_without_journal(sizes, req) + journal;
            (total / PREFILL_SHARE_DIVISOR).min(total.saturating_sub(smallest))
        }
    };
    // A verifying pass's journal comes out of the share when the share can spare it and
    // still carry every draft; else it is a cost on top, so small budgets keep their chunk.
    let per_token = sizes.prefill_bytes_per_token.max(1);
    let spare = journal + req.drafts * per_token;
    let share = if journal > 0 && share >= spare {
        share - journal
    } else {
        share
    };
    let further = share / per_token;
    (further + 1).min(ctx).clamp(1, MAX_PREFILL_CHUNK)
}

/// Named budgets (trunk GB / expert-cache GB), as upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// 3 / 1: the floor.
    Laptop,
    /// 16 / 10.
    Desktop,
    /// 60 / 30.
    Workstation,
    /// 110 / 13: almost the whole trunk pinned.
    Server,
    /// 110 / 109.
    Max,
}

impl Preset {
    /// All presets, smallest first.
    pub const ALL: [Preset; 5] = [
        Preset::Laptop,
        Preset::Desktop,
        Preset::Workstation,
        Preset::Server,
        Preset::Max,
    ];

    /// (trunk GB, expert-cache GB).
    pub fn gb(self) -> (u64, u64) {
        match self {
            Preset::Laptop => (3, 1),
            Preset::Desktop => (16, 10),
            Preset::Workstation => (60, 30),
            Preset::Server => (110, 13),
            Preset::Max => (110, 109),
        }
    }

    /// The preset's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Laptop => "laptop",
            Preset::Desktop => "desktop",
            Preset::Workstation => "workstation",
            Preset::Server => "server",
            Preset::Max => "max",
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, PlanError> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| PlanError::UnknownPreset(s.to_string()))
    }
}

/// How the user sized memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// `--preset NAME`.
    Preset(Preset),
    /// `--trunk-gb X --cache-gb Y`, in bytes.
    Split {
        /// Trunk budget (pinned layers + ring), bytes.
        trunk: u64,
        /// Expert-cache budget, bytes.
        cache: u64,
    },
    /// `--mem-gb TOTAL`, bytes: fixed costs first, then the trunk takes what it can use,
    /// the expert cache the rest.
    Total(u64),
}

/// A planning request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanRequest {
    /// The budget.
    pub budget: Budget,
    /// Context length to reserve latent KV for, positions.
    pub ctx: u64,
    /// Ring slots wanted when streaming (2: one computing, one being read).
    pub ring_slots: usize,
    /// Sessions whose carried state (KDA state + latent KV for `ctx`) is reserved at once:
    /// 1 for `run`/`chat`, the server's `--parallel` plus its saved sessions.
    pub sessions: u64,
    /// Bytes of a draft trunk held in memory for hybrid drafting (0: none). It is a fixed
    /// cost like the sessions' state — on top of a preset or `--trunk-gb/--cache-gb`, taken
    /// out of a `--mem-gb` total before the trunk pins — and the draft model's own state
    /// (one more session) is reserved with it (docs/STREAMING.md#hybrid-drafting). With
    /// [`DraftKind::Block`] these are a DSpark draft's weights and context KV instead, and no
    /// further session is reserved.
    pub draft_trunk_bytes: u64,
    /// What the held draft is: a draft trunk (its own session state) or a DSpark block draft.
    pub draft_kind: DraftKind,
    /// The form a DSpark block draft's weights are held in (`bf16`, `q8`, `mxfp4`), shown
    /// in the plan's draft row.
    pub draft_form: &'static str,
    /// Most drafts one verifying pass carries ([`DEFAULT_DRAFTS`]: the n-gram drafts
    /// `--draft auto` runs when the trunk streams; 0: no speculation); their journal comes
    /// out of the share of the budget that a prefill chunk's further tokens take when that
    /// share can spare it and still carry every draft ([`prefill_chunk_for`]), else on top.
    /// A plan's request holds the drafts it planned ([`fitted_drafts`]), which the engine
    /// never exceeds.
    pub drafts: u64,
}

/// Drafts a verifying pass is planned for unless told: the n-gram drafter's 4.
pub const DEFAULT_DRAFTS: u64 = 4;

/// Drafts a verifying pass is planned for with a DSpark block draft: a published block's 7.
pub const BLOCK_DRAFTS: u64 = 7;

/// The kind of draft a plan holds beside the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftKind {
    /// A quantized copy of the trunk run as a second model: it carries its own KDA state
    /// and latent KV, one more session (docs/STREAMING.md#hybrid-drafting).
    #[default]
    Trunk,
    /// A DSpark block draft (docs/STREAMING.md#dspark-block-drafts): its weights and its
    /// context KV (`layers × (kv_lora + rope) × 4` bytes per position) are all it holds; it
    /// reads the target's hidden states and runs no session of its own.
    Block,
}

impl PlanRequest {
    /// A request for one session with the default 2-slot ring.
    pub fn new(budget: Budget, ctx: u64) -> Self {
        Self {
            budget,
            ctx,
            ring_slots: 2,
            sessions: 1,
            draft_trunk_bytes: 0,
            draft_kind: DraftKind::Trunk,
            draft_form: "bf16",
            drafts: DEFAULT_DRAFTS,
        }
    }

    /// The same request planning verifying passes of up to `n` drafts (0: none).
    pub fn with_drafts(mut self, n: u64) -> Self {
        self.drafts = n;
        self
    }

    /// The same request with a draft trunk of `bytes` in memory (and its model's state).
    pub fn with_draft(mut self, bytes: u64) -> Self {
        self.draft_trunk_bytes = bytes;
        self.draft_kind = DraftKind::Trunk;
        self
    }

    /// The same request with a DSpark block draft holding `bytes` (its weights and every
    /// reserved session's context KV): a fixed cost like a draft trunk, but no session state;
    /// its verifying passes are planned for [`BLOCK_DRAFTS`] drafts.
    pub fn with_block_draft(mut self, bytes: u64) -> Self {
        self.draft_trunk_bytes = bytes;
        self.draft_kind = DraftKind::Block;
        self.drafts = self.drafts.max(BLOCK_DRAFTS);
        self
    }

    /// [`Self::with_block_draft`] with the weights held in `form` (`bf16`, `q8`, `mxfp4`).
    pub fn with_block_draft_as(self, bytes: u64, form: &'static str) -> Self {
        let mut req = self.with_block_draft(bytes);
        req.draft_form = form;
        req
    }

    /// Sessions whose state is reserved, counting a draft trunk's model when there is one.
    pub fn states(&self) -> u64 {
        let draft_session = self.draft_trunk_bytes > 0 && self.draft_kind == DraftKind::Trunk;
        self.sessions.max(1) + u64::from(draft_session)
    }

    /// The same request reserving state for `n` sessions (at least 1).
    pub fn with_sessions(mut self, n: u64) -> Self {
        self.sessions = n.max(1);
        self
    }

    /// Carried state of every reserved session: `(KDA state, latent KV)` bytes.
    pub fn session_bytes(&self, sizes: &ModelSizes) -> (u64, u64) {
        let n = self.states();
        (
            sizes.kda_state_bytes * n,
            sizes.latent_kv_bytes_per_pos * self.ctx * n,
        )
    }
}

/// The plan: where every byte goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The request it answers.
    pub request: PlanRequest,
    /// Trunk: pinned layers and ring.
    pub trunk: TrunkPlan,
    /// Layers in the model.
    pub n_layers: usize,
    /// Expert-cache slots.
    pub expert_slots: u64,
    /// Bytes per expert-cache slot.
    pub expert_slot_bytes: u64,
    /// Routed experts in the model.
    pub n_routed_experts: u64,
    /// The head: `lm_head` and the final norms, bytes (embedding rows are read on demand).
    pub head_bytes: u64,
    /// KDA state of every reserved session, bytes.
    pub kda_state_bytes: u64,
    /// Latent KV for `request.ctx` positions of every reserved session, bytes.
    pub latent_kv_bytes: u64,
    /// Scratch of a one-token call, bytes.
    pub scratch_bytes: u64,
    /// Tokens per prefill pass: a longer prompt is fed in chunks of this many, each reading
    /// the unpinned trunk once and each routed expert of its union once.
    pub prefill_chunk: u64,
    /// Scratch the chunk's further tokens add, bytes.
    pub prefill_scratch_bytes: u64,
    /// What a verifying pass's drafts keep until judged (their KDA journal and one layer's
    /// state copy), bytes (0: no speculation planned).
    pub draft_journal_bytes: u64,
    /// Draft trunk held in memory for hybrid drafting, bytes (0: none).
    pub draft_trunk_bytes: u64,
}

impl MemoryPlan {
    /// Bytes of the expert cache.
    pub fn expert_cache_bytes(&self) -> u64 {
        self.expert_slots * self.expert_slot_bytes
    }

    /// Everything the plan allocates.
    pub fn total_bytes(&self) -> u64 {
        self.trunk.total_bytes()
            + self.head_bytes
            + self.expert_cache_bytes()
            + self.kda_state_bytes
            + self.latent_kv_bytes
            + self.scratch_bytes
            + self.prefill_scratch_bytes
            + self.draft_journal_bytes
            + self.draft_trunk_bytes
    }

    /// Refuses (with the table and what to change) when the plan exceeds `available`.
    pub fn check(&self, sizes: &ModelSizes, available: &Available) -> Result<(), PlanError> {
        match available.bytes() {
            Some(a) if self.total_bytes() > a => Err(error::does_not_fit(self, sizes, available)),
            _ => Ok(()),
        }
    }
}

/// Plans memory for `sizes` under `req`. Errors name the flag to change and by how much.
pub fn plan(sizes: &ModelSizes, req: &PlanRequest) -> Result<MemoryPlan, PlanError> {
    let req = &req.with_drafts(fitted_drafts(sizes, req));
    let layers = sizes.layer_costs();
    let (kda_state, kv) = req.session_bytes(sizes);
    let chunk = prefill_chunk_for(sizes, req);
    let prefill = (chunk - 1) * sizes.prefill_bytes_per_token;
    let journal = sizes.draft_journal_bytes(req.drafts);
    let fixed = kda_state + kv + prefill + journal + req.draft_trunk_bytes;
    let (trunk, cache) = split_budget(sizes, req.budget, &layers, fixed)?;
    let trunk_plan =
        plan_trunk(&layers, trunk, req.ring_slots).ok_or_else(|| PlanError::TrunkTooSmall {
            budget: trunk,
            need: min_trunk_budget(&layers),
            flag: flag(req.budget, "--trunk-gb"),
        })?;
    let cache = match req.budget {
        Budget::Total(_) => cache - trunk_plan.total_bytes(),
        _ => cache,
    };
    let slot = sizes.expert_slot_bytes();
    // More slots than routed experts would never be filled: cap at the pool.
    let expert_slots = (cache / slot).min(sizes.n_routed_experts.max(sizes.min_expert_slots()));
    if expert_slots < sizes.min_expert_slots() {
        return Err(PlanError::CacheTooSmall {
            budget: cache,
            slots: expert_slots,
            min_slots: sizes.min_expert_slots(),
            need: sizes.min_expert_slots() * slot,
            flag: flag(req.budget, "--cache-gb"),
        });
    }
    Ok(MemoryPlan {
        request: *req,
        trunk: trunk_plan,
        n_layers: layers.len(),
        expert_slots,
        expert_slot_bytes: slot,
        n_routed_experts: sizes.n_routed_experts,
        head_bytes: sizes.head_bytes,
        kda_state_bytes: kda_state,
        latent_kv_bytes: kv,
        scratch_bytes: sizes.scratch_bytes,
        prefill_chunk: chunk,
        prefill_scratch_bytes: prefill,
        draft_journal_bytes: journal,
        draft_trunk_bytes: req.draft_trunk_bytes,
    })
}

/// (trunk budget, cache budget). For a total: fixed costs (with `per_session`, every
/// session's KDA state and latent KV, the prefill scratch and any draft trunk) first, then the trunk gets what it can use while leaving the minimum
/// cache; the cache budget returned is everything after fixed costs (the caller subtracts
/// what the trunk plan actually takes).
fn split_budget(
    sizes: &ModelSizes,
    budget: Budget,
    layers: &[LayerCost],
    per_session: u64,
) -> Result<(u64, u64), PlanError> {
    match budget {
        Budget::Preset(p) => Ok((p.gb().0 * GB, p.gb().1 * GB)),
        Budget::Split { trunk, cache } => Ok((trunk, cache)),
        Budget::Total(total) => {
            let fixed = sizes.head_bytes + per_session + sizes.scratch_bytes;
            let rest = total.saturating_sub(fixed);
            let min_trunk = min_trunk_budget(layers);
            let min_cache = sizes.min_expert_slots() * sizes.expert_slot_bytes();
            if rest < min_trunk + min_cache {
                return Err(PlanError::TotalTooSmall {
                    total,
                    need: fixed + min_trunk + min_cache,
                });
            }
            Ok((sizes.trunk_full_bytes().min(rest - min_cache), rest))
        }
    }
}

/// The flag a user should change: `--mem-gb` for a total budget, else `explicit`.
fn flag(budget: Budget, explicit: &'static str) -> &'static str {
    match budget {
        Budget::Total(_) => "--mem-gb",
        _ => explicit,
    }
}
