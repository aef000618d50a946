//! Exact speculative decoding with a free drafter (prompt lookup).
//!
//! Each pass feeds the newest generated token (not yet in the state) followed by up to
//! `max_draft` DRAFTED tokens — the continuation of the most recent earlier occurrence of the
//! context's last n-gram — in ONE forward pass, with logits for the newest token and every
//! draft. The sampler then picks tokens from those rows in
//! order, exactly as one-token-per-pass decoding would (same logits bit for bit, same
//! history, same random stream); every pick that equals the next draft is accepted for free.
//! The drafts are tentative in that pass (k3_model::journal): they give their logits but enter
//! the carried state only once accepted, advanced from the pass's KDA journal without another
//! pass. At the first pick that differs the rest are forgotten, and the next pass feeds only
//! the newest token and its drafts.
//!
//! Why it saves bytes: one pass reads the streamed trunk once whatever the number of tokens
//! it carries, so every accepted draft saves a whole trunk pass. It does NOT save expert
//! bytes (each token needs its own experts) and a rejected draft costs its experts' reads
//! and compute — so it is on by default only when the trunk streams (`--draft auto`), and
//! the draft length adapts: +1 after a pass that accepted every draft, halved after one that
//! accepted none, and after it reaches 0 drafting pauses for [`COOLDOWN_PASSES`] passes
//! before trying one draft again (bounds the loss when drafts are poor; measured in
//! docs/PERFORMANCE.md "Speculative decoding").

use crate::emit::Emitter;
use crate::stop::StopReason;
use crate::{EngineError, Sampler, Session};

/// Passes without drafts after the adaptive draft length fell to 0. Each further fall with
/// nothing accepted in between doubles the pause (up to [`MAX_COOLDOWN_PASSES`]), so a drafter
/// that is never right costs O(log n) wasted drafts over n tokens — it matters for the draft
/// model, whose every draft costs a forward pass (bench-draft, docs/PERFORMANCE.md).
pub const COOLDOWN_PASSES: usize = 8;

/// Longest pause of the doubling cooldown.
pub const MAX_COOLDOWN_PASSES: usize = 256;

/// Longest draft a custom drafter ([`Session::generate_with_drafter`]) is asked for.
pub const MAX_CUSTOM_DRAFT: usize = 16;

/// The adaptive draft length (see the module docs): for callers with their own decode loop
/// (the server's scheduler) as for [`Session::generate_with`].
#[derive(Clone, Debug)]
pub struct DraftLength {
    max: usize,
    now: usize,
    pause: usize,
    /// The pause the next fall to 0 starts.
    cooldown: usize,
}

impl DraftLength {
    /// Starts at `max` drafts per pass.
    pub fn new(max: usize) -> Self {
        DraftLength {
            max,
            now: max,
            pause: 0,
            cooldown: COOLDOWN_PASSES,
        }
    }
    /// Drafts allowed in the next pass.
    pub fn allowed(&mut self) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            0
        } else {
            self.now
        }
    }
    /// Learns from a pass that drafted `k` tokens and accepted `a` of them.
    pub fn learn(&mut self, k: usize, a: usize) {
        if k == 0 {
            return;
        }
        if a > 0 {
            self.cooldown = COOLDOWN_PASSES;
        }
        if a == k {
            self.now = (self.now + 1).min(self.max);
        } else if a == 0 {
            self.now /= 2;
            if self.now == 0 {
                self.pause = self.cooldown;
                self.cooldown = (self.cooldown * 2).min(MAX_COOLDOWN_PASSES);
                self.now = 1;
            }
        }
    }
}

/// Drafting parameters of [`crate::DecodeMode::Speculative`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speculation {
    /// Most tokens drafted per pass (≥ 1).
    pub max_draft: usize,
    /// Longest context suffix looked up (tried first).
    pub max_ngram: usize,
    /// Shortest context suffix looked up (≥ 1).
    pub min_ngram: usize,
}

impl Default for Speculation {
    /// 4 drafts from a 3- or 2-token match: see docs/PERFORMANCE.md for the measurements.
    fn default() -> Self {
        Speculation {
            max_draft: 4,
            max_ngram: 3,
            min_ngram: 2,
        }
    }
}

/// Counters of speculative decoding in a session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Forward passes run while generating speculatively.
    pub passes: u64,
    /// Tokens drafted.
    pub drafted: u64,
    /// Positions the verifying passes fed: each pass's own token plus its drafts.
    pub positions: u64,
    /// Drafted tokens accepted (each one a token generated without its own pass).
    pub accepted: u64,
    /// Passes that rejected a draft (it and the drafts after it never entered the state).
    pub rollbacks: u64,
}

