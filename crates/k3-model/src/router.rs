//! The Stable LatentMoE router (docs/MODEL.md#moe-router): sigmoid scores on the FULL normed input, a
//! selection-only bias, top-k by repeated strict-`>` argmax, weights from the UNBIASED scores.

use k3_kernels::act::sigmoid;
use k3_kernels::tmatvec::{row_dots_f64_lanes, LANES};
use k3_kernels::{bf16_to_f32, Matrix, MatrixData};
use rayon::prelude::*;

/// Routing constants of one layer.
#[derive(Clone, Copy, Debug)]
pub struct RouterParams {
    /// Experts chosen per token.
    pub topk: usize,
    /// Renormalise the chosen weights to sum 1 (only when `topk > 1`).
    pub renorm: bool,
    /// Final multiplier of every weight (`routed_scaling_factor`).
    pub scale: f32,
}

/// Router logit of expert `e`: `Σ_i (f64)W[e][i]·(f64)x[i]`, sequential, plain mul+add.
/// `None` for MXFP4 or Q8 storage (a router is never quantised, not even in a draft trunk).
pub fn router_logit(gate: &Matrix, e: usize, x: &[f32]) -> Option<f64> {
    let c = gate.cols;
    let mut acc = 0f64;
    match gate.data {
        MatrixData::F32(d) => {
            for (&w, &v) in d[e * c..(e + 1) * c].iter().zip(x) {
                acc += w as f64 * v as f64;
            }
        }
        MatrixData::Bf16(d) => {
            for (&w, &v) in d[e * c..(e + 1) * c].iter().zip(x) {
                acc += bf16_to_f32(w) as f64 * v as f64;
            }
        }
        MatrixData::Mxfp4 { .. } | MatrixData::Q8 { .. } => return None,
    }
    Some(acc)
}

/// Sigmoid scores `s_e = σ((f32)logit_e)` of every expert (`scores` is `[NE]`), experts in
/// parallel. Returns `false` when the gate storage is unsupported (MXFP4).
pub fn router_scores(scores: &mut [f32], gate: &Matrix, x: &[f32]) -> bool {
    scores
        .par_iter_mut()
        .enumerate()
        .map(|(e, s)| {
            router_logit(gate, e, x)
                .map(|l| *s = sigmoid(l as f32))
                .is_some()
        })
        .reduce(|| true, |a, b| a && b)
}

/// Experts per parallel task of [`router_scores_tokens`].
const EXPERT_BLOCK: usize = 16;

/// [`router_scores`] of `t` tokens at once (`x` `[T][E]`, `scores` `[T][NE]`): tiles of
/// [`LANES`] tokens run in the lanes of [`row_dots_f64_lanes`] (each gate row read once per
/// tile), blocks of [`EXPERT_BLOCK`] experts in parallel; every logit is the sequential f64
/// sum of [`router_logit`], so every score has its bits. Tokens go in groups of
/// [`ROUTER_GROUP`], so the lane-interleaved copy stays within `ROUTER_GROUP · E · 8` bytes
/// (3.7 MB at E = 7168) whatever `t`. Returns `false` when the gate storage is unsupported.
pub fn router_scores_tokens(scores: &mut [f32], gate: &Matrix, x: &[f32], t: usize) -> bool {
    let (ne, e) = (gate.rows, gate.cols);
    if !matches!(gate.data, MatrixData::F32(_) | MatrixData::Bf16(_)) {
        return false;
    }
    for g in (0..t).step_by(ROUTER_GROUP) {
        let n = ROUTER_GROUP.min(t - g);
        scores_group(
            &mut scores[g * ne..(g + n) * ne],
            gate,
            &x[g * e..(g + n) * e],
            n,
        );
    }
    true
}

/// Tokens per group of [`router_scores_tokens`] (4 tiles of [`LANES`]).
const ROUTER_GROUP: usize = 4 * LANES;

