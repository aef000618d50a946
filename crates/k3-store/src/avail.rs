//! The memory this process may use, read from the real `/proc` and cgroup files; the parsing
//! and the rules live in [`k3_plan::Available`].

use k3_plan::Available;
use std::fs;
use std::path::Path;

/// Reads the figures of this machine.
pub fn available_memory() -> Available {
    available_memory_at(Path::new("/"))
}

/// Reads the figures under `root` (`/` normally; a fake tree in tests): `proc/meminfo`,
/// `proc/self/cgroup`, and `sys/fs/cgroup/…`.
pub fn available_memory_at(root: &Path) -> Available {
    Available::from_reader(|p| fs::read_to_string(root.join(p)).ok())
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
