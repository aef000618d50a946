//! Gated MLA with NoPE (docs/MODEL.md#gated-mla) over a LATENT KV cache, with weight absorption.
//!
//! Cache: per position `c_s = [rmsnorm(latent) (kv_lora) | k_rope (rope)]`, never expanded.
//! `kv_b_proj` rows of head h are `[W_kb_h (nope rows) ; W_vb_h (v rows)]`, each `[·][kv_lora]`.
//!
//! Latent (absorbed) attention for head h, query position p, key positions s ≤ p:
//! 1. `q_lat[c] = Σ_{i asc} (f64)W_kb_h[i][c]·(f64)q_nope[i]` (f64, plain mul+add, kept f64);
//! 2. `d_s = Σ_{c asc} q_lat[c]·(f64)c_s[c]  +  Σ_{r asc} (f64)q_rope[r]·(f64)k_rope_s[r]`
//!    (one f64 accumulator, latent terms then rope terms); `sc_s = (f32)d_s · scale`,
//!    `scale = 1/sqrtf(nope + rope)`;
//! 3. softmax: `e_s = expf(sc_s − max)`, `Z = Σ (f64)e_s`, `p_s = (f32)(e_s/Z)`;
//! 4. `ctx[c] = Σ_{s asc} p_s·c_s[c]` (f32, from 0);
//! 5. `o_h[j] = W_vb_h[j]·ctx` (the standard 16-lane f64 row dot, rounded to f32).
//!
//! The expanded form (the literal order of docs/MODEL.md#mla-attention, k/v re-expanded per position) is kept in
//! [`MlaPath::Expanded`]; the two agree to rounding (tested), the latent form is the default.
//! Heads run in parallel; every sum above is inside one head, so results are thread-count-free.

use crate::dims::Dims;
use crate::dist::Dist;
use crate::error::{check_len, check_shape, ModelError};
pub use crate::mla_path::MlaPath;
use crate::pass::{Pass, Seq, ROWS_PER_JOB};
pub use crate::scratch::ops::MlaScratch;
use crate::share::mla_split;
use crate::state::{AttnState, MlaCache};
use crate::weights::MlaWeights;
use k3_kernels::act::mul_sigmoid;
use k3_kernels::attn::{add_scaled, softmax_inplace};
use k3_kernels::norm::rmsnorm_inplace;
use k3_kernels::tmatvec::{latent_scores_lanes, matvec_t_f64, matvec_t_f64_lanes, LANES};
use k3_kernels::{matvec, Matrix};
use rayon::prelude::*;
use std::sync::Mutex;

/// Checks every MLA tensor against the config: a dealt tensor may be whole or exactly this
/// rank's share of rows (crate::share::mla_split).
pub fn check_mla(
    d: &Dims,
    dist: &Dist<'_>,
    w: &MlaWeights,
    layer: Option<usize>,
) -> Result<(), ModelError> {
    let (e, h, hv) = (d.hidden, d.mla_heads, d.mla_heads * d.v_head);
    let s = mla_split(h);
    let c = |what, x: &Matrix, want, split| dist.check_dealt(layer, what, x, want, split);
    c("mla q_a_proj", &w.q_a_proj, (d.q_lora, e), s.q_a)?;
    check_len(layer, "mla q_a_layernorm", w.q_a_norm.len(), d.q_lora)?;
    c(
        "mla q_b_proj",
        &w.q_b_proj,
        (h * d.qk_head(), d.q_lora),
        s.q_b,
    )?;
    c(
        "mla kv_a_proj_with_mqa",
        &w.kv_a_proj,
        (d.kv_row(), e),
        s.kv_a,
    )?;
    check_len(layer, "mla kv_a_layernorm", w.kv_a_norm.len(), d.kv_lora)?;
    let kv_b = (h * (d.nope + d.v_head), d.kv_lora);
    c("mla kv_b_proj", &w.kv_b_proj, kv_b, s.kv_b)?;
    c("mla o_proj", &w.o_proj, (e, hv), s.o)?;
    match (&w.g_proj, d.mla_gate) {
        (Some(g), true) => c("mla g_proj", g, (hv, e), s.g),
        (None, false) => Ok(()),
        (Some(_), false) => check_shape(layer, "mla g_proj (config has no gate)", (hv, e), (0, 0)),
        (None, true) => check_shape(layer, "mla g_proj (missing)", (0, 0), (hv, e)),
    }
}

