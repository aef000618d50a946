//! Where the server reports what it does: one trait, so that the core never prints. The `k3`
//! binary logs to stderr with a live status line on a terminal ([`Stderr`]); a program that
//! embeds the server routes the same events to its own logging.

use std::net::SocketAddr;

/// The server's log lines and live status.
pub trait Events: Send + Sync {
    /// One log line: a request served, refused or cancelled, listening, shutting down.
    fn log(&self, line: &str);
    /// The scheduler's state in one line, after every step: each prefilling request's
    /// progress and ETA, how many generate at what s/token, how many wait.
    fn status(&self, _line: &str) {}
    /// [`crate::serve`] listens on `addr`; called once, after SIGINT and SIGTERM are caught
    /// and before the `listening on` log line.
    fn listening(&self, _addr: SocketAddr) {}
}

/// Reports nothing (a follower rank of an MPI job: rank 0 logs every request).
#[derive(Debug, Default, Clone, Copy)]
pub struct Quiet;

impl Events for Quiet {
    fn log(&self, _line: &str) {}
}

/// stderr: each log line stamped with the time (RFC 3339, UTC, ms); on a terminal the status
/// is a line under the log (docs/SERVER.md "Logging").
#[derive(Debug, Default, Clone, Copy)]
pub struct Stderr;

impl Events for Stderr {
    fn log(&self, line: &str) {
        let now = humantime::format_rfc3339_millis(std::time::SystemTime::now());
        crate::status_line::print(&format!("{now} {line}"));
    }
    fn status(&self, line: &str) {
        crate::status_line::set(line.to_string());
    }
    fn listening(&self, _addr: SocketAddr) {
        crate::status_line::start();
    }
}
