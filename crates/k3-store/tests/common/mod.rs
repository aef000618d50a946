//! Shared helpers for the store tests: temp files whose bytes are derived from their owner.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

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
        let name = format!("k3-plan-{}-{tag}-{n}.bin", std::process::id());
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
