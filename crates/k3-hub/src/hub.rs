//! The few Hugging Face hub calls `k3 download` needs (docs/QUICKSTART.md#download): the file
//! list with sizes and hashes (`/api/models/{repo}/tree/{revision}?recursive=true`, following
//! `Link: <…>; rel="next"` pages), and a file's bytes (`/{repo}/resolve/{revision}/{path}`).
//! Endpoint from `HF_ENDPOINT`, token from `HF_TOKEN` or `$HF_HOME/token`.

use crate::HubError;
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// The hub used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How a file's content is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Digest {
    /// An LFS file: SHA-256 of the content (`lfs.oid`).
    Sha256(String),
    /// A plain git file: the git blob id, SHA-1 of `"blob {len}\0"` + content (`oid`).
    GitSha1(String),
}

/// One file of the repository.
#[derive(Clone, Debug)]
pub struct RepoFile {
    /// Path inside the repository (`/`-separated, checked to stay inside it).
    pub path: String,
    /// Length in bytes.
    pub size: u64,
    /// Expected hash.
    pub digest: Digest,
}

#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    oid: String,
    #[serde(default)]
    lfs: Option<LfsInfo>,
}

#[derive(Deserialize)]
struct LfsInfo {
    oid: String,
    size: u64,
}

/// A repository on a hub, with the HTTP agent and credentials to reach it.
pub struct Hub {
    agent: ureq::Agent,
    endpoint: String,
    repo: String,
    revision: String,
    token: Option<String>,
}

impl Hub {
    /// The hub from the environment (`HF_ENDPOINT`, `HF_TOKEN`, `HF_HOME`).
    pub fn from_env(repo: &str, revision: &str) -> Hub {
        let stall = stall_timeout();
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(stall)
            .timeout_read(stall)
            .user_agent(concat!("k3/", env!("CARGO_PKG_VERSION")))
            .build();
        Hub {
            agent,
            endpoint: endpoint_from_env(),
            repo: repo.to_string(),
            revision: revision.to_string(),
            token: token_from_env(),
        }
    }

    /// `repo@revision on endpoint`, for messages.
    pub fn describe(&self) -> String {
        format!("{} ({}) on {}", self.repo, self.revision, self.endpoint)
    }

    fn get(&self, url: &str) -> ureq::Request {
        let req = self.agent.get(url);
        match &self.token {
            Some(t) => req.set("Authorization", &format!("Bearer {t}")),
            None => req,
        }
    }

    /// Every file of the repository at the revision.
    pub fn list(&self) -> Result<Vec<RepoFile>, HubError> {
        let mut url = format!(
            "{}/api/models/{}/tree/{}?recursive=true",
            self.endpoint, self.repo, self.revision
        );
        let mut files = Vec::new();
        loop {
            let resp = self.get(&url).call().map_err(|e| self.api_error(&url, e))?;
            let next = resp.header("link").and_then(next_link);
            let entries: Vec<TreeEntry> = resp.into_json().map_err(|e| {
                HubError::Failed(format!(
                    "{url}: the hub's file list is not the expected JSON: {e}"
                ))
            })?;
            for e in entries.into_iter().filter(|e| e.kind == "file") {
                files.push(repo_file(e)?);
            }
            match next {
                Some(n) => url = n,
                None => return Ok(files),
            }
        }
    }

    /// A GET of `path`'s bytes, from byte `from` on (a Range request when `from > 0`).
    pub fn fetch(&self, path: &str, from: u64) -> Result<ureq::Response, Box<ureq::Error>> {
        let url = format!(
            "{}/{}/resolve/{}/{}",
            self.endpoint, self.repo, self.revision, path
        );
        let req = self.get(&url);
        let req = if from > 0 {
            req.set("Range", &format!("bytes={from}-"))
        } else {
            req
        };
        req.call().map_err(Box::new)
    }

