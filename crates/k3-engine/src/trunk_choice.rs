//! Plain or compressed trunk pack (docs/PERFORMANCE.md#trunk-compression): `k3_plan::CodecRates`
//! fed with the drive's read rate, the compressed pack's stored ratio, the measured decode
//! rate per core and the decoding cores (the compute threads); `k3 plan` prints the forecast
//! and a streaming engine opens the pack it names when a model directory holds both.

use crate::EngineError;
use k3_format::TrunkPack;
use k3_plan::plan::{CodecForecast, CodecRates};
use k3_store::probe::{read_rates, ReadTest, TestRead};
use k3_store::ShardFile;
use std::path::{Path, PathBuf};

/// Decoded bytes one core produces per second when no compressed pack is at hand to time
/// ([`probe_decode_rate`]): k3-codec decodes 1.63 GB/s of bf16 per core on a 2-vCPU Xeon VM
/// with AVX-512 and 3.5–3.9 on a Zen 4 VM; the slower figure is assumed
/// (docs/PERFORMANCE.md#trunk-compression).
pub const DECODE_BYTES_PER_S_PER_CORE: f64 = 1.6e9;
/// Stored ÷ decoded bytes when no compressed pack is at hand: 0.667 measured on trained-like
/// BF16 weights (docs/PERFORMANCE.md#trunk-compression).
pub const MEASURED_STORED_RATIO: f64 = 0.667;
/// The drive rate assumed when none is given and no pack can be read: 2 GB/s, within the
/// 1.2–2.4 GB/s O_DIRECT measured on the 2-core VM (docs/PERFORMANCE.md#trunk-read-ahead).
pub const ASSUMED_READ_BYTES_PER_S: f64 = 2.0e9;
/// Where a model directory keeps its plain pack (`k3_hub::store::TRUNK_SUBDIR`, where
/// `k3 pull` packs one).
pub const PLAIN_SUBDIR: &str = "trunk";
/// Where a model directory keeps a compressed pack, beside the plain one (either kind is
/// recognised in either directory).
pub const COMPRESSED_SUBDIR: &str = "trunk-compressed";
/// The read probe: one 64 MiB O_DIRECT read at a time from the pack's start, for 0.3 s or
/// 1 GiB at most (about the size of a streamed piece, read as the ring reads it).
const PROBE_READ: u64 = 64 << 20;
const PROBE_SECS: f64 = 0.3;
const PROBE_CAP: u64 = 1 << 30;

/// Where the drive rate came from.
#[derive(Clone, Debug, PartialEq)]
pub enum ReadRateSource {
    /// `--read-gbps`.
    Given,
    /// Read from this pack file just now.
    Measured(PathBuf),
    /// [`ASSUMED_READ_BYTES_PER_S`]: nothing given, no pack to read.
    Assumed,
}

/// Where the decode rate came from.
#[derive(Clone, Debug, PartialEq)]
pub enum DecodeRateSource {
    /// Timed on this compressed pack's chunks just now ([`probe_decode_rate`]).
    Measured(PathBuf),
    /// [`DECODE_BYTES_PER_S_PER_CORE`]: no compressed pack, or none of its tensors coded.
    Assumed,
}

/// The packs a run could stream its trunk from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrunkPacks {
    /// A plain pack's directory.
    pub plain: Option<PathBuf>,
    /// A compressed pack's directory and its stored ÷ decoded bytes.
    pub compressed: Option<(PathBuf, f64)>,
    /// Directories holding a `trunk.json` that does not open, and why.
    pub unreadable: Vec<(PathBuf, String)>,
}

impl TrunkPacks {
    /// The packs kept in `model_dir` (`trunk`, `trunk-compressed`); a directory without a
    /// `trunk.json` is skipped, one whose `trunk.json` does not open is listed as unreadable.
    pub fn in_model_dir(model_dir: &Path) -> TrunkPacks {
        let mut packs = TrunkPacks::default();
        for sub in [PLAIN_SUBDIR, COMPRESSED_SUBDIR] {
            let dir = model_dir.join(sub);
            if !dir.join("trunk.json").is_file() {
                continue;
            }
            match TrunkPack::open(&dir) {
                Ok(pack) => packs.add(dir, &pack),
                Err(e) => packs.unreadable.push((dir, e.to_string())),
            }
        }
        packs
    }

