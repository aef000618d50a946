//! Continuous batching (docs/SERVER.md "Batching"): one OS thread owns every live session
//! and advances them together, one [`Engine::feed_batch`] pass per step, so concurrent
//! requests share each step's trunk stream and expert reads.
//!
//! Every step: admit queued jobs while fewer than `--parallel` sessions are live (restoring
//! the longest saved prefix of the prompt); give each decoding session its last sampled id
//! and each prefilling one a slice of its prompt — the whole planner chunk when nobody is
//! decoding, else at most `--ubatch` prompt ids per step so the others' tokens keep flowing;
//! run the pass; sample, stream and stop per session; retire the finished and the
//! disconnected. Tokens are each session's own: a batched pass gives every session the
//! logits it gets alone, and every sampler draws from its own seed.

mod spec_step;

use super::replica::Inbox;
use super::worker::{Event, Job, JobKind, Lru, Metrics, Output, Summary};
use crate::Events;
use k3_engine::{token_logprob, BatchFeed, Engine, EngineError, Sampler, Session, StopReason};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// How the scheduler batches.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Context positions per session.
    pub ctx: usize,
    /// Sessions advanced together at most (`--parallel`).
    pub parallel: usize,
    /// Prompt ids fed per step while other sessions decode (`--ubatch`).
    pub ubatch: usize,
    /// Keep saved sessions for conversation reuse.
    pub reuse: bool,
    /// Print control ids in the text as their spellings (`--special`).
    pub special: bool,
}

/// A job being served: its session and where it stands.
struct Live<'e> {
    job: Job,
    session: Session<'e>,
    sampler: Sampler,
    out: Output<'e>,
    /// Prompt ids restored from a saved session.
    reused: usize,
    /// Prompt ids fed so far (from `reused` up to the prompt's length).
    fed: usize,
    /// The id sampled last, fed at the next step.
    next: Option<u32>,
    /// The ids generated so far.
    ids: Vec<u32>,
    picked: Instant,
    prompt_seconds: f64,
    decode_started: Option<Instant>,
    last_token: Option<Instant>,
    max_gap: f64,
    /// This job's share of the bytes read by the steps it was in.
    bytes_read: f64,
    /// Sum over its decode steps of the sessions in the step.
    batch_sum: usize,
    decode_steps: usize,
    /// The prompt just finished: save its state (a prefix of the conversation's next turn).
    save_prompt: bool,
    /// Adaptive draft length of hybrid drafting (`spec_step`).
    draft_len: k3_engine::speculate::DraftLength,
    /// Tokens drafted and accepted for this job, and its verifying passes.
    drafted: usize,
    accepted: usize,
    verify_passes: usize,
    /// This job's share of the bytes read by its decode steps.
    decode_bytes: f64,
    /// Ids fed instead of sampled: the think→response transition once the thinking budget
    /// is spent (docs/SERVER.md "Anthropic Messages API").
    forced: std::collections::VecDeque<u32>,
    /// Why the job's constraint failed (a forced id it refused); reported as a failure.
    failed: Option<String>,
}

impl Live<'_> {
    fn prefilling(&self) -> bool {
        self.fed < self.job.prompt.len()
    }

    /// Whether the next id is forced (or about to be): the reply is still thinking and its
    /// thinking budget is spent.
    fn over_think_budget(&self) -> bool {
        !self.forced.is_empty()
            || self
                .think_budget()
                .is_some_and(|b| self.out.thinking() && self.ids.len() >= b)
    }

    /// The job's thinking budget, if it has one.
    fn think_budget(&self) -> Option<usize> {
        match self.job.kind {
            JobKind::Chat(c) => c.think_budget,
            JobKind::Completion { .. } => None,
        }
    }
}

