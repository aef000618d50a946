//! `cargo xtask bench-layers MODEL_DIR [--runs N] [--chunk 64] [--threads T]`: one KDA token
//! mixer, one MLA token mixer, one MoE FFN (experts resident) and the dense layer 0 at the
//! model's real dimensions: ms per decode token and per prefill chunk, on one thread and on
//! all, median of several runs (docs/PERFORMANCE.md "Layers at real dims").
//!
//! The widths come from MODEL_DIR's `config.json`; the weights are k3-model's deterministic
//! random ones (`testing::random_model`, BF16 trunk matrices, MXFP4 experts — the released
//! storage), built for three layers: 0 = KDA + dense MLP, 1 = KDA + MoE, 2 = MLA + MoE. The
//! parts are timed through k3-model's public per-op entry points (`kda_forward`,
//! `mla_forward`, `moe_forward`, `dense_forward`, `decoder_layer`), so no hook is needed.
//!
//! Routing uses the released width by default (`--route-experts 896`): the router has 896
//! rows, and expert `e` is served from a resident pool of `--pool` distinct random experts
//! (`e mod pool`), so a 64-token chunk computes as many distinct experts as the real model
//! would under random routing (~610 of 896) while only the pool is in memory (the pool is
//! larger than the L3, so weights still stream from DRAM).

use crate::bench_util::{self, median};
use clap::Args;
use k3_format::K3Config;
use k3_model::dense::dense_forward;
use k3_model::kda::kda_forward;
use k3_model::layer::{decoder_layer, AttnState, Residual};
use k3_model::mla::mla_forward;
use k3_model::moe::moe_forward;
use k3_model::scratch::LayerScratch;
use k3_model::testing::{
    random_model, OwnedAttn, OwnedExpert, OwnedFfn, OwnedMatrix, OwnedWeights, Rng, Storage,
};
use k3_model::weights::{ExpertFetchError, ExpertProvider, ExpertWeights};
use k3_model::{Dims, KdaState, MlaCache, Model, Pass};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `bench-layers`.
#[derive(Args, Debug)]
pub struct BenchLayersArgs {
    /// Model directory whose `config.json` gives the widths.
    pub model_dir: PathBuf,
    /// Timed decode runs per case (after one warm-up; the median is reported).
    #[arg(long, default_value_t = 7)]
    pub runs: usize,
    /// Timed prefill-chunk runs per case (no warm-up: one chunk takes seconds).
    #[arg(long, default_value_t = 3)]
    pub prefill_runs: usize,
    /// Prefill chunk length in tokens.
    #[arg(long, default_value_t = 64)]
    pub chunk: usize,
    /// The "all threads" pool size (default: available parallelism).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Router width (experts per MoE layer the router chooses from).
    #[arg(long, default_value_t = 896)]
    pub route_experts: usize,
    /// Distinct resident experts per MoE layer serving the routed ids.
    #[arg(long, default_value_t = 32)]
    pub pool: usize,
}

