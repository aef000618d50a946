//! `fixtures/upstream/` is redistributed unchanged from upstream: every file must match the
//! SHA-256 listed in `fixtures/upstream/CHECKSUMS.sha256` (`sha256sum` format, `./` paths), and
//! no file may be there without being listed (the README and the list itself excepted).

use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn upstream_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/upstream")
}

/// `(hex digest, path relative to the folder)` per line of a `sha256sum` listing.
fn parse_listing(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (hex, rest) = line
            .split_once(' ')
            .ok_or_else(|| format!("CHECKSUMS.sha256:{}: no space in {line:?}", i + 1))?;
        // `sha256sum` writes two spaces (text mode) or " *" (binary mode) before the name.
        let name = rest
            .strip_prefix(' ')
            .or_else(|| rest.strip_prefix('*'))
            .ok_or_else(|| format!("CHECKSUMS.sha256:{}: malformed line {line:?}", i + 1))?;
        let valid_hex = hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid_hex {
            return Err(format!(
                "CHECKSUMS.sha256:{}: not a SHA-256 digest: {hex:?}",
                i + 1
            ));
        }
        let name = name.strip_prefix("./").unwrap_or(name);
        out.push((hex.to_ascii_lowercase(), name.to_string()));
    }
    Ok(out)
}

fn sha256_hex(path: &Path) -> std::io::Result<String> {
    let bytes = fs::read(path)?;
    let digest = Sha256::digest(&bytes);
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

/// Every file under `dir`, as `/`-separated paths relative to `base`.
fn all_files(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            all_files(base, &p, out);
        } else {
            let rel = p.strip_prefix(base).unwrap();
            let parts: Vec<_> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect();
            out.insert(parts.join("/"));
        }
    }
}

#[test]
fn upstream_fixtures_match_their_checksums() {
    let dir = upstream_dir();
    let listing = fs::read_to_string(dir.join("CHECKSUMS.sha256"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("CHECKSUMS.sha256").display()));
    let entries = parse_listing(&listing).unwrap_or_else(|e| panic!("{e}"));
    assert!(!entries.is_empty(), "CHECKSUMS.sha256 lists no files");

    let mut problems = Vec::new();
    let mut listed = BTreeSet::new();
    for (want, name) in &entries {
        if !listed.insert(name.clone()) {
            problems.push(format!("{name}: listed twice"));
        }
        match sha256_hex(&dir.join(name)) {
            Ok(got) if got == *want => {}
            Ok(got) => problems.push(format!(
                "{name}: sha256 {got}, CHECKSUMS.sha256 says {want}"
            )),
            Err(e) => problems.push(format!("{name}: listed but cannot be read: {e}")),
        }
    }
    let mut present = BTreeSet::new();
    all_files(&dir, &dir, &mut present);
    for name in &present {
        let exempt = name == "README.md" || name == "CHECKSUMS.sha256";
        if !exempt && !listed.contains(name) {
            problems.push(format!(
                "{name}: present but not listed in CHECKSUMS.sha256"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "fixtures/upstream does not match CHECKSUMS.sha256:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn listing_parser_accepts_both_sha256sum_modes() {
    let hex = "ab".repeat(32);
    let text = format!("{hex}  ./a/b.json\n{hex} *c.bin\n\n");
    let got = parse_listing(&text).unwrap();
    assert_eq!(
        got,
        [
            (hex.clone(), "a/b.json".to_string()),
            (hex.clone(), "c.bin".to_string())
        ]
    );
    assert!(parse_listing("nothex  ./x\n").is_err());
    assert!(parse_listing(&format!("{hex}\n")).is_err());
}
