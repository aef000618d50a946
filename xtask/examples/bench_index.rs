//! `cargo run --release -p xtask --example bench_index [-- --runs N --dir DIR]`: indexes a
//! synthetic checkpoint of the real size (96 shards, 497,220 tensors with the released names,
//! shapes, dtypes and byte offsets, written as sparse files: headers plus `set_len`, no data)
//! and reports index time and memory per tensor (docs/PERFORMANCE.md#checkpoint-index).
//!
//! Heap is measured with a counting global allocator (two relaxed atomic adds per
//! allocation), which is why this is an example binary of its own: it counts nothing else.

use clap::Parser;
use k3_format::bind::bind_model;
use k3_format::writer::{write_index, write_sparse_shard};
use k3_format::{Checkpoint, K3Config};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

/// Counts live and peak heap bytes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only adds bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwards the caller's layout unchanged to the system allocator.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with this `layout` (every alloc goes there).
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr`/`layout` came from `System` as above; the caller upholds `new_size`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
            let now = LIVE.fetch_add(new_size, Relaxed) + new_size;
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Real checkpoint size (docs/MODEL.md#real-model-sizing).
use k3_format::released::TENSORS;

/// Flags of the example.
#[derive(Parser)]
#[command(about = "Index a synthetic real-size checkpoint: time and bytes per tensor")]
struct Args {
    /// Keep the synthetic checkpoint here (default: a temp dir, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Timed opens (the best and the median are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args.dir, args.runs) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_index: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the benchmark; `dir` keeps the synthetic checkpoint (else a temp dir, removed after).
fn run(dir: Option<PathBuf>, runs: usize) -> Result<(), String> {
    let (root, cleanup) = match dir {
        Some(d) => (d, false),
        None => (
            std::env::temp_dir().join(format!("k3-bench-index-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let result = bench(&root, runs.max(1));
    if cleanup {
        let _ = std::fs::remove_dir_all(&root);
    }
    result
}

fn generate(root: &Path) -> Result<(usize, u64, u64), String> {
    let shards = k3_format::released::layout(&K3Config::released());
    let mut apparent = 0u64;
    let mut header_bytes = 0u64;
    for (name, tensors) in &shards {
        let len = write_sparse_shard(&root.join(name), tensors).map_err(|e| e.to_string())?;
        apparent += len;
        let (head, _) = k3_format::writer::encode_header(tensors).map_err(|e| e.to_string())?;
        header_bytes += head.len() as u64;
    }
    let pairs = shards
        .iter()
        .flat_map(|(f, ts)| ts.iter().map(move |t| (t.name.as_str(), f.as_str())));
    write_index(&root.join(k3_format::INDEX_FILE), pairs).map_err(|e| e.to_string())?;
    Ok((shards.len(), apparent, header_bytes))
}

/// Process CPU seconds (user + system, all threads) from /proc; `None` off Linux.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// The 1-minute load average, to judge wall-clock numbers on a shared machine.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn mb(b: usize) -> f64 {
    b as f64 / 1e6
}

/// Timings and heap of repeated `Checkpoint::open` calls.
struct OpenStats {
    wall: Vec<f64>,
    cpu: Vec<f64>,
    retained: usize,
    peak: usize,
}

/// Opens the checkpoint `runs` times, measuring each; returns the last index.
fn measure_open(root: &Path, runs: usize) -> Result<(Checkpoint, OpenStats), String> {
    let mut st = OpenStats {
        wall: Vec::new(),
        cpu: Vec::new(),
        retained: 0,
        peak: 0,
    };
    let mut last = None;
    for _ in 0..runs {
        drop(last.take());
        let base = LIVE.load(Relaxed);
        PEAK.store(base, Relaxed);
        let (t, c) = (Instant::now(), cpu_seconds());
        let ck = Checkpoint::open(root).map_err(|e| e.to_string())?;
        st.wall.push(t.elapsed().as_secs_f64());
        if let (Some(a), Some(b)) = (c, cpu_seconds()) {
            st.cpu.push(b - a);
        }
        st.retained = LIVE.load(Relaxed) - base;
        st.peak = PEAK.load(Relaxed) - base;
        last = Some(ck);
    }
    st.wall.sort_by(f64::total_cmp);
    st.cpu.sort_by(f64::total_cmp);
    Ok((last.ok_or("no run")?, st))
}

fn bench(root: &Path, runs: usize) -> Result<(), String> {
    let t = Instant::now();
    let (nshards, apparent, header_bytes) = generate(root)?;
    let index_len = std::fs::metadata(root.join(k3_format::INDEX_FILE)).map_or(0, |m| m.len());
    println!(
        "synthetic checkpoint: {nshards} shards, {:.2} TB apparent (sparse), headers {:.1} MB, \
         index.json {:.1} MB, written in {:.1} s",
        apparent as f64 / 1e12,
        header_bytes as f64 / 1e6,
        index_len as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    let (ck, st) = measure_open(root, runs)?;
    let n = ck.len();
    let per = st.retained as f64 / n as f64;
    println!("\n| metric | value |\n|---|---|");
    println!("| shards / tensors | {} / {n} |", ck.shards().len());
    let (w, c) = (&st.wall, &st.cpu);
    println!(
        "| Checkpoint::open (index.json + {nshards} headers), wall best / median of {runs} | {:.3} s / {:.3} s |",
        w[0],
        w[w.len() / 2]
    );
    if !c.is_empty() {
        println!(
            "| CPU time of open (all threads), best / median | {:.2} s / {:.2} s (load average {}) |",
            c[0],
            c[c.len() / 2],
            load_average()
        );
    }
    println!(
        "| heap retained by the index | {:.1} MB = {per:.1} B/tensor |",
        mb(st.retained)
    );
    let own = ck.heap_bytes();
    println!(
        "| index's own accounting (heap_bytes) | {:.1} MB = {:.1} B/tensor |",
        mb(own),
        own as f64 / n as f64
    );
    println!(
        "| peak transient heap during open | {:.1} MB |",
        mb(st.peak)
    );
    let found = lookups_and_bind(&ck)?;
    let met = w[0] < 1.0 && per < 200.0;
    println!(
        "\ngoal: open < 1 s and < 200 B/tensor: {}",
        if met { "MET" } else { "NOT MET" }
    );
    if found != n || n != TENSORS {
        return Err(format!(
            "indexed {n} tensors, found {found} by name; expected {TENSORS}"
        ));
    }
    Ok(())
}

/// Looks every tensor up by name, then binds the released model; prints their rows.
fn lookups_and_bind(ck: &Checkpoint) -> Result<usize, String> {
    let names: Vec<&str> = ck.iter().map(|v| v.name).collect();
    let t = Instant::now();
    let found = names.iter().filter(|name| ck.get(name).is_some()).count();
    let lookup_ns = t.elapsed().as_secs_f64() * 1e9 / names.len().max(1) as f64;
    println!("| lookup by name ({found} hits) | {lookup_ns:.0} ns/lookup |");
    let base = LIVE.load(Relaxed);
    let t = Instant::now();
    let b = bind_model(ck, &K3Config::released()).map_err(|e| e.to_string())?;
    let bind_s = t.elapsed().as_secs_f64();
    let bytes = LIVE.load(Relaxed) - base;
    let trunk_ok = b.layers.iter().filter(|l| l.trunk_run().is_ok()).count();
    let experts = b.experts.len();
    println!(
        "| bind_model (93 layers + {experts} experts validated) | {bind_s:.3} s, {:.1} MB |",
        mb(bytes)
    );
    println!(
        "| contiguous trunk runs / single-read experts | {trunk_ok}/93 / {}/{experts} |",
        experts - b.experts.scattered_count()
    );
    Ok(found)
}
