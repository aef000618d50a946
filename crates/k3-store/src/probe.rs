//! Facts about this machine that the planner's numbers need and only the machine can give:
//! free disk space, this process's peak memory, and read rates at several queue depths
//! (measured by the caller's read test, held here).

use std::path::Path;

/// Bytes available to unprivileged users on the filesystem holding `dir` (statvfs); `None`
/// where it cannot be told.
pub fn free_disk(dir: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Read rates measured at several queue depths: `(outstanding reads, bytes per second)`.
#[derive(Debug, Clone, Default)]
pub struct Bandwidth {
    /// One entry per depth tested, in the order tested.
    pub levels: Vec<(usize, f64)>,
}

impl Bandwidth {
    /// The rate at `qd` outstanding reads, when it was measured and is positive.
    pub fn at(&self, qd: usize) -> Option<f64> {
        self.levels
            .iter()
            .find(|l| l.0 == qd)
            .map(|l| l.1)
            .filter(|b| *b > 0.0)
    }

    /// The I/O-floor seconds of a token ([`k3_plan::forecast::io_floor_secs`]): trunk bytes at
    /// 1 outstanding read, expert bytes at 16 (else the deepest measured of 4 and 1).
    pub fn floor_secs(&self, trunk: f64, experts: f64) -> Option<f64> {
        let one = self.at(1)?;
        let many = self.at(16).or(self.at(4)).or(self.at(1))?;
        Some(k3_plan::forecast::io_floor_secs(trunk, experts, one, many))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_uses_the_deepest_measured_level() {
        let bw = Bandwidth {
            levels: vec![(1, 1e9), (4, 2e9)],
        };
        assert_eq!(bw.floor_secs(1e9, 4e9), Some(3.0));
        assert_eq!(Bandwidth::default().floor_secs(1.0, 1.0), None);
    }

    #[test]
    fn this_process_has_a_peak_and_the_root_has_free_space() {
        assert!(peak_rss_bytes() > 0);
        assert!(free_disk(Path::new("/")).is_some());
    }
}