/// Runs jobs until every sender is gone and no session is live, or a shutdown tick. Over
/// ranks (`inbox` not [`Inbox::Local`]) every rank runs this loop on the same ticks
/// (docs/DISTRIBUTED.md#serve-over-ranks); an error is one the group cannot go on from (a
/// failed collective, ranks that diverged).
pub fn run(
    engine: Arc<Engine>,
    mut inbox: Inbox,
    metrics: Arc<Metrics>,
    lim: Limits,
    events: Arc<dyn Events>,
) -> Result<(), String> {
    let engine: &Engine = &engine;
    let ev: &dyn Events = &*events;
    let tok = engine
        .tokenizer()
        .ok_or_else(|| "the model has no tokenizer".to_string())?;
    let mut lru = Lru::new(if lim.reuse {
        super::worker::LRU_CAPACITY
    } else {
        0
    });
    let mut live: Vec<Live<'_>> = Vec::new();
    loop {
        let room = lim.parallel.max(1).saturating_sub(live.len());
        let queued: Vec<&Job> = live.iter().map(|l| &l.job).collect();
        let tick = inbox.next(ev, &queued, room, tok)?;
        for &i in &tick.cancel {
            if let Some(l) = live.get_mut(i) {
                l.out.cancelled = true;
            }
        }
        if tick.shutdown {
            let why = EngineError::Invalid("the server is shutting down".into());
            live.drain(..).for_each(|l| fail(ev, &l.job, &why));
            return Ok(());
        }
        for job in tick.jobs {
            if !inbox.follower() {
                metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
                metrics.live.dequeue(&job.id);
            }
            if let Some(mut l) = admit(ev, engine, &mut lru, lim.ctx, job, inbox.replicated()) {
                l.out.local_cancel = !inbox.replicated();
                l.out.set_show_special(lim.special);
                live.push(l);
            }
        }
        metrics
            .active_sessions
            .store(live.len() as u64, Ordering::SeqCst);
        let stepped = Instant::now();
        if let Err(e) = step(engine, &mut live, lim, inbox.replicated()) {
            for l in live.drain(..) {
                fail(ev, &l.job, &e);
            }
        }
        if let Some(comm) = inbox.comm() {
            let views = live
                .iter()
                .map(|l| (l.ids.len(), l.ids.last().copied(), l.next, l.out.cancelled));
            super::replica::check_agreement(comm.as_ref(), super::replica::agreement_hash(views))?;
        }
        for l in live.iter_mut().filter(|l| l.save_prompt) {
            l.save_prompt = false;
            // The state after the last prompt token, before its reply's first id is fed.
            if lru.capacity > 0 && l.session.tokens() == l.job.prompt {
                if let Ok(bytes) = l.session.to_bytes() {
                    lru.insert(l.job.prompt.clone(), bytes);
                }
            }
        }
        let (done, running): (Vec<_>, Vec<_>) = live.into_iter().partition(is_done);
        live = running;
        for l in done {
            retire(ev, engine, &mut lru, &metrics, l);
        }
        if !inbox.follower() {
            show_status(ev, &live, &metrics, stepped.elapsed().as_secs_f64());
        }
        metrics
            .active_sessions
            .store(live.len() as u64, Ordering::SeqCst);
    }
}

