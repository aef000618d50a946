//! Memory actually available: MemAvailable, capped by cgroup v2 / v1 headroom. Parsed from
//! texts the caller reads (k3-store's `available_memory` reads the real files), so the planner
//! itself never opens a file.

/// What the machine and its cgroup leave to this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Available {
    /// `MemAvailable` from `/proc/meminfo`, bytes.
    pub mem_available: Option<u64>,
    /// cgroup limit minus current use (v2 `memory.max − memory.current + inactive_file`,
    /// or v1 `limit_in_bytes − usage_in_bytes`), bytes; `None` when unlimited or unknown.
    pub cgroup_headroom: Option<u64>,
}

impl Available {
    /// The binding figure: the smaller of the two (`None` when neither is known).
    pub fn bytes(&self) -> Option<u64> {
        match (self.mem_available, self.cgroup_headroom) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Where the figure comes from, for the plan table.
    pub fn source(&self) -> &'static str {
        match (self.mem_available, self.cgroup_headroom) {
            (Some(a), Some(c)) if c < a => "cgroup headroom, below MemAvailable",
            (Some(_), Some(_)) => "MemAvailable, below cgroup headroom",
            (Some(_), None) => "MemAvailable",
            (None, Some(_)) => "cgroup headroom",
            (None, None) => "unknown",
        }
    }
}

impl Available {
    /// The figures from the files `read` returns (paths relative to the filesystem root:
    /// `proc/meminfo`, `proc/self/cgroup`, `sys/fs/cgroup/…`; `None` for a missing file).
    pub fn from_reader(read: impl Fn(&str) -> Option<String>) -> Available {
        let mem_available = read("proc/meminfo").as_deref().and_then(parse_meminfo);
        let cgroups = read("proc/self/cgroup").unwrap_or_default();
        let v2 = cgroup_path(&cgroups, |c| c.is_empty()).map(|p| format!("sys/fs/cgroup{p}"));
        let v1 = cgroup_path(&cgroups, |c| c.split(',').any(|x| x == "memory"))
            .map(|p| format!("sys/fs/cgroup/memory{p}"));
        let headroom_v2 = v2
            .into_iter()
            .chain(["sys/fs/cgroup".to_string()])
            .find_map(|d| {
                let max = read(&format!("{d}/memory.max"))?;
                let cur = read(&format!("{d}/memory.current"))?;
                let stat = read(&format!("{d}/memory.stat")).unwrap_or_default();
                Some(cgroup_v2_headroom(&max, &cur, &stat))
            });
        let headroom_v1 = || {
            let d = v1.clone().unwrap_or_else(|| "sys/fs/cgroup/memory".into());
            let lim = read(&format!("{d}/memory.limit_in_bytes"))?;
            let use_ = read(&format!("{d}/memory.usage_in_bytes"))?;
            Some(cgroup_v1_headroom(&lim, &use_))
        };
        Available {
            mem_available,
            cgroup_headroom: headroom_v2.or_else(headroom_v1).flatten(),
        }
    }
}

/// `MemAvailable:  N kB` → bytes.
pub fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// cgroup v2 headroom: `max − (current − inactive_file)`; `None` for `max` (unlimited).
pub fn cgroup_v2_headroom(max: &str, current: &str, stat: &str) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?;
    let current: u64 = current.trim().parse().ok()?;
    let inactive = stat
        .lines()
        .find_map(|l| l.strip_prefix("inactive_file "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Some(max.saturating_sub(current.saturating_sub(inactive)))
}

/// cgroup v1 headroom: `limit − usage`; `None` for the "unlimited" sentinel (≥ 2^60).
pub fn cgroup_v1_headroom(limit: &str, usage: &str) -> Option<u64> {
    let limit: u64 = limit.trim().parse().ok()?;
    let usage: u64 = usage.trim().parse().ok()?;
    (limit < 1 << 60).then(|| limit.saturating_sub(usage))
}

/// The path of the first `/proc/self/cgroup` line whose controller list satisfies `pick`.
fn cgroup_path(text: &str, pick: impl Fn(&str) -> bool) -> Option<String> {
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        pick(ctrl).then(|| path.trim_end_matches('/').to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let t = "MemTotal: 100 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(parse_meminfo(t), Some(2048 * 1024));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn cgroup_headrooms() {
        assert_eq!(cgroup_v2_headroom("max\n", "5", ""), None);
        assert_eq!(
            cgroup_v2_headroom("1000\n", "600\n", "inactive_file 100\n"),
            Some(500)
        );
        assert_eq!(cgroup_v1_headroom("9223372036854771712", "5"), None);
        assert_eq!(cgroup_v1_headroom("1000", "1200"), Some(0));
    }

    #[test]
    fn cgroup_v2_tree() {
        let files = [
            ("proc/meminfo", "MemAvailable: 4000000 kB\n"),
            ("proc/self/cgroup", "0::/job\n"),
            ("sys/fs/cgroup/job/memory.max", "3000000000\n"),
            ("sys/fs/cgroup/job/memory.current", "1000000000\n"),
        ];
        let read = |p: &str| files.iter().find(|f| f.0 == p).map(|f| f.1.to_string());
        let a = Available::from_reader(read);
        assert_eq!(a.mem_available, Some(4_096_000_000));
        assert_eq!(a.cgroup_headroom, Some(2_000_000_000));
        assert_eq!(a.bytes(), Some(2_000_000_000));
    }
}
