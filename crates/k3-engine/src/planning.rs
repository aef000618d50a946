//! From a bound checkpoint to the planner's inputs: real per-layer trunk run sizes, widen
//! areas, expert size, head, KDA state and latent-KV sizes.

use crate::EngineError;
use k3_format::{K3Config, ModelBinding};
use k3_plan::{Budget, MemoryPlan, ModelSizes, PlanRequest};
use k3_store::available_memory;

pub use crate::spec_shares::{rank_sizes_of_config, spec_tensors};

/// Bytes per f32.
const F32: u64 = 4;

/// The planner's view of this checkpoint.
pub fn model_sizes(cfg: &K3Config, b: &ModelBinding) -> Result<ModelSizes, EngineError> {
    let mut layer_run_bytes = Vec::with_capacity(b.layers.len());
    let mut widen_bytes = Vec::with_capacity(b.layers.len());
    for lt in &b.layers {
        // A non-contiguous layer is gathered tensor by tensor: it costs its tensors' bytes.
        layer_run_bytes.push(
            lt.trunk_run()
                .map(|r| r.len())
                .unwrap_or_else(|_| lt.trunk_bytes()),
        );
        // Vectors are widened to f32 per bind; matrices are used in place.
        let (vecs, _) = crate::layer_view::layer_tensors(lt);
        widen_bytes.push(vecs.iter().map(|t| t.numel() as u64 * F32).sum());
    }
    let g = &b.globals;
    let head_bytes = g.lm_head.nbytes
        + (g.norm.numel() + g.output_attn_res_norm.numel() + g.output_attn_res_proj.numel()) as u64
            * F32;
    let n_kda = (0..cfg.num_hidden_layers)
        .filter(|&l| cfg.is_kda(l))
        .count() as u64;
    let n_mla = cfg.num_hidden_layers as u64 - n_kda;
    let p = cfg.kda_proj() as u64;
    let kda_per_layer = (cfg.kda_num_heads * cfg.kda_head_dim * cfg.kda_head_dim) as u64
        + 3 * p * (cfg.short_conv_kernel_size as u64 - 1);
    let widest = [
        cfg.hidden_size,
        cfg.kda_proj(),
        cfg.intermediate_size,
        cfg.num_attention_heads * cfg.mla_qk_head(),
        cfg.num_experts,
    ]
    .into_iter()
    .max()
    .unwrap_or(0) as u64;
    Ok(ModelSizes {
        layer_run_bytes,
        widen_bytes,
        expert_bytes: b.experts.expert_bytes(),
        top_k: cfg.num_experts_per_token as u32,
        n_routed_experts: b.experts.len() as u64,
        head_bytes,
        layer_piece_bytes: crate::pieces::piece_bytes(b),
        kda_state_bytes: kda_per_layer * n_kda * F32,
        latent_kv_bytes_per_pos: n_mla * cfg.mla_kv_a_width() as u64 * F32,
        // Logits, per-token activations (a few dozen vectors of the widest width) and the
        // per-expert output buffers of one MoE layer.
        scratch_bytes: (2 * cfg.vocab_size as u64
            + 64 * widest
            + (cfg.num_experts_per_token * cfg.routed_expert_hidden_size) as u64)
            * F32,
        prefill_bytes_per_token: k3_model::scratch::Scratch::bytes_per_token(&k3_model::Dims::new(
            cfg,
        )?),
        journal_bytes_per_draft: n_kda * (6 * p + cfg.kda_num_heads as u64) * F32,
        tentative_state_bytes: kda_per_layer * F32,
    })
}

