//! The memory this process may use, read from the real `/proc` and cgroup files; the parsing
//! and the rules live in [`k3_plan::Available`].

use k3_plan::Available;
use std::fs;
use std::path::{Path, PathBuf};

/// Reads the figures of this machine.
pub fn available_memory() -> Available {
    available_memory_at(Path::new("/"))
}

/// Reads the figures under `root` (`/` normally; a fake tree in tests): `proc/meminfo`,
/// `proc/self/cgroup`, and `sys/fs/cgroup/…`.
pub fn available_memory_at(root: &Path) -> Available {
    Available::from_reader(|p| fs::read_to_string(root.join(p)).ok())
}

/// A new cgroup v2 directory `name` under this process's own (delegated) cgroup with
/// `memory.max` = `limit`, when the memory controller is there and the directory is writable:
/// a real cap for checks that run k3 under a budget (write a child's pid to its
/// `cgroup.procs`). `None` where there is no such cgroup.
pub fn memory_cgroup(name: &str, limit: u64) -> Option<PathBuf> {
    let own = fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let base = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    let controllers = fs::read_to_string(base.join("cgroup.controllers")).ok()?;
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return None;
    }
    let dir = base.join(name);
    fs::create_dir(&dir).ok()?;
    if fs::write(dir.join("memory.max"), limit.to_string()).is_err() {
        let _ = fs::remove_dir(&dir);
        return None;
    }
    Some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_tree() {
        let root = std::env::temp_dir().join(format!("k3-store-avail-{}", std::process::id()));
        let cg = root.join("sys/fs/cgroup/job");
        fs::create_dir_all(&cg).unwrap();
        fs::create_dir_all(root.join("proc/self")).unwrap();
        fs::write(root.join("proc/meminfo"), "MemAvailable: 4000000 kB\n").unwrap();
        fs::write(root.join("proc/self/cgroup"), "0::/job\n").unwrap();
        fs::write(cg.join("memory.max"), "3000000000\n").unwrap();
        fs::write(cg.join("memory.current"), "1000000000\n").unwrap();
        let a = available_memory_at(&root);
        assert_eq!(a.mem_available, Some(4_096_000_000));
        assert_eq!(a.cgroup_headroom, Some(2_000_000_000));
        assert_eq!(a.bytes(), Some(2_000_000_000));
        fs::remove_dir_all(&root).unwrap();
    }
}
