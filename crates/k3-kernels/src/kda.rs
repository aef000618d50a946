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
