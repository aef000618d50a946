//! `k3 serve`: the flags, the model and its engine; the server itself is the `k3-server`
//! library (docs/SERVER.md). What the binary adds: the API key from a flag, a file or the
//! environment, `k3 ps`'s record while listening, and exit codes.

use crate::engine_args::EngineArgs;
use crate::CliError;
use clap::Args;
use k3_server::registry::{Announcement, Published};
use k3_server::{Events, Options, ServeError, Stderr};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

#[derive(Args)]
#[command(
    after_help = "Examples:\n  k3 serve fixtures/tiny-k3 --port 8080\n  K3_API_KEY=$KEY k3 serve /models/kimi-k3 --preset server\n  curl -s localhost:8080/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'"
)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub model: crate::engine_args::ModelArgs,
    /// Address to bind (loopback by default; anything else exposes the model to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (default 8080, or `port` from the config file; 0 = any free port; the
    /// bound address is printed on stderr).
    #[arg(long)]
    pub port: Option<u16>,
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics. On a shared machine prefer
    /// $K3_API_KEY or --api-key-file: a key on the command line is visible in `ps`.
    #[arg(long, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// Read the API key from the first line of FILE (instead of --api-key or $K3_API_KEY).
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Requests that may wait while `--parallel` others generate; more ⇒ 429.
    #[arg(long, default_value_t = 8)]
    pub queue: usize,
    /// Generations batched together at most (continuous batching; llama-server's name). The
    /// memory plan reserves each one's state (KDA state + latent KV for `--ctx`).
    #[arg(long, visible_alias = "np", default_value_t = 4)]
    pub parallel: usize,
    /// Prompt tokens fed per step while other requests are generating: bounds the time
    /// between their tokens when a long prompt arrives (alone, a prompt is fed in planner
    /// chunks).
    #[arg(long, visible_alias = "ubatch-size", default_value_t = 64)]
    pub ubatch: usize,
    /// Context positions per request (prompt + reply; default 4096, or `ctx` from the config
    /// file, or the model's trained context when smaller; past it only when given).
    #[arg(short = 'c', long, visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// Do not keep saved sessions for conversation state reuse (every prompt is fed whole).
    #[arg(long)]
    pub no_reuse: bool,
    /// Print control tokens the model writes in its text as their spellings (llama.cpp's
    /// `--special`); by default they are left out of every reply. Template markup never is text.
    #[arg(long)]
    pub special: bool,
    /// Do not serve the chat page at `/` (docs/SERVER.md "Chat page"); the API is unchanged.
    #[arg(long)]
    pub no_webui: bool,
}

/// Environment variable holding the API key (kept out of `ps`).
const ENV_API_KEY: &str = "K3_API_KEY";

/// The API key: `--api-key`, else `--api-key-file`'s first line, else `$K3_API_KEY`.
fn api_key(args: &ServeArgs) -> Result<Option<String>, CliError> {
    if let Some(k) = &args.api_key {
        return Ok(Some(k.clone()));
    }
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CliError::usage(format!(
                "{}: cannot read the API key file: {e}",
                path.display()
            ))
        })?;
        let key = text.lines().next().unwrap_or("").trim().to_string();
        if key.is_empty() {
            return Err(CliError::usage(format!(
                "{}: the API key file is empty: put the key on its first line",
                path.display()
            )));
        }
        return Ok(Some(key));
    }
    Ok(std::env::var(ENV_API_KEY).ok().filter(|k| !k.is_empty()))
}

/// `-c` over the config file's `ctx` (explicit), else the default capped at the trained range,
/// checked against the trained range (README "Context").
fn serve_ctx(
    args: &ServeArgs,
    file: &k3_engine::config_file::FileConfig,
    dir: &std::path::Path,
) -> Result<usize, CliError> {
    let trained = crate::context::trained_context(dir);
    let explicit = args.ctx.or(file.ctx);
    let ctx = explicit.unwrap_or(crate::context::default_ctx(trained));
    if ctx < 2 {
        return Err(CliError::usage("-c/--ctx must be at least 2"));
    }
    crate::context::check_trained(dir, trained, ctx, explicit, "requests")?;
    Ok(ctx)
}

impl From<ServeError> for CliError {
    fn from(e: ServeError) -> Self {
        match e {
            ServeError::Usage(m) => CliError::usage(m),
            ServeError::Runtime(m) => CliError::runtime(m),
        }
    }
}

/// stderr events, plus the `k3 ps` record from `listening` until the server returns
/// (docs/MODELS.md#k3-ps).
struct CliEvents {
    announcement: Mutex<Option<Announcement>>,
    record: Mutex<Option<Published>>,
}

impl Events for CliEvents {
    fn log(&self, line: &str) {
        Stderr.log(line);
    }
    fn status(&self, line: &str) {
        Stderr.status(line);
    }
    fn listening(&self, addr: SocketAddr) {
        Stderr.listening(addr);
        let announced = self.announcement.lock().map(|mut a| a.take());
        if let Ok(Some(a)) = announced {
            // A record that cannot be written costs only `k3 ps`'s view: the server goes on.
            match (a.publish(addr.port()), self.record.lock()) {
                (Ok(published), Ok(mut record)) => *record = Some(published),
                (Err(e), _) => eprintln!("k3: {e}"),
                (Ok(_), Err(_)) => {}
            }
        }
    }
}

/// The served model's name: its directory's.
fn model_id(model_dir: &std::path::Path) -> String {
    std::fs::canonicalize(model_dir)
        .unwrap_or_else(|_| model_dir.to_path_buf())
        .file_name()
        .map_or_else(|| "k3".to_string(), |n| n.to_string_lossy().into_owned())
}

pub fn serve(args: ServeArgs, group: Option<Arc<dyn k3_engine::Comm>>) -> Result<(), CliError> {
    if args.queue == 0 {
        return Err(CliError::usage("--queue must be at least 1"));
    }
    let file = k3_engine::config_file::load()?;
    let model_dir = args.model.resolve(&file)?;
    let ctx = serve_ctx(&args, &file, &model_dir)?;
    let port = args.port.or(file.port).unwrap_or(8080);
    let key = api_key(&args)?;
    if args.parallel == 0 || args.ubatch == 0 {
        return Err(CliError::usage(
            "--parallel and --ubatch must be at least 1",
        ));
    }
    let mut options = args.engine.options(&file, ctx, group.clone())?;
    // every batched session's state, and every saved one, inside the budget
    let saved = if args.no_reuse {
        0
    } else {
        k3_server::LRU_CAPACITY
    };
    options.sessions = args.parallel + saved;
    let resident = args.engine.resident;
    args.engine.set_numerics()?;
    let engine = Arc::new(crate::engine_args::open_engine(
        &model_dir, options, resident, true,
    )?);
    crate::engine_args::print_plan(&engine);
    crate::engine_args::tokenizer_of(&engine, &model_dir)?;
    let server = Options {
        model_id: model_id(&model_dir),
        ctx,
        parallel: args.parallel,
        queue: args.queue,
        ubatch: args.ubatch,
        reuse: !args.no_reuse,
        api_key: key,
        webui: !args.no_webui,
        special: args.special,
    };
    let events = Arc::new(CliEvents {
        announcement: Mutex::new(Some(Announcement::new(&model_dir, &engine))),
        record: Mutex::new(None),
    });
    let addr = format!("{}:{port}", args.host);
    let served = k3_server::serve(engine, &server, &addr, group, events.clone());
    // The record goes when serve returns, whatever the outcome.
    if let Ok(mut record) = events.record.lock() {
        record.take();
    }
    Ok(served?)
}
