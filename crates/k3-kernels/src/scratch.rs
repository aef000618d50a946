//! Per-thread scratch buffers, reused across kernel calls (no allocation once warm).
//!
//! A buffer already in use on this thread (a rayon worker that, while waiting inside one
//! kernel call, runs a task of another) is never shared: that caller gets a fresh one.

use std::cell::RefCell;
use std::thread::LocalKey;

thread_local! {
    /// Activations in a kernel layout (mat-vec / GEMM callers).
    pub(crate) static X: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// GEMM weight panels (one per task at a time).
    pub(crate) static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// GEMM lane state (one per task at a time).
    pub(crate) static STATE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// GEMM outputs staged token-major before they are stored (one per task at a time).
    pub(crate) static EMIT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's buffer `key` (or a fresh one if it is in use).
pub(crate) fn with<T, R>(
    key: &'static LocalKey<RefCell<Vec<T>>>,
    f: impl FnOnce(&mut Vec<T>) -> R,
) -> R {
    key.with(|c| match c.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut Vec::new()),
    })
}

/// `len` f32 of `buf` starting at a 64-byte boundary (so vector loads never split a cache
/// line), holding whatever an earlier use left (zeros where it grows): for callers that
/// write every element before they read it (not clearing saved the GEMM ~3 % of its time:
/// 64 KB of lane state per task).
pub(crate) fn aligned_any(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len + 16 {
        buf.resize(len + 16, 0.0);
    }
    let off = buf.as_ptr().align_offset(64).min(16);
    &mut buf[off..off + len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_use_gets_a_fresh_buffer() {
        let n = with(&X, |a| {
            a.clear();
            a.push(1.0);
            with(&X, |b| {
                assert!(b.is_empty());
                b.push(2.0);
                b.len()
            }) + a.len()
        });
        assert_eq!(n, 2);
        with(&X, |a| assert_eq!(a, &[1.0]));
    }

    #[test]
    fn aligned_slices_start_on_a_cache_line_and_keep_their_contents() {
        let mut v = Vec::new();
        for len in [0, 1, 100, 4096, 50] {
            let s = aligned_any(&mut v, len);
            assert_eq!(s.len(), len);
            assert_eq!(s.as_ptr() as usize % 64, 0);
            s.fill(7.0);
        }
        assert!(aligned_any(&mut v, 60).iter().all(|&x| x == 7.0));
    }
}