    /// The one pack given with `--trunk DIR`.
    pub fn given(dir: &Path) -> Result<TrunkPacks, EngineError> {
        let mut packs = TrunkPacks::default();
        packs.add(dir.to_path_buf(), &TrunkPack::open(dir)?);
        Ok(packs)
    }

    fn add(&mut self, dir: PathBuf, pack: &TrunkPack) {
        if !pack.is_compressed() {
            self.plain.get_or_insert(dir);
            return;
        }
        let decoded: u64 = (0..pack.num_layers()).map(|l| pack.decoded_bytes(l)).sum();
        let ratio = pack.stored_total_bytes() as f64 / decoded.max(1) as f64;
        self.compressed.get_or_insert((dir, ratio));
    }

    /// No pack at all.
    pub fn is_empty(&self) -> bool {
        self.plain.is_none() && self.compressed.is_none()
    }
}

/// The compression forecast of one machine and model directory.
#[derive(Clone, Debug, PartialEq)]
pub struct TrunkCodecPlan {
    /// What the forecast is computed from.
    pub rates: CodecRates,
    /// Where `rates.disk_bytes_per_s` came from.
    pub read_source: ReadRateSource,
    /// Where `rates.decode_bytes_per_s_per_core` came from.
    pub decode_source: DecodeRateSource,
    /// The packs at hand.
    pub packs: TrunkPacks,
}

impl TrunkCodecPlan {
    /// The forecast for `packs` with `decoding_cores` cores: the drive rate `read_bytes_per_s`
    /// when given, else measured on a pack's file (the plain one first), else assumed;
    /// `overlapped` when the next read overlaps the current decode (the engine: always).
    pub fn new(
        packs: TrunkPacks,
        read_bytes_per_s: Option<f64>,
        decoding_cores: usize,
        overlapped: bool,
    ) -> TrunkCodecPlan {
        let probe_file = packs
            .plain
            .as_ref()
            .or(packs.compressed.as_ref().map(|c| &c.0))
            .map(|d| d.join("trunk.bin"));
        let (disk, read_source) = match (read_bytes_per_s, probe_file) {
            (Some(r), _) => (r, ReadRateSource::Given),
            (None, Some(f)) => match probe_read_rate(&f) {
                Ok(r) => (r, ReadRateSource::Measured(f)),
                Err(_) => (ASSUMED_READ_BYTES_PER_S, ReadRateSource::Assumed),
            },
            (None, None) => (ASSUMED_READ_BYTES_PER_S, ReadRateSource::Assumed),
        };
        let stored_ratio = packs
            .compressed
            .as_ref()
            .map_or(MEASURED_STORED_RATIO, |c| c.1);
        let timed = packs.compressed.as_ref().and_then(|(dir, _)| {
            let pack = TrunkPack::open(dir).ok()?;
            Some((probe_decode_rate(&pack).ok()?, dir.clone()))
        });
        let (decode, decode_source) = match timed {
            Some((rate, dir)) => (rate, DecodeRateSource::Measured(dir)),
            None => (DECODE_BYTES_PER_S_PER_CORE, DecodeRateSource::Assumed),
        };
        TrunkCodecPlan {
            rates: CodecRates {
                stored_ratio,
                disk_bytes_per_s: disk,
                decode_bytes_per_s_per_core: decode,
                decoding_cores: decoding_cores.max(1),
                overlapped,
                compute_bytes_per_s_per_core: probe_compute_rate(),
            },
            read_source,
            decode_source,
            packs,
        }
    }

    /// Seconds per token for `decoded_bytes` of trunk streamed per token.
    pub fn forecast(&self, decoded_bytes: u64) -> CodecForecast {
        self.rates.forecast(decoded_bytes)
    }

    /// The pack a run should open: the one the forecast names when both are at hand, else
    /// the only one (a compressed pack that does not pay still beats the shards' scattered
    /// reads only in bytes, and it is what the user made), `None` without a pack.
    pub fn chosen(&self) -> Option<&Path> {
        self.candidates().first().copied()
    }

    /// Every pack at hand, the chosen one first.
    pub fn candidates(&self) -> Vec<&Path> {
        let plain = self.packs.plain.as_deref();
        let compressed = self.packs.compressed.as_ref().map(|c| c.0.as_path());
        let order = match self.rates.pays() {
            true => [compressed, plain],
            false => [plain, compressed],
        };
        order.into_iter().flatten().collect()
    }

