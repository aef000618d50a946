//! The registry of running `k3 serve` processes that `k3 ps` lists (docs/MODELS.md#k3-ps).
//! Each server writes `PID.json` into the servers directory (`$XDG_RUNTIME_DIR/k3/servers`,
//! else `$TMPDIR/k3-UID/servers`) once it listens and removes it when it returns; a server
//! killed by a signal cannot, so [`running_servers`] prunes every record whose process is gone
//! (or whose pid now names another process: the record keeps the process's start time).

use k3_plan::plan::fmt_bytes;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What a running server holds.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ServerRecord {
    /// The server's process id.
    pub pid: u32,
    /// The process's start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
    /// The port it listens on.
    pub port: u16,
    /// The model directory it opened (canonical).
    pub model_dir: PathBuf,
    /// The memory plan it runs under, one line.
    pub plan: String,
    /// When it started listening (seconds since the Unix epoch).
    pub started: u64,
}

/// The directory the records live in.
pub fn servers_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(run) => PathBuf::from(run).join("k3/servers"),
        // SAFETY: getuid has no preconditions and cannot fail.
        None => std::env::temp_dir().join(format!("k3-{}/servers", unsafe { libc::getuid() })),
    }
}

/// Start time (clock ticks since boot) of process `pid`, `None` when it is gone.
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name start at field 3; starttime is field 22.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Resident set size of process `pid` (`VmRSS`), `None` when it is gone.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// The record `k3 serve` publishes, prepared before it listens (docs/MODELS.md#k3-ps).
pub struct Announcement {
    model_dir: PathBuf,
    plan: String,
}

/// Removes the record when dropped (when the server returns).
pub struct Published(PathBuf);

/// A record that could not be written; it costs only `k3 ps`'s view of the server.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {} for `k3 ps`: {source}", path.display())]
pub struct PublishError {
    /// The record's path.
    pub path: PathBuf,
    /// Why it could not be written.
    pub source: std::io::Error,
}

impl Drop for Published {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Announcement {
    /// What `engine`, opened on `model_dir`, holds.
    pub fn new(model_dir: &Path, engine: &k3_engine::Engine) -> Announcement {
        let plan = match engine.plan() {
            Some(p) => format!(
                "{} (trunk {}, expert cache {})",
                fmt_bytes(p.total_bytes()),
                fmt_bytes(p.trunk.total_bytes()),
                fmt_bytes(p.expert_cache_bytes())
            ),
            None => "resident (no budget: every weight in memory)".into(),
        };
        Announcement {
            model_dir: std::fs::canonicalize(model_dir).unwrap_or_else(|_| model_dir.into()),
            plan,
        }
    }

    /// Writes the record for a server listening on `port`.
    pub fn publish(self, port: u16) -> Result<Published, PublishError> {
        let pid = std::process::id();
        let record = ServerRecord {
            pid,
            start_ticks: start_ticks(pid).unwrap_or(0),
            port,
            model_dir: self.model_dir,
            plan: self.plan,
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let dir = servers_dir();
        let path = dir.join(format!("{pid}.json"));
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&path, serde_json::to_vec_pretty(&record)?));
        match written {
            Ok(()) => Ok(Published(path)),
            Err(source) => Err(PublishError { path, source }),
        }
    }
}

/// The records of running servers; stale ones are deleted.
pub fn running_servers() -> Vec<ServerRecord> {
    let Ok(rd) = std::fs::read_dir(servers_dir()) else {
        return Vec::new();
    };
    let mut live = Vec::new();
    for path in rd.filter_map(Result::ok).map(|e| e.path()) {
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let record: Option<ServerRecord> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        match record {
            Some(r) if start_ticks(r.pid) == Some(r.start_ticks) => live.push(r),
            _ => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    live.sort_by_key(|r| r.pid);
    live
}

/// The running servers that opened `dir`.
pub fn servers_holding(dir: &Path) -> Vec<ServerRecord> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.into());
    running_servers()
        .into_iter()
        .filter(|r| r.model_dir == dir)
        .collect()
}
