//! The KDA delta-rule recurrence of one head (docs/NUMERICS.md#model-ops, "KDA
//! recurrence"), state `S[d_k][d_v]` f32, and the per-channel decay.

/// One head's inputs over `tokens` tokens: token `t`'s `q`, `k`, `v`, `alpha` are the `dim`
/// values at `t·stride + offset` of their `[T][·]` arrays, its `beta` is
/// `beta[t·beta_stride + beta_offset]`.
#[derive(Clone, Copy)]
pub struct HeadTokens<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub alpha: &'a [f32],
    pub beta: &'a [f32],
    pub tokens: usize,
    pub dim: usize,
    pub stride: usize,
    pub offset: usize,
    pub beta_stride: usize,
    pub beta_offset: usize,
}

impl HeadTokens<'_> {
    /// Token `t`'s `dim` values of `x` (one of `q`, `k`, `v`, `alpha`).
    #[inline(always)]
    fn at<'x>(&self, x: &'x [f32], t: usize) -> &'x [f32] {
        let at = t * self.stride + self.offset;
        &x[at..at + self.dim]
    }
}

/// Every token of one head in order through the delta rule (`s` `[dim][dim]`, row-major;
/// `out` receives `[tokens][dim]`). Per token:
/// 1. decay rows `S[i][:] *= alpha[i]`;
/// 2. read `u[j] = Σ_i k[i]·S[i][j]` (i ascending, rows with `k[i] == 0` skipped);
/// 3. write `S[i][j] += (k[i]·beta)·(v[j] − u[j])` (rows with `k[i] == 0` skipped);
/// 4. `out[j] = Σ_i q[i]·S[i][j]` from the UPDATED state (rows with `q[i] == 0` skipped).
///
/// `q` must already be L2-normalised and scaled by `1/sqrt(d_k)`. Every loop is one multiply
/// and one add per element (no fusion), the same at every vector width. The four steps run
/// in ONE sweep of the state per token — row `i`'s write and output for token `t` are followed
/// at once by its decay and read for token `t + 1` (each element still sees write `t`,
/// output `t`, decay `t + 1`, read `t + 1`, and every sum still runs over `i` ascending) —
/// and columns in blocks whose `u`, `v − u` and output stay in registers across the rows.
/// `scratch` holds `2·dim` values. Panics if a length disagrees with the shape.
pub fn kda_head_tokens(s: &mut [f32], x: &HeadTokens<'_>, out: &mut [f32], scratch: &mut [f32]) {
    let (n, d) = (x.tokens, x.dim);
    assert_eq!(s.len(), d * d, "kda state size");
    assert_eq!(scratch.len(), 2 * d, "kda scratch length");
    assert_eq!(out.len(), n * d, "kda output length");
    if n == 0 {
        return;
    }
    let last = (n - 1) * x.stride + x.offset + d;
    for (what, a) in [("q", x.q), ("k", x.k), ("v", x.v), ("alpha", x.alpha)] {
        assert!(a.len() >= last, "kda {what} length");
    }
    assert!(
        x.beta.len() > (n - 1) * x.beta_stride + x.beta_offset,
        "kda beta length"
    );
    head_tokens_best(s, x, out, scratch)
}

