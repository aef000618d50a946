//! Keeps the input that aborts the process: an allocation failure (a length field trusted as
//! a capacity) or a stack overflow cannot be caught by `catch_unwind`, so while a campaign
//! runs a SIGABRT/SIGSEGV/SIGBUS handler writes the current input to a pre-opened file, then
//! lets the signal kill the process as usual.

use std::os::fd::IntoRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};

static FD: AtomicI32 = AtomicI32::new(-1);
static BUF: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static LEN: AtomicUsize = AtomicUsize::new(0);
/// Length of the allocation behind `BUF` (only the campaign thread reads or writes it).
static OWNED_LEN: AtomicUsize = AtomicUsize::new(0);

/// The input about to run: a copy the signal handler can read without locking.
pub fn set_current(input: &[u8]) {
    let copy: Box<[u8]> = input.into();
    let len = copy.len();
    let new = Box::into_raw(copy) as *mut u8;
    LEN.store(0, Ordering::SeqCst);
    let old = BUF.swap(new, Ordering::SeqCst);
    let old_len = OWNED_LEN.swap(len, Ordering::SeqCst);
    LEN.store(len, Ordering::SeqCst);
    if !old.is_null() {
        // SAFETY: `old` came from `Box::into_raw` of a boxed slice of `old_len` bytes and is
        // no longer reachable through `BUF`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(old, old_len)) });
    }
}

extern "C" fn on_fatal(sig: libc::c_int) {
    let fd = FD.load(Ordering::SeqCst);
    let (p, n) = (BUF.load(Ordering::SeqCst), LEN.load(Ordering::SeqCst));
    if fd >= 0 && !p.is_null() {
        // SAFETY: write(2) is async-signal-safe; `p` points at `n` live bytes.
        unsafe {
            libc::write(fd, p as *const libc::c_void, n);
            libc::fsync(fd);
            let msg = b"fuzz: fatal signal: the running input is saved in abort-input.bin\n";
            libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len());
        }
    }
    // SAFETY: restore the default action and re-raise, so the process dies of `sig`.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Installs the handlers; the file is created now (empty unless a fatal signal arrives).
pub fn arm(out_dir: &Path) {
    if let Ok(f) = std::fs::File::create(out_dir.join("abort-input.bin")) {
        FD.store(f.into_raw_fd(), Ordering::SeqCst);
    }
    for sig in [libc::SIGABRT, libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: installs a handler that only calls async-signal-safe functions.
        unsafe {
            libc::signal(sig, on_fatal as *const () as libc::sighandler_t);
        }
    }
}

/// Removes the handlers and the empty rescue file.
pub fn disarm(out_dir: &Path) {
    for sig in [libc::SIGABRT, libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: restores the default disposition.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
    let fd = FD.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: `fd` came from `into_raw_fd` above and is closed once.
        unsafe { libc::close(fd) };
    }
    let p = out_dir.join("abort-input.bin");
    if std::fs::metadata(&p).is_ok_and(|m| m.len() == 0) {
        let _ = std::fs::remove_file(p);
    }
}
