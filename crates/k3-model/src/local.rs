//! [`LocalComm`]: `N` ranks as `N` threads of one process (docs/DISTRIBUTED.md#in-process),
//! so `cargo test` proves the distributed model bit-identical without MPI installed.
//!
//! Every collective is one round of an exchange: each rank deposits its contribution, the
//! last to arrive publishes all of them (in rank order) and wakes the others. A rank that
//! aborts marks the group failed; every pending and later collective of every rank returns
//! [`CommError::Aborted`] naming it. A round that waits longer than the group's timeout
//! fails too (a rank that never arrives cannot hang the others).

use crate::dist::{check_counts, Comm, CommError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a rank waits for the others in one collective before giving up.
pub const LOCAL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Round {
    /// Completed rounds.
    gen: u64,
    /// This round's contributions so far.
    slots: Vec<Option<Vec<u32>>>,
    arrived: usize,
    /// The last completed round's contributions, rank order.
    published: Arc<Vec<Vec<u32>>>,
    /// The first rank to fail, and why.
    failed: Option<(usize, String)>,
}

struct Group {
    size: usize,
    timeout: Duration,
    round: Mutex<Round>,
    wake: Condvar,
}

/// One rank of an in-process group; [`LocalComm::group`] makes all of them.
#[derive(Clone)]
pub struct LocalComm {
    rank: usize,
    group: Arc<Group>,
}

impl std::fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalComm(rank {} of {})", self.rank, self.group.size)
    }
}

impl LocalComm {
    /// `size` ranks (`size ≥ 1`), index = rank; hand each to its own thread.
    pub fn group(size: usize) -> Vec<LocalComm> {
        Self::group_with_timeout(size, LOCAL_TIMEOUT)
    }

    /// [`LocalComm::group`] with a collective timeout of `timeout`.
    pub fn group_with_timeout(size: usize, timeout: Duration) -> Vec<LocalComm> {
        let size = size.max(1);
        let group = Arc::new(Group {
            size,
            timeout,
            round: Mutex::new(Round {
                slots: vec![None; size],
                ..Round::default()
            }),
            wake: Condvar::new(),
        });
        (0..size)
            .map(|rank| LocalComm {
                rank,
                group: Arc::clone(&group),
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Round> {
        // A rank that panicked holding the lock leaves the data consistent (no partial writes).
        self.group
            .round
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn failed(round: &Round) -> Option<CommError> {
        round
            .failed
            .as_ref()
            .map(|(rank, reason)| CommError::Aborted {
                rank: *rank,
                reason: reason.clone(),
            })
    }

    /// One round: deposits `mine`, returns every rank's contribution in rank order.
    fn exchange(&self, mine: Vec<u32>) -> Result<Arc<Vec<Vec<u32>>>, CommError> {
        let g = &self.group;
        let mut round = self.lock();
        if let Some(err) = Self::failed(&round) {
            return Err(err);
        }
        let my_gen = round.gen;
        round.slots[self.rank] = Some(mine);
        round.arrived += 1;
        if round.arrived == g.size {
            let all: Vec<Vec<u32>> = round
                .slots
                .iter_mut()
                .map(|s| s.take().unwrap_or_default())
                .collect();
            round.published = Arc::new(all);
            round.arrived = 0;
            round.gen += 1;
            g.wake.notify_all();
            return Ok(Arc::clone(&round.published));
        }
        let deadline = Instant::now() + g.timeout;
        while round.gen == my_gen {
            if let Some(err) = Self::failed(&round) {
                return Err(err);
            }
            let now = Instant::now();
            if now >= deadline {
                let reason = format!("rank {} waited {:?} for the others", self.rank, g.timeout);
                round.failed = Some((self.rank, reason.clone()));
                g.wake.notify_all();
                return Err(CommError::Aborted {
                    rank: self.rank,
                    reason,
                });
            }
            round = g
                .wake
                .wait_timeout(round, deadline - now)
                .unwrap_or_else(|poison| poison.into_inner())
                .0;
        }
        Ok(Arc::clone(&round.published))
    }
}

impl Comm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.group.size
    }
    fn allgather_f32(
        &self,
        mine: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError> {
        check_counts(self.rank, mine.len(), counts, out.len())?;
        let all = self.exchange(mine.iter().map(|v| v.to_bits()).collect())?;
        let mut off = 0;
        for (q, part) in all.iter().enumerate() {
            if part.len() != counts[q] {
                return Err(CommError::Mismatch(format!(
                    "rank {q} sent {} values, rank {} expected {}",
                    part.len(),
                    self.rank,
                    counts[q]
                )));
            }
            for (o, &b) in out[off..off + part.len()].iter_mut().zip(part) {
                *o = f32::from_bits(b);
            }
            off += part.len();
        }
        Ok(())
    }
    fn broadcast_u32(&self, root: usize, ids: &mut Vec<u32>) -> Result<(), CommError> {
        let mine = if self.rank == root {
            ids.clone()
        } else {
            Vec::new()
        };
        let all = self.exchange(mine)?;
        let from_root = all
            .get(root)
            .ok_or_else(|| CommError::Mismatch(format!("broadcast root {root} is not a rank")))?;
        ids.clone_from(from_root);
        Ok(())
    }
    fn allgather_u64(&self, mine: u64) -> Result<Vec<u64>, CommError> {
        let all = self.exchange(vec![mine as u32, (mine >> 32) as u32])?;
        Ok(all
            .iter()
            .map(|p| match p[..] {
                [lo, hi] => lo as u64 | (hi as u64) << 32,
                _ => 0,
            })
            .collect())
    }
    fn barrier(&self) -> Result<(), CommError> {
        self.exchange(Vec::new()).map(|_| ())
    }
    fn abort(&self, reason: &str) {
        let mut round = self.lock();
        if round.failed.is_none() {
            round.failed = Some((self.rank, reason.to_string()));
        }
        self.group.wake.notify_all();
    }
}