/// The planner's view of what rank `rank` of `size` holds (docs/DISTRIBUTED.md#memory-per-rank):
/// the sizes of its share binding (`crate::rank_share`: every trunk layer and `lm_head` cut to
/// the rank's rows), with the expert cache capped at the routed experts it owns. `b` is the
/// whole binding; with `size == 1` this is [`model_sizes`].
pub fn rank_sizes(
    cfg: &K3Config,
    b: &ModelBinding,
    rank: usize,
    size: usize,
) -> Result<ModelSizes, EngineError> {
    if size <= 1 {
        return model_sizes(cfg, b);
    }
    let share = crate::rank_share::share_binding(b, rank, size)?;
    let mut sizes = model_sizes(cfg, &share)?;
    sizes.n_routed_experts = crate::rank_share::owned_experts(b, rank, size);
    let heads_share = |whole| kda_state_share(cfg, whole, rank, size);
    sizes.kda_state_bytes = heads_share(sizes.kda_state_bytes);
    sizes.journal_bytes_per_draft = heads_share(sizes.journal_bytes_per_draft);
    sizes.tentative_state_bytes = heads_share(sizes.tentative_state_bytes);
    Ok(sizes)
}

/// A rank's part of the KDA state (`whole` bytes for all heads): every byte of the state
/// (recurrent matrices and conv histories) belongs to one head, and a rank holds its heads'
/// (`k3_model::share::Split::Heads`, docs/DISTRIBUTED.md#the-seam); the same holds for the
/// draft journal and the tentative state copy, which are per KDA head too.
pub(crate) fn kda_state_share(cfg: &K3Config, whole: u64, rank: usize, size: usize) -> u64 {
    let heads = cfg.kda_num_heads;
    if heads == 0 || size <= 1 {
        return whole;
    }
    let mine = k3_model::share::Split::Heads(heads).rows(heads, rank, size);
    whole / heads as u64 * mine.len() as u64
}

/// Plans memory for `budget` and a context of `ctx` positions, and refuses (exit 2, with the
/// plan table and what to change) when it does not fit this machine's available memory.
/// `sizes` are the model's ([`model_sizes`]) or one rank's ([`rank_sizes`]).
pub fn plan_checked(
    sizes: &ModelSizes,
    budget: Budget,
    options: &crate::EngineOptions,
    draft_trunk_bytes: u64,
) -> Result<MemoryPlan, EngineError> {
    let sizes = sizes.clone();
    let req = PlanRequest::new(budget, options.ctx as u64)
        .with_sessions(options.sessions as u64)
        .with_draft(draft_trunk_bytes);
    let req = with_planned_drafts(req, options);
    let plan = k3_plan::plan::plan(&sizes, &req)?;
    plan.check(&sizes, &available_memory())?;
    Ok(plan)
}

/// `req` with the drafts `options` ask for ([`crate::EngineOptions::max_drafts`]), when
/// they ask.
pub(crate) fn with_planned_drafts(req: PlanRequest, options: &crate::EngineOptions) -> PlanRequest {
    match options.max_drafts {
        Some(n) => req.with_drafts(n as u64),
        None => req,
    }
}

/// What `k3 plan` prints: the plan for `dir` under `budget` without reading any weight, and
/// whether it fits this machine (`Err` carries the refusal).
/// `draft_trunk_bytes` > 0 plans a draft trunk of that size too (hybrid drafting).
pub fn forecast(
    dir: &std::path::Path,
    budget: Budget,
    ctx: usize,
    sessions: usize,
    draft_trunk_bytes: u64,
) -> Result<(MemoryPlan, k3_plan::Available, Result<(), EngineError>), EngineError> {
    forecast_rank(dir, budget, ctx, sessions, draft_trunk_bytes, (0, 1))
}

/// [`forecast`] for rank `group.0` of `group.1` ([`rank_sizes`]; `(0, 1)`: one process).
pub fn forecast_rank(
    dir: &std::path::Path,
    budget: Budget,
    ctx: usize,
    sessions: usize,
    draft_trunk_bytes: u64,
    group: (usize, usize),
) -> Result<(MemoryPlan, k3_plan::Available, Result<(), EngineError>), EngineError> {
    let req = PlanRequest::new(budget, ctx as u64)
        .with_sessions(sessions as u64)
        .with_draft(draft_trunk_bytes);
    forecast_request(dir, &req, group)
}

