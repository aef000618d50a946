//! k3-hub: models from the Hugging Face hub and the local model store, as a library.
//!
//! * [`Hub`]: the few hub calls a download needs — the file list with sizes and hashes, a
//!   file's bytes from an offset (docs/QUICKSTART.md#download).
//! * [`fetch_all`]: every file of a listing into a directory, several at once, resumable,
//!   each checked against the hub's hash before it takes its name.
//! * [`store`]: the local model store (`k3 pull/list/show/rm`, docs/MODELS.md): where it
//!   lives, names, pull records.
//! * [`manifest`]: SHA-256 / XXH3 sums of a model directory's files, compared with a
//!   published manifest (`k3 verify --deep`).
//!
//! Progress is reported through [`Progress`]; nothing here prints.

// Untrusted data must never reach an unwrap/expect (docs/RELIABILITY.md); tests may.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![forbid(unsafe_code)]

mod fetch;
mod hub;
pub mod manifest;
pub mod store;

pub use fetch::{part_path, present_bytes, Outcome};
pub use hub::{
    endpoint_from_env, stall_timeout, Digest, Hub, RepoFile, DEFAULT_ENDPOINT, DEFAULT_STALL_SECS,
};

use std::path::Path;
use std::sync::Mutex;

/// Why a hub or store call failed.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The request cannot succeed as given (no access, no such repository, a name or path
    /// refused): the user must change something. Exit code 2 in the binary.
    #[error("{0}")]
    Refused(String),
    /// It failed on the way (network, disk, a damaged transfer); running it again may work.
    #[error("{0}")]
    Failed(String),
}

/// Where a download reports its bytes and events.
pub trait Progress: Sync {
    /// `bytes` more to fetch than counted so far (a file fetched again, a lost resume).
    fn add_total(&self, bytes: u64);
    /// `bytes` more fetched.
    fn advance(&self, bytes: u64);
    /// One line worth telling: a resume, a hash mismatch and its re-fetch.
    fn say(&self, line: &str);
}

/// Fetches every file of `files` into `dir` with `jobs` threads, largest first. Fails listing
/// every file that failed (the files that succeeded stay, so a rerun resumes).
pub fn fetch_all(
    hub: &Hub,
    dir: &Path,
    mut files: Vec<RepoFile>,
    jobs: usize,
    progress: &dyn Progress,
) -> Result<Vec<(RepoFile, Outcome)>, HubError> {
    files.sort_by_key(|f| f.size);
    let workers = jobs.max(1).min(files.len());
    let queue = Mutex::new(files);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let next = queue.lock().map(|mut q| q.pop());
                let Ok(Some(f)) = next else { return };
                let r = fetch::fetch_file(hub, dir, &f, progress);
                if let Ok(mut all) = results.lock() {
                    all.push((f, r));
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_default();
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().err().cloned())
        .collect();
    if !failed.is_empty() {
        return Err(HubError::Failed(format!(
            "{} of {} files failed (run the same command again to resume):\n  {}",
            failed.len(),
            results.len(),
            failed.join("\n  ")
        )));
    }
    Ok(results
        .into_iter()
        .filter_map(|(f, r)| r.ok().map(|o| (f, o)))
        .collect())
}
