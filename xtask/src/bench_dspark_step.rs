//! `cargo xtask bench-dspark-step [--context N] [--repeat R] [--threads T]`: what one DSpark
//! block pass costs at the published dims (docs/DSPARK.md: hidden 7168, 5 layers, MLA 64
//! heads, q_lora 1536, kv_lora 512, MLP 14336, block 7, Markov rank 256, vocabulary 163,840
//! through the target's lm_head), measured with random weights layer by layer
//! (docs/PERFORMANCE.md#dspark-block-drafts).
//!
//! Method: ONE draft layer is built at the published widths in each matrix form (bf16 as
//! published; the draft trunk's q8 rows and MXFP4 for comparison) and its block pass timed
//! through `k3_model::dspark` (`block_hidden`: embed, the layer over `--context` context rows,
//! final norm); the heads (`propose`: bf16 lm_head `[163840 × 7168]` for 7 rows, Markov bias,
//! confidence) and one context position's projection are timed once. A pass is
//! `5 × layer + heads`; each verified token adds a context position (`context_proj` + each
//! layer's `kv_a`). Median of `--repeat` timed runs after one warm run.

use crate::bench_util::{self, median};
use clap::Args;
use half::bf16;
use k3_format::dspark::{DraftAct, DraftRope, DsparkConfig, TapStream};
use k3_kernels::Matrix;
use k3_model::dspark::{DraftContext, Dspark, DsparkLayer, DsparkWeights};
use k3_model::weights::{HeadWeights, LayerHold, SourceError, WeightProvider};
use rayon::prelude::*;
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `bench-dspark-step`.
#[derive(Args, Debug)]
pub struct BenchDsparkStepArgs {
    /// Context positions the block attends to.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Timed runs per part (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Draft layers of the published checkpoint.
const LAYERS: usize = 5;

fn config() -> DsparkConfig {
    DsparkConfig {
        hidden_size: 7168,
        intermediate_size: 14336,
        num_hidden_layers: 1,
        num_attention_heads: 64,
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        vocab_size: 163_840,
        rms_norm_eps: 1e-5,
        rope_theta: 50_000.0,
        rope: DraftRope::Plain,
        fc_norm: false,
        target_layer_ids: vec![7, 31, 47, 63, 87],
        stream: TapStream::Prefix,
        mask_token_id: 163_837,
        block_size: 7,
        markov_rank: 256,
        confidence_head: true,
        confidence_with_markov: true,
        act: DraftAct::Silu,
    }
}

/// One matrix's storage in a form the kernels multiply.
enum Store {
    Bf16(Vec<bf16>),
    Q8(Vec<i8>, Vec<f32>),
    Mxfp4(Vec<u8>, Vec<u8>),
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    v.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(c, chunk)| {
            let mut s = seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for b in chunk.chunks_mut(8) {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                b.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes()[..b.len()]);
            }
        });
    v
}

impl Store {
    fn new(form: &str, rows: usize, cols: usize, seed: u64) -> Store {
        let n = rows * cols;
        match form {
            "q8" => Store::Q8(
                random_bytes(n, seed).into_iter().map(|b| b as i8).collect(),
                vec![1.0 / (127.0 * (cols as f32).sqrt()); rows],
            ),
            "mxfp4" => Store::Mxfp4(random_bytes(n / 2, seed), vec![118u8; n / 32]),
            _ => {
                let scale = 1.0 / (cols as f32).sqrt();
                let bytes = random_bytes(n, seed);
                Store::Bf16(
                    bytes
                        .par_iter()
                        .map(|&b| bf16::from_f32((b as f32 / 255.0 - 0.5) * scale))
                        .collect(),
                )
            }
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Store::Bf16(v) => v.len() * 2,
            Store::Q8(v, s) => v.len() + s.len() * 4,
            Store::Mxfp4(p, s) => p.len() + s.len(),
        }
    }

    fn matrix(&self, rows: usize, cols: usize) -> Matrix<'_> {
        let m = match self {
            Store::Bf16(v) => Matrix::bf16(rows, cols, v),
            Store::Q8(v, s) => Matrix::q8(rows, cols, v, s),
            Store::Mxfp4(p, s) => Matrix::mxfp4(rows, cols, p, s),
        };
        m.expect("storage fits its shape")
    }
}

/// The shapes of one draft layer's matrices, in `DsparkLayer` order.
fn layer_shapes(c: &DsparkConfig) -> [(usize, usize); 8] {
    let (e, h) = (c.hidden_size, c.num_attention_heads);
    let qh = c.qk_nope_head_dim + c.qk_rope_head_dim;
    [
        (c.q_lora_rank, e),
        (h * qh, c.q_lora_rank),
        (c.kv_lora_rank + c.qk_rope_head_dim, e),
        (h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
        (e, h * c.v_head_dim),
        (c.intermediate_size, e),
        (c.intermediate_size, e),
        (e, c.intermediate_size),
    ]
}

/// The target's seams the draft reads: its embedding (constant rows) and its lm_head.
struct Target<'a> {
    lm_head: Matrix<'a>,
    ones: Vec<f32>,
}