/// Runs the subcommand.
pub fn run(args: &BenchLayersArgs) -> ExitCode {
    match bench(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-layers: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Routed experts served from a small resident pool per layer (`e mod pool`).
struct PoolExperts {
    pool: Vec<Vec<OwnedExpert>>,
}

impl ExpertProvider for PoolExperts {
    fn fetch(
        &self,
        layer: usize,
        experts: &[u32],
        on_ready: &mut dyn FnMut(usize, &ExpertWeights<'_>),
    ) -> Result<(), ExpertFetchError> {
        let pool = &self.pool[layer];
        for (i, &e) in experts.iter().enumerate() {
            on_ready(i, &pool[e as usize % pool.len()].view());
        }
        Ok(())
    }
}

fn mat_bytes(m: &OwnedMatrix) -> u64 {
    match m {
        OwnedMatrix::F32 { data, .. } => data.len() as u64 * 4,
        OwnedMatrix::Bf16 { data, .. } => data.len() as u64 * 2,
        OwnedMatrix::Mxfp4 { packed, scales, .. } => (packed.len() + scales.len()) as u64,
    }
}

/// Weight bytes a decode token of each part reads: KDA, MLA, MoE (trunk + top-k experts),
/// dense MLP, whole layer 0.
fn part_bytes(w: &OwnedWeights, experts: &PoolExperts, topk: usize) -> [u64; 5] {
    let kda = |l: usize| match &w.layers[l].attn {
        OwnedAttn::Kda(k) => [
            &k.q_proj,
            &k.k_proj,
            &k.v_proj,
            &k.g_proj,
            &k.o_proj,
            &k.f_a_proj,
            &k.f_b_proj,
            &k.b_proj,
        ]
        .iter()
        .map(|m| mat_bytes(m))
        .sum(),
        OwnedAttn::Mla(_) => 0,
    };
    let mla = match &w.layers[2].attn {
        OwnedAttn::Mla(m) => [
            Some(&m.q_a_proj),
            Some(&m.q_b_proj),
            Some(&m.kv_a_proj),
            Some(&m.kv_b_proj),
            Some(&m.o_proj),
            m.g_proj.as_ref(),
        ]
        .iter()
        .flatten()
        .map(|m| mat_bytes(m))
        .sum(),
        OwnedAttn::Kda(_) => 0,
    };
    let expert = experts.pool[1].first().map_or(0, |x| {
        mat_bytes(&x.w1) + mat_bytes(&x.w2) + mat_bytes(&x.w3)
    });
    let moe = match &w.layers[1].ffn {
        OwnedFfn::Moe(m) => {
            [
                &m.router,
                &m.down_proj,
                &m.up_proj,
                &m.shared_gate,
                &m.shared_up,
                &m.shared_down,
            ]
            .iter()
            .map(|x| mat_bytes(x))
            .sum::<u64>()
                + topk as u64 * expert
        }
        OwnedFfn::Dense(_) => 0,
    };
    let dense = match &w.layers[0].ffn {
        OwnedFfn::Dense(d) => {
            mat_bytes(&d.gate_proj) + mat_bytes(&d.up_proj) + mat_bytes(&d.down_proj)
        }
        OwnedFfn::Moe(_) => 0,
    };
    [kda(1), mla, moe, dense, kda(0) + dense]
}

const PARTS: [&str; 5] = [
    "KDA token mixer (layer 1)",
    "MLA token mixer (layer 2, latent path)",
    "MoE FFN (layer 1: router, shared, top-k experts resident)",
    "dense MLP (layer 0)",
    "dense layer 0 whole (KDA + dense MLP + residuals)",
];

/// Everything one timing needs.
struct Bench {
    d: Dims,
    w: OwnedWeights,
    experts: PoolExperts,
    chunk: usize,
}

impl Bench {
    /// Median seconds of `runs` calls of part `part` over `t` tokens, after one warm-up call
    /// for decode (`t == 1`).
    fn time(&self, part: usize, t: usize, runs: usize) -> Result<f64, String> {
        let d = &self.d;
        let e = d.hidden;
        let mut rng = Rng::new(11);
        let xn = rng.vec(t * e, 0.0, 1.0);
        let mut y = vec![0f32; t * e];
        let mut kst = KdaState::new(d.kda_heads, d.kda_dim, d.conv_k);
        let mut cache = MlaCache::new(self.chunk + 2, d.kv_row());
        let mut sc = LayerScratch::default();
        sc.ensure(d, t);
        let mut h = xn.clone();
        let mut blocks = vec![0f32; t * d.max_blocks * e];
        let lw: Vec<_> = self.w.layers.iter().map(|l| l.view()).collect();
        // Decode attends over a filled context of `chunk` positions.
        let pos = if t == 1 { self.chunk } else { 0 };
        let pass = Pass::new(d, t, pos, &self.experts);
        let mut one = || -> Result<(), String> {
            use k3_model::weights::{AttnWeights, FfnWeights};
            let r = match (part, &lw[1].attn, &lw[2].attn, &lw[1].ffn, &lw[0].ffn) {
                (0, AttnWeights::Kda(k), ..) => {
                    kda_forward(&pass, 1, k, &xn, &mut kst, &mut y, &mut sc.kda)
                }
                (1, _, AttnWeights::Mla(m), ..) => {
                    mla_forward(&pass, 2, m, &xn, &mut cache, &mut y, &mut sc.mla)
                }
                (2, _, _, FfnWeights::Moe(m), _) => {
                    moe_forward(&pass, 1, m, &xn, &mut y, &mut sc.moe)
                }
                (3, _, _, _, FfnWeights::Dense(dw)) => {
                    dense_forward(&pass, 0, dw, &xn, &mut y, &mut sc.dense)
                }
                (4, ..) => {
                    h.copy_from_slice(&xn);
                    let mut res = Residual {
                        h: &mut h,
                        blocks: &mut blocks,
                        n_blocks: 0,
                    };
                    let attn = AttnState::Kda(&mut kst);
                    decoder_layer(&pass, 0, &lw[0], &mut res, attn, &mut sc)
                }
                _ => return Err(format!("part {part}: unexpected layer kinds")),
            };
            r.map_err(|e| e.to_string())
        };
        if t == 1 {
            one()?;
        }
        let mut v = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t0 = Instant::now();
            one()?;
            v.push(t0.elapsed().as_secs_f64());
        }
        Ok(median(&v))
    }
}

fn build(args: &BenchLayersArgs) -> Result<Bench, String> {
    let base = K3Config::load(args.model_dir.join("config.json")).map_err(|e| e.to_string())?;
    let topk = base.num_experts_per_token;
    let mut gen = base.clone();
    gen.num_hidden_layers = 3;
    gen.full_attn_layers = vec![3];
    gen.first_k_dense_replace = 1;
    gen.vocab_size = 16;
    gen.num_experts = args.pool.max(topk);
    let mut route = gen.clone();
    route.num_experts = args.route_experts.max(topk);
    let d = Model::new(&route)
        .map_err(|e| e.to_string())?
        .dims()
        .clone();
    let t = Instant::now();
    let (mut w, ex) = random_model(&gen, 5, Storage::Bf16, Storage::Mxfp4);
    let mut rng = Rng::new(9);
    for l in &mut w.layers {
        if let OwnedFfn::Moe(m) = &mut l.ffn {
            m.router =
                OwnedMatrix::random(&mut rng, route.num_experts, gen.hidden_size, Storage::Bf16);
            m.router_bias = rng.vec(route.num_experts, 0.0, 0.05);
        }
    }
    println!(
        "random weights for 3 layers at real dims built in {:.1} s (router width {}, {} resident experts per MoE layer)",
        t.elapsed().as_secs_f64(),
        route.num_experts,
        gen.num_experts
    );
    Ok(Bench {
        d,
        w,
        experts: PoolExperts { pool: ex.experts },
        chunk: args.chunk,
    })
}

fn bench(args: &BenchLayersArgs) -> Result<(), String> {
    if args.runs == 0 || args.prefill_runs == 0 || args.chunk == 0 || args.pool == 0 {
        return Err("--runs, --prefill-runs, --chunk and --pool must be at least 1".into());
    }
    let all = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!("machine: {}", bench_util::machine_facts());
    let b = build(args)?;
    let bytes = part_bytes(&b.w, &b.experts, b.d.topk);
    let pools = [bench_util::pool(1)?, bench_util::pool(all)?];
    let mut rows = Vec::new();
    for (part, name) in PARTS.iter().enumerate() {
        let mut cells = Vec::new();
        for (t, runs) in [(1, args.runs), (b.chunk, args.prefill_runs)] {
            for p in &pools {
                cells.push(p.install(|| b.time(part, t, runs))?);
            }
        }
        println!("  {name}: {:?}", cells);
        rows.push((name, bytes[part], cells));
    }
    let c = b.chunk;
    println!(
        "\n| part | weights read per decode token | decode ms/token 1 thread | decode ms/token {all} threads | decode GB/s ({all} threads) | {c}-token chunk ms 1 thread | chunk ms {all} threads | prefill ms/token 1 thread | prefill ms/token {all} threads |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, bytes, v) in rows {
        println!(
            "| {name} | {:.1} MB | {:.1} | {:.1} | {:.2} | {:.0} | {:.0} | {:.1} | {:.1} |",
            bytes as f64 / 1e6,
            v[0] * 1e3,
            v[1] * 1e3,
            bytes as f64 / v[1] / 1e9,
            v[2] * 1e3,
            v[3] * 1e3,
            v[2] * 1e3 / c as f64,
            v[3] * 1e3 / c as f64,
        );
    }
    Ok(())
}
