//! `k3 pull`, `k3 list`, `k3 show`, `k3 rm`: the local model store (docs/MODELS.md).
//! `pull` is `k3 download` (which ends with `k3 verify`) into the store, then `k3 pack` into
//! `NAME/trunk`, then the pull record `NAME/k3-model.json`.

use crate::CliError;
use clap::Args;
use k3_hub::store::{self, PullRecord, TRUNK_SUBDIR};
use k3_plan::plan::fmt_bytes;
use std::path::{Path, PathBuf};

#[derive(Args)]
#[command(
    after_help = "Examples:\n  k3 pull moonshotai/Kimi-K3\n  k3 pull org/model --name m --no-pack\n  k3 run Kimi-K3 --preset desktop -p Hello\n\nThe store: $K3_MODELS, else $XDG_DATA_HOME/k3/models, else ~/.local/share/k3/models.\nEnvironment of the hub: HF_ENDPOINT, HF_TOKEN (as `k3 download`)."
)]
pub struct PullArgs {
    /// The hub repository (owner/name), e.g. moonshotai/Kimi-K3.
    pub repo: String,
    /// Name to store it under (default: the repository's last component).
    #[arg(long)]
    pub name: Option<String>,
    /// Branch, tag or commit to fetch.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Files fetched at the same time.
    #[arg(short = 'j', long, default_value_t = 4)]
    pub jobs: usize,
    /// Do not pack the trunk into NAME/trunk (saves the trunk's size on disk; `run --trunk`
    /// then has nothing to read).
    #[arg(long)]
    pub no_pack: bool,
}

/// Downloads (resuming, hash-checked, verified), packs and records one model in the store.
pub fn pull(args: PullArgs) -> Result<(), CliError> {
    let name = match &args.name {
        Some(n) if store::is_store_name(n) => n.clone(),
        Some(n) => {
            return Err(CliError::usage(format!(
                "--name {n:?} is not a plain name (no '/', not '.' or '..')"
            )))
        }
        None => store::name_from_repo(&args.repo)?,
    };
    let dir = store::models_root()?.join(&name);
    if let Some(old) = store::read_record(&dir).filter(|r| r.repo != args.repo) {
        return Err(CliError::usage(format!(
            "{name} is already in the store from {} ({}): `k3 rm {name}` first, or pull under another --name",
            old.repo,
            dir.display()
        )));
    }
    eprintln!("pulling {} into {}", args.repo, dir.display());
    crate::download::download(crate::download::DownloadArgs {
        targets: vec![args.repo.clone(), dir.to_string_lossy().into_owned()],
        revision: args.revision.clone(),
        jobs: args.jobs,
        no_verify: false,
    })?;
    let packed = !args.no_pack && pack_trunk(&dir)?;
    store::write_record(
        &dir,
        &PullRecord {
            repo: args.repo.clone(),
            revision: args.revision,
            endpoint: crate::download::endpoint(),
            pulled_at: now_secs(),
            packed_trunk: packed,
        },
    )?;
    eprintln!(
        "stored {name} ({} on disk): k3 run {name} -p Hello",
        fmt_bytes(store::dir_bytes(&dir))
    );
    Ok(())
}

/// Packs `dir`'s trunk into `dir/trunk` unless a pack of these very shards is already there.
fn pack_trunk(dir: &Path) -> Result<bool, CliError> {
    let out = dir.join(TRUNK_SUBDIR);
    let current = k3_format::TrunkPack::open(&out).ok().is_some_and(|p| {
        k3_format::Checkpoint::open(dir).is_ok_and(|ck| p.check_source(&ck).is_ok())
    });
    if current {
        eprintln!("{}: packed trunk already up to date", out.display());
        return Ok(true);
    }
    if let Some((need, free)) = pack_room(dir).filter(|(need, free)| need > free) {
        eprintln!(
            "k3: note: not packing the trunk: it needs {:.2} GB and {} has {:.2} GB free; the model runs from its shards (pack it later with `k3 pack {} {}`)",
            need as f64 / 1e9,
            dir.display(),
            free as f64 / 1e9,
            dir.display(),
            out.display()
        );
        return Ok(false);
    }
    crate::pack::pack(crate::pack::PackArgs {
        model_dir: dir.to_path_buf(),
        out_dir: Some(out),
        adopt: None,
        overwrite: true,
        verify: false,
        compress: false,
        draft_quant: None,
    })?;
    Ok(true)
}