/// Attention scale `1/sqrtf(nope + rope)` (f32).
pub fn mla_scale(d: &Dims) -> f32 {
    1.0 / (d.qk_head() as f32).sqrt()
}

/// One gated MLA layer over `t` tokens at absolute positions `pos..pos+t`: appends their latent
/// rows to `cache` and attends causally over `0..=p`. `x` normed input `[T][E]`, `out` `[T][E]`.
pub fn mla_forward(
    pass: &Pass<'_>,
    l: usize,
    w: &MlaWeights,
    x: &[f32],
    cache: &mut MlaCache,
    out: &mut [f32],
    sc: &mut MlaScratch,
) -> Result<(), ModelError> {
    let one = Pass {
        batch: &[],
        ..*pass
    };
    mla_forward_batch(&one, l, w, x, &mut [AttnState::Mla(cache)], out, sc)
}

/// The latent cache of sequence `i` of a batch, checked to hold its new rows.
fn seq_cache<'a>(
    states: &'a mut [AttnState<'_>],
    i: usize,
    seq: Seq,
) -> Result<&'a mut MlaCache, ModelError> {
    let cache = match states.get_mut(i) {
        Some(AttnState::Mla(c)) => c,
        _ => {
            return Err(ModelError::StateMismatch(format!(
                "sequence {i} of the batch has no MLA cache for this layer"
            )))
        }
    };
    if seq.pos + seq.len > cache.capacity() {
        return Err(ModelError::ContextOverflow {
            pos: seq.pos,
            tokens: seq.len,
            max_ctx: cache.capacity(),
        });
    }
    Ok(cache)
}