/// [`forecast`] with a DSpark block draft holding `draft_bytes` (its weights and context KV;
/// no session of its own, docs/STREAMING.md#dspark-block-drafts).
pub fn forecast_block_draft(
    dir: &std::path::Path,
    budget: Budget,
    ctx: usize,
    sessions: usize,
    draft_bytes: u64,
) -> Result<(MemoryPlan, k3_plan::Available, Result<(), EngineError>), EngineError> {
    forecast_block_draft_as(dir, budget, ctx, sessions, draft_bytes, "bf16")
}

/// [`forecast_block_draft`] with the draft's weights held in `form` (`bf16`, `q8`, `mxfp4`;
/// named in the plan's draft row).
pub fn forecast_block_draft_as(
    dir: &std::path::Path,
    budget: Budget,
    ctx: usize,
    sessions: usize,
    draft_bytes: u64,
    form: &'static str,
) -> Result<(MemoryPlan, k3_plan::Available, Result<(), EngineError>), EngineError> {
    let req = PlanRequest::new(budget, ctx as u64)
        .with_sessions(sessions as u64)
        .with_block_draft_as(draft_bytes, form);
    forecast_request(dir, &req, (0, 1))
}

/// [`forecast`] of a run streaming its trunk from `pack`: a compressed pack's staging
/// buffers are counted with the scratch, as the engine counts them.
pub fn forecast_pack(
    dir: &std::path::Path,
    budget: Budget,
    ctx: usize,
    sessions: usize,
    pack: Option<&k3_format::TrunkPack>,
) -> Result<(MemoryPlan, k3_plan::Available, Result<(), EngineError>), EngineError> {
    let req = PlanRequest::new(budget, ctx as u64).with_sessions(sessions as u64);
    let staging = pack.map_or(0, staging_bytes);
    forecast_sized(dir, &req, (0, 1), staging)
}

/// Bytes of a compressed pack's two staging buffers (each the largest stored run, aligned:
/// the next run is read into one while the other decodes, docs/STREAMING.md#overlapped-decode);
/// 0 for a plain pack.
pub fn staging_bytes(pack: &k3_format::TrunkPack) -> u64 {
    match pack.is_compressed() {
        true => 2 * (pack.max_stored_bytes().div_ceil(4096) * 4096 + 4096),
        false => 0,
    }
}

fn forecast_request(
    dir: &std::path::Path,
    req: &PlanRequest,
    group: (usize, usize),
) -> Result<(MemoryPlan, k3_plan::Available, Result<(), EngineError>), EngineError> {
    forecast_sized(dir, req, group, 0)
}

/// [`forecast_request`] with `extra_scratch` bytes more scratch.
fn forecast_sized(
    dir: &std::path::Path,
    req: &PlanRequest,
    group: (usize, usize),
    extra_scratch: u64,
) -> Result<(MemoryPlan, k3_plan::Available, Result<(), EngineError>), EngineError> {
    let cfg = K3Config::load(dir.join("config.json"))?;
    let ckpt = k3_format::Checkpoint::open(dir)?;
    let binding = k3_format::bind_model(&ckpt, &cfg)?;
    let mut sizes = rank_sizes(&cfg, &binding, group.0, group.1)?;
    sizes.scratch_bytes += extra_scratch;
    let plan = k3_plan::plan::plan(&sizes, req)?;
    let available = available_memory();
    let fits = plan.check(&sizes, &available).map_err(EngineError::from);
    Ok((plan, available, fits))
}

/// The smallest legal budget for `dir`'s model (nothing pinned, one ring slot, top-k + 1
/// expert slots) and the budget that holds everything, as explicit splits.
pub fn budget_extremes(dir: &std::path::Path) -> Result<(Budget, Budget), EngineError> {
    budget_extremes_rank(dir, 0, 1)
}

/// Largest extra trunk streaming per pass that `--draft auto` accepts for hybrid drafting,
/// as a share of plain decoding's: 10 %. Holding the draft trunk may unpin exact layers
/// (`--mem-gb`); with drafts all rejected the adaptive draft length pauses drafting, and the
/// worst case is then this much more streaming per token (docs/STREAMING.md#hybrid-drafting).
pub const AUTO_DRAFT_MAX_EXTRA_STREAMING: f64 = 0.10;

