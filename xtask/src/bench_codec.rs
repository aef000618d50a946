//! `cargo xtask bench-codec MODEL_DIR [--layers N] [--chunk-kib K] [--repeats R]`: how far the
//! bf16 trunk compresses and how fast it decodes (docs/PERFORMANCE.md#trunk-compression).
//!
//! 1. Per tensor class (the name after `layers.N.`): the entropy of the exponent plane and of
//!    the sign+mantissa plane, the Huffman code's mean bits, and the ratio that code reaches.
//! 2. Every BF16 trunk tensor of the first N layers, cut into chunks of K KiB, compressed by:
//!    `zstd-3 raw` (the bf16 bytes as they are), `zstd-1 planes` (exponent plane through zstd,
//!    sign+mantissa raw: zstd's entropy stage is huff0) and `k3 huffman` (`k3_codec`: one code
//!    per tensor, four interleaved streams, once per build of the decoder this CPU runs:
//!    portable, x86-64-v3 (the one an AVX2-only CPU runs), AVX-512); ratio, encode MB/s,
//!    decode GB/s of bf16 output
//!    with 1 thread (wall and thread CPU time, which a loaded machine does not inflate) and 2
//!    threads (wall). Every decode is checked bit for bit against the source.

use clap::Args;
use k3_codec::{CodeLengths, DecodeTable};
use k3_format::{bind_model, Checkpoint, Dtype, K3Config};
use k3_kernels::simd::Level;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `bench-codec`.
#[derive(Args, Debug)]
pub struct BenchCodecArgs {
    /// Checkpoint directory (e.g. from `cargo xtask gen-bench --trained-weights`).
    pub model_dir: PathBuf,
    /// Layers to measure (from layer 0).
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Decoded chunk size in KiB.
    #[arg(long, default_value_t = 1024)]
    pub chunk_kib: usize,
    /// Timed decodes per codec and thread count (the best is reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
}

/// Runs the subcommand.
pub fn run(args: &BenchCodecArgs) -> ExitCode {
    match bench(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-codec: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One BF16 trunk tensor's bytes and class.
struct Tensor<'a> {
    class: String,
    bytes: &'a [u8],
}

fn bench(args: &BenchCodecArgs) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = K3Config::load(args.model_dir.join("config.json"))?;
    let ck = Checkpoint::open(&args.model_dir)?;
    let binding = bind_model(&ck, &cfg)?;
    let mut tensors = Vec::new();
    for lt in binding.layers.iter().take(args.layers) {
        for t in lt.tensors() {
            if t.dtype != Dtype::BF16 {
                continue;
            }
            let view = t
                .view(&ck)
                .ok_or_else(|| format!("{} not in the checkpoint", t.name))?;
            let prefix = format!("layers.{}.", lt.layer);
            let class = t
                .name
                .split_once(&prefix)
                .map_or(t.name.as_str(), |(_, c)| c);
            tensors.push(Tensor {
                class: class.to_string(),
                bytes: view.bytes,
            });
        }
    }
    let total: usize = tensors.iter().map(|t| t.bytes.len()).sum();
    println!(
        "{} BF16 trunk tensors of layers 0..{}: {:.1} MB, chunks of {} KiB",
        tensors.len(),
        args.layers,
        total as f64 / 1e6,
        args.chunk_kib
    );
    entropy_table(&tensors);
    let chunks = chunk(&tensors, args.chunk_kib * 1024);
    println!();
    println!("| codec | ratio | encode MB/s | decode GB/s 1 thread (wall / CPU) | decode GB/s 2 threads (wall) |");
    println!("|---|---:|---:|---:|---:|");
    let huffman = k3_kernels::simd::available_levels()
        .into_iter()
        .map(Codec::Huffman);
    for codec in [Codec::ZstdRaw, Codec::ZstdPlanes]
        .into_iter()
        .chain(huffman)
    {
        measure(codec, &tensors, &chunks, args.repeats)?;
    }
    Ok(())
}

/// Per class: exponent and sign+mantissa entropy, Huffman bits, the ratio that code gives.
fn entropy_table(tensors: &[Tensor]) {
    let mut classes: BTreeMap<&str, ([u64; 256], [u64; 256], usize)> = BTreeMap::new();
    for t in tensors {
        let e = classes.entry(&t.class).or_insert(([0; 256], [0; 256], 0));
        k3_codec::add_exponents(t.bytes, &mut e.0);
        k3_codec::add_sign_mantissa(t.bytes, &mut e.1);
        e.2 += t.bytes.len();
    }
    println!();
    println!("| tensor class | MB | exponent entropy (bits) | Huffman (bits) | sign+mantissa entropy (bits) | ratio (exp Huffman + raw s+m) |");
    println!("|---|---:|---:|---:|---:|---:|");
    let (mut all_e, mut all_s) = ([0u64; 256], [0u64; 256]);
    for (class, (e, s, bytes)) in &classes {
        let lens = CodeLengths::for_histogram(e);
        println!(
            "| {class} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} |",
            *bytes as f64 / 1e6,
            k3_codec::entropy(e),
            lens.mean_bits(e),
            k3_codec::entropy(s),
            (lens.mean_bits(e) + 8.0) / 16.0
        );
        for i in 0..256 {
            all_e[i] += e[i];
            all_s[i] += s[i];
        }
    }
    println!(
        "| all | {:.1} | {:.3} | | {:.3} | |",
        tensors.iter().map(|t| t.bytes.len()).sum::<usize>() as f64 / 1e6,
        k3_codec::entropy(&all_e),
        k3_codec::entropy(&all_s)
    );
}

/// A chunk: which tensor, and its bytes.
struct Chunk<'a> {
    tensor: usize,
    bytes: &'a [u8],
}