/// [`mla_forward`] over the sequences of `pass` (`states[i]` carries `pass.seq(i)`): the
/// projections, gate and `o_proj` run over all rows at once; each sequence's latent rows go
/// to its own cache and its queries attend over that cache only.
///
/// Over ranks (docs/DISTRIBUTED.md#the-seam) `q_a` and the latent `kv_a` are row-dealt and
/// gathered (every rank keeps the whole latent cache, shared by every head); this rank runs
/// only its heads ([`Dist::heads`]): their `q_b` and gate rows, their `kv_b` blocks and their
/// attention; the gated head outputs are all-gathered in head order, `o_proj` is row-dealt.
pub fn mla_forward_batch(
    pass: &Pass<'_>,
    l: usize,
    w: &MlaWeights,
    x: &[f32],
    states: &mut [AttnState<'_>],
    out: &mut [f32],
    sc: &mut MlaScratch,
) -> Result<(), ModelError> {
    let (d, t, dist) = (pass.d, pass.t, &pass.dist);
    check_mla(d, dist, w, Some(l))?;
    pass.check_states(l, states.len())?;
    let mut longest = 0;
    for i in 0..pass.n_seqs() {
        let seq = pass.seq(i);
        seq_cache(states, i, seq)?;
        longest = longest.max(seq.pos + seq.len);
    }
    sc.ensure(d, t, longest);
    let h = d.mla_heads;
    let split = mla_split(h);
    let hl = dist.heads(h).len();
    let (kvr, hv, qw) = (d.kv_row(), h * d.v_head, h * d.qk_head());
    let (hvl, qwl) = (hl * d.v_head, hl * d.qk_head());
    // 1. query: q_a → RMSNorm → q_b (this rank's heads); q_a and the latent kv_a read the
    //    same input (one all-gather over ranks), the gate rows of this rank's heads stay local
    let mut jobs = [
        (&mut sc.cq[..t * d.q_lora], &w.q_a_proj),
        (&mut sc.ckv[..t * kvr], &w.kv_a_proj),
    ];
    dist.matmuls(&mut jobs, x, t)?;
    if let Some(g) = &w.g_proj {
        dist.local_matmuls(&mut [(&mut sc.gate[..t * hvl], g, hv, split.g)], x, t)?;
    }
    sc.cq[..t * d.q_lora]
        .par_chunks_mut(d.q_lora)
        .with_max_len(ROWS_PER_JOB)
        .for_each(|row| rmsnorm_inplace(row, w.q_a_norm, d.mla_norm_eps));
    let mut q = [(&mut sc.q[..t * qwl], &w.q_b_proj, qw, split.q_b)];
    dist.local_matmuls(&mut q, &sc.cq[..t * d.q_lora], t)?;
    let kv_rows = h * (d.nope + d.v_head);
    let kv_b = dist
        .share_of(&w.kv_b_proj, kv_rows, split.kv_b)
        .ok_or(ModelError::Shape {
            layer: Some(l),
            what: "mla kv_b_proj",
            got: format!("[{}, {}]", w.kv_b_proj.rows, w.kv_b_proj.cols),
            want: format!("[{kv_rows}, {}] or this rank's heads' rows", d.kv_lora),
        })?;
    // 2. latent: RMSNorm on the latent part only of kv_a's output
    sc.ckv[..t * kvr]
        .par_chunks_mut(kvr)
        .with_max_len(ROWS_PER_JOB)
        .for_each(|row| rmsnorm_inplace(&mut row[..d.kv_lora], w.kv_a_norm, d.mla_norm_eps));
    // 3.–4. per sequence: its rows into its cache at pos..pos+len, then causal attention,
    //       token by token, this rank's heads in parallel
    for i in 0..pass.n_seqs() {
        let seq = pass.seq(i);
        let (pos, n) = (seq.pos, seq.len);
        let cache = seq_cache(states, i, seq)?;
        let new_rows = &sc.ckv[seq.start * kvr..(seq.start + n) * kvr];
        cache.rows_mut(pos + n)[pos * kvr..].copy_from_slice(new_rows);
        let rows = cache.rows(pos + n);
        if pass.mla_path == MlaPath::Latent && n > 1 {
            // a prefill chunk: every query of the chunk per head at once
            let q = &sc.q[seq.start * qwl..(seq.start + n) * qwl];
            let o = &mut sc.o[seq.start * hvl..(seq.start + n) * hvl];
            attend_latent_chunk(d, &kv_b, rows, pos, q, o);
            continue;
        }
        for j in 0..n {
            let (tok, p) = (seq.start + j, pos + j);
            let q_t = &sc.q[tok * qwl..(tok + 1) * qwl];
            let o_t = &mut sc.o[tok * hvl..(tok + 1) * hvl];
            match pass.mla_path {
                MlaPath::Latent => {
                    let scratch = LatentScratch {
                        q_lat: &mut sc.q_lat,
                        ctx: &mut sc.ctx,
                        scores: &mut sc.scores,
                    };
                    attend_latent(d, &kv_b, &rows[..(p + 1) * kvr], q_t, o_t, scratch)
                }
                MlaPath::Expanded => attend_expanded(d, &kv_b, &rows[..(p + 1) * kvr], q_t, o_t),
            }
        }
    }
    // 5. output gate on this rank's heads (no norm), 6. every head in order, o_proj
    if w.g_proj.is_some() {
        sc.o[..t * hvl]
            .par_chunks_mut(hvl.max(1))
            .zip(sc.gate[..t * hvl].par_chunks(hvl.max(1)))
            .with_max_len(ROWS_PER_JOB)
            .for_each(|(o, g)| mul_sigmoid(o, g));
    }
    //    (the gate's pre-activations are spent: the gathered outputs go there)
    dist.allgather_cols(&sc.o[..t * hvl], hv, split.g, &mut sc.gate[..t * hv], t)?;
    dist.matmul(&mut out[..t * d.hidden], &w.o_proj, &sc.gate[..t * hv], t)?;
    Ok(())
}

/// Per-head scratch of [`attend_latent`].
pub struct LatentScratch<'a> {
    /// `[H][kv_lora]` absorbed queries (f64).
    pub q_lat: &'a mut [f64],
    /// `[H][kv_lora]` attention-weighted latent context.
    pub ctx: &'a mut [f32],
    /// `[H][≥S]` scores, then probabilities.
    pub scores: &'a mut [f32],
}