/// What `--draft auto` decided about hybrid drafting, and why (printed on stderr and by
/// `k3 plan --draft-trunk`).
#[derive(Clone, Debug, PartialEq)]
pub struct DraftChoice {
    /// Hybrid drafting is on.
    pub on: bool,
    /// One line: the numbers behind the decision.
    pub why: String,
    /// Trunk bytes streamed per pass without the draft trunk (`None`: no budget).
    pub plain_streamed: Option<u64>,
    /// Trunk bytes streamed per pass with the draft trunk held (`None`: it does not fit).
    pub hybrid_streamed: Option<u64>,
}

impl DraftChoice {
    /// `--draft hybrid`: on whatever the plan says (`hybrid_streamed` when there is a plan).
    pub fn forced(dir: &std::path::Path, hybrid_streamed: Option<u64>) -> DraftChoice {
        DraftChoice {
            on: true,
            why: format!("--draft hybrid with {}", dir.display()),
            plain_streamed: None,
            hybrid_streamed,
        }
    }

    /// `--draft auto` without a memory budget: off.
    pub fn no_budget() -> DraftChoice {
        DraftChoice {
            on: false,
            why: "no memory budget: the weights are used in place and no trunk layer streams, so a draft would only add compute".into(),
            plain_streamed: None,
            hybrid_streamed: None,
        }
    }
}

/// Decides hybrid drafting from the plans without and with the draft trunk: on only when
/// the exact trunk streams (a verifying pass then serves every accepted draft for one trunk
/// read), a verifying pass can hold more than one token, and holding the draft costs at most
/// [`AUTO_DRAFT_MAX_EXTRA_STREAMING`] more streaming per pass. `hybrid` carries the refusal
/// when the draft does not fit.
pub fn choose_draft(plain: &MemoryPlan, hybrid: Result<&MemoryPlan, &EngineError>) -> DraftChoice {
    let gb = k3_plan::plan::fmt_bytes;
    let s0 = plain.trunk.streamed_per_token;
    let hybrid = match hybrid {
        Ok(h) => h,
        Err(e) => {
            return DraftChoice {
                on: false,
                why: format!("the draft trunk does not fit this budget: {e}"),
                plain_streamed: Some(s0),
                hybrid_streamed: None,
            }
        }
    };
    let s1 = hybrid.trunk.streamed_per_token;
    let (on, why) = if hybrid.prefill_chunk < 2 {
        (
            false,
            "the budget leaves room for one token per pass: no draft could be verified".to_string(),
        )
    } else if s0 == 0 {
        (
            false,
            "every trunk layer is pinned: a verifying pass would save no trunk read".to_string(),
        )
    } else if s1 as f64 > s0 as f64 * (1.0 + AUTO_DRAFT_MAX_EXTRA_STREAMING) {
        (false, format!(
            "holding the {} draft trunk unpins exact layers: {} streamed per pass instead of {} (needs {:.2} tokens per pass to break even)",
            gb(hybrid.draft_trunk_bytes), gb(s1), gb(s0), s1 as f64 / s0 as f64
        ))
    } else {
        (true, format!(
            "the trunk streams {} per pass ({} without the draft trunk): every accepted draft saves a pass",
            gb(s1), gb(s0)
        ))
    };
    DraftChoice {
        on,
        why,
        plain_streamed: Some(s0),
        hybrid_streamed: Some(s1),
    }
}