impl WeightProvider for Target<'_> {
    fn embed_row(&self, id: u32, out: &mut [f32]) -> Result<(), SourceError> {
        let v = (id % 97) as f32 / 97.0 - 0.5;
        out.iter_mut().for_each(|o| *o = v);
        Ok(())
    }
    fn layer(&self, _l: usize) -> Result<Box<dyn LayerHold + '_>, SourceError> {
        Err("the draft bench has no target layers".into())
    }
    fn head(&self) -> Result<HeadWeights<'_>, SourceError> {
        Ok(HeadWeights {
            norm: &self.ones,
            out_res_norm: &self.ones,
            out_res_proj: &self.ones,
            lm_head: self.lm_head,
        })
    }
}

fn time<T>(repeat: usize, mut f: impl FnMut() -> T) -> f64 {
    std::hint::black_box(f());
    let runs: Vec<f64> = (0..repeat.max(1))
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64()
        })
        .collect();
    median(&runs)
}

fn bench(args: &BenchDsparkStepArgs) -> Result<(), String> {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let pool = bench_util::pool(threads)?;
    let c = config();
    let (e, v, r) = (c.hidden_size, c.vocab_size, c.markov_rank);
    let graph = Dspark::new(c.clone());
    let lm = Store::new("bf16", v, e, 1);
    let (w1, w2) = (Store::new("bf16", v, r, 2), Store::new("bf16", v, r, 3));
    let taps = c.target_layer_ids.len() * e;
    let ctx_proj = Store::new("bf16", e, taps, 4);
    let ones = vec![1f32; c.intermediate_size.max(e + r)];
    let conf = vec![0.01f32; e + r];
    let target = Target {
        lm_head: lm.matrix(v, e),
        ones: ones.clone(),
    };
    println!("bench-dspark-step — {}", bench_util::machine_facts());
    println!(
        "published dims, {threads} threads, context {} positions, median of {}",
        args.context, args.repeat
    );
    println!("\n| form | draft bytes (5 layers + context_proj + Markov) | layer ms | heads ms | context ms/position | block pass ms (5 layers + heads) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for form in ["bf16", "q8", "mxfp4"] {
        let stores: Vec<Store> = layer_shapes(&c)
            .iter()
            .enumerate()
            .map(|(i, &(rows, cols))| Store::new(form, rows, cols, 10 + i as u64))
            .collect();
        let m: Vec<Matrix<'_>> = stores
            .iter()
            .zip(layer_shapes(&c))
            .map(|(s, (rows, cols))| s.matrix(rows, cols))
            .collect();
        let layer = DsparkLayer {
            input_norm: &ones[..e],
            post_attn_norm: &ones[..e],
            q_a_proj: m[0],
            q_a_norm: &ones[..c.q_lora_rank],
            q_b_proj: m[1],
            kv_a_proj: m[2],
            kv_a_norm: &ones[..c.kv_lora_rank],
            kv_b_proj: m[3],
            o_proj: m[4],
            gate_proj: m[5],
            up_proj: m[6],
            down_proj: m[7],
        };
        let w = DsparkWeights {
            context_proj: ctx_proj.matrix(e, taps),
            context_norm: &ones[..e],
            fc_norm: None,
            layers: vec![layer],
            final_norm: &ones[..e],
            markov_w1: w1.matrix(v, r),
            markov_w2: w2.matrix(v, r),
            confidence: Some((&conf, 0.0)),
        };
        let layer_bytes: usize = stores.iter().map(Store::bytes).sum();
        let draft_bytes = LAYERS * layer_bytes + ctx_proj.bytes() + w1.bytes() + w2.bytes();
        let tap_rows = vec![0.01f32; args.context * taps];
        let mut ctx = DraftContext::new(&c);
        let (layer_s, heads_s, ctx_s) = pool.install(|| -> Result<_, String> {
            graph
                .extend_context(&w, &tap_rows, &mut ctx)
                .map_err(|e| e.to_string())?;
            let t = ctx.len();
            let layer_s = time(args.repeat, || graph.block_hidden(&w, &target, 5, &ctx, t));
            let hidden = graph
                .block_hidden(&w, &target, 5, &ctx, t)
                .map_err(|e| e.to_string())?;
            let heads_s = time(args.repeat, || graph.propose(&w, &target, &hidden, 5));
            let one = vec![0.01f32; taps];
            let ctx_s = time(args.repeat, || {
                ctx.truncate(t);
                graph.extend_context(&w, &one, &mut ctx)
            });
            Ok((layer_s, heads_s, ctx_s))
        })?;
        // context: context_proj once, each of the 5 layers' kv_a (the measured run has 1)
        let kv_a = m[2].rows as f64 * m[2].cols as f64;
        let proj = (e * taps) as f64;
        let ctx5 = ctx_s * (proj + LAYERS as f64 * kv_a) / (proj + kv_a);
        println!(
            "| {form} | {:.2} GB | {:.1} | {:.1} | {:.1} | {:.0} |",
            draft_bytes as f64 / 1e9,
            layer_s * 1e3,
            heads_s * 1e3,
            ctx5 * 1e3,
            (LAYERS as f64 * layer_s + heads_s) * 1e3
        );
    }
    println!(
        "\nlm_head (target's, bf16, not in the draft): {:.2} GB read per block pass",
        lm.bytes() as f64 / 1e9
    );
    Ok(())
}

/// Runs the benchmark.
pub fn run(args: &BenchDsparkStepArgs) -> ExitCode {
    match bench(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-dspark-step: {e}");
            ExitCode::FAILURE
        }
    }
}