/// One group of [`router_scores_tokens`]: `t ≤ ROUTER_GROUP` tokens.
fn scores_group(scores: &mut [f32], gate: &Matrix, x: &[f32], t: usize) {
    let (ne, e) = (gate.rows, gate.cols);
    let tiles = t.div_ceil(LANES);
    // [tiles][E][LANES] the tokens, lane-interleaved (unused lanes 0)
    let mut xt = vec![0f64; tiles * e * LANES];
    xt.par_chunks_mut((e * LANES).max(1))
        .enumerate()
        .for_each(|(tile, xt)| {
            let toks = &x[tile * LANES * e..(t.min((tile + 1) * LANES)) * e];
            for (j, xj) in toks.chunks_exact(e.max(1)).enumerate() {
                for (i, &v) in xj.iter().enumerate() {
                    xt[i * LANES + j] = v as f64;
                }
            }
        });
    // per block of experts: [tiles][block][LANES] logits
    let blocks: Vec<Vec<f64>> = (0..ne.div_ceil(EXPERT_BLOCK))
        .into_par_iter()
        .map(|b| {
            let rows = b * EXPERT_BLOCK..ne.min((b + 1) * EXPERT_BLOCK);
            let per = rows.len() * LANES;
            let mut out = vec![0f64; tiles * per];
            for (tile, o) in out.chunks_exact_mut(per).enumerate() {
                let xt = &xt[tile * e * LANES..(tile + 1) * e * LANES];
                row_dots_f64_lanes(o, gate, rows.clone(), xt);
            }
            out
        })
        .collect();
    for (tok, sc) in scores[..t * ne].chunks_exact_mut(ne).enumerate() {
        let (tile, j) = (tok / LANES, tok % LANES);
        for (ex, s) in sc.iter_mut().enumerate() {
            let (b, r) = (ex / EXPERT_BLOCK, ex % EXPERT_BLOCK);
            let width = EXPERT_BLOCK.min(ne - b * EXPERT_BLOCK);
            *s = sigmoid(blocks[b][(tile * width + r) * LANES + j] as f32);
        }
    }
}

/// Top-k selection and weights from precomputed sigmoid `scores` (`[NE]`) and `bias` (`[NE]`).
/// `choice_e = s_e + bias_e` (f32); k rounds of argmax over the untaken experts with strict `>`
/// (ties → lowest index), so `idx` is in descending choice order. `w_j = s_{idx_j}`; if
/// `renorm && k > 1`: `inv = (f32)(1/(Σ_j (f64)w_j + 1e-20))`, `w_j *= inv`; then
/// `w_j *= scale`. `taken` is `[NE]` scratch; `idx`/`w` receive `[k]`.
pub fn select_topk(
    scores: &[f32],
    bias: &[f32],
    p: &RouterParams,
    taken: &mut [bool],
    idx: &mut [u32],
    w: &mut [f32],
) {
    let n = scores.len();
    taken[..n].fill(false);
    for j in 0..p.topk {
        let mut best = usize::MAX;
        let mut best_v = 0f32;
        for e in 0..n {
            if taken[e] {
                continue;
            }
            let c = scores[e] + bias[e];
            if best == usize::MAX || c > best_v {
                best = e;
                best_v = c;
            }
        }
        taken[best] = true;
        idx[j] = best as u32;
        w[j] = scores[best];
    }
    if p.renorm && p.topk > 1 {
        let mut sum = 0f64;
        for &v in &w[..p.topk] {
            sum += v as f64;
        }
        let inv = (1.0 / (sum + 1e-20)) as f32;
        w[..p.topk].iter_mut().for_each(|v| *v *= inv);
    }
    w[..p.topk].iter_mut().for_each(|v| *v *= p.scale);
}

/// The `[NE]` scratch of one routing.
pub struct RouteScratch<'a> {
    /// `[NE]` sigmoid scores.
    pub scores: &'a mut [f32],
    /// `[NE]` experts already chosen.
    pub taken: &'a mut [bool],
}

