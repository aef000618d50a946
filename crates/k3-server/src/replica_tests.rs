//! The replicated scheduler (docs/DISTRIBUTED.md#serve-over-ranks) in-process: N ranks of a
//! `LocalComm` group as threads, each with its own engine, rank 0 fed jobs as the HTTP
//! handlers feed it. Concurrent streaming jobs (sampled, a stop string, a constrained tool
//! call, a prefix-cache hit) must give the ids, text and tool calls of one process.

use super::replica::Inbox;
use super::scheduler::{self, Limits};
use super::worker::{ChatJob, Event, Finish, Job, JobConstraint, JobKind, Metrics};
use k3_api::GenSettings;
use k3_engine::chat_template::{render_with_tools, ChatMessage, Thinking, ToolSpec};
use k3_engine::{
    Comm, Constraint, ConstraintSpec, Engine, EngineOptions, LocalComm, ReplyStart, SamplingParams,
};
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

const CTX: usize = 1024;

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3")
}

fn open(comm: Option<Arc<dyn Comm>>) -> Arc<Engine> {
    let options = EngineOptions {
        ctx: CTX,
        sessions: 8,
        threads: Some(1),
        comm,
        ..EngineOptions::default()
    };
    Arc::new(Engine::open(&tiny(), options).unwrap())
}

/// One request as the handlers would queue it.
#[derive(Clone)]
struct Req {
    kind: JobKind,
    prompt: Vec<u32>,
    params: SamplingParams,
    stop: Vec<String>,
    tools: Option<ConstraintSpec>,
    max_new: usize,
    /// The client leaves after its first event.
    leaves: bool,
}

/// What rank 0 streamed for a job.
#[derive(Debug, PartialEq)]
struct Outcome {
    ids: Vec<u32>,
    text: String,
    calls: Vec<(String, String)>,
    finish: Finish,
    reused: usize,
}

fn job(engine: &Engine, r: &Req, n: usize) -> (Job, mpsc::UnboundedReceiver<Event>) {
    let (events, rx) = mpsc::unbounded_channel();
    let tok = engine.tokenizer().unwrap();
    let constraint = r.tools.clone().map(|spec| JobConstraint {
        compiled: Constraint::new(tok, &spec, ReplyStart::Response).unwrap(),
        spec,
        start: ReplyStart::Response,
    });
    let permit = Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned();
    let settings = GenSettings {
        params: r.params.clone(),
        max_tokens: None,
        stop: r.stop.clone(),
        stream: true,
        include_usage: false,
        n: 1,
        return_tokens: true,
        logprobs: None,
    };
    let job = Job {
        id: format!("job-{n}"),
        queued: Instant::now(),
        kind: r.kind,
        prompt: r.prompt.clone(),
        settings,
        constraint,
        max_new: r.max_new,
        index: 0,
        events,
        _admission: permit.unwrap(),
    };
    (job, rx)
}

/// Every event of a job until it is done.
fn outcome(mut rx: mpsc::UnboundedReceiver<Event>) -> Outcome {
    let (mut text, mut calls) = (String::new(), Vec::<(String, String)>::new());
    while let Some(event) = rx.blocking_recv() {
        match event {
            Event::Delta { content, .. } => text.push_str(&content),
            Event::ToolCallStart { name, .. } => calls.push((name, String::new())),
            Event::ToolCallArguments { fragment, .. } => {
                calls.last_mut().unwrap().1.push_str(&fragment)
            }
            Event::ToolCallEnd { .. } => {}
            Event::Failed(e) => panic!("a job failed: {e}"),
            Event::Done(s) => {
                return Outcome {
                    ids: s.ids,
                    text,
                    calls,
                    finish: s.finish,
                    reused: s.prompt_tokens_reused,
                }
            }
        }
    }
    panic!("the scheduler dropped a job")
}

/// Serves `phases` (each phase's jobs queued together, the next phase after they finish;
/// a phase may build on the previous outcomes) over `ranks` ranks; rank 0's outcomes.
/// A phase's requests, given the outcomes so far.
type Phase<'a> = &'a dyn Fn(&[Outcome]) -> Vec<Req>;

