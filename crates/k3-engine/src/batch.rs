//! Batched feeding: several sessions advanced by one forward pass (docs/SERVER.md
//! "Batching"). The trunk — streamed or pinned — and the union of the batch's routed experts
//! are read once per pass for every session in it; each session's logits and state are bit
//! for bit what feeding it alone would give ([`k3_model::Model::forward_batch`]).

use crate::{Engine, EngineError, Session};
use k3_model::{BatchItem, LogitsMode};

/// One session's part of [`Engine::feed_batch`]: the ids to feed it (a decode step's one id,
/// or a chunk of a prompt). A token the session holds pending runs first, as with
/// [`Session::feed`].
pub struct BatchFeed<'a, 'e> {
    /// The session to advance.
    pub session: &'a mut Session<'e>,
    /// Ids to feed (may be empty: then only a pending token runs, if any).
    pub ids: &'a [u32],
}

/// What one pass takes from each session: `(feed index, first id, ids)`.
type PassPlan = Vec<(usize, usize, usize)>;

/// Splits every feed's ids into passes of at most `chunk` rows, in feed order: a pass takes
/// from each unfinished feed what room is left, so short feeds (decode steps) finish in the
/// first pass and a long prompt spreads over several.
fn plan_passes(lens: &[usize], chunk: usize) -> Vec<PassPlan> {
    let mut done = vec![0usize; lens.len()];
    let mut passes = Vec::new();
    while done.iter().zip(lens).any(|(d, l)| d < l) {
        let mut room = chunk.max(1);
        let mut pass = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            let n = (len - done[i]).min(room);
            if n > 0 {
                pass.push((i, done[i], n));
                done[i] += n;
                room -= n;
            }
        }
        passes.push(pass);
    }
    passes
}

impl Engine {
    /// Feeds every session its ids in as few forward passes as the planner's prefill chunk
    /// allows (one when the batch's rows fit in [`Engine::prefill_chunk`]). Afterwards each
    /// session's logits are those of its last id, exactly as [`Session::feed`] alone would
    /// leave them. Every feed is checked (ids in range, room in its context, a session of
    /// this engine) before any state is touched; an error during a pass poisons the states
    /// of that pass's sessions (call [`Session::reset`]).
    pub fn feed_batch(&self, feeds: &mut [BatchFeed<'_, '_>]) -> Result<(), EngineError> {
        for (i, f) in feeds.iter().enumerate() {
            if !std::ptr::eq(f.session.owner(), self) {
                return Err(EngineError::Invalid(format!(
                    "batch entry {i}: the session belongs to another engine"
                )));
            }
            f.session.check_ids(f.ids)?;
        }
        // A batch of one with a DSpark draft is the session's own feed: the same logits and
        // state, and the target's taps recorded for its draft context (a batched pass keeps
        // none), so a session served alone can draft blocks (docs/DSPARK.md).
        if let [one] = feeds {
            if one.session.taps.is_some() && !one.ids.is_empty() {
                return one.session.feed(one.ids);
            }
        }
        // every session's rows: its pending token, then its ids
        let rows: Vec<Vec<u32>> = feeds
            .iter_mut()
            .map(|f| {
                f.session
                    .take_pending()
                    .into_iter()
                    .chain(f.ids.iter().copied())
                    .collect()
            })
            .collect();
        let lens: Vec<usize> = rows.iter().map(Vec::len).collect();
        for pass in plan_passes(&lens, self.prefill_chunk()) {
            let mut items = Vec::with_capacity(pass.len());
            let mut picked: Vec<Option<&mut BatchFeed<'_, '_>>> =
                feeds.iter_mut().map(Some).collect();
            for &(i, from, n) in &pass {
                let Some(f) = picked[i].take() else { continue };
                // logits only from the pass that runs a feed's last row
                let mode = if from + n == lens[i] {
                    LogitsMode::Last
                } else {
                    LogitsMode::None
                };
                items.push((f, &rows[i][from..from + n], mode));
            }
            let mut batch: Vec<BatchItem<'_>> = items
                .iter_mut()
                .map(|(f, tokens, mode)| BatchItem {
                    tokens,
                    state: f.session.state_mut(),
                    mode: *mode,
                })
                .collect();
            let logits = self.pool.install(|| {
                self.model
                    .forward_batch(self.weights(), self.experts(), &mut batch, &mut |_| {})
            })?;
            drop(batch);
            for ((f, tokens, mode), l) in items.iter_mut().zip(logits) {
                let last = *mode == LogitsMode::Last;
                f.session.record_batched(tokens, last.then_some(l.data));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::plan_passes;

    #[test]
    fn passes_never_exceed_the_chunk_and_cover_every_row_in_order() {
        for (lens, chunk) in [
            (vec![1, 1, 1], 8),
            (vec![300, 1, 1], 64),
            (vec![5, 0, 7], 3),
            (vec![2, 2], 1),
        ] {
            let passes = plan_passes(&lens, chunk);
            let mut next = vec![0; lens.len()];
            for p in &passes {
                assert!(p.iter().map(|&(_, _, n)| n).sum::<usize>() <= chunk);
                for &(i, from, n) in p {
                    assert_eq!(from, next[i], "rows of feed {i} in order");
                    assert!(n > 0);
                    next[i] += n;
                }
            }
            assert_eq!(next, lens);
        }
        assert_eq!(
            plan_passes(&[1, 1, 1], 8).len(),
            1,
            "decode steps share one pass"
        );
    }
}