crate::simd::per_level! {
    fn head_tokens_best(s: &mut [f32], x: &HeadTokens<'_>, out: &mut [f32], scratch: &mut [f32]) = head_tokens_any;
}

/// The body of [`kda_head_tokens`] (lengths checked), compiled once per vector level.
#[inline(always)]
fn head_tokens_any(s: &mut [f32], x: &HeadTokens<'_>, out: &mut [f32], scratch: &mut [f32]) {
    let d = x.dim;
    // u of the coming token (Σ_i k_i·S_i, rows decayed), then `v − u` of the current one
    let (u, vu) = scratch.split_at_mut(d);
    let first = Sweep {
        write: None,
        next: Some((x.at(x.alpha, 0), x.at(x.k, 0))),
    };
    first.run(s, d, &mut [], u);
    for t in 0..x.tokens {
        for ((w, &vj), &uj) in vu.iter_mut().zip(x.at(x.v, t)).zip(u.iter()) {
            *w = vj - uj;
        }
        let beta = x.beta[t * x.beta_stride + x.beta_offset];
        let sweep = Sweep {
            write: Some((x.at(x.k, t), beta, x.at(x.q, t), &vu[..])),
            next: (t + 1 < x.tokens).then(|| (x.at(x.alpha, t + 1), x.at(x.k, t + 1))),
        };
        sweep.run(s, d, &mut out[t * d..(t + 1) * d], u);
    }
}

/// One sweep of the state: for each row `i` (ascending), first token `t`'s write
/// `S_i += (k_i·β)·(v − u)` (skipped when `k_i = 0`) and output `o += q_i·S_i` (skipped when
/// `q_i = 0`), then token `t + 1`'s decay `S_i *= α_i` and read `u' += k'_i·S_i` (skipped when
/// `k'_i = 0`).
struct Sweep<'a> {
    /// Token `t`'s write and output.
    write: Option<Write<'a>>,
    /// Token `t + 1`: `(α, k)`.
    next: Option<(&'a [f32], &'a [f32])>,
}

/// Token `t`'s part of a [`Sweep`]: `(k, β, q, v − u)`.
type Write<'a> = (&'a [f32], f32, &'a [f32], &'a [f32]);

/// Columns per register block of a [`Sweep`] (`v − u`, output and `u'`: 12 vectors).
const BLOCK: usize = 64;

impl Sweep<'_> {
    /// Runs over `s` (`[d][d]`); `out` (`[d]`, or empty without a write) receives the output,
    /// `u` (`[d]`) the next token's read.
    #[inline(always)]
    fn run(&self, s: &mut [f32], d: usize, out: &mut [f32], u: &mut [f32]) {
        let mut c0 = 0;
        while c0 < d {
            let w = d - c0;
            if w >= BLOCK {
                self.block::<BLOCK>(s, d, c0, out, u);
                c0 += BLOCK;
            } else if w >= 16 {
                self.block::<16>(s, d, c0, out, u);
                c0 += 16;
            } else {
                self.block::<1>(s, d, c0, out, u);
                c0 += 1;
            }
        }
    }

    /// Columns `c0 .. c0 + W` of every row.
    #[inline(always)]
    fn block<const W: usize>(
        &self,
        s: &mut [f32],
        d: usize,
        c0: usize,
        out: &mut [f32],
        u: &mut [f32],
    ) {
        let mut vu = [0f32; W];
        let mut o = [0f32; W];
        let mut un = [0f32; W];
        if let Some((_, _, _, v)) = self.write {
            vu.copy_from_slice(&v[c0..c0 + W]);
        }
        for i in 0..d {
            let row = &mut s[i * d + c0..i * d + c0 + W];
            // the row in registers, stored once (a zmm store reloaded at once stalls on
            // store-to-load forwarding: 2× slower on Zen 4 when each step went to memory)
            let mut r = [0f32; W];
            r.copy_from_slice(row);
            if let Some((k, beta, q, _)) = self.write {
                let ki = k[i];
                if ki != 0.0 {
                    let kb = ki * beta;
                    for j in 0..W {
                        r[j] += kb * vu[j];
                    }
                }
                let qi = q[i];
                if qi != 0.0 {
                    for j in 0..W {
                        o[j] += qi * r[j];
                    }
                }
            }
            if let Some((alpha, k)) = self.next {
                let a = alpha[i];
                for x in r.iter_mut() {
                    *x *= a;
                }
                let ki = k[i];
                if ki != 0.0 {
                    for j in 0..W {
                        un[j] += ki * r[j];
                    }
                }
            }
            row.copy_from_slice(&r);
        }
        if self.write.is_some() {
            out[c0..c0 + W].copy_from_slice(&o);
        }
        u[c0..c0 + W].copy_from_slice(&un);
    }
}