    /// What `k3 plan` prints for `decoded_bytes` streamed per token from `model_dir`: the
    /// forecast, whether compression pays, and which pack to use or to make.
    pub fn lines(&self, model_dir: &Path, decoded_bytes: u64) -> Vec<String> {
        let r = &self.rates;
        let rate = match &self.read_source {
            ReadRateSource::Given => "given".to_string(),
            ReadRateSource::Measured(f) => format!("measured on {}", f.display()),
            ReadRateSource::Assumed => "assumed; give --read-gbps R for your drive".to_string(),
        };
        let ratio = match &self.packs.compressed {
            Some((d, _)) => format!("of {}", d.display()),
            None => "measured on trained-like weights".to_string(),
        };
        let decode = match &self.decode_source {
            DecodeRateSource::Measured(d) => format!("timed on {}", d.display()),
            DecodeRateSource::Assumed => "docs/PERFORMANCE.md#trunk-compression".to_string(),
        };
        let mut lines = vec![
            format!(
                "trunk codec rates: drive {:.2} GB/s ({rate}), stored ratio {:.3} ({ratio}), decode {:.2} GB/s per core ({decode}), mat-vec {:.2} GB/s per core (timed), on {} cores",
                r.disk_bytes_per_s / 1e9,
                r.stored_ratio,
                r.decode_bytes_per_s_per_core / 1e9,
                r.compute_bytes_per_s_per_core / 1e9,
                r.decoding_cores
            ),
            r.summary(decoded_bytes),
        ];
        lines.push(format!("{}: {}", r.decision(), self.advice(model_dir)));
        lines
    }

    /// Which pack to use, naming the one at hand or the command that makes it.
    fn advice(&self, model_dir: &Path) -> String {
        let m = model_dir.display();
        match (self.rates.pays(), &self.packs.plain, &self.packs.compressed) {
            (true, _, Some((d, _))) => format!("use the compressed pack {}", d.display()),
            (true, _, None) => format!(
                "make a compressed pack (`k3 pack --compress {m} {}`)",
                model_dir.join(COMPRESSED_SUBDIR).display()
            ),
            (false, Some(d), _) => format!("use the plain pack {}", d.display()),
            (false, None, Some(_)) => format!(
                "use a plain pack, not the compressed one (`k3 pack {m} {}`)",
                model_dir.join(PLAIN_SUBDIR).display()
            ),
            (false, None, None) => format!(
                "use a plain pack (`k3 pack {m} {}`)",
                model_dir.join(PLAIN_SUBDIR).display()
            ),
        }
    }

    /// The forecast as JSON (`k3 plan --json`).
    pub fn json(&self, decoded_bytes: u64) -> serde_json::Value {
        let f = self.forecast(decoded_bytes);
        let r = &self.rates;
        serde_json::json!({
            "read_bytes_per_s": r.disk_bytes_per_s,
            "read_rate_source": match &self.read_source {
                ReadRateSource::Given => "given",
                ReadRateSource::Measured(_) => "measured",
                ReadRateSource::Assumed => "assumed",
            },
            "stored_ratio": r.stored_ratio,
            "decode_bytes_per_s_per_core": r.decode_bytes_per_s_per_core,
            "decode_rate_source": match &self.decode_source {
                DecodeRateSource::Measured(_) => "measured",
                DecodeRateSource::Assumed => "assumed",
            },
            "decoding_cores": r.decoding_cores,
            "compute_bytes_per_s_per_core": r.compute_bytes_per_s_per_core,
            "overlapped": r.overlapped,
            "stored_bytes_per_token": f.stored_bytes,
            "decoded_bytes_per_token": f.decoded_bytes,
            "decode_seconds_per_token": f.decode_s,
            "plain_seconds_per_token": f.plain_s,
            "compressed_seconds_per_token": f.compressed_s,
            "crossover_bytes_per_s_per_core": r.crossover_bytes_per_s() / r.decoding_cores as f64,
            "compression_pays": r.pays(),
            "pack": self.chosen().map(|p| p.display().to_string()),
        })
    }
}

/// Decoding cores by default: the compute threads a run would start (the physical cores).
pub fn default_decoding_cores() -> usize {
    crate::open::default_threads()
}

/// Decoded bytes of the probe: about 32 MiB of the first coded layer's chunks, decoded three
/// times on this thread (about 60 ms at 1.6 GB/s).
const DECODE_PROBE_BYTES: usize = 32 << 20;
const DECODE_PROBE_ROUNDS: usize = 3;

