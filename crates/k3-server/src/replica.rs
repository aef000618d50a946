//! `k3 serve` over MPI ranks (docs/DISTRIBUTED.md#serve-over-ranks): every rank runs the same
//! scheduler loop as a replicated state machine. Each scheduler tick starts with an
//! [`Inbox::next`]: rank 0 gathers the tick's inputs (newly admitted jobs, clients that left,
//! shutdown) and broadcasts them; followers apply the same inputs, so every rank admits,
//! batches, samples and retires identically (bit-identical logits ⇒ identical samples,
//! constraint masks and prefix-cache decisions). Nothing a follower's machine or clock says
//! reaches an engine call.

use super::worker::{Job, JobConstraint, JobKind};
use crate::Events;
use k3_api::GenSettings;
use k3_engine::chat_template::Thinking;
use k3_engine::{Comm, Constraint, ConstraintSpec, ReplyStart, SamplingParams, Tokenizer};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How long rank 0 sleeps between looks at an empty queue while nothing is live (so that a
/// shutdown request is noticed; the followers wait in the broadcast meanwhile).
const IDLE_POLL: Duration = Duration::from_millis(2);

/// Where a scheduler's jobs come from.
pub enum Inbox {
    /// One process: jobs straight from the handlers (a client that left is seen by its
    /// closed event channel).
    Local(mpsc::Receiver<Job>),
    /// Rank 0 of several: jobs from the handlers; each tick is broadcast to the followers.
    Leader {
        jobs: mpsc::Receiver<Job>,
        comm: Arc<dyn Comm>,
        /// Set by SIGINT/SIGTERM: the next tick tells every rank to stop.
        shutdown: Arc<AtomicBool>,
    },
    /// A rank other than 0: every tick comes from rank 0.
    Follower(Arc<dyn Comm>),
}

/// One tick's inputs, the same on every rank.
pub struct Tick {
    pub jobs: Vec<Job>,
    /// Live sessions (indices in the scheduler's order at the tick) whose client left.
    pub cancel: Vec<usize>,
    /// Stop: fail what is live and return.
    pub shutdown: bool,
}

/// [`Tick`] as broadcast.
#[derive(Serialize, Deserialize, Default)]
struct WireTick {
    jobs: Vec<WireJob>,
    cancel: Vec<usize>,
    shutdown: bool,
}

impl Inbox {
    /// Replicated across ranks (cancellation comes from ticks, not from channels).
    pub fn replicated(&self) -> bool {
        !matches!(self, Inbox::Local(_))
    }

    /// A rank whose output is discarded.
    pub fn follower(&self) -> bool {
        matches!(self, Inbox::Follower(_))
    }

    /// The group, when replicated.
    pub fn comm(&self) -> Option<&Arc<dyn Comm>> {
        match self {
            Inbox::Local(_) => None,
            Inbox::Leader { comm, .. } | Inbox::Follower(comm) => Some(comm),
        }
    }

    /// The next tick's inputs, given the live jobs' event senders (in order) and the room
    /// for new ones. Blocks while nothing is live and nothing is queued.
    pub fn next(
        &mut self,
        ev: &dyn Events,
        live: &[&Job],
        room: usize,
        tok: &Tokenizer,
    ) -> Result<Tick, String> {
        match self {
            Inbox::Local(jobs) => Ok(local_tick(jobs, live.is_empty(), room)),
            Inbox::Leader {
                jobs,
                comm,
                shutdown,
            } => leader_tick(ev, jobs, comm.as_ref(), shutdown, live, room),
            Inbox::Follower(comm) => follower_tick(comm.as_ref(), tok),
        }
    }
}

/// One process: up to `room` queued jobs, waiting for one when nothing is live; the
/// handlers gone (the channel closed) with nothing live is a shutdown.
fn local_tick(jobs: &mut mpsc::Receiver<Job>, idle: bool, room: usize) -> Tick {
    let mut tick = Tick {
        jobs: Vec::new(),
        cancel: Vec::new(),
        shutdown: false,
    };
    if idle && room > 0 {
        match jobs.blocking_recv() {
            Some(j) => tick.jobs.push(j),
            None => tick.shutdown = true,
        }
    }
    while tick.jobs.len() < room {
        match jobs.try_recv() {
            Ok(j) => tick.jobs.push(j),
            Err(_) => break,
        }
    }
    tick
}

/// Rank 0: this tick's jobs (a job whose client already left is dropped here, before any
/// rank sees it), the live jobs whose client left, and shutdown; broadcast, then returned.
fn leader_tick(
    ev: &dyn Events,
    jobs: &mut mpsc::Receiver<Job>,
    comm: &dyn Comm,
    shutdown: &AtomicBool,
    live: &[&Job],
    room: usize,
) -> Result<Tick, String> {
    let mut tick = Tick {
        jobs: Vec::new(),
        cancel: Vec::new(),
        shutdown: false,
    };
    loop {
        while tick.jobs.len() < room {
            match jobs.try_recv() {
                Ok(j) if j.events.is_closed() => ev.log(&format!(
                    "k3: request {} {}: cancelled while queued",
                    j.id,
                    j.kind.endpoint()
                )),
                Ok(j) => tick.jobs.push(j),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    tick.shutdown = live.is_empty() && tick.jobs.is_empty();
                    break;
                }
            }
        }
        tick.shutdown |= shutdown.load(Ordering::SeqCst);
        if tick.shutdown || !tick.jobs.is_empty() || !live.is_empty() || room == 0 {
            break;
        }
        std::thread::sleep(IDLE_POLL);
    }
    tick.cancel = (live.iter().enumerate())
        .filter(|(_, j)| j.events.is_closed())
        .map(|(i, _)| i)
        .collect();
    let wire = WireTick {
        jobs: tick.jobs.iter().map(WireJob::of).collect(),
        cancel: tick.cancel.clone(),
        shutdown: tick.shutdown,
    };
    let mut bytes = serde_json::to_vec(&wire).map_err(|e| format!("encoding a tick: {e}"))?;
    comm.broadcast_bytes(0, &mut bytes)
        .map_err(|e| format!("broadcasting a tick: {e}"))?;
    Ok(tick)
}