/// Per-channel decay of one token (docs/MODEL.md#kda-decay): for head h, channel i = h·D + d,
/// `u = exp(A_log[h]) · (z_i + dt_bias_i)`, `g_i = lb · σ(u)`, `α_i = exp(g_i)` (k3's own
/// `act::exp`; `exp(A_log[h])` once per head — the same value for each of its channels).
/// `z`, `dt_bias`, `alpha` are `[P]`; `a_log` holds at least P / D values (one per HEAD).
/// `g_out`, when given, receives `g` (`[P]`). Compiled for the vector level in use.
pub fn decay(
    alpha: &mut [f32],
    mut g_out: Option<&mut [f32]>,
    z: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    lb: f32,
    dim: usize,
) {
    let p = alpha.len();
    assert!(
        dim > 0 && p.is_multiple_of(dim),
        "kda decay: [P] is heads × dim"
    );
    assert!(
        z.len() == p && dt_bias.len() == p,
        "kda decay input lengths"
    );
    assert!(a_log.len() >= p / dim, "kda decay: one A_log per head");
    if let Some(g) = g_out.as_deref() {
        assert_eq!(g.len(), p, "kda decay g length");
    }
    for (h, c0) in (0..p).step_by(dim).enumerate() {
        let r = c0..c0 + dim;
        let ah = crate::act::exp(a_log[h]);
        let g = g_out.as_deref_mut().map(|g| &mut g[r.clone()]);
        decay_best(&mut alpha[r.clone()], g, &z[r.clone()], &dt_bias[r], ah, lb);
    }
}

crate::simd::per_level! {
    fn decay_best(
        alpha: &mut [f32],
        g_out: Option<&mut [f32]>,
        z: &[f32],
        dt_bias: &[f32],
        ah: f32,
        lb: f32,
    ) = decay_any;
}