impl SpecStats {
    /// Accepted ÷ drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// Up to `limit` tokens that followed the most recent earlier occurrence of the context's
/// last n-gram, for n from `max_ngram` down to `min_ngram` (longest match wins).
pub fn draft(context: &[u32], spec: &Speculation, limit: usize) -> Vec<u32> {
    let limit = limit.min(spec.max_draft);
    if limit == 0 {
        return Vec::new();
    }
    let len = context.len();
    for n in (spec.min_ngram.max(1)..=spec.max_ngram).rev() {
        if len <= n {
            continue;
        }
        let suffix = &context[len - n..];
        // Earlier occurrences start at 0..len-n (exclusive of the suffix itself).
        if let Some(start) = (0..len - n).rev().find(|&i| &context[i..i + n] == suffix) {
            let from = start + n;
            return context[from..(from + limit).min(len)].to_vec();
        }
    }
    Vec::new()
}

/// A drafter of the speculative loop: `(session, context, limit)` → at most `limit` ids.
pub(crate) type Drafter<'d, 'e> = dyn FnMut(&mut Session<'e>, &[u32], usize) -> Vec<u32> + 'd;

impl<'e> Session<'e> {
    /// The speculative loop behind [`Session::generate_with`] and
    /// [`Session::generate_with_drafter`] (`n ≥ 1`, fresh logits). `drafter(session,
    /// context, limit)` proposes at most `limit` tokens to follow `context`. With `adaptive`
    /// the draft length follows [`DraftLength`]; without, every pass may draft `max_draft`
    /// (the block drafter chooses its own count from its confidence head).
    pub(crate) fn generate_speculative<F: FnMut(u32) -> bool>(
        &mut self,
        n: usize,
        max_draft: usize,
        adaptive: bool,
        drafter: &mut Drafter<'_, 'e>,
        sampler: &mut Sampler,
        emitter: &mut Emitter<'_, F>,
    ) -> Result<StopReason, EngineError> {
        let mut length = DraftLength::new(max_draft);
        // `history` = what one-token decoding would pass the sampler: every token so far.
        let mut history = self.history().to_vec();
        let (first, stopped) = self.sample_emit(sampler, self.logits(), &history, emitter)?;
        history.push(first);
        let mut generated = 1;
        if let Some(r) = stopped {
            self.keep_pending(first)?;
            return Ok(r);
        }
        if n == 1 {
            self.keep_pending(first)?;
            return Ok(StopReason::Length);
        }
        let mut newest = first; // sampled, not yet in the state
        loop {
            // The last token of the generation is never drafted: it comes from the row after
            // the last draft, so a run of accepted drafts never ends inside the state.
            // A verifying pass never exceeds the planner's prefill chunk: split, it would
            // stream the trunk twice and lose what the drafts save.
            // ... nor the drafts the plan's journal holds.
            let chunk_room = self.owner().prefill_chunk().saturating_sub(1);
            let room = (n - generated - 1)
                .min(self.room_after(1))
                .min(chunk_room)
                .min(self.owner().max_drafts())
                .min(if adaptive {
                    length.allowed()
                } else {
                    max_draft
                });
            let mut drafts = drafter(self, &history, room);
            drafts.truncate(room);
            let k = drafts.len();
            let batch = [&[newest], &drafts[..]].concat();
            let rows = self.run_verify(&batch, k, k + 1)?;
            self.spec_stats.passes += 1;
            self.spec_stats.drafted += k as u64;
            self.spec_stats.positions += batch.len() as u64;
            let vocab = rows.len() / (k + 1);
            let accepted_before = self.spec_stats.accepted;
            for j in 0..=k {
                let row = &rows[j * vocab..(j + 1) * vocab];
                let (next, stopped) = self.sample_emit(sampler, row, &history, emitter)?;
                history.push(next);
                generated += 1;
                let ended = stopped.is_some() || generated == n;
                if j < k && next == drafts[j] && !ended {
                    self.spec_stats.accepted += 1;
                    continue;
                }
                length.learn(k, (self.spec_stats.accepted - accepted_before) as usize);
                if j < k {
                    // drafts j.. are not in the reply: they never enter the state
                    self.spec_stats.accepted += u64::from(next == drafts[j]);
                    self.spec_stats.rollbacks += 1;
                }
                self.keep_drafts(&drafts[..j])?;
                if ended {
                    self.keep_pending(next)?;
                    return Ok(stopped.unwrap_or(StopReason::Length));
                }
                newest = next;
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_length_grows_on_full_acceptance_and_pauses_after_misses() {
        let mut d = DraftLength::new(4);
        assert_eq!(d.allowed(), 4);
        d.learn(4, 4);
        assert_eq!(d.allowed(), 4, "capped at max");
        d.learn(4, 2);
        assert_eq!(d.allowed(), 4, "partial acceptance keeps the length");
        d.learn(4, 0);
        assert_eq!(d.allowed(), 2);
        d.learn(2, 0);
        assert_eq!(d.allowed(), 1);
        d.learn(1, 0);
        for _ in 0..COOLDOWN_PASSES {
            assert_eq!(d.allowed(), 0, "paused");
        }
        assert_eq!(d.allowed(), 1, "one draft after the pause");
        d.learn(0, 0);
        assert_eq!(d.allowed(), 1, "a pass without drafts teaches nothing");
        d.learn(1, 1);
        assert_eq!(d.allowed(), 2);
    }

    #[test]
    fn a_drafter_that_is_never_right_pauses_longer_and_longer() {
        /// Learns one rejected single draft; returns the pause that follows.
        fn miss(d: &mut DraftLength) -> usize {
            assert_eq!(d.allowed(), 1);
            d.learn(1, 0);
            let mut p = 0;
            while d.pause > 0 {
                assert_eq!(d.allowed(), 0);
                p += 1;
            }
            p
        }
        let mut d = DraftLength::new(1);
        let pauses: Vec<usize> = (0..7).map(|_| miss(&mut d)).collect();
        assert_eq!(pauses, [8, 16, 32, 64, 128, 256, 256]);
        assert_eq!(d.allowed(), 1);
        d.learn(1, 1);
        assert_eq!(
            miss(&mut d),
            COOLDOWN_PASSES,
            "an accepted draft resets the cooldown"
        );
    }
}