/// A follower: rank 0's tick, its jobs rebuilt (their events go nowhere).
fn follower_tick(comm: &dyn Comm, tok: &Tokenizer) -> Result<Tick, String> {
    let mut bytes = Vec::new();
    comm.broadcast_bytes(0, &mut bytes)
        .map_err(|e| format!("receiving a tick from rank 0: {e}"))?;
    let wire: WireTick = serde_json::from_slice(&bytes).map_err(|e| {
        format!("rank 0 sent a tick this rank cannot read (same k3 build on every rank?): {e}")
    })?;
    let jobs = (wire.jobs.into_iter())
        .map(|w| w.into_job(tok))
        .collect::<Result<_, _>>()?;
    Ok(Tick {
        jobs,
        cancel: wire.cancel,
        shutdown: wire.shutdown,
    })
}

/// A fingerprint of what every live job has done so far (ids, what is next, cancelled),
/// compared across ranks after each tick.
pub fn agreement_hash(views: impl Iterator<Item = (usize, Option<u32>, Option<u32>, bool)>) -> u64 {
    let mut words: Vec<u8> = Vec::new();
    for (n, last, next, cancelled) in views {
        words.extend((n as u64).to_le_bytes());
        words.extend(last.map_or(u64::MAX, u64::from).to_le_bytes());
        words.extend(next.map_or(u64::MAX, u64::from).to_le_bytes());
        words.push(u8::from(cancelled));
    }
    xxhash_rust::xxh3::xxh3_64(&words)
}

/// Allgathers this rank's `hash`; an error naming the ranks that differ from rank 0.
pub fn check_agreement(comm: &dyn Comm, hash: u64) -> Result<(), String> {
    let all = comm
        .allgather_u64(hash)
        .map_err(|e| format!("comparing the ranks' ids: {e}"))?;
    let differ: Vec<String> = (all.iter().enumerate())
        .filter(|(_, &h)| h != all[0])
        .map(|(r, _)| r.to_string())
        .collect();
    match differ.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "rank(s) {} of {} generated other ids than rank 0: the ranks diverged (same model, k3 build and flags on every rank?)",
            differ.join(", "),
            all.len()
        )),
    }
}

/// A job as broadcast: what the scheduler reads of it, floats as their bits.
#[derive(Serialize, Deserialize)]
struct WireJob {
    id: String,
    kind: WireKind,
    prompt: Vec<u32>,
    params: [u64; 9],
    stop: Vec<String>,
    logprobs: Option<usize>,
    constraint: Option<(WireConstraint, bool)>,
    max_new: usize,
    index: usize,
}

#[derive(Serialize, Deserialize)]
enum WireKind {
    Chat {
        thinking: u8,
        ignore_eos: bool,
        think_budget: Option<usize>,
        endpoint: String,
        call_id_prefix: Option<String>,
    },
    Completion {
        ignore_eos: bool,
    },
}

/// [`ConstraintSpec`], as broadcast (recompiled by each follower: compiling is deterministic).
#[derive(Serialize, Deserialize)]
enum WireConstraint {
    JsonObject,
    JsonSchema {
        schema: Value,
        strict: bool,
    },
    ToolCalls {
        tools: Vec<(String, Value)>,
        named: Option<String>,
        parallel: bool,
    },
}

const THINKING: [Thinking; 4] = [Thinking::Off, Thinking::Low, Thinking::High, Thinking::Max];
/// The endpoints and call id prefixes a job may name (`&'static str` in [`Job`]).
const NAMES: [&str; 5] = [
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/completions",
    "call_",
    "toolu_",
];