/// Routes one token: scores then [`select_topk`] into `idx`/`w` (`[k]`). Returns `false` when
/// the gate storage is unsupported.
pub fn route(
    x: &[f32],
    gate: &Matrix,
    bias: &[f32],
    p: &RouterParams,
    sc: RouteScratch<'_>,
    idx: &mut [u32],
    w: &mut [f32],
) -> bool {
    if !router_scores(sc.scores, gate, x) {
        return false;
    }
    select_topk(sc.scores, bias, p, sc.taken, idx, w);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(topk: usize, renorm: bool) -> RouterParams {
        RouterParams {
            topk,
            renorm,
            scale: 1.0,
        }
    }

    #[test]
    fn ties_go_to_the_lowest_index_in_descending_order() {
        let scores = [0.5f32, 0.7, 0.7, 0.2, 0.7];
        let bias = [0.0f32; 5];
        let (mut taken, mut idx, mut w) = ([false; 5], [0u32; 4], [0f32; 4]);
        select_topk(
            &scores,
            &bias,
            &params(4, false),
            &mut taken,
            &mut idx,
            &mut w,
        );
        assert_eq!(idx, [1, 2, 4, 0]);
        assert_eq!(w, [0.7, 0.7, 0.7, 0.5]);
    }

    #[test]
    fn bias_selects_but_weights_stay_unbiased() {
        let scores = [0.9f32, 0.1, 0.5, 0.4];
        let bias = [0.0f32, 2.0, 0.0, 0.0];
        let (mut taken, mut idx, mut w) = ([false; 4], [0u32; 2], [0f32; 2]);
        select_topk(
            &scores,
            &bias,
            &params(2, false),
            &mut taken,
            &mut idx,
            &mut w,
        );
        assert_eq!(idx, [1, 0]);
        assert_eq!(w, [0.1, 0.9]);
        select_topk(
            &scores,
            &bias,
            &params(2, true),
            &mut taken,
            &mut idx,
            &mut w,
        );
        let inv = (1.0 / (0.1f32 as f64 + 0.9f32 as f64 + 1e-20)) as f32;
        assert_eq!(w, [0.1 * inv, 0.9 * inv]);
    }

    #[test]
    fn single_expert_is_not_renormalised() {
        let scores = [0.3f32, 0.6];
        let (mut taken, mut idx, mut w) = ([false; 2], [0u32; 1], [0f32; 1]);
        let p = RouterParams {
            topk: 1,
            renorm: true,
            scale: 2.0,
        };
        select_topk(&scores, &[0.0, 0.0], &p, &mut taken, &mut idx, &mut w);
        assert_eq!((idx[0], w[0]), (1, 0.6 * 2.0));
    }

    #[test]
    fn logits_are_sequential_f64() {
        let w = [1e8f32, 1.0, -1e8];
        let m = Matrix::f32(1, 3, &w).unwrap();
        assert_eq!(router_logit(&m, 0, &[1.0, 1.0, 1.0]), Some(1.0));
    }

    /// The prefill's lane-batched scores equal routing each token alone, bit for bit, for
    /// tile and expert-block tails (37 experts: two blocks of 16 and one of 5).
    #[test]
    fn batched_scores_equal_one_token_scores() {
        let (ne, e) = (37, 45);
        let wf: Vec<f32> = (0..ne * e)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0)
            .collect();
        let wb: Vec<half::bf16> = wf.iter().map(|v| half::bf16::from_f32(*v)).collect();
        for t in [2, 16, 17, 35, 2 * ROUTER_GROUP + 3] {
            let x: Vec<f32> = (0..t * e)
                .map(|i| ((i as f32) * 0.613).sin() * 3.0)
                .collect();
            let bf = Matrix::bf16(ne, e, &wb).unwrap();
            for gate in [Matrix::f32(ne, e, &wf).unwrap(), bf] {
                let mut batched = vec![0f32; t * ne];
                assert!(router_scores_tokens(&mut batched, &gate, &x, t));
                let mut one = vec![0f32; ne];
                for tok in 0..t {
                    assert!(router_scores(&mut one, &gate, &x[tok * e..(tok + 1) * e]));
                    for ex in 0..ne {
                        let got = batched[tok * ne + ex].to_bits();
                        assert_eq!(got, one[ex].to_bits(), "T {t} token {tok} expert {ex}");
                    }
                }
            }
        }
    }
}