fn chunk<'a>(tensors: &[Tensor<'a>], size: usize) -> Vec<Chunk<'a>> {
    let mut out = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        for c in t.bytes.chunks(size.max(2) & !1) {
            out.push(Chunk {
                tensor: i,
                bytes: c,
            });
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq)]
enum Codec {
    ZstdRaw,
    ZstdPlanes,
    /// `k3_codec`, decoded by the build for this level.
    Huffman(Level),
}

impl Codec {
    fn name(self) -> String {
        match self {
            Codec::ZstdRaw => "zstd-3 raw bf16".into(),
            Codec::ZstdPlanes => "zstd-1 exponent plane + raw sign+mantissa".into(),
            Codec::Huffman(level) => format!(
                "k3 huffman: exponent 4 streams + raw sign+mantissa, {}",
                k3_codec::build_name(level)
            ),
        }
    }
}

/// Per-tensor Huffman tables (built once; the pack stores them in its index).
fn tables(tensors: &[Tensor]) -> Vec<(CodeLengths, DecodeTable)> {
    tensors
        .iter()
        .map(|t| {
            let mut h = [0u64; 256];
            k3_codec::add_exponents(t.bytes, &mut h);
            let lens = CodeLengths::for_histogram(&h);
            let table = DecodeTable::new(&lens).expect("a built table is valid");
            (lens, table)
        })
        .collect()
}

fn encode(codec: Codec, c: &Chunk, tables: &[(CodeLengths, DecodeTable)]) -> Vec<u8> {
    match codec {
        Codec::ZstdRaw => zstd::bulk::compress(c.bytes, 3).expect("zstd compress"),
        Codec::ZstdPlanes => {
            let (e, s) = k3_codec::split_planes(c.bytes);
            let mut out = zstd::bulk::compress(&e, 1).expect("zstd compress");
            out.extend_from_slice(&(out.len() as u32).to_le_bytes());
            out.extend_from_slice(&s);
            out
        }
        Codec::Huffman(_) => {
            let mut out = Vec::new();
            k3_codec::encode_chunk(c.bytes, &tables[c.tensor].0, &mut out).expect("encode");
            out
        }
    }
}

fn decode(
    codec: Codec,
    enc: &[u8],
    out: &mut [u8],
    table: &DecodeTable,
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    match codec {
        Codec::ZstdRaw => {
            zstd::bulk::decompress_to_buffer(enc, out).map_err(|e| e.to_string())?;
        }
        Codec::ZstdPlanes => {
            let n = out.len() / 2;
            let (head, s) = enc.split_at(enc.len() - n);
            let (z, len) = head.split_at(head.len() - 4);
            debug_assert_eq!(
                u32::from_le_bytes(len.try_into().unwrap_or([0; 4])) as usize,
                z.len()
            );
            scratch.resize(n, 0);
            zstd::bulk::decompress_to_buffer(z, scratch).map_err(|e| e.to_string())?;
            k3_codec::join_planes(scratch, s, out);
        }
        Codec::Huffman(level) => {
            k3_codec::decode_chunk_at(level, enc, out.len() / 2, table, out, scratch)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

fn measure(
    codec: Codec,
    tensors: &[Tensor],
    chunks: &[Chunk],
    repeats: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let tables = tables(tensors);
    let t0 = Instant::now();
    let enc: Vec<Vec<u8>> = chunks.iter().map(|c| encode(codec, c, &tables)).collect();
    let enc_secs = t0.elapsed().as_secs_f64();
    let raw: usize = chunks.iter().map(|c| c.bytes.len()).sum();
    let packed: usize = enc.iter().map(Vec::len).sum();
    // Filled, not zeroed, so the pages are mapped before the first timed decode (a zeroed
    // allocation is mapped on first write: with `--repeats 1` the 1-thread rows read
    // 1.46 GB/s instead of 3.5).
    let mut outs: Vec<Vec<u8>> = chunks.iter().map(|c| vec![0xA5u8; c.bytes.len()]).collect();
    let mut rates = Vec::new();
    for threads in [1usize, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()?;
        let (mut best_wall, mut best_cpu) = (f64::MAX, f64::MAX);
        for _ in 0..repeats.max(1) {
            let (wall, cpu) = pool.install(|| {
                let (w0, c0) = (Instant::now(), thread_cpu_seconds());
                let res: Result<(), String> = outs
                    .par_iter_mut()
                    .zip(&enc)
                    .zip(chunks)
                    .try_for_each_init(Vec::new, |scratch, ((out, e), c)| {
                        decode(codec, e, out, &tables[c.tensor].1, scratch)
                    });
                (
                    res.map(|()| w0.elapsed().as_secs_f64()),
                    thread_cpu_seconds() - c0,
                )
            });
            best_wall = best_wall.min(wall?);
            best_cpu = best_cpu.min(cpu);
            for (o, c) in outs.iter().zip(chunks) {
                if o.as_slice() != c.bytes {
                    return Err(format!(
                        "{}: a decoded chunk differs from its source",
                        codec.name()
                    )
                    .into());
                }
            }
        }
        rates.push((raw as f64 / best_wall / 1e9, raw as f64 / best_cpu / 1e9));
    }
    println!(
        "| {} | {:.4} | {:.0} | {:.2} / {:.2} | {:.2} |",
        codec.name(),
        packed as f64 / raw as f64,
        raw as f64 / enc_secs / 1e6,
        rates[0].0,
        rates[0].1,
        rates[1].0
    );
    Ok(())
}

/// CPU seconds of the calling thread (CLOCK_THREAD_CPUTIME_ID).
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer to a local.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
