//! Fetching one file (docs/QUICKSTART.md#download): into `NAME.part`, resumed with an HTTP
//! Range request after an interrupted transfer (in this run or an earlier one), hashed as it is
//! written, checked against the hub's SHA-256 (LFS) or git blob id, fetched again from scratch
//! when the hash is wrong, and renamed to `NAME` only once it is right.

use crate::hub::{Digest, Hub, RepoFile};
use crate::Progress;
use sha1::Sha1;
use sha2::{Digest as _, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Transfer attempts per file (each resumes where the last one stopped).
const ATTEMPTS: u32 = 5;
/// Whole-file fetches after a hash mismatch.
const REFETCHES: u32 = 2;
const BUF: usize = 1 << 20;

/// What happened to one file.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Already complete and correct on disk.
    pub present: bool,
    /// Bytes fetched in this run.
    pub fetched: u64,
    /// Resumed from this many bytes already on disk (the largest resume point).
    pub resumed_from: u64,
    /// Fetched again after a wrong hash (a damaged file on disk or in transfer).
    pub refetched: u32,
}

/// `NAME.part` beside `NAME`.
pub fn part_path(final_path: &Path) -> PathBuf {
    let mut name = final_path.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    final_path.with_file_name(name)
}

/// Bytes of `f` already on disk: a complete-looking file, or a partial one (not yet checked).
pub fn present_bytes(dir: &Path, f: &RepoFile) -> u64 {
    let target = dir.join(&f.path);
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
    match (len(&target), len(&part_path(&target))) {
        (Some(n), _) if n == f.size => n,
        (_, Some(n)) if n <= f.size => n,
        _ => 0,
    }
}

/// A running hash of the file's content, in the hub's scheme.
enum Hasher {
    Sha256(Sha256),
    Git(Sha1),
}

