//! Facts about this machine that the planner's numbers need and only the machine can give:
//! free disk space, this process's peak memory, and read rates at several queue depths
//! (measured by the caller's read test, held here).

use crate::io::{aligned_span, AlignedBuf, ReadAt, ShardFile};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// What this machine is, as `k3 doctor` and the benchmarks report it.
#[derive(Debug, Clone)]
pub struct MachineFacts {
    /// `model name` (x86), else the ARM `Hardware` / `CPU part` lines, else "unknown".
    pub cpu: String,
    /// Logical cores this process may use.
    pub usable_cores: usize,
    /// Logical cores online.
    pub online_cores: usize,
    /// `MemTotal` and `MemAvailable`, bytes (`None` without /proc/meminfo).
    pub mem_total: Option<u64>,
    /// See `mem_total`.
    pub mem_available: Option<u64>,
    /// The 1-minute load average, as /proc/loadavg writes it ("?" where unknown).
    pub load_average: String,
}

impl MachineFacts {
    /// Reads /proc/cpuinfo, /proc/meminfo and /proc/loadavg.
    pub fn read() -> MachineFacts {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let (cpuinfo, meminfo) = (read("/proc/cpuinfo"), read("/proc/meminfo"));
        MachineFacts {
            cpu: cpu_model(&cpuinfo),
            usable_cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            online_cores: cpuinfo
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count(),
            mem_total: meminfo_kb(&meminfo, "MemTotal:").map(|k| k * 1024),
            mem_available: meminfo_kb(&meminfo, "MemAvailable:").map(|k| k * 1024),
            load_average: read("/proc/loadavg")
                .split_whitespace()
                .next()
                .unwrap_or("?")
                .to_string(),
        }
    }
}

/// `model name` (x86), else the ARM `Hardware`/`CPU part` lines, else "unknown".
fn cpu_model(cpuinfo: &str) -> String {
    let field = |key: &str| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key && !v.trim().is_empty()).then(|| v.trim().to_string())
        })
    };
    field("model name")
        .or_else(|| field("Hardware"))
        .or_else(|| field("CPU part").map(|p| format!("ARM CPU part {p}")))
        .unwrap_or_else(|| "unknown".into())
}

fn meminfo_kb(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `TYPE on MOUNTPOINT` of the longest /proc/mounts entry containing `dir`.
pub fn fs_type(dir: &Path) -> Option<String> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, mnt, ty) = (f.next()?, f.next()?, f.next()?);
            dir.starts_with(mnt)
                .then(|| (mnt.len(), format!("{ty} on {mnt}")))
        })
        .max_by_key(|m| m.0)
        .map(|m| m.1)
}

/// One read of a read test: the file (an index into the test's files) and its pieces,
/// `(offset, length)`, read in order into one aligned buffer.
#[derive(Debug, Clone)]
pub struct TestRead {
    /// Which of the files.
    pub file: usize,
    /// `(offset, length)` pieces.
    pub pieces: Vec<(u64, u64)>,
}

/// How long and how far a read test goes at each depth.
#[derive(Debug, Clone, Copy)]
pub struct ReadTest<'a> {
    /// Outstanding reads to test, one level each (e.g. `[1, 4, 16]`).
    pub depths: &'a [usize],
    /// Seconds per level.
    pub secs: f64,
    /// Bytes per level at most (a level always finishes the reads it started).
    pub cap: u64,
    /// The largest single read, in bytes (sizes each thread's aligned buffer).
    pub max_read: u64,
}