/// Updates the live status line (a terminal only; docs/SERVER.md "Logging").
fn show_status(ev: &dyn Events, live: &[Live<'_>], metrics: &Metrics, step_seconds: f64) {
    let views: Vec<_> = live
        .iter()
        .map(|l| super::status_line::JobView {
            id: &l.job.id,
            fed: l.fed,
            prompt: l.job.prompt.len(),
            seconds: l.picked.elapsed().as_secs_f64(),
            generated: l.ids.len(),
            thinking: l.out.thinking(),
        })
        .collect();
    let queued = metrics.queue_depth.load(Ordering::SeqCst);
    metrics.live.publish(&views, step_seconds);
    ev.status(&super::status_line::describe(&views, queued, step_seconds));
}

fn fail(ev: &dyn Events, job: &Job, e: &EngineError) {
    ev.log(&format!(
        "k3: request {} {}: failed: {e}",
        job.id,
        job.kind.endpoint()
    ));
    let _ = job.events.send(Event::Failed(e.to_string()));
}

/// A job's session, restored from the longest saved prefix of its prompt or fresh; `None`
/// when the client already left or the job cannot start (reported to it).
fn admit<'e>(
    ev: &dyn Events,
    engine: &'e Engine,
    lru: &mut Lru,
    ctx: usize,
    mut job: Job,
    replicated: bool,
) -> Option<Live<'e>> {
    // Over ranks rank 0 drops a job whose client left before broadcasting it.
    if job.events.is_closed() && !replicated {
        ev.log(&format!(
            "k3: request {} {}: cancelled while queued",
            job.id,
            job.kind.endpoint()
        ));
        return None;
    }
    let opened = open_session(engine, lru, ctx, &job).and_then(|(session, reused)| {
        let tok = engine
            .tokenizer()
            .ok_or_else(|| EngineError::Invalid("the model has no tokenizer".into()))?;
        let mut sampler = Sampler::new(job.settings.params.clone())?;
        if let Some(constraint) = job.constraint.take() {
            sampler = sampler.with_constraint(constraint.compiled);
        }
        Ok((session, reused, sampler, Output::new(tok, &job)?))
    });
    let (session, reused, sampler, out) = match opened {
        Ok(parts) => parts,
        Err(e) => {
            fail(ev, &job, &e);
            return None;
        }
    };
    Some(Live {
        sampler,
        out,
        session,
        reused,
        fed: reused,
        next: None,
        ids: Vec::new(),
        picked: Instant::now(),
        prompt_seconds: 0.0,
        decode_started: None,
        last_token: None,
        max_gap: 0.0,
        bytes_read: 0.0,
        batch_sum: 0,
        decode_steps: 0,
        save_prompt: false,
        draft_len: k3_engine::speculate::DraftLength::new(spec_step::MAX_DRAFT),
        drafted: 0,
        accepted: 0,
        verify_passes: 0,
        decode_bytes: 0.0,
        forced: std::collections::VecDeque::new(),
        failed: None,
        job,
    })
}

/// The longest saved prefix of the prompt restored (or a fresh session) and its length.
fn open_session<'e>(
    engine: &'e Engine,
    lru: &mut Lru,
    ctx: usize,
    job: &Job,
) -> Result<(Session<'e>, usize), EngineError> {
    let restored = match lru.lookup(&job.prompt) {
        Some((len, bytes)) => engine.session_from_bytes(bytes, ctx).ok().map(|s| (s, len)),
        None => None,
    };
    Ok(match restored {
        // A saved state must be exactly the effect of its key (never rewound into).
        Some((s, len)) if s.tokens() == job.prompt[..len] => (s, len),
        _ => (engine.new_session(ctx)?, 0),
    })
}

