//! The MPI group of this process (docs/DISTRIBUTED.md): the transport is the `k3-mpi` crate
//! (`--features mpi`); this is what the commands ask of the group. Without the feature, or
//! without `mpirun` (a world of one), k3 is one process.

use k3_engine::Comm;
use std::sync::Arc;

/// The MPI group this process runs in (none: one process). Made once by [`start`] in `main`
/// and handed to the commands that run a model; nothing reads it from a global.
#[derive(Clone, Default)]
pub struct Group(Option<Arc<dyn Comm>>);

impl Group {
    /// The communicator, when this process is one rank of several.
    pub fn comm(&self) -> Option<Arc<dyn Comm>> {
        self.0.clone()
    }

    /// Whether this process is a rank other than 0 (its product is discarded).
    pub fn is_follower(&self) -> bool {
        self.0.as_ref().is_some_and(|c| c.rank() > 0)
    }

    /// Replaces `ids` by rank 0's (a prompt read on rank 0 only, e.g. from stdin).
    pub fn share_ids(&self, ids: &mut Vec<u32>) -> Result<(), crate::CliError> {
        match &self.0 {
            Some(c) => c
                .broadcast_u32(0, ids)
                .map_err(|e| crate::CliError::runtime(format!("distributed: {e}"))),
            None => Ok(()),
        }
    }

    /// `rank R of N: ` when this process is one rank of several, else nothing.
    pub fn rank_prefix(&self) -> String {
        self.0
            .as_ref()
            .map(|c| format!("rank {} of {}: ", c.rank(), c.size()))
            .unwrap_or_default()
    }

    /// After this rank's error: ends every rank of the job with exit status `code` (the
    /// others may be waiting in a collective for this one). Nothing to do for one process.
    pub fn end(&self, code: u8) {
        if self.0.is_some() {
            k3_mpi::abort_all(code);
        }
    }
}

/// Starts MPI when built with it and run under `mpirun`; the guard finalizes it when dropped.
pub fn start() -> Result<(Group, k3_mpi::Started), crate::CliError> {
    let mut started = k3_mpi::start().map_err(crate::CliError::runtime)?;
    Ok((Group(started.comm.take()), started))
}