/// Bytes a trunk pack of `dir` takes (its layers' runs, each padded to 4096) and the free
/// bytes of its filesystem; `None` when either cannot be told (packing then goes ahead).
fn pack_room(dir: &Path) -> Option<(u64, u64)> {
    let ck = k3_format::Checkpoint::open(dir).ok()?;
    let cfg = k3_format::K3Config::load(dir.join("config.json")).ok()?;
    let binding = k3_format::bind_model(&ck, &cfg).ok()?;
    let need = binding
        .layers
        .iter()
        .map(|lt| lt.trunk_bytes().div_ceil(4096) * 4096)
        .sum();
    Some((need, k3_store::probe::free_disk(dir)?))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `3 days ago`, `5 minutes ago` …
fn age(then: u64) -> String {
    let s = now_secs().saturating_sub(then);
    match s {
        0..=59 => "just now".into(),
        60..=3599 => format!("{} minutes ago", s / 60),
        3600..=86_399 => format!("{} hours ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    }
}

#[derive(Args)]
#[command(after_help = "Example:\n  k3 list")]
pub struct ListArgs {}

/// One line per stored model on stdout: name, size on disk, repository, packed trunk, age.
pub fn list(_args: ListArgs) -> Result<(), CliError> {
    let root = store::models_root()?;
    let names = store::stored_names(&root);
    println!(
        "{:<24} {:>10} {:<32} {:<6} PULLED",
        "NAME", "SIZE", "REPOSITORY", "TRUNK"
    );
    for name in &names {
        let dir = root.join(name);
        let size = fmt_bytes(store::dir_bytes(&dir));
        match store::read_record(&dir) {
            Some(r) => println!(
                "{name:<24} {size:>10} {:<32} {:<6} {}",
                r.repo,
                if r.packed_trunk { "packed" } else { "-" },
                age(r.pulled_at)
            ),
            None => println!(
                "{name:<24} {size:>10} {:<32} {:<6} -",
                "(unfinished pull or copied in)", "-"
            ),
        }
    }
    if names.is_empty() {
        eprintln!(
            "no models in {} (k3 pull OWNER/REPO adds one)",
            root.display()
        );
    }
    Ok(())
}

#[derive(Args)]
#[command(after_help = "Examples:\n  k3 show Kimi-K3\n  k3 show /models/kimi-k3")]
pub struct ShowArgs {
    /// A stored model's NAME (`k3 list`) or a model directory.
    pub model: PathBuf,
}

/// Where the model is, where it came from, its config and shards, and how to run it.
pub fn show(args: ShowArgs) -> Result<(), CliError> {
    let dir = store::resolve_model(&args.model)?;
    let cfg = k3_format::K3Config::load(dir.join("config.json"))
        .map_err(|e| CliError::usage(e.to_string()))?;
    let ck = k3_format::Checkpoint::open(&dir).map_err(|e| CliError::usage(e.to_string()))?;
    let shard_bytes: u64 = ck.shards().iter().map(|s| s.file_len()).sum();
    println!("model       {}", args.model.display());
    println!("path        {}", dir.display());
    match store::read_record(&dir) {
        Some(r) => {
            println!(
                "repository  {} ({}) from {}",
                r.repo, r.revision, r.endpoint
            );
            println!("pulled      {}", age(r.pulled_at));
        }
        None => println!("repository  unknown (not pulled by k3 pull)"),
    }
    println!("{}", cfg.summary("config.json"));
    println!(
        "shards      {} files, {}",
        ck.shards().len(),
        fmt_bytes(shard_bytes)
    );
    println!("on disk     {}", fmt_bytes(store::dir_bytes(&dir)));
    let trunk = dir.join(TRUNK_SUBDIR);
    let run = format!("k3 run {}", args.model.display());
    match k3_format::TrunkPack::open(&trunk) {
        Ok(p) => {
            println!(
                "trunk pack  {} ({})",
                trunk.display(),
                fmt_bytes(p.total_bytes())
            );
            println!(
                "run         {run} --preset laptop --trunk {} -p Hello",
                trunk.display()
            );
        }
        Err(_) => {
            println!("trunk pack  none");
            println!("run         {run} --preset laptop -p Hello");
        }
    }
    Ok(())
}

#[derive(Args)]
#[command(after_help = "Example:\n  k3 rm Kimi-K3")]
pub struct RmArgs {
    /// The stored model's NAME (`k3 list`); directories outside the store are never removed.
    pub name: String,
    /// Remove it even while a running server (`k3 ps`) holds it.
    #[arg(long)]
    pub force: bool,
}

/// Deletes a stored model's directory, refusing a name not in the store or one a running
/// server holds.
pub fn rm(args: RmArgs) -> Result<(), CliError> {
    let root = store::models_root()?;
    let dir = root.join(&args.name);
    if !store::is_store_name(&args.name) || !dir.is_dir() {
        let names = store::stored_names(&root);
        return Err(CliError::usage(format!(
            "{:?} is not a stored model (stored in {}: {}): `k3 rm` takes a NAME from `k3 list`",
            args.name,
            root.display(),
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        )));
    }
    if let Some(s) = k3_server::registry::servers_holding(&dir)
        .first()
        .filter(|_| !args.force)
    {
        return Err(CliError::usage(format!(
            "{} is held by a running server (pid {}, port {}): stop it first, or pass --force",
            args.name, s.pid, s.port
        )));
    }
    let bytes = store::dir_bytes(&dir);
    std::fs::remove_dir_all(&dir)
        .map_err(|e| CliError::runtime(format!("{}: {e}", dir.display())))?;
    eprintln!("removed {} ({} freed)", args.name, fmt_bytes(bytes));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_room_counts_what_a_pack_writes() {
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3");
        let (need, free) = pack_room(&model).expect("tiny-k3 binds");
        assert!(free > 0);
        let out = std::env::temp_dir().join(format!("k3-pack-room-{}", std::process::id()));
        crate::pack::pack(crate::pack::PackArgs {
            model_dir: model,
            out_dir: Some(out.clone()),
            adopt: None,
            overwrite: true,
            verify: false,
            draft_quant: None,
            compress: false,
        })
        .unwrap_or_else(|e| panic!("packs: {}", e.message));
        let written = std::fs::metadata(out.join("trunk.bin")).unwrap().len();
        std::fs::remove_dir_all(&out).unwrap();
        assert!(
            written <= need && need - written < 4096,
            "estimate {need}, pack wrote {written}"
        );
    }
}