/// The ids each live session feeds this step: decoders their sampled id, prefillers a slice
/// of the prompt (the planner chunk when nobody decodes, else `ubatch` ids shared in order).
fn step_ids(live: &[Live<'_>], chunk: usize, ubatch: usize) -> Vec<Vec<u32>> {
    let decoding = live.iter().filter(|l| !l.prefilling()).count();
    let mut room = if decoding == 0 {
        chunk.max(1)
    } else {
        ubatch.max(1)
    };
    live.iter()
        .map(|l| match l.next {
            Some(id) if !l.prefilling() => vec![id],
            _ => {
                let n = (l.job.prompt.len() - l.fed).min(room);
                room -= n;
                l.job.prompt[l.fed..l.fed + n].to_vec()
            }
        })
        .collect()
}

/// One batched pass over the live sessions, then sampling and streaming for each that has
/// fresh logits. Sessions whose client left are marked cancelled and fed nothing.
fn step(
    engine: &Engine,
    live: &mut [Live<'_>],
    lim: Limits,
    replicated: bool,
) -> Result<(), EngineError> {
    // Over ranks a client that left is rank 0's tick's news, not this rank's channel's.
    for l in live.iter_mut().filter(|_| !replicated) {
        if l.job.events.is_closed() {
            l.out.cancelled = true;
        }
    }
    if let [alone] = live {
        // One session decoding alone: hybrid drafting may verify several ids in this pass.
        if spec_step::run(engine, alone)? {
            return Ok(());
        }
    }
    let ids = step_ids(live, engine.prefill_chunk(), lim.ubatch);
    let before = engine.stats();
    let mut feeds: Vec<BatchFeed<'_, '_>> = live
        .iter_mut()
        .zip(&ids)
        .filter(|(l, ids)| !ids.is_empty() && !l.out.cancelled)
        .map(|(l, ids)| BatchFeed {
            session: &mut l.session,
            ids,
        })
        .collect();
    let in_step = feeds.len();
    if in_step > 0 {
        engine.feed_batch(&mut feeds)?;
    }
    drop(feeds);
    let share = engine.stats().since(&before).bytes_read() as f64 / in_step.max(1) as f64;
    let now = Instant::now();
    for (l, ids) in live.iter_mut().zip(&ids) {
        if ids.is_empty() || l.out.cancelled {
            continue;
        }
        l.bytes_read += share;
        if l.prefilling() {
            l.fed += ids.len();
            if l.prefilling() {
                continue;
            }
            l.prompt_seconds = now.duration_since(l.picked).as_secs_f64();
            l.decode_started = Some(now);
            l.save_prompt = true;
        } else {
            l.decode_bytes += share;
            l.batch_sum += in_step;
            l.decode_steps += 1;
        }
        sample_next(l, now)?;
    }
    Ok(())
}

/// Samples the next id of a session with fresh logits, streams it, and decides whether the
/// job goes on (`l.next` set) or ends (its last id kept pending, as `Session` keeps it).
fn sample_next(l: &mut Live<'_>, now: Instant) -> Result<(), EngineError> {
    l.next = None;
    if l.ids.len() >= l.job.max_new {
        return Ok(());
    }
    if l.over_think_budget() && l.forced.is_empty() {
        l.forced.extend(l.out.think_to_response.iter().copied());
    }
    let id = match l.forced.pop_front() {
        Some(id) => {
            if let Err(e) = l.sampler.advance_constraint(id) {
                l.failed = Some(e.to_string());
                l.out.cancelled = true; // ends it now; `retire` reports the failure
            }
            id
        }
        // A constraint failure ends the reply with an end id; `retire` reports it.
        None => l.sampler.sample(l.session.logits(), l.session.history()),
    };
    if emit(l, id, None, now) {
        l.session.keep_pending(id)?;
    } else {
        l.next = Some(id);
    }
    Ok(())
}

/// Streams a sampled id (with its logprobs from `row`, default the session's logits) and
/// says whether the job ends with it.
fn emit(l: &mut Live<'_>, id: u32, row: Option<&[f32]>, now: Instant) -> bool {
    l.ids.push(id);
    if let Some(prev) = l.last_token {
        l.max_gap = l.max_gap.max(now.duration_since(prev).as_secs_f64());
    }
    l.last_token = Some(now);
    let logits = row.unwrap_or(l.session.logits());
    let logprob = l
        .job
        .settings
        .logprobs
        .map(|top| token_logprob(logits, id, top));
    let keep_going = l.out.on_token(id, logprob);
    l.out.end_ids.contains(&id) || !keep_going || l.ids.len() >= l.job.max_new
}

fn is_done(l: &Live<'_>) -> bool {
    l.out.cancelled || (!l.prefilling() && l.next.is_none())
}

/// Why a finished job stopped, as the engine's generation loop would say: its end id, its
/// length, or else the output's callback (a stop string or a client that left).
fn stop_reason(l: &Live<'_>) -> StopReason {
    match l.ids.last() {
        Some(&id) if l.out.end_ids.contains(&id) => StopReason::EndToken(id),
        _ if !l.out.cancelled && l.ids.len() >= l.job.max_new => StopReason::Length,
        _ => StopReason::Callback,
    }
}

/// Ends a job: flushes its text, saves its state for reuse, counts it and answers it.
fn retire(ev: &dyn Events, engine: &Engine, lru: &mut Lru, metrics: &Metrics, mut l: Live<'_>) {
    let reason = stop_reason(&l);
    if l.out.cancelled && l.prefilling() {
        ev.log(&format!(
            "k3: request {} {}: cancelled during the prompt",
            l.job.id,
            l.job.kind.endpoint()
        ));
        return;
    }
    let failure = l
        .failed
        .take()
        .or_else(|| l.sampler.constraint_failure().map(str::to_string));
    if let Some(why) = failure {
        fail(ev, &l.job, &EngineError::Invalid(why));
        return;
    }
    let finish = l.out.finish(&reason);
    if lru.capacity > 0 && !l.out.cancelled {
        // The state at the end of the reply (its last id pending, as `Session` keeps it).
        if let Ok(bytes) = l.session.to_bytes() {
            lru.insert(l.session.tokens(), bytes);
        }
    }
    let predicted_seconds = l.decode_started.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let n = l.ids.len();
    count(metrics, &l, predicted_seconds);
    let summary = Summary {
        finish,
        prompt_tokens: l.job.prompt.len(),
        prompt_tokens_reused: l.reused,
        completion_tokens: n,
        prompt_seconds: l.prompt_seconds,
        predicted_seconds,
        queue_seconds: l.picked.duration_since(l.job.queued).as_secs_f64(),
        first_token_seconds: l
            .out
            .first_token
            .map_or(0.0, |t| t.duration_since(l.job.queued).as_secs_f64()),
        max_token_gap_seconds: l.max_gap,
        mean_batch: if l.decode_steps > 0 {
            l.batch_sum as f64 / l.decode_steps as f64
        } else {
            1.0
        },
        bytes_read: l.bytes_read as u64,
        expert_hit_rate: engine.stats().expert_hit_rate(),
        decode: decode_stats(engine, &l),
        ids: std::mem::take(&mut l.ids),
    };
    metrics.decode.add(&summary.decode);
    ev.log(&log_line(&l.job, &summary));
    if l.drafted > 0 {
        let d = &summary.decode;
        ev.log(&format!(
            "k3: request {}: {} drafting accepted {} of {} drafted ids, acceptance length {:.2}, {:.2} tokens per trunk pass, {:.0} bytes read per generated token",
            l.job.id,
            if d.drafter == Some("dspark") { "DSpark block" } else { "hybrid" },
            l.accepted,
            l.drafted,
            d.acceptance_length(),
            d.tokens_per_trunk_pass(),
            d.bytes_read_per_generated_token()
        ));
    }
    let _ = l.job.events.send(Event::Done(summary));
}

/// The job's decode counters (docs/SERVER.md "Drafting").
fn decode_stats(engine: &Engine, l: &Live<'_>) -> crate::decode_stats::DecodeStats {
    crate::decode_stats::DecodeStats {
        drafter: crate::decode_stats::drafter(engine),
        tokens: l.ids.len(),
        passes: l.decode_steps,
        verify_passes: l.verify_passes,
        drafted: l.drafted,
        accepted: l.accepted,
        bytes_read: l.decode_bytes,
    }
}

fn count(metrics: &Metrics, l: &Live<'_>, predicted_seconds: f64) {
    let n = l.ids.len();
    metrics
        .tokens_generated
        .fetch_add(n as u64, Ordering::Relaxed);
    metrics
        .prompt_tokens
        .fetch_add(l.job.prompt.len() as u64, Ordering::Relaxed);
    metrics
        .prompt_tokens_reused
        .fetch_add(l.reused as u64, Ordering::Relaxed);
    if n > 0 {
        let spt = predicted_seconds / n as f64;
        metrics
            .seconds_per_token_bits
            .store(spt.to_bits(), Ordering::Relaxed);
    }
    metrics
        .max_token_gap_bits
        .store(l.max_gap.to_bits(), Ordering::Relaxed);
}

/// The request's line on stderr (docs/SERVER.md, "Logging").
fn log_line(job: &Job, s: &Summary) -> String {
    let per_token = if s.completion_tokens > 0 {
        s.predicted_seconds / s.completion_tokens as f64
    } else {
        0.0
    };
    let choice = if job.index > 0 {
        format!(" choice {}", job.index)
    } else {
        String::new()
    };
    format!(
        "k3: request {}{choice} {}: prompt {} tokens ({} reused), generated {}, queue {:.3} s, first token {:.3} s, {:.4} s/token, max gap {:.3} s, batch {:.1}, finish {}",
        job.id,
        job.kind.endpoint(),
        s.prompt_tokens,
        s.prompt_tokens_reused,
        s.completion_tokens,
        s.queue_seconds,
        s.first_token_seconds,
        per_token,
        s.max_token_gap_seconds,
        s.mean_batch,
        s.finish.openai()
    )
}
