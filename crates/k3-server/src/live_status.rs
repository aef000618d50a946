//! What `GET /v1/status` reports, kept live: the scheduler publishes a [`Snapshot`] after
//! every step (`publish`), the handlers add the queued ids (`enqueue`) and the scheduler takes
//! them off as it admits (`dequeue`). `status_api.rs` serves it.

use super::status_line::JobView;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// One live request as the scheduler last saw it.
#[derive(Clone, Debug)]
pub(crate) struct JobSnapshot {
    pub(crate) id: String,
    pub(crate) fed: usize,
    pub(crate) prompt: usize,
    pub(crate) seconds: f64,
    pub(crate) generated: usize,
    pub(crate) thinking: bool,
}

/// A queued job: its id, and whether it still exists (its event sender, held weakly by the
/// caller: the job holds the sender, so a job dropped without reaching the scheduler —
/// cancelled while queued over ranks — leaves the list by itself).
struct Waiting {
    id: String,
    alive: Box<dyn Fn() -> bool + Send>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting").field("id", &self.id).finish()
    }
}

/// What the scheduler published after its last step, and the queue.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub(crate) jobs: Vec<JobSnapshot>,
    /// Jobs waiting for the scheduler, oldest first (one entry per queued choice).
    queued: Vec<Waiting>,
    pub(crate) step_seconds: f64,
    pub(crate) taken: Option<Instant>,
}

/// The snapshot shared by the scheduler thread and the handlers.
#[derive(Debug, Default)]
pub struct LiveStatus(Mutex<Snapshot>);

impl LiveStatus {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Snapshot> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The scheduler's view after a step (the same views the status line shows).
    pub fn publish(&self, views: &[JobView<'_>], step_seconds: f64) {
        let jobs = views
            .iter()
            .map(|v| JobSnapshot {
                id: v.id.to_string(),
                fed: v.fed,
                prompt: v.prompt,
                seconds: v.seconds,
                generated: v.generated,
                thinking: v.thinking,
            })
            .collect();
        let mut s = self.lock();
        s.jobs = jobs;
        s.step_seconds = step_seconds;
        s.taken = Some(Instant::now());
    }

    /// A job was queued; `alive` says whether it still exists.
    pub fn enqueue(&self, id: &str, alive: impl Fn() -> bool + Send + 'static) {
        self.lock().queued.push(Waiting {
            id: id.to_string(),
            alive: Box::new(alive),
        });
    }

    /// The scheduler took a job off the queue (admitted, or skipped as cancelled).
    pub fn dequeue(&self, id: &str) {
        let mut s = self.lock();
        if let Some(i) = s.queued.iter().position(|q| q.id == id) {
            s.queued.remove(i);
        }
    }

    /// The ids still waiting, oldest first (jobs dropped while queued are forgotten).
    pub(crate) fn queued_ids(s: &mut Snapshot) -> Vec<String> {
        s.queued.retain(|w| (w.alive)());
        s.queued.iter().map(|w| w.id.clone()).collect()
    }
}
