//! Dense SiTU-GLU MLP (docs/MODEL.md#dense-mlp, layer 0): `down · SiTU-GLU(gate·x, up·x)`.

use crate::dims::Dims;
use crate::dist::Dist;
use crate::error::ModelError;
use crate::pass::Pass;
pub use crate::scratch::ops::DenseScratch;
use crate::share::FFN_SPLIT;
use crate::weights::DenseWeights;
use k3_kernels::act::situ_glu;
use k3_kernels::Matrix;

/// Checks the dense MLP tensors against the config: each may be whole or exactly this
/// rank's share of rows (crate::share::FFN_SPLIT).
pub fn check_dense(
    d: &Dims,
    dist: &Dist<'_>,
    w: &DenseWeights,
    layer: Option<usize>,
) -> Result<(), ModelError> {
    let (e, di) = (d.hidden, d.dense_inter);
    let c = |what, x: &Matrix, want| dist.check_dealt(layer, what, x, want, FFN_SPLIT);
    c("mlp gate_proj", &w.gate_proj, (di, e))?;
    c("mlp up_proj", &w.up_proj, (di, e))?;
    c("mlp down_proj", &w.down_proj, (e, di))
}

/// Dense MLP over `t` tokens: `x` normed input `[T][E]`, `out` receives `[T][E]`.
pub fn dense_forward(
    pass: &Pass<'_>,
    l: usize,
    w: &DenseWeights,
    x: &[f32],
    out: &mut [f32],
    sc: &mut DenseScratch,
) -> Result<(), ModelError> {
    let (d, t) = (pass.d, pass.t);
    check_dense(d, &pass.dist, w, Some(l))?;
    sc.ensure(d, t);
    let n = t * d.dense_inter;
    let mut jobs = [(&mut sc.g[..n], &w.gate_proj), (&mut sc.u[..n], &w.up_proj)];
    pass.dist.matmuls(&mut jobs, x, t)?; // one all-gather over ranks

    situ_glu(&mut sc.a[..n], &sc.g[..n], &sc.u[..n], d.situ_b1, d.situ_b2);
    pass.dist
        .matmul(&mut out[..t * d.hidden], &w.down_proj, &sc.a[..n], t)?;
    Ok(())
}