/// Bytes of bf16 one core decodes per second from `pack`'s coded chunks (first layer holding
/// any, up to [`DECODE_PROBE_BYTES`]) as a streamed run decodes them once it has checked
/// them: the first round checks the stored hashes, the best of [`DECODE_PROBE_ROUNDS`] on
/// this thread is timed. An error when the pack has no coded chunk or its file cannot be
/// read.
pub fn probe_decode_rate(pack: &TrunkPack) -> Result<f64, String> {
    use k3_format::pack::{DecodeJob, TensorStore};
    use std::os::unix::fs::FileExt;
    let coded = |l: usize, job: &DecodeJob| {
        let t = pack.layer_entry(l).map(|e| &e.tensors[job.tensor]);
        matches!(
            t.and_then(|t| t.stored.as_ref()),
            Some(TensorStore::Coded(_))
        )
    };
    let (l, all) = (0..pack.num_layers())
        .map(|l| (l, pack.decode_jobs(l)))
        .find(|(l, jobs)| jobs.iter().any(|j| coded(*l, j)))
        .ok_or_else(|| format!("{}: no coded chunk to time", pack.path().display()))?;
    let mut jobs = Vec::new();
    let mut decoded = 0usize;
    for j in all.into_iter().filter(|j| coded(l, j)) {
        if decoded >= DECODE_PROBE_BYTES {
            break;
        }
        decoded += j.dst.len();
        jobs.push(j);
    }
    let at = |e: std::io::Error| format!("{}: {e}", pack.path().display());
    let mut stored = vec![0u8; jobs.iter().map(|j| j.src.end).max().unwrap_or(0)];
    std::fs::File::open(pack.path())
        .and_then(|f| f.read_exact_at(&mut stored, pack.layer(l).0))
        .map_err(at)?;
    let mut out = vec![0u8; jobs.iter().map(|j| j.dst.len()).max().unwrap_or(0)];
    let mut scratch = Vec::new();
    let mut best = f64::MAX;
    for round in 0..DECODE_PROBE_ROUNDS {
        let t0 = std::time::Instant::now();
        for j in &jobs {
            let dst = &mut out[..j.dst.len()];
            pack.decode_job_in(l, j, &stored, 0, dst, &mut scratch, round == 0)
                .map_err(|e| e.to_string())?;
        }
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(decoded as f64 / best.max(1e-9))
}

/// The mat-vec probe: a `[4096][8192]` bf16 matrix (64 MiB, past most caches), three times
/// on this thread (about 10 ms each at 6 GB/s).
const COMPUTE_PROBE_ROWS: usize = 4096;
const COMPUTE_PROBE_COLS: usize = 8192;

/// Bytes of bf16 weights one core runs the engine's mat-vec through per second (best of
/// three on this thread, the kernel level in use): the part of a decode pass's compute that
/// grows with the trunk's bytes, and shares the cores with decoding a compressed trunk.
pub fn probe_compute_rate() -> f64 {
    let (rows, cols) = (COMPUTE_PROBE_ROWS, COMPUTE_PROBE_COLS);
    // small finite values of either sign; the rate does not depend on them
    let w: Vec<half::bf16> = (0..rows * cols)
        .map(|i| half::bf16::from_bits(0x3c00 ^ (i as u16 & 0x80ff)))
        .collect();
    let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.125).collect();
    let mut y = vec![0f32; rows];
    let Some(m) = k3_kernels::Matrix::bf16(rows, cols, &w) else {
        return 0.0;
    };
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        k3_kernels::matvec(&mut y, &m, &x);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&y);
    (w.len() * 2) as f64 / best.max(1e-9)
}