/// Latent attention of one query over `rows` (`[S][kv_lora+rope]`), heads in parallel.
/// `q_t` is `[H'][nope+rope]`, `o_t` receives `[H'][v]` and `kv_b` holds those `H'` heads'
/// blocks (all heads, or one rank's).
pub fn attend_latent(
    d: &Dims,
    kv_b: &Matrix,
    rows: &[f32],
    q_t: &[f32],
    o_t: &mut [f32],
    sc: LatentScratch<'_>,
) {
    let LatentScratch { q_lat, ctx, scores } = sc;
    let (kl, kvr, qh, vh) = (d.kv_lora, d.kv_row(), d.qk_head(), d.v_head);
    let n = rows.len() / kvr;
    let stride = scores.len() / (o_t.len() / vh).max(1);
    let scale = mla_scale(d);
    o_t.par_chunks_mut(vh)
        .zip(q_lat.par_chunks_mut(kl))
        .zip(ctx.par_chunks_mut(kl))
        .zip(scores.par_chunks_mut(stride))
        .enumerate()
        .with_max_len(1) // one head per job (rayon's default leaves unshareable runs)
        .for_each(|(h, (((o, ql), cx), sc))| {
            let q = &q_t[h * qh..(h + 1) * qh];
            let kv0 = h * (d.nope + vh);
            matvec_t_f64(ql, kv_b, kv0, &q[..d.nope]);
            let sc = &mut sc[..n];
            for (s, score) in sc.iter_mut().enumerate() {
                let c = &rows[s * kvr..(s + 1) * kvr];
                let mut acc = 0f64;
                for (&a, &b) in ql.iter().zip(&c[..kl]) {
                    acc += a * b as f64;
                }
                for (&a, &b) in q[d.nope..].iter().zip(&c[kl..]) {
                    acc += a as f64 * b as f64;
                }
                *score = acc as f32 * scale;
            }
            softmax_inplace(sc);
            cx.fill(0.0);
            for (s, &p) in sc.iter().enumerate() {
                add_scaled(cx, p, &rows[s * kvr..s * kvr + kl]);
            }
            // the head's W_vb rows as one mat-vec (each output its row dot)
            matvec(o, &kv_b.rows(kv0 + d.nope, vh), cx);
        });
}

/// Most queries per tile of [`attend_latent_chunk`]: each thread holds `[tile][S]` scores;
/// a tile's queries run in the lanes of the k3-kernels lane kernels.
const CHUNK_TILE: usize = LANES;

/// Keys per block of a tile's dots (a few KB per thread, whatever the context).
const DOT_KEYS: usize = 64;

/// One thread's buffers of [`attend_latent_chunk`] for one tile of queries, lane-interleaved
/// (`[·][LANES]`, unused lanes 0).
struct ChunkTile {
    nope_t: Vec<f64>, // [nope][LANES] (f64)q_nope
    rope_t: Vec<f64>, // [rope][LANES] (f64)q_rope
    q_lat: Vec<f64>,  // [kv_lora][LANES] absorbed queries
    dots: Vec<f64>,   // [DOT_KEYS][LANES] latent + rope dots of a block of keys
    ctx: Vec<f32>,    // [TILE][kv_lora]
    scores: Vec<f32>, // [TILE][S]
}

