//! One KDA delta-rule recurrence step for one head (docs/NUMERICS.md#model-ops, "KDA
//! recurrence"), state `S[d_k][d_v]` f32.

/// Updates `s` (`[dk][dv]`, row-major) with one token and writes `out` (`[dv]`):
/// 1. decay rows `S[i][:] *= alpha[i]`;
/// 2. read `u[j] = Σ_i k[i]·S[i][j]` (i ascending, rows with `k[i] == 0` skipped);
/// 3. write `S[i][j] += (k[i]·beta)·(v[j] − u[j])` (rows with `k[i] == 0` skipped);
/// 4. `out[j] = Σ_i q[i]·S[i][j]` from the UPDATED state (rows with `q[i] == 0` skipped).
///
/// `q` must already be L2-normalised and scaled by `1/sqrt(d_k)`; `u` is scratch `[dv]`.
#[allow(clippy::too_many_arguments)]
pub fn kda_step_head(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    alpha: &[f32],
    beta: f32,
    u: &mut [f32],
    out: &mut [f32],
) {
    let (dk, dv) = (k.len(), v.len());
    assert_eq!(s.len(), dk * dv, "kda state size");
    assert_eq!(q.len(), dk, "kda q length");
    assert_eq!(alpha.len(), dk, "kda alpha length");
    assert_eq!(u.len(), dv, "kda scratch length");
    assert_eq!(out.len(), dv, "kda output length");
    step_best(s, q, k, v, alpha, beta, u, out)
}

crate::simd::per_level! {
    fn step_best(
        s: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        alpha: &[f32],
        beta: f32,
        u: &mut [f32],
        out: &mut [f32],
    ) = step_any;
}

/// The body of [`kda_step_head`], compiled once per vector level: every loop runs over `j`
/// with one multiply and one add per element (no fusion), the same at every width.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn step_any(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    alpha: &[f32],
    beta: f32,
    u: &mut [f32],
    out: &mut [f32],
) {
    let dv = v.len();
    for (row, &a) in s.chunks_exact_mut(dv).zip(alpha) {
        for x in row.iter_mut() {
            *x *= a;
        }
    }
    u.fill(0.0);
    for (row, &ki) in s.chunks_exact(dv).zip(k) {
        if ki != 0.0 {
            for (uj, &sj) in u.iter_mut().zip(row) {
                *uj += ki * sj;
            }
        }
    }
    for (row, &ki) in s.chunks_exact_mut(dv).zip(k) {
        if ki != 0.0 {
            let kb = ki * beta;
            for ((sj, &vj), &uj) in row.iter_mut().zip(v).zip(u.iter()) {
                *sj += kb * (vj - uj);
            }
        }
    }
    out.fill(0.0);
    for (row, &qi) in s.chunks_exact(dv).zip(q) {
        if qi != 0.0 {
            for (oj, &sj) in out.iter_mut().zip(row) {
                *oj += qi * sj;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two steps at the vector level in use and on the forced scalar path: the same bits
    /// (zero k and q entries exercise the skipped rows).
    #[test]
    fn step_is_the_same_at_every_level() {
        let (dk, dv) = (12, 37);
        let f = |n: usize, m: f32| -> Vec<f32> {
            (0..n)
                .map(|i| {
                    if i % 5 == 3 {
                        0.0
                    } else {
                        ((i as f32 + m) * 0.77).sin()
                    }
                })
                .collect()
        };
        let (q, k, v, alpha) = (f(dk, 1.0), f(dk, 2.0), f(dv, 3.0), f(dk, 4.0));
        let run = |scalar: bool| {
            crate::simd::set_force_scalar(scalar);
            let (mut s, mut u, mut out) = (f(dk * dv, 5.0), vec![0f32; dv], vec![0f32; dv]);
            kda_step_head(&mut s, &q, &k, &v, &alpha, 0.6, &mut u, &mut out);
            kda_step_head(&mut s, &k, &q, &v, &alpha, 0.3, &mut u, &mut out);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            (bits(&s), bits(&out))
        };
        let (vector, scalar) = (run(false), run(true));
        crate::simd::set_force_scalar(false);
        assert_eq!(vector, scalar);
    }
}