fn serve(ranks: usize, phases: &[Phase<'_>]) -> Vec<Outcome> {
    let lim = Limits {
        ctx: CTX,
        parallel: 4,
        ubatch: 8,
        reuse: true,
        special: false,
    };
    let mut comms: Vec<Arc<dyn Comm>> = match ranks {
        1 => Vec::new(),
        n => (LocalComm::group(n).into_iter())
            .map(|c| Arc::new(c) as Arc<dyn Comm>)
            .collect(),
    };
    let (tx, rx) = mpsc::channel(16);
    let leader = comms.first().cloned();
    let followers: Vec<_> = (comms.drain(..).skip(1))
        .map(|comm| {
            std::thread::spawn(move || {
                let engine = open(Some(comm.clone()));
                let metrics = Arc::new(Metrics::default());
                scheduler::run(
                    engine,
                    Inbox::Follower(comm),
                    metrics,
                    lim,
                    Arc::new(crate::Quiet),
                )
            })
        })
        .collect();
    let engine = open(leader.clone());
    let inbox = match leader {
        Some(comm) => Inbox::Leader {
            jobs: rx,
            comm,
            shutdown: Arc::new(AtomicBool::new(false)),
        },
        None => Inbox::Local(rx),
    };
    let metrics = Arc::new(Metrics::default());
    let worker = {
        let (engine, metrics) = (engine.clone(), metrics.clone());
        std::thread::spawn(move || {
            scheduler::run(engine, inbox, metrics, lim, Arc::new(crate::Quiet))
        })
    };
    let mut done: Vec<Outcome> = Vec::new();
    for phase in phases {
        let reqs = phase(&done);
        let receivers: Vec<_> = (reqs.iter().enumerate())
            .map(|(i, r)| {
                let (job, rx) = job(&engine, r, done.len() + i);
                metrics
                    .queue_depth
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tx.blocking_send(job).unwrap_or_else(|_| panic!("queued"));
                rx
            })
            .collect();
        let mut receivers: Vec<_> = receivers.into_iter().map(Some).collect();
        for (_, rx) in reqs
            .iter()
            .zip(receivers.iter_mut())
            .filter(|(r, _)| r.leaves)
        {
            if let Some(mut rx) = rx.take() {
                rx.blocking_recv(); // then the client leaves: every rank cancels the job
            }
        }
        done.extend(receivers.into_iter().map(|rx| match rx {
            Some(rx) => outcome(rx),
            None => Outcome {
                ids: Vec::new(),
                text: String::new(),
                calls: Vec::new(),
                finish: Finish::Cancelled,
                reused: 0,
            },
        }));
    }
    drop(tx); // the handlers are gone: every rank shuts down
    worker.join().unwrap().unwrap();
    for f in followers {
        f.join().unwrap().unwrap();
    }
    done
}

fn sampled(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_p: 0.95,
        seed,
        ..SamplingParams::default()
    }
}

/// Phase 1: five concurrent jobs, streamed; the client of the last leaves early.
fn first_phase(_: &[Outcome]) -> Vec<Req> {
    let engine = open(None);
    let tok = engine.tokenizer().unwrap();
    let completion = JobKind::Completion { ignore_eos: true };
    let text = |t: &str| tok.encode(t, false);
    let weather = json!({"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}},
                          "required": ["city"]});
    let tools = vec![ToolSpec {
        name: "get_weather".into(),
        description: Some("Weather forecast".into()),
        parameters: weather.clone(),
    }];
    let user = [ChatMessage::new("user", "What is the weather in Paris?")];
    let chat_prompt = render_with_tools(tok, &user, &tools, Thinking::Off, true).unwrap();
    let chat = JobKind::Chat(ChatJob {
        thinking: Thinking::Off,
        ignore_eos: false,
        think_budget: None,
        endpoint: "/v1/chat/completions",
        call_id_prefix: Some("call_"),
    });
    vec![
        Req {
            kind: completion,
            prompt: text("The train left at"),
            params: sampled(0.0, 0),
            stop: Vec::new(),
            tools: None,
            max_new: 12,
            leaves: false,
        },
        Req {
            kind: completion,
            prompt: text("Once upon a time"),
            params: sampled(0.9, 11),
            stop: vec!["e".into()],
            tools: None,
            max_new: 24,
            leaves: false,
        },
        Req {
            kind: chat,
            prompt: chat_prompt,
            params: sampled(1.0, 7),
            stop: Vec::new(),
            tools: Some(ConstraintSpec::ToolCalls {
                tools: vec![("get_weather".into(), weather)],
                named: None,
                parallel: false,
            }),
            max_new: 400,
            leaves: false,
        },
        Req {
            kind: completion,
            prompt: text("Hello, world"),
            params: sampled(0.7, 3),
            stop: Vec::new(),
            tools: None,
            max_new: 16,
            leaves: false,
        },
        Req {
            kind: JobKind::Completion { ignore_eos: true },
            prompt: text("A long story"),
            params: sampled(0.0, 0),
            stop: Vec::new(),
            tools: None,
            max_new: 600,
            leaves: true,
        },
    ]
}

/// Phase 2: one job alone (its states are the newest saved ones).
fn second_phase(before: &[Outcome]) -> Vec<Req> {
    vec![first_phase(before).swap_remove(0)]
}

/// Phase 3: phase 2's conversation continued (its saved state is reused) beside a fresh
/// sampled job.
fn third_phase(before: &[Outcome]) -> Vec<Req> {
    let mut reqs = first_phase(before);
    let mut prompt = reqs[0].prompt.clone();
    prompt.extend(&before[5].ids);
    prompt.extend(&reqs[3].prompt);
    reqs[0].prompt = prompt;
    vec![reqs.swap_remove(0), reqs.swap_remove(1)]
}

#[test]
fn concurrent_streaming_jobs_over_two_and_three_ranks_match_one_process() {
    let phases: [Phase<'_>; 3] = [&first_phase, &second_phase, &third_phase];
    let one = serve(1, &phases);
    assert_eq!(one.len(), 8);
    assert_eq!(one[0].ids.len(), 12, "greedy completion runs to its length");
    assert!(
        matches!(one[1].finish, Finish::StopSequence(_)),
        "the stop string ends job 1: {:?}",
        one[1]
    );
    assert_eq!(one[2].finish, Finish::ToolCalls, "{:?}", one[2]);
    assert_eq!(one[2].calls[0].0, "get_weather");
    let args: serde_json::Value = serde_json::from_str(&one[2].calls[0].1).unwrap();
    assert!(args["city"].is_string(), "constrained arguments: {args}");
    assert!(
        one[6].reused > one[5].ids.len(),
        "the continued conversation reuses the saved state: {:?}",
        one[6]
    );
    for ranks in [2, 3] {
        let group = serve(ranks, &phases);
        for (i, (got, want)) in group.iter().zip(&one).enumerate() {
            assert_eq!(got, want, "N={ranks}: job {i}");
        }
    }
}
