//! Shared helpers for the store tests: temp files whose bytes are derived from their owner.

#![allow(dead_code)]

use k3_store::{FaultyReader, ShardFile};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A byte derived from `(a, b, i)`, so aliasing between layers or experts is visible.
pub fn byte(a: u64, b: u64, i: u64) -> u8 {
    let mut x = a
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        .wrapping_add(i.wrapping_mul(0x1656_67B1_9E37_79F9));
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    x as u8
}

/// `len` bytes derived from `(a, b)`.
pub fn bytes(a: u64, b: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| byte(a, b, i)).collect()
}

/// A temp file removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    /// Writes `data` to a fresh file in `std::env::temp_dir()`.
    pub fn new(tag: &str, data: &[u8]) -> TempFile {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let name = format!("k3-store-{}-{tag}-{n}.bin", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, data).expect("write temp file");
        TempFile(path)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Temp files holding `data`, owned by the caller, and each one opened (O_DIRECT when
/// `direct` and the filesystem allows it) behind a fault injector.
pub struct FaultyFiles {
    /// The files (removed on drop).
    pub tmp: Vec<TempFile>,
    /// One reader per file, in order.
    pub readers: Vec<Arc<FaultyReader>>,
}

impl FaultyFiles {
    /// Writes each of `data` to its own temp file tagged `tag` and opens it.
    pub fn new(tag: &str, data: &[Vec<u8>], direct: bool) -> FaultyFiles {
        let tmp: Vec<TempFile> = data.iter().map(|d| TempFile::new(tag, d)).collect();
        let readers = tmp
            .iter()
            .map(|t| {
                let f = ShardFile::open(t.path(), direct).expect("open");
                Arc::new(FaultyReader::new(Arc::new(f)))
            })
            .collect();
        FaultyFiles { tmp, readers }
    }
}
