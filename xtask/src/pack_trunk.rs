//! `cargo xtask pack-trunk MODEL_DIR OUT_DIR [--overwrite] [--verify] [--compress]`: copy every
//! layer's trunk run into `OUT_DIR/trunk.bin` + `trunk.json` (docs/FORMATS.md#packed-trunk), or
//! with `--compress` store it compressed (docs/FORMATS.md#compressed-trunk).

use k3_format::pack::PackOptions;
use k3_format::{bind_model, write_trunk_pack, Checkpoint, K3Config, TrunkPack};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

/// Options of the subcommand.
pub struct Options<'a> {
    /// Checkpoint directory (config.json + safetensors shards).
    pub model_dir: &'a Path,
    /// Where trunk.bin and trunk.json go.
    pub out_dir: &'a Path,
    /// Replace an existing pack.
    pub overwrite: bool,
    /// Re-read and re-hash every layer afterwards.
    pub verify: bool,
    /// Write a compressed pack (`k3_format::pack::write_compressed_pack`).
    pub compress: bool,
}

/// Runs the subcommand.
pub fn run(opts: &Options) -> ExitCode {
    match pack(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pack-trunk: {e}");
            ExitCode::FAILURE
        }
    }
}

fn pack(opts: &Options) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = K3Config::load(opts.model_dir.join("config.json"))?;
    let ck = Checkpoint::open(opts.model_dir)?;
    let binding = bind_model(&ck, &cfg)?;
    println!("{}", cfg.summary("config.json"));
    let t0 = Instant::now();
    let pack_opts = PackOptions {
        overwrite: opts.overwrite,
        ..PackOptions::default()
    };
    let mut line = ProgressLine::new(if opts.compress { "compress" } else { "copy" });
    let write = if opts.compress {
        k3_format::pack::write_compressed_pack
    } else {
        write_trunk_pack
    };
    let pack = write(
        &ck,
        &binding,
        &cfg,
        opts.out_dir,
        &pack_opts,
        &mut |d, t| line.update(d, t),
    )?;
    line.finish();
    pack.check_against(&binding, &cfg)?;
    report("packed", &pack, t0.elapsed().as_secs_f64());
    if opts.verify {
        let t1 = Instant::now();
        let mut line = ProgressLine::new("verify");
        pack.verify_checksums(&mut |d, t| line.update(d, t))?;
        line.finish();
        report("verified", &pack, t1.elapsed().as_secs_f64());
    }
    Ok(())
}

fn report(what: &str, pack: &TrunkPack, secs: f64) {
    let bytes = pack.total_bytes();
    let stored = if pack.is_compressed() {
        format!(
            ", stored in {} = {:.3} of that",
            human(pack.stored_total_bytes()),
            pack.stored_total_bytes() as f64 / bytes.max(1) as f64
        )
    } else {
        String::new()
    };
    println!(
        "{what} {} layers, {bytes} bytes ({}{stored}; largest run {}) -> {} in {secs:.1} s ({:.0} MB/s)",
        pack.num_layers(),
        human(bytes),
        human(pack.max_run_bytes()),
        pack.path().display(),
        bytes as f64 / 1e6 / secs.max(1e-9),
    );
}

/// Decimal GB from 1 GB up, else MB.
fn human(bytes: u64) -> String {
    if bytes >= 1_000_000_000 {
        format!("{:.2} GB", bytes as f64 / 1e9)
    } else {
        format!("{:.2} MB", bytes as f64 / 1e6)
    }
}

/// A `\r`-rewritten progress line, updated at most once per whole percent.
struct ProgressLine {
    label: &'static str,
    start: Instant,
    shown: Option<u64>,
}

impl ProgressLine {
    fn new(label: &'static str) -> ProgressLine {
        ProgressLine {
            label,
            start: Instant::now(),
            shown: None,
        }
    }

    fn update(&mut self, done: u64, total: u64) {
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        if self.shown == Some(pct) {
            return;
        }
        self.shown = Some(pct);
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        eprint!(
            "\r{}: {pct:3}%  {} / {}  {:.0} MB/s ",
            self.label,
            human(done),
            human(total),
            done as f64 / 1e6 / secs
        );
        let _ = std::io::stderr().flush();
    }

    fn finish(&self) {
        if self.shown.is_some() {
            eprintln!();
        }
    }
}
