//! `cargo xtask gen-bench --released-sparse OUT_DIR`: the released checkpoint's full layout
//! (93 layers, 896 experts × 92 MoE layers, vocab 163,840, 96 shards, 497,220 tensors,
//! 1.56 TB apparent) as sparse files plus a 163,840-id tokenizer
//! (docs/PERFORMANCE.md#released-geometry; which bytes are written and why: `k3_format::released`).

use k3_format::released::{self, SparseSummary, DENSE_VOCAB_ROWS};
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// BPE ranks of the released tokenizer (163,840 ids less the 256 special slots).
pub const RANKS: usize = 163_584;

/// What was written, with the disk it takes.
pub struct Written {
    /// The shards' summary.
    pub sparse: SparseSummary,
    /// Bytes the directory occupies on disk (`du`: allocated blocks).
    pub disk_bytes: u64,
}

/// Writes the sparse checkpoint and the tokenizer into `dir`; checks every shard is as long
/// as its header says and mostly holes.
pub fn write(dir: &Path, seed: u64) -> Result<Written, String> {
    let sparse = released::write_sparse(dir, seed, true).map_err(|e| e.to_string())?;
    write_tokenizer(dir)?;
    let mut disk_bytes = 0u64;
    let mut apparent = 0u64;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let m = entry
            .metadata()
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        disk_bytes += m.blocks() * 512;
        if entry
            .file_name()
            .to_string_lossy()
            .ends_with(".safetensors")
        {
            apparent += m.len();
        }
    }
    if apparent != sparse.apparent_bytes {
        return Err(format!(
            "{}: the shards hold {apparent} bytes, their headers say {}: the filesystem did not \
             keep the sparse lengths",
            dir.display(),
            sparse.apparent_bytes
        ));
    }
    Ok(Written { sparse, disk_bytes })
}

/// Prints the one-paragraph summary of [`write`].
pub fn print(dir: &Path, w: &Written) {
    println!(
        "released sparse checkpoint in {}: {} shards, {} tensors, {:.3} TB apparent, \
         {:.2} GB on disk ({:.2} GB written: headers, router gates + biases, norm gains, \
         the first {DENSE_VOCAB_ROWS} rows of embed_tokens and lm_head), {RANKS} + 256 token \
         ids, in {:.1} s",
        dir.display(),
        w.sparse.n_shards,
        w.sparse.n_tensors,
        w.sparse.apparent_bytes as f64 / 1e12,
        w.disk_bytes as f64 / 1e9,
        w.sparse.written_bytes as f64 / 1e9,
        w.sparse.seconds
    );
}

/// `tiktoken.model` with [`RANKS`] ranks (the 256 bytes, then deterministic merges of two
/// earlier tokens over letters and space, up to 12 bytes) and `tokenizer_config.json` with the
/// 256 special slots after them (the tiny model's names, moved to ids 163,584…163,839).
fn write_tokenizer(dir: &Path) -> Result<(), String> {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let mut seen: HashSet<Vec<u8>> = tokens.iter().cloned().collect();
    let alphabet: Vec<usize> = (0..256)
        .filter(|&b| b == b' ' as usize || (b as u8).is_ascii_alphabetic())
        .collect();
    let mut pool = alphabet.clone();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    while tokens.len() < RANKS {
        let a = &tokens[pool[next(pool.len())]];
        let b = &tokens[pool[next(pool.len())]];
        if a.len() + b.len() > 12 || b.first() == Some(&b' ') {
            continue;
        }
        let t = [a.as_slice(), b.as_slice()].concat();
        if seen.insert(t.clone()) {
            pool.push(tokens.len());
            tokens.push(t);
        }
    }
    let mut text = String::with_capacity(RANKS * 16);
    for (rank, t) in tokens.iter().enumerate() {
        text.push_str(&base64(t));
        text.push_str(&format!(" {rank}\n"));
    }
    let path = dir.join("tiktoken.model");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    write_tokenizer_config(dir)
}

/// The tiny model's `tokenizer_config.json` with every added-token id moved to the released
/// special slots.
fn write_tokenizer_config(dir: &Path) -> Result<(), String> {
    let src = crate::fuzz::workspace_root().join("fixtures/tiny-k3/tokenizer_config.json");
    let text = std::fs::read_to_string(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", src.display()))?;
    let added = v
        .get_mut("added_tokens_decoder")
        .and_then(|a| a.as_object_mut())
        .ok_or_else(|| format!("{}: no added_tokens_decoder object", src.display()))?;
    let moved: serde_json::Map<String, serde_json::Value> = std::mem::take(added)
        .into_iter()
        .map(|(id, tok)| {
            let id: usize = id.parse().unwrap_or(0);
            ((id - 768 + RANKS).to_string(), tok)
        })
        .collect();
    *added = moved;
    v["model_max_length"] = serde_json::json!(131_072);
    let path = dir.join("tokenizer_config.json");
    let out = serde_json::to_string_pretty(&v).unwrap_or_default() + "\n";
    std::fs::write(&path, out).map_err(|e| format!("{}: {e}", path.display()))
}

/// Standard base64 with padding (tiktoken.model's token column).
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_fixture() {
        assert_eq!(super::base64(&[0]), "AA==");
        assert_eq!(super::base64(b" -?"), "IC0/");
        assert_eq!(super::base64(b" BY"), "IEJZ");
    }
}
