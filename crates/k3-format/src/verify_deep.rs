//! The checks of `k3 verify` that read more than headers: a packed trunk against its
//! checkpoint (`--trunk PACK_DIR`: the pack matches the checkpoint's shapes and shards, and
//! every layer's checksum holds — for a compressed pack, of the DECODED run, every chunk's
//! stored hash checked first, docs/FORMATS.md#compressed-trunk) and the MXFP4 scale bytes that
//! are NaN (`--deep`).

use crate::verify::{scale_nan_counts, Check, Status};
use crate::{bind_model, Checkpoint, K3Config, TrunkPack};
use std::path::Path;

/// One check line (`trunk pack`) for the pack in `pack_dir` against the checkpoint in
/// `model_dir`: PASS with its layers and bytes, or FAIL with the first refusal.
pub fn check_trunk_pack(model_dir: &Path, pack_dir: &Path) -> Check {
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

/// Counts E8M0 bytes equal to 255 per layer (`--deep`): a warning, never a failure. `progress`
/// is called with the scale bytes read as they are read.
pub fn scale_check(ck: &Checkpoint, progress: &(dyn Fn(u64) + Sync)) -> Check {
    let counts = scale_nan_counts(ck, progress);
    let (tensors, bytes, nan) = counts.values().fold((0, 0, 0), |a, c| {
        (a.0 + c.tensors, a.1 + c.bytes, a.2 + c.nan)
    });
    let with_nan = counts.values().filter(|c| c.nan > 0).count();
    let details = counts
        .iter()
        .filter(|(_, c)| c.nan > 0)
        .map(|(l, c)| {
            let layer = l.map_or("no layer".to_string(), |l| format!("layer {l}"));
            format!(
                "{layer}: {} of {} scale bytes are 255 (NaN groups, decoded as 0)",
                c.nan, c.bytes
            )
        })
        .collect();
    Check {
        name: "mxfp4 scales",
        status: if nan == 0 { Status::Pass } else { Status::Warn },
        summary: format!(
            "{nan} of {bytes} E8M0 scale bytes in {tensors} tensors are 255 (NaN), in {with_nan} layer(s)"
        ),
        details,
    }
}
