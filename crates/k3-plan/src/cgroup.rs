//! The memory limit set on this process's cgroup, as `k3 doctor` reports it beside the
//! [`Available`](crate::Available) figure (which is the limit's headroom). Parsed from texts
//! the caller reads, so the planner itself never opens a file.

use crate::plan::fmt_bytes;
use std::fmt;

/// The cgroup memory limit: cgroup v2 `memory.max`, else v1 `memory.limit_in_bytes`, of the
/// first `/proc/self/cgroup` line with a memory controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupLimit {
    /// cgroup v2, `memory.max` is `max`.
    V2Unlimited,
    /// cgroup v2 `memory.max`, bytes.
    V2Bytes(u64),
    /// cgroup v2 `memory.max` holds something else (shown as is).
    V2Other(String),
    /// cgroup v2 without a `memory.max` file (no memory controller).
    V2NoController,
    /// cgroup v1, `memory.limit_in_bytes` at the "unlimited" sentinel (≥ 2^60).
    V1Unlimited,
    /// cgroup v1 `memory.limit_in_bytes`, bytes.
    V1Bytes(u64),
    /// cgroup v1 with a memory controller but no readable limit.
    V1Unknown,
    /// No cgroup line names a memory controller.
    NoController,
}

impl CgroupLimit {
    /// The limit from the files `read` returns (paths relative to the filesystem root:
    /// `proc/self/cgroup`, `sys/fs/cgroup/…`; `None` for a missing file).
    pub fn from_reader(read: impl Fn(&str) -> Option<String>) -> CgroupLimit {
        let read = |p: &str| read(p).map(|s| s.trim().to_string());
        let cgroups = read("proc/self/cgroup").unwrap_or_default();
        for line in cgroups.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let path = path.trim_end_matches('/');
            if ctrl.is_empty() {
                let max = read(&format!("sys/fs/cgroup{path}/memory.max"))
                    .or_else(|| read("sys/fs/cgroup/memory.max"));
                return match max {
                    Some(v) if v == "max" => CgroupLimit::V2Unlimited,
                    Some(v) => v
                        .parse()
                        .map_or(CgroupLimit::V2Other(v), CgroupLimit::V2Bytes),
                    None => CgroupLimit::V2NoController,
                };
            }
            if ctrl.split(',').any(|c| c == "memory") {
                let lim = read(&format!("sys/fs/cgroup/memory{path}/memory.limit_in_bytes"))
                    .or_else(|| read("sys/fs/cgroup/memory/memory.limit_in_bytes"));
                return match lim.and_then(|v| v.parse::<u64>().ok()) {
                    Some(b) if b >= 1 << 60 => CgroupLimit::V1Unlimited,
                    Some(b) => CgroupLimit::V1Bytes(b),
                    None => CgroupLimit::V1Unknown,
                };
            }
        }
        CgroupLimit::NoController
    }
}

impl fmt::Display for CgroupLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupLimit::V2Unlimited => write!(f, "unlimited (cgroup v2)"),
            CgroupLimit::V2Bytes(b) => write!(f, "{} (cgroup v2 memory.max)", fmt_bytes(*b)),
            CgroupLimit::V2Other(v) => write!(f, "{v} (cgroup v2)"),
            CgroupLimit::V2NoController => {
                write!(f, "none found (cgroup v2, no memory controller)")
            }
            CgroupLimit::V1Unlimited => write!(f, "unlimited (cgroup v1)"),
            CgroupLimit::V1Bytes(b) => {
                write!(f, "{} (cgroup v1 memory.limit_in_bytes)", fmt_bytes(*b))
            }
            CgroupLimit::V1Unknown => write!(f, "unknown (cgroup v1)"),
            CgroupLimit::NoController => write!(f, "none (no cgroup memory controller)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(files: &[(&str, &str)]) -> CgroupLimit {
        CgroupLimit::from_reader(|p| files.iter().find(|f| f.0 == p).map(|f| f.1.to_string()))
    }

    #[test]
    fn v2_reads_its_own_memory_max_then_the_root() {
        let own = [
            ("proc/self/cgroup", "0::/job/\n"),
            ("sys/fs/cgroup/job/memory.max", "3000000000\n"),
        ];
        assert_eq!(limit(&own), CgroupLimit::V2Bytes(3_000_000_000));
        let root = [
            ("proc/self/cgroup", "0::/job\n"),
            ("sys/fs/cgroup/memory.max", "max\n"),
        ];
        assert_eq!(limit(&root), CgroupLimit::V2Unlimited);
        assert_eq!(
            limit(&[("proc/self/cgroup", "0::/\n")]).to_string(),
            "none found (cgroup v2, no memory controller)"
        );
    }

    #[test]
    fn v1_reads_the_memory_controller_and_its_sentinel() {
        let files = [
            ("proc/self/cgroup", "4:cpu,cpuacct:/a\n3:memory:/a\n"),
            (
                "sys/fs/cgroup/memory/a/memory.limit_in_bytes",
                "9223372036854771712",
            ),
        ];
        assert_eq!(limit(&files), CgroupLimit::V1Unlimited);
        let files = [
            ("proc/self/cgroup", "3:memory:/a\n"),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "2000000000\n"),
        ];
        assert_eq!(limit(&files), CgroupLimit::V1Bytes(2_000_000_000));
        assert_eq!(limit(&[]), CgroupLimit::NoController);
    }
}
