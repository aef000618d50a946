//! The serving core of k3 and its HTTP adapters: an OpenAI- and Anthropic-compatible server
//! over one [`Engine`]. One core (`routes.rs`, the scheduler) sits behind thin protocol
//! adapters (`http_openai.rs`, `http_anthropic.rs`); request bodies and their validation are
//! the `k3-api` crate.
//!
//! The engine runs on ONE dedicated OS thread (the scheduler); handlers on a tokio runtime
//! parse and validate requests, render the prompt with the shared engine's tokenizer, and
//! queue jobs (at most `parallel` + `queue` at once; more ⇒ 429). Up to `parallel`
//! generations run together, batched into one forward pass per step (continuous batching).
//! See docs/SERVER.md.
//!
//! Two ways in: [`serve`] binds an address and serves until SIGINT/SIGTERM (what `k3 serve`
//! runs), and [`Core::start`] + [`Core::router`] give a router to nest into a program's own
//! axum app, next to its own routes:
//!
//! ```
//! use axum::{routing::get, Router};
//! use k3_engine::{Engine, EngineOptions};
//! use k3_server::{Core, Options, Quiet};
//! use std::sync::Arc;
//! use tower::ServiceExt; // `oneshot`: one request through the app, in-process
//!
//! # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tiny-k3");
//! // let dir = "fixtures/tiny-k3";
//! let engine = Arc::new(Engine::open(dir.as_ref(), EngineOptions::default())?);
//! let core = Core::start(engine, &Options::new("tiny-k3", 256), Arc::new(Quiet))?;
//! // The program's own route, and k3's OpenAI and Anthropic API under /llm.
//! let app = Router::new()
//!     .route("/hello", get(|| async { "hello" }))
//!     .nest("/llm", core.router());
//!
//! let runtime = tokio::runtime::Runtime::new()?;
//! let reply: serde_json::Value = runtime.block_on(async {
//!     let body = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}"#;
//!     let request = axum::http::Request::post("/llm/v1/chat/completions")
//!         .header("content-type", "application/json")
//!         .body(axum::body::Body::from(body))?;
//!     let response = app.clone().oneshot(request).await?;
//!     let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await?;
//!     Ok::<_, Box<dyn std::error::Error>>(serde_json::from_slice(&bytes)?)
//! })?;
//! assert_eq!(reply["object"], "chat.completion");
//! assert_eq!(reply["usage"]["completion_tokens"], 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod decode_stats;
mod error_body;
mod events;
mod http_anthropic;
mod http_openai;
mod live_status;
pub mod registry;
mod replica;
#[cfg(test)]
mod replica_tests;
mod room;
mod routes;
mod scheduler;
mod server;
mod status_api;
mod status_line;
mod webui;
mod worker;

pub use events::{Events, Quiet, Stderr};
pub use server::{serve, Core, Options, ServeError};
pub use worker::LRU_CAPACITY;

use k3_engine::Engine;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Request bodies larger than this are refused with 413.
const BODY_LIMIT: usize = 1 << 20;

/// A streaming response with nothing to send for this long gets a `: keep-alive` comment.
const SSE_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(5);

/// The keep-alive interval: [`SSE_KEEP_ALIVE`], or `K3_SSE_KEEP_ALIVE_MS` (≥ 1) when set (for
/// tests).
fn keep_alive_interval() -> std::time::Duration {
    std::env::var("K3_SSE_KEEP_ALIVE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(SSE_KEEP_ALIVE, std::time::Duration::from_millis)
}

/// State shared by every handler.
pub(crate) struct Shared {
    /// The engine, shared for its tokenizer and stats; only the worker thread generates.
    pub engine: Arc<Engine>,
    pub model_id: String,
    pub ctx: usize,
    pub started: u64,
    /// SHA-256 of the API key, when one is required.
    pub api_key_digest: Option<[u8; 32]>,
    pub jobs: mpsc::Sender<worker::Job>,
    /// `--parallel` + `--queue` permits: one per job generating or waiting.
    pub admission: Arc<tokio::sync::Semaphore>,
    pub metrics: Arc<worker::Metrics>,
    /// SSE keep-alive interval.
    pub keep_alive: std::time::Duration,
}

/// SHA-256 of an API key: both sides of the comparison get the same length.
pub(crate) fn key_digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Constant-time equality of two digests: every byte is compared, no early exit, so the
/// time does not depend on where they differ (and hashing first hides the key's length).
pub(crate) fn digest_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The engine is shared between the worker thread and the handlers.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Engine>();
};