/// One head of [`decay`]: `ah = exp(A_log[h])`.
#[inline(always)]
fn decay_any(
    alpha: &mut [f32],
    g_out: Option<&mut [f32]>,
    z: &[f32],
    dt_bias: &[f32],
    ah: f32,
    lb: f32,
) {
    use crate::act::{exp, sigmoid};
    let gate = |zi: f32, bi: f32| lb * sigmoid(ah * (zi + bi));
    match g_out {
        Some(go) => {
            for (((a, g), &zi), &bi) in alpha.iter_mut().zip(go).zip(z).zip(dt_bias) {
                *g = gate(zi, bi);
                *a = exp(*g);
            }
        }
        None => {
            for ((a, &zi), &bi) in alpha.iter_mut().zip(z).zip(dt_bias) {
                *a = exp(gate(zi, bi));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The four steps of [`kda_head_tokens`]' doc for one token, one sweep each, as written.
    #[allow(clippy::too_many_arguments)]
    fn four_sweeps(
        s: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        alpha: &[f32],
        beta: f32,
        out: &mut [f32],
    ) {
        let dv = v.len();
        for (row, &a) in s.chunks_exact_mut(dv).zip(alpha) {
            row.iter_mut().for_each(|x| *x *= a);
        }
        let mut u = vec![0f32; dv];
        for (row, &ki) in s.chunks_exact(dv).zip(k).filter(|(_, &ki)| ki != 0.0) {
            u.iter_mut().zip(row).for_each(|(uj, &sj)| *uj += ki * sj);
        }
        for (row, &ki) in s.chunks_exact_mut(dv).zip(k).filter(|(_, &ki)| ki != 0.0) {
            let kb = ki * beta;
            for ((sj, &vj), &uj) in row.iter_mut().zip(v).zip(&u) {
                *sj += kb * (vj - uj);
            }
        }
        out.fill(0.0);
        for (row, &qi) in s.chunks_exact(dv).zip(q).filter(|(_, &qi)| qi != 0.0) {
            out.iter_mut().zip(row).for_each(|(oj, &sj)| *oj += qi * sj);
        }
    }

    /// A head's tokens in one call equal the definition's four sweeps per token bit for bit,
    /// on every level, at widths that take each column block (64, 16 and single columns),
    /// with `T` 1..4 and zero `k` and `q` entries in every combination.
    #[test]
    fn head_tokens_equal_four_sweeps_per_token() {
        for dim in [1, 5, 37, 80, 128] {
            for tokens in 1..=4 {
                let (heads, h) = (3, 1);
                let p = heads * dim;
                let f = |n: usize, m: f32, zero: usize| -> Vec<f32> {
                    (0..n)
                        .map(|i| {
                            if i % zero == 1 {
                                0.0
                            } else {
                                ((i as f32 + m) * 0.37).sin()
                            }
                        })
                        .collect()
                };
                let (q, k) = (f(tokens * p, 1.0, 3), f(tokens * p, 2.0, 4));
                let (v, alpha) = (f(tokens * p, 3.0, 1000), f(tokens * p, 4.0, 1000));
                let beta = f(tokens * heads, 5.0, 1000);
                let x = HeadTokens {
                    q: &q,
                    k: &k,
                    v: &v,
                    alpha: &alpha,
                    beta: &beta,
                    tokens,
                    dim,
                    stride: p,
                    offset: h * dim,
                    beta_stride: heads,
                    beta_offset: h,
                };
                for scalar in [false, true] {
                    crate::simd::set_force_scalar(scalar);
                    let (mut s1, mut s2) = (f(dim * dim, 6.0, 1000), f(dim * dim, 6.0, 1000));
                    let mut o1 = vec![0f32; tokens * dim];
                    kda_head_tokens(&mut s1, &x, &mut o1, &mut vec![0f32; 2 * dim]);
                    let mut o2 = vec![0f32; tokens * dim];
                    for t in 0..tokens {
                        let r = t * p + h * dim..t * p + (h + 1) * dim;
                        let (qt, kt, vt, at) =
                            (&q[r.clone()], &k[r.clone()], &v[r.clone()], &alpha[r]);
                        let o = &mut o2[t * dim..(t + 1) * dim];
                        four_sweeps(&mut s2, qt, kt, vt, at, beta[t * heads + h], o);
                    }
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    let what = format!("dim {dim}, tokens {tokens}, scalar {scalar}");
                    assert_eq!(bits(&s1), bits(&s2), "state, {what}");
                    assert_eq!(bits(&o1), bits(&o2), "out, {what}");
                }
            }
        }
        crate::simd::set_force_scalar(false);
    }

    /// The decay at the vector level in use and on the forced scalar path equals the
    /// per-channel definition, with and without `g_out`.
    #[test]
    fn decay_is_the_definition_at_every_level() {
        use crate::act::{exp, sigmoid};
        let (heads, dim) = (3, 37);
        let p = heads * dim;
        let z: Vec<f32> = (0..p).map(|i| (i as f32 * 0.31).sin() * 6.0).collect();
        let dt: Vec<f32> = (0..p).map(|i| (i as f32 * 0.17).cos()).collect();
        let a_log = [0.3f32, -1.2, 2.0];
        let lb = -5.0;
        for scalar in [false, true] {
            crate::simd::set_force_scalar(scalar);
            let (mut alpha, mut alpha2, mut g) = (vec![0f32; p], vec![0f32; p], vec![0f32; p]);
            decay(&mut alpha, Some(&mut g), &z, &a_log, &dt, lb, dim);
            decay(&mut alpha2, None, &z, &a_log, &dt, lb, dim);
            for i in 0..p {
                let want_g = lb * sigmoid(exp(a_log[i / dim]) * (z[i] + dt[i]));
                assert_eq!(g[i].to_bits(), want_g.to_bits(), "g {i}, scalar {scalar}");
                assert_eq!(alpha[i].to_bits(), exp(want_g).to_bits(), "alpha {i}");
                assert_eq!(alpha2[i].to_bits(), alpha[i].to_bits());
            }
        }
        crate::simd::set_force_scalar(false);
    }
}