impl Hasher {
    fn new(d: &Digest, size: u64) -> Hasher {
        match d {
            Digest::Sha256(_) => Hasher::Sha256(Sha256::new()),
            Digest::GitSha1(_) => {
                let mut h = Sha1::new();
                h.update(format!("blob {size}\0").as_bytes());
                Hasher::Git(h)
            }
        }
    }
    fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(b),
            Hasher::Git(h) => h.update(b),
        }
    }
    fn hex(self) -> String {
        let bytes = match self {
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Git(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn expected(d: &Digest) -> &str {
    match d {
        Digest::Sha256(h) | Digest::GitSha1(h) => h,
    }
}

/// Hashes the first `n` bytes of `path`.
fn hash_prefix(path: &Path, f: &RepoFile, n: u64) -> Result<Hasher, String> {
    let mut h = Hasher::new(&f.digest, f.size);
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r = file.take(n);
    let mut buf = vec![0u8; BUF];
    loop {
        let k = r
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if k == 0 {
            return Ok(h);
        }
        h.update(&buf[..k]);
    }
}

/// Fetches `f` into `dir` (see the module docs); `pb` hears the bytes and the resumes and
/// re-fetches.
pub fn fetch_file(
    hub: &Hub,
    dir: &Path,
    f: &RepoFile,
    pb: &dyn Progress,
) -> Result<Outcome, String> {
    let target = dir.join(&f.path);
    let part = part_path(&target);
    let mut out = Outcome::default();
    if std::fs::metadata(&target).is_ok_and(|m| m.len() == f.size) {
        if hash_prefix(&target, f, f.size)?.hex() == expected(&f.digest) {
            out.present = true;
            return Ok(out);
        }
        pb.say(&format!(
            "{}: on disk but its hash is wrong: fetching it again",
            f.path
        ));
        std::fs::remove_file(&target).map_err(|e| format!("{}: {e}", target.display()))?;
        pb.add_total(f.size);
        out.refetched += 1;
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    loop {
        let hash = transfer(hub, f, &part, pb, &mut out)?;
        if hash == expected(&f.digest) {
            break;
        }
        if out.refetched >= REFETCHES {
            return Err(format!(
                "{}: the downloaded bytes hash to {hash} but the hub says {} (after {} fetches): the file is damaged at the source or in transit; try again later",
                f.path,
                expected(&f.digest),
                out.refetched + 1
            ));
        }
        pb.say(&format!(
            "{}: hash {hash} is not the hub's {}: fetching it again",
            f.path,
            expected(&f.digest)
        ));
        let _ = std::fs::remove_file(&part);
        pb.add_total(f.size);
        out.refetched += 1;
    }
    std::fs::rename(&part, &target).map_err(|e| format!("{}: {e}", target.display()))?;
    Ok(out)
}

/// Brings `part` to the full size, resuming as needed; returns the content's hash.
fn transfer(
    hub: &Hub,
    f: &RepoFile,
    part: &Path,
    pb: &dyn Progress,
    out: &mut Outcome,
) -> Result<String, String> {
    let mut last_err = String::new();
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(250 * u64::from(attempt)));
        }
        let mut have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
        if have > f.size {
            std::fs::remove_file(part).map_err(|e| format!("{}: {e}", part.display()))?;
            pb.add_total(have.min(f.size));
            have = 0;
        }
        let mut hasher = hash_prefix_or_new(part, f, have)?;
        if have == f.size {
            return Ok(hasher.hex());
        }
        if have > 0 {
            pb.say(&format!(
                "{}: resuming at byte {have} of {}",
                f.path, f.size
            ));
            out.resumed_from = out.resumed_from.max(have);
        }
        match stream(hub, f, part, have, &mut hasher, pb, out) {
            Ok(()) => return Ok(hasher.hex()),
            Err(Fatal(e)) => return Err(e),
            Err(Retry(e)) => last_err = e,
        }
    }
    Err(format!(
        "{}: gave up after {ATTEMPTS} attempts: {last_err}",
        f.path
    ))
}

fn hash_prefix_or_new(part: &Path, f: &RepoFile, have: u64) -> Result<Hasher, String> {
    match have {
        0 => Ok(Hasher::new(&f.digest, f.size)),
        n => hash_prefix(part, f, n),
    }
}

/// Why a transfer stopped short.
enum StreamError {
    /// Worth another attempt (network trouble, a server error).
    Retry(String),
    /// Not (a local write failed, the hub refused the file).
    Fatal(String),
}
use StreamError::{Fatal, Retry};

/// One GET from byte `have` to the end, appended to `part` and hashed.
fn stream(
    hub: &Hub,
    f: &RepoFile,
    part: &Path,
    mut have: u64,
    hasher: &mut Hasher,
    pb: &dyn Progress,
    out: &mut Outcome,
) -> Result<(), StreamError> {
    let resp = match hub.fetch(&f.path, have).map_err(|e| *e) {
        Ok(r) => r,
        Err(ureq::Error::Status(code, _)) if code == 416 || (code >= 500) => {
            if code == 416 {
                let _ = std::fs::remove_file(part);
                pb.add_total(have);
            }
            return Err(Retry(format!("{}: HTTP {code}", f.path)));
        }
        Err(ureq::Error::Status(code, _)) => {
            return Err(Fatal(format!("{}: the hub answered HTTP {code}", f.path)))
        }
        Err(ureq::Error::Transport(t)) => {
            return Err(Retry(format!(
                "{}: {}",
                f.path,
                crate::hub::transport_text(&t)
            )))
        }
    };
    let mut file = OpenOptions::new().create(true).append(true).open(part);
    if have > 0 && resp.status() == 200 {
        // The server ignored the Range: start over.
        pb.add_total(have);
        file = File::create(part);
        have = 0;
        *hasher = Hasher::new(&f.digest, f.size);
    }
    let mut file = file.map_err(|e| Fatal(format!("{}: {e}", part.display())))?;
    let mut body = resp.into_reader().take(f.size - have + 1);
    let mut buf = vec![0u8; BUF];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                return Err(Retry(format!(
                    "{}: transfer interrupted at byte {have}: {e}",
                    f.path
                )))
            }
        };
        if have + n as u64 > f.size {
            return Err(Fatal(format!(
                "{}: the hub sent more than the {} bytes its file list gives",
                f.path, f.size
            )));
        }
        file.write_all(&buf[..n])
            .map_err(|e| Fatal(format!("{}: {e}", part.display())))?;
        hasher.update(&buf[..n]);
        have += n as u64;
        out.fetched += n as u64;
        pb.advance(n as u64);
    }
    file.sync_all()
        .map_err(|e| Fatal(format!("{}: {e}", part.display())))?;
    if have < f.size {
        return Err(Retry(format!(
            "{}: transfer ended at byte {have} of {}",
            f.path, f.size
        )));
    }
    Ok(())
}
