//! `k3 verify MODEL_DIR --trunk PACK_DIR`: the packed trunk matches the checkpoint and every
//! layer's checksum holds — for a compressed pack, of the DECODED run, every chunk's stored
//! hash checked first (docs/FORMATS.md#compressed-trunk).

use k3_format::verify::{Check, Status};
use k3_format::{bind_model, Checkpoint, K3Config, TrunkPack};
use std::path::Path;

/// One check line for the pack in `pack_dir` against the checkpoint in `model_dir`.
pub fn check(model_dir: &Path, pack_dir: &Path) -> Check {
    match verify(model_dir, pack_dir) {
        Ok(summary) => Check {
            name: "trunk pack",
            status: Status::Pass,
            summary,
            details: Vec::new(),
        },
        Err(e) => Check {
            name: "trunk pack",
            status: Status::Fail,
            summary: format!("{}: refused", pack_dir.display()),
            details: vec![e],
        },
    }
}

fn verify(model_dir: &Path, pack_dir: &Path) -> Result<String, String> {
    let cfg = K3Config::load(model_dir.join("config.json")).map_err(|e| e.to_string())?;
    let ck = Checkpoint::open(model_dir).map_err(|e| e.to_string())?;
    let binding = bind_model(&ck, &cfg).map_err(|e| e.to_string())?;
    let pack = TrunkPack::open(pack_dir).map_err(|e| e.to_string())?;
    pack.check_against(&binding, &cfg)
        .map_err(|e| e.to_string())?;
    pack.check_source(&ck).map_err(|e| e.to_string())?;
    pack.verify_checksums(&mut |_, _| {})
        .map_err(|e| e.to_string())?;
    let stored = if pack.is_compressed() {
        format!(
            " decoded from {:.3} GB stored ({:.3})",
            pack.stored_total_bytes() as f64 / 1e9,
            pack.stored_total_bytes() as f64 / pack.total_bytes().max(1) as f64
        )
    } else {
        String::new()
    };
    Ok(format!(
        "{} layers, {:.3} GB{stored}: every layer's checksum matches",
        pack.num_layers(),
        pack.total_bytes() as f64 / 1e9
    ))
}
