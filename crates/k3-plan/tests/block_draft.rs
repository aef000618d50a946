//! A DSpark block draft in the plan (docs/STREAMING.md#dspark-block-drafts): its weights and
//! context KV are a fixed cost, and unlike a draft trunk it reserves no session of its own.

use k3_plan::plan::{plan, BLOCK_DRAFTS, DEFAULT_DRAFTS, GB};
use k3_plan::{Budget, DraftKind, ModelSizes, PlanRequest, Preset};

/// The published draft in bf16 (5 layers at the released dims, 4.78 GB) and its context KV:
/// 5 layers × (kv_lora 512 + rope 64) × 4 bytes per position.
const DRAFT_WEIGHTS: u64 = 4_775_608_320;
const KV_PER_POSITION: u64 = 5 * 576 * 4;

#[test]
fn a_block_draft_holds_its_weights_and_context_kv_and_no_second_session() {
    let sizes = ModelSizes::k3_estimate();
    let ctx = 4096;
    let held = DRAFT_WEIGHTS + KV_PER_POSITION * ctx;
    assert_eq!(KV_PER_POSITION * ctx, 47_185_920, "11.25 KB per position");
    // a block draft's verifying passes are planned for its 7 drafts (n-gram drafting: 4)
    let ngram = PlanRequest::new(Budget::Preset(Preset::Laptop), ctx);
    assert_eq!(ngram.drafts, DEFAULT_DRAFTS);
    assert_eq!(ngram.with_block_draft(held).drafts, BLOCK_DRAFTS);
    let req = ngram.with_drafts(BLOCK_DRAFTS);
    let plain = plan(&sizes, &req).unwrap();
    let block = plan(&sizes, &req.with_block_draft(held)).unwrap();
    assert_eq!(
        block.draft_journal_bytes,
        sizes.tentative_state_bytes + 7 * sizes.journal_bytes_per_draft
    );
    let trunk = plan(&sizes, &req.with_draft(held)).unwrap();
    assert_eq!(block.request.draft_kind, DraftKind::Block);
    assert_eq!(trunk.request.draft_kind, DraftKind::Trunk);

    // one session's state, the same as without a draft
    assert_eq!(block.kda_state_bytes, plain.kda_state_bytes);
    assert_eq!(block.latent_kv_bytes, plain.latent_kv_bytes);
    assert_eq!(block.draft_trunk_bytes, held);
    // the preset's trunk and cache are untouched: the draft adds exactly its bytes
    assert_eq!(block.trunk, plain.trunk);
    assert_eq!(block.expert_slots, plain.expert_slots);
    assert_eq!(block.total_bytes(), plain.total_bytes() + held);
    // a draft trunk of the same bytes also reserves its model's session (KDA state + KV)
    let session = sizes.kda_state_bytes + sizes.latent_kv_bytes_per_pos * ctx;
    assert_eq!(trunk.kda_state_bytes, 2 * plain.kda_state_bytes);
    assert_eq!(trunk.total_bytes(), block.total_bytes() + session);

    // with more sessions, the block draft still adds none
    let three = req.with_sessions(3);
    let three_block = plan(&sizes, &three.with_block_draft(held)).unwrap();
    assert_eq!(three_block.kda_state_bytes, 3 * sizes.kda_state_bytes);

    // the table names it as what it is
    let table = block.table(None);
    assert!(table.contains("DSpark draft"), "{table}");
    assert!(table.contains("weights (bf16) + context KV"), "{table}");
    assert!(
        table.contains("up to 7 drafts per verifying pass"),
        "{table}"
    );
    assert!(!table.contains("draft trunk"), "{table}");
    assert!(!table.contains("session + draft model"), "{table}");
}

#[test]
fn under_a_total_a_block_draft_leaves_the_second_session_to_the_cache() {
    let sizes = ModelSizes::k3_estimate();
    let ctx = 4096;
    let held = DRAFT_WEIGHTS + KV_PER_POSITION * ctx;
    let req = PlanRequest::new(Budget::Total(24 * GB), ctx);
    let block = plan(&sizes, &req.with_block_draft(held)).unwrap();
    let trunk = plan(&sizes, &req.with_draft(held)).unwrap();
    assert!(block.total_bytes() <= 24 * GB);
    let freed = trunk.kda_state_bytes + trunk.latent_kv_bytes
        - (block.kda_state_bytes + block.latent_kv_bytes);
    assert_eq!(
        freed,
        sizes.kda_state_bytes + sizes.latent_kv_bytes_per_pos * ctx
    );
    // what the second session held goes to the trunk and cache
    let kept = |p: &k3_plan::MemoryPlan| p.trunk.total_bytes() + p.expert_cache_bytes();
    assert!(kept(&block) > kept(&trunk));
}
