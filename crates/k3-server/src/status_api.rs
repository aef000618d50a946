//! `GET /v1/status` (docs/SERVER.md "Status"): what the scheduler is doing, as JSON — the
//! live status line's facts (each request's prefill progress and ETA, thinking or answering,
//! tokens so far), the requests waiting in order (so a client finds its queue position), the
//! last step's seconds, and the memory plan in force. The chat page polls it.
//!
//! The scheduler publishes a [`Snapshot`] after every step (`publish`), the handlers add
//! the queued ids (`enqueue`) and the scheduler takes them off as it admits (`dequeue`); a
//! request reads the snapshot and ages its clocks by the time since it was taken, so a long
//! prefill step does not freeze the elapsed time and ETA the page shows.

use super::live_status::{JobSnapshot, LiveStatus, Snapshot};
use super::routes::{authorize, json_response};
use super::worker::Metrics;
use super::Shared;
use crate::error_body::OpenAiError;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use k3_plan::{Budget, MemoryPlan};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A request's phase as the page names it.
fn phase(j: &JobSnapshot) -> &'static str {
    match (j.fed < j.prompt, j.thinking) {
        (true, _) => "prefill",
        (false, true) => "thinking",
        (false, false) => "generating",
    }
}

/// Seconds left of a prefill at its own rate so far (`None` before its first fed token).
fn prefill_eta(j: &JobSnapshot, seconds: f64) -> Option<f64> {
    (j.fed > 0 && j.fed < j.prompt).then(|| seconds / j.fed as f64 * (j.prompt - j.fed) as f64)
}

fn jobs_json(s: &Snapshot) -> Vec<Value> {
    let age = s.taken.map_or(0.0, |t| t.elapsed().as_secs_f64());
    s.jobs
        .iter()
        .map(|j| {
            let seconds = j.seconds + age;
            json!({
                "id": j.id,
                "phase": phase(j),
                "prompt_tokens": j.prompt,
                "prompt_fed": j.fed,
                "generated": j.generated,
                "elapsed_s": seconds,
                "prefill_eta_s": prefill_eta(j, j.seconds).map(|eta| (eta - age).max(0.0)),
            })
        })
        .collect()
}

/// How the user sized memory: `{"kind": "preset", "preset"}`, `{"kind": "split",
/// "trunk_bytes", "cache_bytes"}` or `{"kind": "total", "total_bytes"}`.
fn budget_json(budget: &Budget) -> Value {
    match *budget {
        Budget::Preset(p) => json!({"kind": "preset", "preset": p.name()}),
        Budget::Split { trunk, cache } => {
            json!({"kind": "split", "trunk_bytes": trunk, "cache_bytes": cache})
        }
        Budget::Total(total) => json!({"kind": "total", "total_bytes": total}),
    }
}

/// The memory plan in force, or `{"resident": true}` when weights are used in place.
fn plan_json(plan: Option<&MemoryPlan>) -> Value {
    let Some(p) = plan else {
        return json!({"resident": true});
    };
    json!({
        "resident": false,
        "budget": budget_json(&p.request.budget),
        "total_bytes": p.total_bytes(),
        "layers": p.n_layers,
        "trunk_pinned_layers": p.trunk.pinned.len(),
        "trunk_pinned_bytes": p.trunk.pinned_bytes,
        "trunk_ring_slots": p.trunk.ring_slots,
        "trunk_streamed_bytes_per_token": p.trunk.streamed_per_token,
        "expert_cache_bytes": p.expert_cache_bytes(),
        "expert_cache_slots": p.expert_slots,
        "routed_experts": p.n_routed_experts,
        "prefill_chunk": p.prefill_chunk,
        "ctx": p.request.ctx,
        "sessions": p.request.sessions,
    })
}

/// The whole status object.
pub fn status_json(shared: &Shared) -> Value {
    let m: &Metrics = &shared.metrics;
    let mut s = m.live.lock();
    let queued = LiveStatus::queued_ids(&mut s);
    let stats = shared.engine.stats();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    json!({
        "object": "k3.status",
        "model": shared.model_id,
        "ctx": shared.ctx,
        "state": if s.jobs.is_empty() && queued.is_empty() { "idle" } else { "busy" },
        "jobs": jobs_json(&s),
        "queued": queued,
        "last_step_s": s.step_seconds,
        "seconds_per_token": f64::from_bits(load(&m.seconds_per_token_bits)),
        "tokens_generated_total": load(&m.tokens_generated),
        "requests_total": load(&m.requests),
        "expert_hit_rate": stats.expert_hit_rate(),
        "bytes_read_total": stats.bytes_read(),
        "decode": m.decode.sum(crate::decode_stats::drafter(&shared.engine)).json(),
        "plan": plan_json(shared.engine.plan()),
        "uptime_s": super::routes::now().saturating_sub(shared.started),
    })
}

/// `GET /v1/status`: the status object (needs the API key when one is set, like `/metrics`).
pub async fn status(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, OpenAiError> {
    authorize(&shared, &headers)?;
    Ok(json_response(status_json(&shared)))
}

/// A streamed response names its request in `x-request-id` before the first token, so a
/// client (the chat page) finds itself in the status's `queued` and `jobs` while it waits.
pub fn with_request_id(id: &str, mut response: Response) -> Response {
    if let Ok(value) = axum::http::HeaderValue::from_str(id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status_line::JobView;

    fn view(id: &str, fed: usize, prompt: usize, thinking: bool) -> JobView<'_> {
        JobView {
            id,
            fed,
            prompt,
            seconds: 10.0,
            generated: 3,
            thinking,
        }
    }

    #[test]
    fn jobs_carry_their_phase_and_prefill_eta() {
        let live = LiveStatus::default();
        let views = [
            view("a", 100, 500, false),
            view("b", 30, 30, true),
            view("c", 30, 30, false),
            view("d", 0, 64, false),
        ];
        live.publish(&views, 0.5);
        let jobs = jobs_json(&live.lock());
        let phases: Vec<_> = jobs.iter().map(|j| j["phase"].clone()).collect();
        assert_eq!(
            phases,
            [
                json!("prefill"),
                json!("thinking"),
                json!("generating"),
                json!("prefill")
            ]
        );
        // 100 of 500 fed in 10 s: 400 left at the same rate is 40 s (less the snapshot's age)
        let eta = jobs[0]["prefill_eta_s"].as_f64().unwrap();
        assert!((39.0..=40.0).contains(&eta), "{eta}");
        assert!(jobs[1]["prefill_eta_s"].is_null());
        assert!(jobs[3]["prefill_eta_s"].is_null());
        assert!(jobs[0]["elapsed_s"].as_f64().unwrap() >= 10.0);
    }

    #[test]
    fn the_queue_keeps_arrival_order_and_loses_admitted_and_dropped_jobs() {
        let live = LiveStatus::default();
        let mut senders = Vec::new();
        for id in ["x", "y", "x", "z", "gone"] {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel::<()>();
            let weak = tx.downgrade();
            live.enqueue(id, move || weak.upgrade().is_some());
            senders.push(tx);
        }
        live.dequeue("x");
        live.dequeue("nobody");
        // the job "gone" is dropped without reaching the scheduler
        drop(senders.pop());
        assert_eq!(LiveStatus::queued_ids(&mut live.lock()), ["y", "x", "z"]);
    }

    #[test]
    fn a_resident_model_has_no_budget() {
        assert_eq!(plan_json(None), json!({"resident": true}));
        assert_eq!(
            budget_json(&Budget::Split { trunk: 3, cache: 4 }),
            json!({"kind": "split", "trunk_bytes": 3, "cache_bytes": 4})
        );
    }
}