/// [`attend_latent`] of the `n` consecutive queries of one sequence at positions
/// `pos..pos + n` over `rows` (`[pos + n][kv_lora + rope]`, causal): `q` is
/// `[n][H'][nope + rope]`, `o` receives `[n][H'][v]`, `kv_b` holds those `H'` heads' blocks.
/// Heads run in parallel; within a head the queries go in tiles of up to [`CHUNK_TILE`] and
/// each latent row is read once per tile for all its queries. Every (query, head) result is made
/// of exactly the sums of [`attend_latent`], in the same order (the key loop is outside the
/// query loop, but each query's accumulators still see keys in ascending order), so the
/// bits are those of attending token by token. Allocates (prefill only) the head-major
/// outputs, `[H'][n][v]`, and one tile per worker thread, whose scores together stay within
/// the `[H][S]` of the planned decode scratch (a tile size never changes a bit).
pub fn attend_latent_chunk(
    d: &Dims,
    kv_b: &Matrix,
    rows: &[f32],
    pos: usize,
    q: &[f32],
    o: &mut [f32],
) {
    let (kl, vh) = (d.kv_lora, d.v_head);
    let n = rows.len() / d.kv_row() - pos;
    let heads = o.len() / (n * vh).max(1);
    // [H'][n][v] head-major outputs
    let mut o_hm = vec![0f32; heads * n * vh];
    // the threads' tiles of scores together stay within `[H][S]` (the decode scratch's)
    let keys = pos + n;
    let room = d.mla_heads / rayon::current_num_threads().max(1);
    let per_tile = room.clamp(1, CHUNK_TILE);
    let tile = || ChunkTile {
        nope_t: vec![0.0; d.nope * LANES],
        rope_t: vec![0.0; d.rope * LANES],
        q_lat: vec![0.0; kl * LANES],
        dots: vec![0.0; DOT_KEYS * LANES],
        ctx: vec![0.0; per_tile * kl],
        scores: vec![0.0; per_tile * keys],
    };
    // one tile per pool thread, taken by the thread running a head (a job never waits on
    // another: nothing inside `attend` runs on the pool, so each lock is uncontended)
    let threads = rayon::current_num_threads().max(1);
    let tiles: Vec<Mutex<ChunkTile>> = (0..threads).map(|_| Mutex::new(tile())).collect();
    o_hm.par_chunks_mut((n * vh).max(1))
        .enumerate()
        .with_max_len(1) // one head per job (rayon's default leaves unshareable runs)
        .for_each(|(h, oh)| {
            let me = rayon::current_thread_index().unwrap_or(0) % threads;
            let mut t = tiles[me].lock().unwrap_or_else(|e| e.into_inner());
            let t = &mut *t;
            for start in (0..n).step_by(per_tile) {
                let m = per_tile.min(n - start);
                let head = HeadQueries {
                    d,
                    kv_b,
                    rows,
                    q,
                    heads,
                    h,
                    pos,
                    start,
                };
                head.attend(t, m, &mut oh[start * vh..(start + m) * vh]);
            }
        });
    for (h, oh) in o_hm.chunks_exact(n * vh).enumerate() {
        for j in 0..n {
            let dst = (j * heads + h) * vh;
            o[dst..dst + vh].copy_from_slice(&oh[j * vh..(j + 1) * vh]);
        }
    }
}

/// A tile of one head's queries of [`attend_latent_chunk`]: the call's queries
/// `start..start + m`, at absolute positions `pos + start..`.
struct HeadQueries<'a> {
    d: &'a Dims,
    kv_b: &'a Matrix<'a>,
    rows: &'a [f32],
    q: &'a [f32],
    heads: usize,
    h: usize,
    pos: usize,
    start: usize,
}