fn known(name: &str) -> Result<&'static str, String> {
    NAMES.iter().find(|n| **n == name).copied().ok_or_else(|| {
        format!("rank 0 sent an unknown name `{name}` (same k3 build on every rank?)")
    })
}

fn params_bits(p: &SamplingParams) -> [u64; 9] {
    let f = |x: f32| u64::from(x.to_bits());
    [
        f(p.temperature),
        p.top_k as u64,
        f(p.top_p),
        f(p.min_p),
        f(p.repeat_penalty),
        p.repeat_last_n as u64,
        f(p.presence_penalty),
        f(p.frequency_penalty),
        p.seed,
    ]
}

fn params_of(b: [u64; 9]) -> SamplingParams {
    let f = |x: u64| f32::from_bits(x as u32);
    SamplingParams {
        temperature: f(b[0]),
        top_k: b[1] as usize,
        top_p: f(b[2]),
        min_p: f(b[3]),
        repeat_penalty: f(b[4]),
        repeat_last_n: b[5] as usize,
        presence_penalty: f(b[6]),
        frequency_penalty: f(b[7]),
        seed: b[8],
    }
}

impl WireJob {
    fn of(job: &Job) -> WireJob {
        let kind = match job.kind {
            JobKind::Chat(c) => WireKind::Chat {
                thinking: THINKING.iter().position(|t| *t == c.thinking).unwrap_or(3) as u8,
                ignore_eos: c.ignore_eos,
                think_budget: c.think_budget,
                endpoint: c.endpoint.to_string(),
                call_id_prefix: c.call_id_prefix.map(str::to_string),
            },
            JobKind::Completion { ignore_eos } => WireKind::Completion { ignore_eos },
        };
        let constraint = job.constraint.as_ref().map(|c| {
            let spec = match &c.spec {
                ConstraintSpec::JsonObject => WireConstraint::JsonObject,
                ConstraintSpec::JsonSchema { schema, strict } => WireConstraint::JsonSchema {
                    schema: schema.clone(),
                    strict: *strict,
                },
                ConstraintSpec::ToolCalls {
                    tools,
                    named,
                    parallel,
                } => WireConstraint::ToolCalls {
                    tools: tools.clone(),
                    named: named.clone(),
                    parallel: *parallel,
                },
            };
            (spec, c.start == ReplyStart::Think)
        });
        WireJob {
            id: job.id.clone(),
            kind,
            prompt: job.prompt.clone(),
            params: params_bits(&job.settings.params),
            stop: job.settings.stop.clone(),
            logprobs: job.settings.logprobs,
            constraint,
            max_new: job.max_new,
            index: job.index,
        }
    }

    fn into_job(self, tok: &Tokenizer) -> Result<Job, String> {
        let kind = match self.kind {
            WireKind::Chat {
                thinking,
                ignore_eos,
                think_budget,
                endpoint,
                call_id_prefix,
            } => JobKind::Chat(super::worker::ChatJob {
                thinking: THINKING[usize::from(thinking).min(3)],
                ignore_eos,
                think_budget,
                endpoint: known(&endpoint)?,
                call_id_prefix: call_id_prefix.as_deref().map(known).transpose()?,
            }),
            WireKind::Completion { ignore_eos } => JobKind::Completion { ignore_eos },
        };
        let constraint = match self.constraint {
            Some((wire, think)) => Some(compile(tok, wire, think)?),
            None => None,
        };
        let (events, _) = mpsc::unbounded_channel();
        let permit = Arc::new(tokio::sync::Semaphore::new(1))
            .try_acquire_owned()
            .map_err(|e| format!("admission: {e}"))?;
        Ok(Job {
            id: self.id,
            queued: Instant::now(),
            kind,
            prompt: self.prompt,
            settings: GenSettings {
                params: params_of(self.params),
                max_tokens: None,
                stop: self.stop,
                stream: false,
                include_usage: false,
                n: 1,
                return_tokens: false,
                logprobs: self.logprobs,
            },
            constraint,
            max_new: self.max_new,
            index: self.index,
            events,
            _admission: permit,
        })
    }
}

fn compile(tok: &Tokenizer, wire: WireConstraint, think: bool) -> Result<JobConstraint, String> {
    let spec = match wire {
        WireConstraint::JsonObject => ConstraintSpec::JsonObject,
        WireConstraint::JsonSchema { schema, strict } => {
            ConstraintSpec::JsonSchema { schema, strict }
        }
        WireConstraint::ToolCalls {
            tools,
            named,
            parallel,
        } => ConstraintSpec::ToolCalls {
            tools,
            named,
            parallel,
        },
    };
    let start = match think {
        true => ReplyStart::Think,
        false => ReplyStart::Response,
    };
    let compiled = Constraint::new(tok, &spec, start)
        .map_err(|e| format!("a constraint rank 0 compiled fails here: {e}"))?;
    Ok(JobConstraint {
        compiled,
        spec,
        start,
    })
}
