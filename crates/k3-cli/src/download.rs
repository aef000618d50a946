//! `k3 download [REPO] DIR` (docs/QUICKSTART.md#download): lists the repository on the hub,
//! refuses up front when DIR's filesystem lacks the space, fetches several files at once under
//! one progress bar (resuming partial files, checking every file's hash, fetching a damaged
//! file again) and ends with `k3 verify DIR`.

use crate::CliError;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use k3_hub::{present_bytes, Hub, Outcome, Progress, RepoFile};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The released Kimi K3 repository.
pub const DEFAULT_REPO: &str = "moonshotai/Kimi-K3";

#[derive(Args)]
#[command(
    override_usage = "k3 download [OPTIONS] [REPO] <DIR>",
    after_help = "Examples:\n  k3 download /models/kimi-k3\n  k3 download moonshotai/Kimi-K3 /models/kimi-k3 -j 8\n  HF_ENDPOINT=https://hub.example HF_TOKEN=hf_… k3 download org/model /models/m\n\nEnvironment: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (else $HF_HOME/token), K3_HUB_TIMEOUT (seconds without a byte before a stalled hub is given up, default 30)."
)]
pub struct DownloadArgs {
    /// [REPO] DIR: the hub repository (default moonshotai/Kimi-K3) and the directory to fill.
    #[arg(value_name = "TARGET", num_args = 1..=2, required = true)]
    pub targets: Vec<String>,
    /// Branch, tag or commit to fetch.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Files fetched at the same time.
    #[arg(short = 'j', long, default_value_t = 4)]
    pub jobs: usize,
    /// Skip the closing `k3 verify DIR`.
    #[arg(long)]
    pub no_verify: bool,
}

/// The hub endpoint in use (`HF_ENDPOINT`, else huggingface.co), for the pull record.
pub fn endpoint() -> String {
    k3_hub::endpoint_from_env()
}

pub fn download(args: DownloadArgs) -> Result<(), CliError> {
    let (repo, dir) = match args.targets.as_slice() {
        [dir] => (DEFAULT_REPO.to_string(), PathBuf::from(dir)),
        [repo, dir] => (repo.clone(), PathBuf::from(dir)),
        _ => return Err(CliError::usage("k3 download takes [REPO] DIR")),
    };
    if args.jobs == 0 {
        return Err(CliError::usage("-j/--jobs must be at least 1"));
    }
    let hub = Hub::from_env(&repo, &args.revision);
    eprintln!("listing {}", hub.describe());
    let files = hub.list()?;
    if files.is_empty() {
        return Err(CliError::usage(format!(
            "{} lists no files",
            hub.describe()
        )));
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| CliError::runtime(format!("{}: {e}", dir.display())))?;
    let total: u64 = files.iter().map(|f| f.size).sum();
    let need: u64 = files.iter().map(|f| f.size - present_bytes(&dir, f)).sum();
    check_space(&dir, total, need)?;
    let t0 = Instant::now();
    let outcomes = fetch_all(&hub, &dir, files, need, args.jobs)?;
    report(&outcomes, t0.elapsed().as_secs_f64(), &dir);
    if args.no_verify {
        return Ok(());
    }
    crate::verify_cmd::verify(crate::verify_cmd::VerifyArgs {
        model_dir: dir,
        deep: false,
        manifest: None,
        write_manifest: None,
        all: false,
        trunk: None,
    })
}

/// Refuses (exit 2) when the bytes still to fetch exceed the free space of `dir`'s filesystem.
fn check_space(dir: &Path, total: u64, need: u64) -> Result<(), CliError> {
    let gb = |b: u64| b as f64 / 1e9;
    let Some(free) = k3_store::probe::free_disk(dir) else {
        eprintln!(
            "k3: cannot tell the free space of {}; going on",
            dir.display()
        );
        return Ok(());
    };
    eprintln!(
        "{:.2} GB in all, {:.2} GB still to fetch, {:.2} GB free on {}",
        gb(total),
        gb(need),
        gb(free),
        dir.display()
    );
    if need > free {
        return Err(CliError::usage(format!(
            "{} has {:.2} GB free but {:.2} GB are still to fetch ({} bytes more than there is room for): free space or choose a directory on another disk",
            dir.display(),
            gb(free),
            gb(need),
            need - free
        )));
    }
    Ok(())
}

fn progress_bar(len: u64) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(
            "downloading [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb
}

/// The download's progress bar on stderr; events go above it (or alone, off a terminal).
struct Bar(ProgressBar);

impl Progress for Bar {
    fn add_total(&self, bytes: u64) {
        self.0.inc_length(bytes);
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn say(&self, line: &str) {
        match self.0.is_hidden() {
            true => eprintln!("{line}"),
            false => self.0.println(line),
        }
    }
}

/// Fetches every file with `jobs` threads under one progress bar.
fn fetch_all(
    hub: &Hub,
    dir: &Path,
    files: Vec<RepoFile>,
    need: u64,
    jobs: usize,
) -> Result<Vec<(RepoFile, Outcome)>, CliError> {
    let bar = Bar(progress_bar(need));
    let fetched = k3_hub::fetch_all(hub, dir, files, jobs, &bar);
    bar.0.finish_and_clear();
    Ok(fetched?)
}

/// One summary line on stderr.
fn report(outcomes: &[(RepoFile, Outcome)], secs: f64, dir: &Path) {
    let fetched: u64 = outcomes.iter().map(|(_, o)| o.fetched).sum();
    let present = outcomes.iter().filter(|(_, o)| o.present).count();
    let resumed = outcomes.iter().filter(|(_, o)| o.resumed_from > 0).count();
    let refetched = outcomes.iter().filter(|(_, o)| o.refetched > 0).count();
    eprintln!(
        "{} files in {}: fetched {:.3} GB in {secs:.1} s ({:.1} MB/s); {present} already complete, {resumed} resumed, {refetched} fetched again after a wrong hash; every file's hash matches the hub's",
        outcomes.len(),
        dir.display(),
        fetched as f64 / 1e9,
        fetched as f64 / 1e6 / secs.max(1e-9)
    );
}