/// The O_DIRECT rate of sequential 64 MiB reads from `file`'s start (bytes/s); a smaller file
/// is read whole, again and again (O_DIRECT reads do not come from the page cache), so the
/// probe's buffer and threads do not dominate its few milliseconds.
pub fn probe_read_rate(file: &Path) -> Result<f64, String> {
    let f = ShardFile::open(file, true).map_err(|e| format!("{}: {e}", file.display()))?;
    let len = std::fs::metadata(file)
        .map_err(|e| format!("{}: {e}", file.display()))?
        .len();
    let read = PROBE_READ.min(len / 4096 * 4096);
    if read == 0 {
        return Err(format!(
            "{}: under 4096 bytes, nothing to time",
            file.display()
        ));
    }
    let test = ReadTest {
        depths: &[1],
        secs: PROBE_SECS,
        cap: PROBE_CAP,
        max_read: read,
    };
    let slots = len / read;
    let next = |i: u64| {
        Some(TestRead {
            file: 0,
            pieces: vec![((i % slots) * read, read)],
        })
    };
    read_rates(std::slice::from_ref(&f), test, &next)?
        .at(1)
        .ok_or_else(|| format!("{}: nothing read", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(packs: TrunkPacks, gbps: f64, cores: usize, overlapped: bool) -> TrunkCodecPlan {
        TrunkCodecPlan::new(packs, Some(gbps * 1e9), cores, overlapped)
    }

    #[test]
    fn chooses_the_pack_the_forecast_names() {
        let both = TrunkPacks {
            plain: Some("m/trunk".into()),
            compressed: Some(("m/trunk-compressed".into(), 0.665)),
            unreadable: Vec::new(),
        };
        // 2 cores at 1.6 GB/s: serial pays below 0.335 · 3.2 = 1.07 GB/s, overlapped below 3.2.
        let slow = plan(both.clone(), 0.8, 2, false);
        assert_eq!(slow.chosen(), Some(Path::new("m/trunk-compressed")));
        let fast = plan(both.clone(), 2.4, 2, false);
        assert_eq!(fast.chosen(), Some(Path::new("m/trunk")));
        let overlapped = plan(both, 2.4, 2, true);
        assert_eq!(
            overlapped.candidates(),
            [Path::new("m/trunk-compressed"), Path::new("m/trunk")]
        );
        assert_eq!(overlapped.rates.stored_ratio, 0.665);
    }

    #[test]
    fn names_the_command_for_the_missing_pack() {
        let only_compressed = TrunkPacks {
            plain: None,
            compressed: Some(("m/trunk".into(), 0.667)),
            unreadable: Vec::new(),
        };
        let p = plan(only_compressed, 2.4, 2, false);
        assert_eq!(p.chosen(), Some(Path::new("m/trunk")), "the only pack");
        let lines = p.lines(Path::new("m"), 4_000_000_000).join("\n");
        assert!(
            lines.contains("compression does not pay at 2.4 GB/s with 2 decoding cores (crossover 0.53 GB/s per core): use a plain pack, not the compressed one (`k3 pack m m/trunk`)"),
            "{lines}"
        );
        assert!(lines.contains("drive 2.40 GB/s (given)"), "{lines}");
        let none = plan(TrunkPacks::default(), 0.5, 2, false);
        assert!(none.chosen().is_none());
        let lines = none.lines(Path::new("m"), 4_000_000_000).join("\n");
        assert!(
            lines.contains("make a compressed pack (`k3 pack --compress m m/trunk-compressed`)"),
            "{lines}"
        );
        assert!(lines.contains("stored ratio 0.667 (measured"), "{lines}");
    }

    #[test]
    fn json_carries_the_forecast() {
        let mut p = plan(TrunkPacks::default(), 2.0, 2, true);
        assert!(
            p.rates.compute_bytes_per_s_per_core > 0.0,
            "the mat-vec rate is timed"
        );
        p.rates.compute_bytes_per_s_per_core = 0.0;
        let v = p.json(3_200_000_000);
        assert_eq!(v["decoded_bytes_per_token"], 3_200_000_000u64);
        assert_eq!(v["compression_pays"], true);
        // Overlapped: max(0.667 · 3.2 / 2, 3.2 / 3.2) = 1.067 s against 1.6 s plain.
        let c = v["compressed_seconds_per_token"].as_f64().unwrap_or(0.0);
        assert!((c - 1.0672).abs() < 1e-3, "{v}");
        assert_eq!(v["plain_seconds_per_token"], 1.6);
        // With 8 GB/s of mat-vecs per core on the same 2 cores (0.2 s): max(1.067, 0.2 + 1.0)
        p.rates.compute_bytes_per_s_per_core = 8e9;
        let v = p.json(3_200_000_000);
        let c = v["compressed_seconds_per_token"].as_f64().unwrap_or(0.0);
        assert!((c - 1.2).abs() < 1e-9, "{v}");
        assert_eq!(v["compute_bytes_per_s_per_core"], 8e9);
    }
}
