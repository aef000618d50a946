//! The MPI transport of k3's distribution seam (docs/DISTRIBUTED.md): under
//! `mpirun -np N` (N > 1) every process opens the same model as one rank of the group;
//! rank 0 owns the product (stdout, files), the followers run the same calls silently.
//!
//! Built with the `mpi` feature (a system MPI with `mpicc`, and libclang for the binding's
//! generator); without it — or without `mpirun`, a world of one — [`start`] returns no group
//! and k3 is one process. The group is handed to whoever runs a model; nothing keeps it in a
//! global.

use k3_engine::Comm;
use std::sync::Arc;

/// What [`start`] began: the group (none for one process), and MPI itself, finalized when
/// this is dropped.
#[derive(Default)]
pub struct Started {
    /// This process's group when it is one rank of several.
    pub comm: Option<Arc<dyn Comm>>,
    #[cfg(feature = "mpi")]
    _universe: Option<mpi::environment::Universe>,
}

/// One process: built without the `mpi` feature there is nothing to start.
#[cfg(not(feature = "mpi"))]
pub fn start() -> Result<Started, String> {
    Ok(Started::default())
}

/// Ends every rank of the job with exit status `code` (`MPI_Abort`); nothing to do for one
/// process or without the `mpi` feature.
pub fn abort_all(code: u8) {
    #[cfg(feature = "mpi")]
    transport::abort_all(code);
    #[cfg(not(feature = "mpi"))]
    let _ = code;
}

#[cfg(feature = "mpi")]
pub use transport::start;

#[cfg(feature = "mpi")]
mod transport {
    use super::Started;
    use k3_engine::{Comm, CommError};
    use mpi::datatype::PartitionMut;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;
    use mpi::Threading;
    use std::sync::Arc;

    /// `MPI_COMM_WORLD`; every call builds the handle afresh (it is a constant), so the
    /// transport holds no raw handle and is `Send + Sync`. Calls are serialized: one forward
    /// pass at a time (`MPI_THREAD_SERIALIZED`).
    #[derive(Debug)]
    struct MpiComm {
        rank: usize,
        size: usize,
    }

    fn world() -> SimpleCommunicator {
        SimpleCommunicator::world()
    }

    fn counts_i32(counts: &[usize]) -> Result<Vec<i32>, CommError> {
        counts
            .iter()
            .map(|&c| {
                i32::try_from(c)
                    .map_err(|_| CommError::Transport(format!("{c} values in one message")))
            })
            .collect()
    }

    impl Comm for MpiComm {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn allgather_f32(
            &self,
            mine: &[f32],
            counts: &[usize],
            out: &mut [f32],
        ) -> Result<(), CommError> {
            k3_engine::check_counts(self.rank, mine.len(), counts, out.len())?;
            let counts = counts_i32(counts)?;
            let displs: Vec<i32> = counts
                .iter()
                .scan(0i32, |acc, &c| {
                    let d = *acc;
                    *acc += c;
                    Some(d)
                })
                .collect();
            let mut part = PartitionMut::new(out, counts, displs);
            world().all_gather_varcount_into(mine, &mut part);
            Ok(())
        }
        fn broadcast_u32(&self, root: usize, ids: &mut Vec<u32>) -> Result<(), CommError> {
            let w = world();
            let root = w.process_at_rank(root as i32);
            let mut len = ids.len() as u64;
            // The length comes by a non-blocking broadcast waited on with a backoff: a rank
            // can wait here for minutes (an idle server's followers wait for the next tick,
            // a chat's for the next line), and Open MPI's blocking waits spin a core.
            mpi::request::scope(|scope| {
                let mut req = root.immediate_broadcast_into(scope, &mut len);
                let mut idle = Backoff::default();
                loop {
                    match req.test() {
                        Ok(_) => break,
                        Err(pending) => req = pending,
                    }
                    idle.pause();
                }
            });
            ids.resize(len as usize, 0);
            root.broadcast_into(&mut ids[..]);
            Ok(())
        }
        fn allgather_u64(&self, mine: u64) -> Result<Vec<u64>, CommError> {
            let mut all = vec![0u64; self.size];
            world().all_gather_into(&mine, &mut all[..]);
            Ok(all)
        }
        fn barrier(&self) -> Result<(), CommError> {
            world().barrier();
            Ok(())
        }
        fn abort(&self, reason: &str) {
            eprintln!("k3: error: rank {} of {}: {reason}", self.rank, self.size);
            // MPI_Abort ends every rank of the job (mpirun reports the aborting rank).
            world().abort(1)
        }
    }

    /// Pauses between tests of a pending request: spins through the first ~100 µs (peers
    /// that are already in the collective finish it within microseconds), then sleeps from
    /// 50 µs doubling up to 1 ms, so a long wait costs a few wake-ups per millisecond of one
    /// core instead of all of it and the reply is late by at most 1 ms.
    struct Backoff {
        started: std::time::Instant,
        sleep_us: u64,
    }

    impl Default for Backoff {
        fn default() -> Self {
            Backoff {
                started: std::time::Instant::now(),
                sleep_us: 0,
            }
        }
    }

    impl Backoff {
        fn pause(&mut self) {
            if self.started.elapsed() < std::time::Duration::from_micros(100) {
                std::hint::spin_loop();
                return;
            }
            self.sleep_us = (self.sleep_us * 2).clamp(50, 1_000);
            std::thread::sleep(std::time::Duration::from_micros(self.sleep_us));
        }
    }

    /// `MPI_Abort` with `code`: mpirun ends every rank and exits with it.
    pub fn abort_all(code: u8) {
        world().abort(i32::from(code))
    }

    /// Initializes MPI; under `mpirun -np N` with N > 1 returns the group and sends the
    /// followers' stdout to /dev/null. The returned [`Started`] finalizes MPI when dropped.
    pub fn start() -> Result<Started, String> {
        let Some((universe, _)) = mpi::initialize_with_threading(Threading::Serialized) else {
            return Ok(Started::default());
        };
        let w = universe.world();
        let (rank, size) = (w.rank() as usize, w.size() as usize);
        let mut comm: Option<Arc<dyn Comm>> = None;
        if size > 1 {
            comm = Some(Arc::new(MpiComm { rank, size }));
            if rank > 0 {
                silence_stdout()?;
            }
        }
        Ok(Started {
            comm,
            _universe: Some(universe),
        })
    }

    /// A follower's stdout goes to /dev/null: rank 0 alone prints the product.
    fn silence_stdout() -> Result<(), String> {
        use std::os::fd::AsRawFd;
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .map_err(|e| format!("/dev/null: {e}"))?;
        // SAFETY: dup2 on two open descriptors owned by this process; fd 1 stays valid.
        let rc = unsafe { libc::dup2(null.as_raw_fd(), 1) };
        if rc < 0 {
            return Err("cannot redirect a follower's stdout".into());
        }
        Ok(())
    }
}