/// [`budget_extremes`] for rank `rank` of `size` ([`rank_sizes`]): the smallest legal split
/// and the split that pins its whole share with a cache for every expert it owns.
pub fn budget_extremes_rank(
    dir: &std::path::Path,
    rank: usize,
    size: usize,
) -> Result<(Budget, Budget), EngineError> {
    let cfg = K3Config::load(dir.join("config.json"))?;
    let ckpt = k3_format::Checkpoint::open(dir)?;
    let sizes = rank_sizes(&cfg, &k3_format::bind_model(&ckpt, &cfg)?, rank, size)?;
    let slot = sizes.expert_slot_bytes();
    let smallest = Budget::Split {
        trunk: k3_plan::plan::min_trunk_budget(&sizes.layer_costs()),
        cache: sizes.min_expert_slots() * slot,
    };
    let everything = Budget::Split {
        trunk: sizes.trunk_full_bytes(),
        cache: sizes.n_routed_experts.max(sizes.min_expert_slots()) * slot,
    };
    Ok((smallest, everything))
}

/// The smallest split budget whose trunk streams through a ring of pieces
/// (docs/STREAMING.md#trunk-pieces): one slot per piece class, nothing pinned, the fewest
/// expert slots. `None` when some layer of the model cannot be split into pieces.
pub fn piece_ring_budget(dir: &std::path::Path) -> Result<Option<Budget>, EngineError> {
    let cfg = K3Config::load(dir.join("config.json"))?;
    let ckpt = k3_format::Checkpoint::open(dir)?;
    let sizes = model_sizes(&cfg, &k3_format::bind_model(&ckpt, &cfg)?)?;
    let costs = sizes.layer_costs();
    let Some(pieces) = costs.iter().map(|c| c.pieces).collect::<Option<Vec<_>>>() else {
        return Ok(None);
    };
    let ring: u64 = (0..2)
        .map(|i| pieces.iter().map(|p| p[i]).max().unwrap_or(0))
        .sum();
    Ok(Some(Budget::Split {
        trunk: ring,
        cache: sizes.min_expert_slots() * sizes.expert_slot_bytes(),
    }))
}

/// What one decoded token exchanges between `ranks` ranks (`k3_model::dist_cost`): the
/// one-token pass's all-gathers plus the broadcast of the sampled id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TokenExchange {
    /// Collective calls every rank makes per token.
    pub collectives: u64,
    /// Bytes gathered per token, summed over ranks.
    pub bytes_total: u64,
    /// Bytes one rank receives per token (an even share of the gathers).
    pub bytes_received_per_rank: u64,
}

/// [`TokenExchange`] of `cfg`'s model over `ranks` ranks (zeros for one).
pub fn decode_exchange(cfg: &K3Config, ranks: usize) -> Result<TokenExchange, EngineError> {
    let dims = k3_model::Dims::new(cfg)?;
    let (pass, broadcast) = k3_model::dist_cost::decode_token_cost(&dims, ranks);
    Ok(TokenExchange {
        collectives: pass.collectives + u64::from(broadcast > 0),
        bytes_total: pass.bytes() + broadcast,
        // a follower receives rank 0's id too
        bytes_received_per_rank: pass.bytes_received_per_rank(ranks) + broadcast,
    })
}

/// The block drafter's cost model (docs/STREAMING.md#dspark-block-drafts): a verifying pass
/// reads the trunk once (every layer's run, streamed or in memory) whatever its positions,
/// and in every MoE layer the union of its positions' routed experts — `top_k` of
/// `n_experts` each, routed independently (`block::Routing`), so `m` positions read
/// `n_experts·(1 − (1 − top_k/n_experts)^m)` experts per layer, not `m·top_k`.
pub fn pass_cost(cfg: &K3Config, b: &ModelBinding) -> Result<crate::block::PassCost, EngineError> {
    let sizes = model_sizes(cfg, b)?;
    let dims = k3_model::Dims::new(cfg)?;
    let moe_layers = dims.dense.iter().filter(|&&d| !d).count();
    let one_position = (dims.topk as u64 * moe_layers as u64 * sizes.expert_bytes) as f64;
    Ok(crate::block::PassCost::bytes_only(
        sizes.layer_run_bytes.iter().sum::<u64>() as f64,
        one_position,
    )
    .with_routing(crate::block::Routing::independent(
        dims.n_experts,
        dims.topk,
    )))
}
