//! The read tests `k3 doctor` runs (the rates its I/O floors divide by): one expert per read
//! over the model's own expert locations, and a scratch file where the release would go.
//! Reads go through k3-store's [`read_rates`] with O_DIRECT where the filesystem allows it.

use k3_format::{Checkpoint, K3Config, ModelBinding};
use k3_store::probe::{read_rates, Bandwidth, ReadTest, TestRead};
use k3_store::ShardFile;
use std::path::Path;

/// Byte cap per queue depth of the expert read test (a level always finishes its first round).
const LEVEL_BYTES: u64 = 192 << 20;

/// Why the expert read test cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ReadTestSkipped {
    /// A shard cannot be opened for reading.
    #[error("{0}")]
    Open(String),
    /// There is nothing to read: no routed experts.
    #[error("the model has no routed experts")]
    NoExperts,
}

/// The model's shards opened for the expert read test.
pub struct ExpertReads<'a> {
    shards: Vec<ShardFile>,
    binding: &'a ModelBinding,
    first_moe_layer: usize,
    moe_layers: usize,
    experts: usize,
}

impl<'a> ExpertReads<'a> {
    /// Opens every shard of `ck` (O_DIRECT where allowed) for reads of `binding`'s experts.
    pub fn open(
        ck: &Checkpoint,
        binding: &'a ModelBinding,
        cfg: &K3Config,
    ) -> Result<Self, ReadTestSkipped> {
        let shards = ck
            .shards()
            .iter()
            .map(|s| ShardFile::open(s.path(), true))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ReadTestSkipped::Open(e.to_string()))?;
        let first_moe_layer = cfg.first_k_dense_replace;
        let moe_layers = cfg.num_hidden_layers.saturating_sub(first_moe_layer);
        if moe_layers == 0 || cfg.num_experts == 0 || binding.experts.is_empty() {
            return Err(ReadTestSkipped::NoExperts);
        }
        Ok(ExpertReads {
            shards,
            binding,
            first_moe_layer,
            moe_layers,
            experts: cfg.num_experts,
        })
    }

    /// Whether every shard reads with O_DIRECT (else the page cache is in the figures).
    pub fn direct(&self) -> bool {
        self.shards.iter().all(ShardFile::is_direct)
    }

    /// Bytes of one read: one expert.
    pub fn read_bytes(&self) -> u64 {
        self.binding.experts.expert_bytes()
    }

    /// Reads of one expert each at 1, 4 and 16 outstanding reads, `secs` per depth, over
    /// expert locations spread across the model (a fixed pseudo-random walk).
    pub fn run(&self, secs: f64) -> Result<Bandwidth, String> {
        let nth = |i: u64| {
            // Weyl sequence over the expert table: deterministic, spread over every shard.
            let k = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) as usize
                % (self.moe_layers * self.experts);
            let layer = self.first_moe_layer + k / self.experts;
            self.binding.experts.locate(layer, k % self.experts).ok()
        };
        let test = ReadTest {
            depths: &[1, 4, 16],
            secs,
            cap: LEVEL_BYTES,
            max_read: self.read_bytes(),
        };
        let next = |i: u64| {
            nth(i).map(|loc| TestRead {
                file: loc.shard,
                pieces: loc.reads.clone(),
            })
        };
        read_rates(&self.shards, test, &next)
    }
}

/// Bytes of the scratch file the release's read test reads (a fraction of a real shard: the
/// figures lean on the drive's cache and are optimistic).
pub const SCRATCH_BYTES: u64 = 128 << 20;
/// Bytes per scratch read: one released expert (17,547,264 B) rounded up to 4096.
pub const SCRATCH_READ_BYTES: usize = 17_551_360;

/// Reads of one released expert's size at 1 and 16 outstanding reads over a scratch file
/// written in `dir` (deleted afterwards): the rates, and whether the reads were O_DIRECT.
pub fn scratch_read_test(dir: &Path, secs: f64) -> Result<(Bandwidth, bool), String> {
    let path = dir.join(format!(".k3-doctor-{}.tmp", std::process::id()));
    let result = write_scratch(&path).and_then(|()| read_scratch(&path, secs));
    let _ = std::fs::remove_file(&path);
    result
}

fn write_scratch(path: &Path) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // Not zeros, so no layer below may store the file sparse or compressed.
    let chunk: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    for _ in 0..SCRATCH_BYTES >> 20 {
        f.write_all(&chunk)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    f.sync_all().map_err(|e| format!("{}: {e}", path.display()))
}

fn read_scratch(path: &Path, secs: f64) -> Result<(Bandwidth, bool), String> {
    let file = ShardFile::open(path, true).map_err(|e| e.to_string())?;
    let slots = SCRATCH_BYTES / SCRATCH_READ_BYTES as u64;
    let test = ReadTest {
        depths: &[1, 16],
        secs,
        cap: u64::MAX,
        max_read: SCRATCH_READ_BYTES as u64,
    };
    let next = |i: u64| {
        Some(TestRead {
            file: 0,
            pieces: vec![(
                (i % slots) * SCRATCH_READ_BYTES as u64,
                SCRATCH_READ_BYTES as u64,
            )],
        })
    };
    let direct = file.is_direct();
    let bw = read_rates(std::slice::from_ref(&file), test, &next)?;
    Ok((bw, direct))
}