    /// The listing call's error: 401/403/404 are refusals the user can act on (exit 2).
    fn api_error(&self, url: &str, e: ureq::Error) -> HubError {
        match e {
            ureq::Error::Status(code @ (401 | 403), _) => HubError::Refused(format!(
                "{url}: HTTP {code}: the hub refused access to {}: set HF_TOKEN to a token that may read it (or accept the model's licence on its page)",
                self.repo
            )),
            ureq::Error::Status(404, _) => HubError::Refused(format!(
                "{url}: HTTP 404: no repository {} with revision {} on {}: check the name (default moonshotai/Kimi-K3) and HF_ENDPOINT",
                self.repo, self.revision, self.endpoint
            )),
            ureq::Error::Status(code, _) => {
                HubError::Failed(format!("{url}: the hub answered HTTP {code}"))
            }
            ureq::Error::Transport(t) => HubError::Failed(format!("{url}: {}", transport_text(&t))),
        }
    }
}

/// `HF_ENDPOINT` without a trailing `/`, else [`DEFAULT_ENDPOINT`].
pub fn endpoint_from_env() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
        .trim_end_matches('/')
        .to_string()
}

/// Seconds without a byte from the hub before a connection, listing or transfer is given up
/// (a transfer is then resumed): `K3_HUB_TIMEOUT`, default [`DEFAULT_STALL_SECS`]
/// (docs/QUICKSTART.md#download).
pub fn stall_timeout() -> Duration {
    let secs = std::env::var("K3_HUB_TIMEOUT")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(DEFAULT_STALL_SECS);
    Duration::from_secs_f64(secs)
}

/// The stall limit when `K3_HUB_TIMEOUT` is unset (was a silent 120 s read timeout).
pub const DEFAULT_STALL_SECS: f64 = 30.0;

/// A transport error without the URL ureq puts in front (the caller names the URL once);
/// a stall says how long k3 waited and how to wait longer.
pub fn transport_text(t: &ureq::Transport) -> String {
    let stalled = std::error::Error::source(t)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|e| {
            matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            )
        });
    if stalled {
        return format!(
            "no answer for {:.0} s: the hub (or a proxy) stalled; try again, or wait longer with K3_HUB_TIMEOUT=SECONDS",
            stall_timeout().as_secs_f64()
        );
    }
    let mut text = t.kind().to_string();
    if let Some(m) = t.message() {
        text.push_str(&format!(": {m}"));
    }
    if let Some(s) = std::error::Error::source(t) {
        text.push_str(&format!(": {s}"));
    }
    text
}

/// `HF_TOKEN`, else the token file `huggingface-cli login` writes (`$HF_HOME/token`, default
/// `~/.cache/huggingface/token`).
fn token_from_env() -> Option<String> {
    if let Some(t) = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Some(t.trim().to_string());
    }
    let home = std::env::var_os("HF_HOME").map(PathBuf::from).or_else(|| {
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface"))
    })?;
    let t = std::fs::read_to_string(home.join("token")).ok()?;
    Some(t.trim().to_string()).filter(|t| !t.is_empty())
}

/// The `rel="next"` target of a `Link` header.
fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        params.contains("rel=\"next\"").then(|| {
            target
                .trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_string()
        })
    })
}

/// A tree entry as a file to fetch, refusing a path that would leave the target directory.
fn repo_file(e: TreeEntry) -> Result<RepoFile, HubError> {
    let p = Path::new(&e.path);
    let inside = !e.path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !inside {
        return Err(HubError::Refused(format!(
            "the hub lists a file {:?} that is not a plain relative path: refusing to write outside the target directory",
            e.path
        )));
    }
    let (size, digest) = match e.lfs {
        Some(l) => (l.size, Digest::Sha256(l.oid.to_ascii_lowercase())),
        None => (e.size, Digest::GitSha1(e.oid.to_ascii_lowercase())),
    };
    Ok(RepoFile {
        path: e.path,
        size,
        digest,
    })
}