impl HeadQueries<'_> {
    /// Query `j` of the tile, this head's `[nope + rope]`.
    fn query(&self, j: usize) -> &[f32] {
        let (qh, at) = (self.d.qk_head(), (self.start + j) * self.heads + self.h);
        &self.q[at * qh..(at + 1) * qh]
    }

    /// Attends the tile's `m` queries (the sums and orders of [`attend_latent`]); `oh`
    /// receives `[m][v]`. The absorbed queries and the scores run the tile's queries in the
    /// lanes of [`matvec_t_f64_lanes`] and [`latent_scores_lanes`] (per lane the same sums).
    fn attend(&self, t: &mut ChunkTile, m: usize, oh: &mut [f32]) {
        let d = self.d;
        let (kl, kvr, vh, nope) = (d.kv_lora, d.kv_row(), d.v_head, d.nope);
        let first = self.pos + self.start; // position of the tile's first query
        let keys = first + m; // the last query sees keys 0..keys
        let stride = t.scores.len() / (t.ctx.len() / kl).max(1);
        let kv0 = self.h * (nope + vh);
        let scale = mla_scale(d);
        t.nope_t.fill(0.0);
        t.rope_t.fill(0.0);
        for j in 0..m {
            let q = self.query(j);
            for (i, &v) in q[..nope].iter().enumerate() {
                t.nope_t[i * LANES + j] = v as f64;
            }
            for (r, &v) in q[nope..].iter().enumerate() {
                t.rope_t[r * LANES + j] = v as f64;
            }
        }
        matvec_t_f64_lanes(&mut t.q_lat, self.kv_b, kv0, &t.nope_t);
        // scores: each latent row once, for every query of the tile that sees it, in
        // blocks of DOT_KEYS rows
        for s0 in (0..keys).step_by(DOT_KEYS) {
            let n = DOT_KEYS.min(keys - s0);
            let dots = &mut t.dots[..n * LANES];
            let rows = &self.rows[s0 * kvr..(s0 + n) * kvr];
            latent_scores_lanes(dots, &t.q_lat, &t.rope_t, rows);
            for s in s0..s0 + n {
                for j in s.saturating_sub(first)..m {
                    t.scores[j * stride + s] = dots[(s - s0) * LANES + j] as f32 * scale;
                }
            }
        }
        for j in 0..m {
            softmax_inplace(&mut t.scores[j * stride..j * stride + first + j + 1]);
        }
        // context: each query's sum over its keys in ascending order
        t.ctx[..m * kl].fill(0.0);
        for s in 0..keys {
            let c = &self.rows[s * kvr..s * kvr + kl];
            for j in s.saturating_sub(first)..m {
                let p = t.scores[j * stride + s];
                add_scaled(&mut t.ctx[j * kl..(j + 1) * kl], p, c);
            }
        }
        // the head's W_vb rows, one mat-vec per query (each output its row dot; one layout
        // copy of the context per query instead of one per row)
        let w_vb = self.kv_b.rows(kv0 + nope, vh);
        for (cx, o) in t.ctx[..m * kl]
            .chunks_exact(kl)
            .zip(oh.chunks_exact_mut(vh))
        {
            matvec(o, &w_vb, cx);
        }
    }
}

/// Expanded attention (docs/MODEL.md#mla-attention literally): per position, `k_nope = W_kb_h·c`, `v = W_vb_h·c`;
/// `d = Σ (f64)q_nope·k_nope + Σ (f64)q_rope·k_rope`; `o[j] = Σ_s p_s·v_s[j]` (f32).
/// Allocates its own buffers (reference path).
pub fn attend_expanded(d: &Dims, kv_b: &Matrix, rows: &[f32], q_t: &[f32], o_t: &mut [f32]) {
    let (kl, kvr, qh, vh, nope) = (d.kv_lora, d.kv_row(), d.qk_head(), d.v_head, d.nope);
    let n = rows.len() / kvr;
    let scale = mla_scale(d);
    o_t.par_chunks_mut(vh).enumerate().for_each(|(h, o)| {
        let q = &q_t[h * qh..(h + 1) * qh];
        let kv0 = h * (nope + vh);
        let mut sc = vec![0f32; n];
        let mut vs = vec![0f32; n * vh];
        for s in 0..n {
            let c = &rows[s * kvr..(s + 1) * kvr];
            let mut acc = 0f64;
            for (i, &qi) in q[..nope].iter().enumerate() {
                acc += qi as f64 * kv_b.row_dot(kv0 + i, &c[..kl]) as f64;
            }
            for (&a, &b) in q[nope..].iter().zip(&c[kl..]) {
                acc += a as f64 * b as f64;
            }
            sc[s] = acc as f32 * scale;
            for j in 0..vh {
                vs[s * vh + j] = kv_b.row_dot(kv0 + nope + j, &c[..kl]);
            }
        }
        softmax_inplace(&mut sc);
        o.fill(0.0);
        for (s, &p) in sc.iter().enumerate() {
            for (oj, &v) in o.iter_mut().zip(&vs[s * vh..(s + 1) * vh]) {
                *oj += p * v;
            }
        }
    });
}
