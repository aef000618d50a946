//! Shared pieces of the decode / layer / prefill benchmarks: machine facts, medians, the
//! model's planner sizes, and the O_DIRECT read test on the model's own shard files.

use k3_format::{bind_model, Checkpoint, K3Config, ModelBinding};
use k3_plan::ModelSizes;
use k3_store::io::{aligned_span, ReadAt};
use k3_store::probe::{read_rates, ReadTest, TestRead};
use k3_store::{AlignedBuf, ShardFile};
use std::path::Path;
use std::time::Instant;

/// Median of `v` (mean of the two middle values for an even count; 0 when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Mean of `v` (0 when empty).
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Decimal gigabytes.
pub fn gb(bytes: f64) -> f64 {
    bytes / 1e9
}

/// One line of machine facts: CPU, cores, SIMD path, RAM, load average.
pub fn machine_facts() -> String {
    let m = k3_store::probe::MachineFacts::read();
    let gb = |b: Option<u64>| b.map_or(0.0, |b| b as f64 / 1e9);
    format!(
        "{}, {} logical cores, kernels {}, AMX-BF16 {}, RAM {:.1} GB (available {:.1} GB), load average {}",
        m.cpu,
        m.usable_cores,
        k3_kernels::simd::simd_level(),
        k3_kernels::probe::amx_bf16().label(),
        gb(m.mem_total),
        gb(m.mem_available),
        m.load_average
    )
}

/// The 1-minute load average (a noise indicator for the tables).
pub fn load_average() -> String {
    k3_store::probe::MachineFacts::read().load_average
}

/// The model's config, binding and the planner's view of it.
pub struct ModelInfo {
    pub cfg: K3Config,
    pub ckpt: Checkpoint,
    pub binding: ModelBinding,
    pub sizes: ModelSizes,
}

/// Opens `dir`'s index and binding (reads headers only).
pub fn model_info(dir: &Path) -> Result<ModelInfo, String> {
    let cfg = K3Config::load(dir.join("config.json")).map_err(|e| e.to_string())?;
    let ckpt = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    let binding = bind_model(&ckpt, &cfg).map_err(|e| e.to_string())?;
    let sizes = k3_engine::planning::model_sizes(&cfg, &binding).map_err(|e| e.to_string())?;
    Ok(ModelInfo {
        cfg,
        ckpt,
        binding,
        sizes,
    })
}

/// Bytes of trunk runs the read test reads (whole runs, at least one).
pub const TRUNK_TEST_BYTES: u64 = 3_000_000_000;

/// Disk read rates measured on the model's own files.
pub struct DiskRates {
    /// Every shard opened with O_DIRECT (page cache bypassed).
    pub direct: bool,
    /// `(outstanding reads, bytes/s)` of one-expert reads.
    pub expert: Vec<(usize, f64)>,
    /// Bytes/s of whole trunk-run reads (one read call per run, as the trunk store does).
    pub trunk: f64,
    /// Bytes of the trunk run read.
    pub trunk_run_bytes: u64,
}

impl DiskRates {
    /// Expert-read rate at `qd` outstanding reads (the nearest measured depth not above it).
    pub fn expert_at(&self, qd: usize) -> f64 {
        self.expert
            .iter()
            .filter(|l| l.0 <= qd)
            .max_by_key(|l| l.0)
            .or(self.expert.first())
            .map_or(0.0, |l| l.1)
    }

    /// The better rate of `self` and `other` at every depth (a floor uses the best the disk
    /// delivered).
    pub fn best(&self, other: &DiskRates) -> DiskRates {
        let expert = self
            .expert
            .iter()
            .map(|&(qd, b)| (qd, b.max(other.expert_at(qd))))
            .collect();
        DiskRates {
            direct: self.direct && other.direct,
            expert,
            trunk: self.trunk.max(other.trunk),
            trunk_run_bytes: self.trunk_run_bytes.max(other.trunk_run_bytes),
        }
    }

    /// A one-line summary.
    pub fn summary(&self) -> String {
        let levels: Vec<String> = self
            .expert
            .iter()
            .map(|(qd, b)| format!("{:.0} MB/s at {qd}", b / 1e6))
            .collect();
        format!(
            "{}: expert-sized reads {}; whole trunk runs ({:.2} GB, one read per run) {:.0} MB/s",
            if self.direct {
                "O_DIRECT"
            } else {
                "BUFFERED (page cache not bypassed)"
            },
            levels.join(", "),
            gb(self.trunk_run_bytes as f64),
            self.trunk / 1e6
        )
    }
}

