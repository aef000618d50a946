//! Speculative steps in the server (docs/SERVER.md "Batching"): when one session decodes
//! alone and the engine holds a drafter — a DSpark draft model (block drafts, as many
//! verified as the cost model of docs/STREAMING.md#dspark-block-drafts chooses) or a draft
//! trunk (hybrid drafting, adaptive length) — the drafter proposes ids and one exact pass
//! over `next + drafts` verifies them; the session's sampler picks from those rows in
//! order exactly as one-id steps would (same logits bit for bit, same history, same random
//! stream), so the reply is the one plain decoding gives. The drafts are tentative in that
//! pass (k3_model::journal): the accepted ones enter the state from the pass's journal, the
//! rest never do.

use super::{emit, Live};
use k3_engine::{Engine, EngineError};
use std::time::Instant;

/// Most ids drafted per pass (the adaptive length starts here).
pub(super) const MAX_DRAFT: usize = 4;

/// One speculative step for `l`; `false` when nothing was drafted (a plain step follows).
pub(super) fn run(engine: &Engine, l: &mut Live<'_>) -> Result<bool, EngineError> {
    let Some(next) = l.next else {
        return Ok(false);
    };
    // While a thinking budget runs, steps are plain ones (a draft could overshoot it).
    let budgeted = l.think_budget().is_some() && l.out.thinking();
    let blocks = engine.dspark().is_some();
    if !(blocks || engine.has_draft())
        || l.prefilling()
        || l.out.cancelled
        || budgeted
        || !l.forced.is_empty()
    {
        return Ok(false);
    }
    let left = l.job.max_new.saturating_sub(l.ids.len());
    let chunk_room = engine.prefill_chunk().saturating_sub(1);
    let limit = left
        .saturating_sub(1)
        .min(chunk_room)
        .min(engine.max_drafts());
    let mut batch = vec![next];
    // block drafts: the cost model chooses how many; a draft trunk: the adaptive length
    let drafts = match blocks {
        true => l.session.propose_block(&batch, limit),
        false => {
            let allowed = l.draft_len.allowed();
            l.session.propose_drafts(&batch, limit.min(allowed))
        }
    };
    if drafts.is_empty() {
        return Ok(false);
    }
    let before = engine.stats();
    batch.extend_from_slice(&drafts);
    let rows = l.session.feed_verify(&batch, drafts.len())?;
    let vocab = rows.len() / batch.len();
    let history_at_next = l.session.history().len() - drafts.len();
    let now = Instant::now();
    let k = drafts.len();
    l.drafted += k;
    let mut accepted = 0;
    for j in 0..=k {
        let row = &rows[j * vocab..(j + 1) * vocab]; // row j: after `next` and j drafts
        let id = l
            .sampler
            .sample(row, &l.session.history()[..history_at_next + j]);
        let ended = emit(l, id, Some(row), now);
        if j < k && id == drafts[j] && !ended {
            accepted += 1;
            continue;
        }
        // drafts j.. are not in the reply: they never enter the state
        l.session.keep_verified(&drafts[..j], j < k)?;
        accepted += usize::from(j < k && id == drafts[j]);
        if ended {
            l.session.settle_block();
            l.session.keep_pending(id)?;
            l.next = None;
        } else {
            l.next = Some(id);
        }
        break;
    }
    l.accepted += accepted;
    l.verify_passes += 1;
    l.draft_len.learn(k, accepted.min(k));
    let bytes = engine.stats().since(&before).bytes_read() as f64;
    l.bytes_read += bytes;
    l.decode_bytes += bytes;
    l.batch_sum += 1;
    l.decode_steps += 1;
    Ok(true)
}
