//! The `k3 serve` process behind `cargo xtask bench-serve` (docs/SERVER.md#serving-benchmark):
//! built, started on loopback, killed at the end.
//!
//! The k3 binary is built first with `cargo build -p k3-cli --bin k3` (a no-op when fresh),
//! in the profile xtask itself was built in (debug unless xtask runs with `--release`), and
//! is found at `$CARGO_TARGET_DIR/<profile>/k3` (a relative `CARGO_TARGET_DIR` is taken from
//! the workspace root) or `<workspace>/target/<profile>/k3`. The server binds 127.0.0.1 only,
//! on an ephemeral port read from its `listening on http://ADDR` stderr line, ignores the
//! user's config, and is killed when its [`ServerGuard`] drops, on success or error.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The running server; killed and reaped when dropped.
pub struct ServerGuard {
    child: Child,
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Builds (if needed) and locates the k3 binary.
pub fn build_k3(root: &Path) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args(["build", "-p", "k3-cli", "--bin", "k3"]);
    if profile() == "release" {
        cmd.arg("--release");
    }
    eprintln!("xtask: cargo build -p k3-cli --bin k3 ({})", profile());
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build -p k3-cli failed ({status})"));
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    };
    let bin = target
        .join(profile())
        .join(format!("k3{}", std::env::consts::EXE_SUFFIX));
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("built k3 not found at {}", bin.display()))
    }
}

/// `model` as given, else (relative) from the workspace root.
pub fn resolve_model(model: &Path, root: &Path) -> Result<PathBuf, String> {
    if model.is_dir() {
        return Ok(model.to_path_buf());
    }
    let from_root = root.join(model);
    if model.is_relative() && from_root.is_dir() {
        return Ok(from_root);
    }
    Err(format!("model directory not found: {}", model.display()))
}

/// Starts `k3 serve MODEL --host 127.0.0.1 --port 0 --queue QUEUE EXTRA…` and waits for its
/// address (`http://127.0.0.1:PORT`) at most `startup`, and never past `deadline`.
pub fn start_server(
    bin: &Path,
    model: &Path,
    queue: usize,
    extra: &[String],
    startup: Duration,
    deadline: Instant,
) -> Result<(ServerGuard, String), String> {
    let mut child = Command::new(bin)
        .arg("serve")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", "0", "--queue"])
        .arg(queue.to_string())
        .args(extra)
        .env_remove("K3_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent/k3-bench-serve-xdg")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let stderr = child.stderr.take();
    let guard = ServerGuard { child };
    let Some(stderr) = stderr else {
        return Err("the server's stderr is not piped".into());
    };
    let (tx, rx) = mpsc::channel();
    // Keeps draining stderr after the address so the server never blocks on a full pipe; an
    // error line before the address is passed on as `Err`.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(addr) = line.split("listening on ").nth(1) {
                let _ = tx.send(Ok(addr.trim().to_string()));
            } else if line.contains("error") {
                let _ = tx.send(Err(line));
            }
        }
    });
    let wait = startup.min(deadline.saturating_duration_since(Instant::now()));
    let base = match rx.recv_timeout(wait) {
        Ok(Ok(base)) => base,
        Ok(Err(line)) => return Err(format!("k3 serve failed to start: {line}")),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            return Err("k3 serve exited before printing its address".into())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return Err(format!(
                "k3 serve printed no address within {} s",
                wait.as_secs()
            ))
        }
    };
    if !base.starts_with("http://127.0.0.1:") {
        return Err(format!("the server is not on loopback: {base}"));
    }
    Ok((guard, base))
}