/// Measures O_DIRECT reads on the model's files: one routed expert per read at each depth in
/// `depths` (for about `secs` seconds each, over a fixed pseudo-random walk of real expert
/// locations), then whole trunk runs in layer order, one read call each as the trunk store
/// does, until [`TRUNK_TEST_BYTES`] are read.
pub fn measure_disk(m: &ModelInfo, depths: &[usize], secs: f64) -> Result<DiskRates, String> {
    let shards: Vec<ShardFile> = m
        .ckpt
        .shards()
        .iter()
        .map(|s| ShardFile::open(s.path(), true).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let direct = shards.iter().all(ShardFile::is_direct);
    let (first, per) = (m.cfg.first_k_dense_replace, m.cfg.num_experts);
    let layers = m.cfg.num_hidden_layers.saturating_sub(first);
    if layers == 0 || per == 0 || m.binding.experts.is_empty() {
        return Err("the model has no routed experts".into());
    }
    let bytes = m.binding.experts.expert_bytes();
    let test = ReadTest {
        depths,
        secs,
        cap: u64::MAX,
        max_read: bytes,
    };
    let next = |i: u64| {
        let k = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as usize % (layers * per);
        let loc = m.binding.experts.locate(first + k / per, k % per).ok()?;
        Some(TestRead {
            file: loc.shard,
            pieces: loc.reads,
        })
    };
    let expert = read_rates(&shards, test, &next)?.levels;
    // Whole layer runs in layer order: the trunk store reads a run with one call.
    let runs: Vec<_> = m
        .binding
        .layers
        .iter()
        .filter_map(|lt| lt.trunk_run().ok())
        .collect();
    let largest = runs
        .iter()
        .map(|r| r.len())
        .max()
        .ok_or("no contiguous trunk run")?;
    let mut buf = AlignedBuf::new(aligned_span(0, largest) as usize + 4096);
    let (mut read, t) = (0u64, Instant::now());
    for run in runs.iter().rev() {
        let span = aligned_span(run.start, run.len()) as usize;
        shards[run.shard]
            .read_into_aligned(&mut buf[..span], run.start, run.len() as usize)
            .map_err(|e| e.to_string())?;
        read += run.len();
        if read >= TRUNK_TEST_BYTES {
            break;
        }
    }
    let trunk = read as f64 / t.elapsed().as_secs_f64().max(1e-9);
    Ok(DiskRates {
        direct,
        expert,
        trunk,
        trunk_run_bytes: read,
    })
}

/// A rayon pool of `n` threads (the benchmarks' own, like the engine's compute pool).
pub fn pool(n: usize) -> Result<rayon::ThreadPool, String> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .map_err(|e| e.to_string())
}

/// Deterministic token ids in `0..vocab` (a Weyl walk, no repeats for short prompts).
pub fn prompt_ids(n: usize, vocab: usize, salt: u64) -> Vec<u32> {
    (0..n as u64)
        .map(|i| {
            let x = (i + 1 + salt * 1000).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((x >> 17) % vocab as u64) as u32
        })
        .collect()
}

/// A prompt with a repeated phrase (so a prompt-lookup drafter has something to look up),
/// for the drafting benchmarks.
pub fn phrase_prompt(vocab: u32) -> Vec<u32> {
    let phrase: Vec<u32> = (0..6).map(|i| (37 + 101 * i) % vocab).collect();
    let mut p = vec![1 % vocab, 2 % vocab];
    for _ in 0..3 {
        p.extend(&phrase);
        p.push(5 % vocab);
    }
    p
}

/// Deterministic "coin" of an oracle drafter for position `p`: right with probability
/// `accept`.
pub fn oracle_right(p: usize, accept: f64) -> bool {
    let h = (p as u64 ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((h >> 11) as f64 / (1u64 << 53) as f64) < accept
}

/// `tokens` greedy decode steps (at least one) from `s`'s current logits, each timed alone:
/// the seconds of each step, and the engine's counters over them. The ids fed are appended
/// to `ids`.
pub fn timed_greedy_steps(
    engine: &k3_engine::Engine,
    s: &mut k3_engine::Session<'_>,
    tokens: usize,
    ids: &mut Vec<u32>,
) -> Result<(Vec<f64>, k3_engine::StoreStats), String> {
    let before = engine.stats();
    let mut times = Vec::new();
    for _ in 0..tokens.max(1) {
        let id = k3_engine::argmax(s.logits());
        ids.push(id);
        let t = Instant::now();
        s.step(id, k3_engine::DecodeMode::Incremental)
            .map_err(|e| e.to_string())?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok((times, engine.stats().since(&before)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_mean() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(mean(&[1.0, 2.0, 3.0]), 2.0);
    }

    #[test]
    fn prompt_ids_are_in_range_and_deterministic() {
        let a = prompt_ids(64, 97, 1);
        assert_eq!(a, prompt_ids(64, 97, 1));
        assert!(a.iter().all(|&id| id < 97));
        assert_ne!(a, prompt_ids(64, 97, 2));
    }

    #[test]
    fn best_takes_the_faster_rate_per_depth() {
        let r = |e1: f64, e4: f64, t: f64| DiskRates {
            direct: true,
            expert: vec![(1, e1), (4, e4)],
            trunk: t,
            trunk_run_bytes: 10,
        };
        let b = r(1.0, 5.0, 2.0).best(&r(2.0, 3.0, 1.0));
        assert_eq!(b.expert, vec![(1, 2.0), (4, 5.0)]);
        assert_eq!(b.trunk, 2.0);
        assert_eq!(b.expert_at(16), 5.0);
        assert_eq!(b.expert_at(2), 2.0);
    }
}