/// Measures the read rate of `files` at each depth of `test`: that many threads read
/// `next(0)`, `next(1)`, … (one counter across every level, so a level does not re-read the
/// last one's bytes) until the level's seconds or bytes are spent, or `next` has no more.
/// Reads bypass the page cache where the files were opened with O_DIRECT. The first failed
/// read or thread ends the test with its reason, naming the depth.
pub fn read_rates(
    files: &[ShardFile],
    test: ReadTest<'_>,
    next: &(dyn Fn(u64) -> Option<TestRead> + Sync),
) -> Result<Bandwidth, String> {
    let counter = AtomicU64::new(0);
    let mut levels = Vec::new();
    for &qd in test.depths {
        let done = AtomicU64::new(0);
        let start = Instant::now();
        let limit = Duration::from_secs_f64(test.secs);
        let reader = || -> Result<(), String> {
            let mut buf = AlignedBuf::new(aligned_span(0, test.max_read) as usize + 4096);
            loop {
                let Some(read) = next(counter.fetch_add(1, Ordering::Relaxed)) else {
                    return Ok(());
                };
                let file = files
                    .get(read.file)
                    .ok_or_else(|| format!("read test: no file {}", read.file))?;
                let mut bytes = 0;
                for &(off, len) in &read.pieces {
                    let span = aligned_span(off, len) as usize;
                    let into = buf
                        .get_mut(..span)
                        .ok_or_else(|| format!("read test: a read of {len} B exceeds max_read"))?;
                    file.read_into_aligned(into, off, len as usize)
                        .map_err(|e| e.to_string())?;
                    bytes += len;
                }
                let total = done.fetch_add(bytes, Ordering::Relaxed) + bytes;
                if start.elapsed() >= limit || total >= test.cap {
                    return Ok(());
                }
            }
        };
        let failed = std::thread::scope(|s| {
            let readers: Vec<_> = (0..qd)
                .map(|_| {
                    std::thread::Builder::new()
                        .spawn_scoped(s, reader)
                        .map_err(|e| format!("cannot start a reader thread: {e}"))
                })
                .collect();
            readers.into_iter().find_map(|r| match r {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err("a reader panicked".into()))
                    .err(),
                Err(e) => Some(e),
            })
        });
        if let Some(e) = failed {
            return Err(format!("failed at {qd} outstanding: {e}"));
        }
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        levels.push((qd, done.into_inner() as f64 / secs));
    }
    Ok(Bandwidth { levels })
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
    fn a_read_test_counts_what_it_read_at_each_depth() {
        let dir = std::env::temp_dir().join(format!("k3-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("scratch.bin");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let files = [ShardFile::open(&path, false).unwrap()];
        let test = ReadTest {
            depths: &[1, 2],
            secs: 10.0,
            cap: 4 << 20,
            max_read: 64 << 10,
        };
        // 16 reads of 64 KiB in all: the first level takes them all, the second finds none.
        let next = |i: u64| {
            (i < 16).then(|| TestRead {
                file: 0,
                pieces: vec![(i * (64 << 10), 64 << 10)],
            })
        };
        let bw = read_rates(&files, test, &next).unwrap();
        assert_eq!(bw.levels.len(), 2);
        assert!(bw.at(1).is_some(), "the first level read 1 MiB");
        assert_eq!(bw.at(2), None, "nothing was left for the second level");
        let no_such_file = |_: u64| {
            Some(TestRead {
                file: 3,
                pieces: vec![(0, 4096)],
            })
        };
        let err = read_rates(&files, test, &no_such_file).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(err, "failed at 1 outstanding: read test: no file 3");
    }

    #[test]
    fn cpu_names_come_from_x86_or_arm_fields() {
        assert_eq!(
            cpu_model("processor : 0\nmodel name : AMD EPYC 9R14\n"),
            "AMD EPYC 9R14"
        );
        assert_eq!(cpu_model("CPU part : 0xd0c\n"), "ARM CPU part 0xd0c");
        assert_eq!(cpu_model(""), "unknown");
        assert_eq!(meminfo_kb("MemTotal:  2048 kB\n", "MemTotal:"), Some(2048));
    }

    #[test]
    fn this_process_has_a_peak_and_the_root_has_free_space() {
        assert!(peak_rss_bytes() > 0);
        assert!(free_disk(Path::new("/")).is_some());
    }
}
