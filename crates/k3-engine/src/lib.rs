//! # k3-engine — the embeddable Kimi K3 API
//!
//! Open a model directory, create a [`Session`], feed token ids, step or generate with a
//! callback per token, read logits, drop.
//!
//! ```no_run
//! use k3_engine::{Engine, EngineOptions, DecodeMode};
//! let engine = Engine::open("fixtures/tiny-k3".as_ref(), EngineOptions::default())?;
//! let mut session = engine.new_session(256)?;
//! session.feed(&[1, 2, 3])?;
//! let ids = session.generate(8, DecodeMode::Incremental, |_id| true)?;
//! println!("{ids:?}");
//! # Ok::<(), k3_engine::EngineError>(())
//! ```

mod error;
mod resident;
mod session;

pub use error::{EngineError, EXIT_EXPERT, EXIT_RUNTIME, EXIT_USAGE};
pub use k3_format::K3Config;
pub use session::{argmax, DecodeMode, Session};

use k3_model::Model;
use resident::ResidentStore;
use std::path::{Path, PathBuf};

/// How to open a model.
#[derive(Clone, Debug, Default)]
pub struct EngineOptions {
    /// Compute threads (default: the number of available cores).
    pub threads: Option<usize>,
}

/// An opened model: config, weights and the compute pool. Create sessions from it.
pub struct Engine {
    dir: PathBuf,
    config: K3Config,
    model: Model,
    store: ResidentStore,
    pool: rayon::ThreadPool,
}

impl Engine {
    /// Opens `dir` (a checkpoint in the released format: `config.json` + safetensors shards),
    /// validates the config, binds every tensor by name and checks shapes and dtypes.
    pub fn open(dir: &Path, options: EngineOptions) -> Result<Engine, EngineError> {
        if !dir.is_dir() {
            return Err(EngineError::ModelDir {
                path: dir.to_path_buf(),
                what: "not a directory: pass the model directory (config.json + *.safetensors)".into(),
            });
        }
        let config = K3Config::load(&dir.join("config.json"))?;
        let store = ResidentStore::open(dir, &config)?;
        let model = Model::new(&config)?;
        let threads = options.threads.unwrap_or_else(default_threads);
        if threads == 0 {
            return Err(EngineError::Invalid("--threads must be at least 1".into()));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("k3-compute-{i}"))
            .build()
            .map_err(|e| EngineError::Invalid(format!("cannot start {threads} compute threads: {e}")))?;
        Ok(Engine { dir: dir.to_path_buf(), config, model, store, pool })
    }

    /// The model directory this engine was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The model's configuration.
    pub fn config(&self) -> &K3Config {
        &self.config
    }

    /// Number of compute threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// A new conversation state able to hold `max_ctx` positions.
    pub fn new_session(&self, max_ctx: usize) -> Result<Session<'_>, EngineError> {
        Session::new(self, max_ctx)
    }
}

/// Physical parallelism available to this process.
fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
