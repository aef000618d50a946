//! RMSNorm and L2Norm (docs/NUMERICS.md#where-f64-stays): sums of squares in f64, sequential,
//! eps inside the sqrt.

/// Sequential `Σ (f64)x_i²` (plain multiply and add, no fusion).
#[inline]
pub fn sum_squares(x: &[f32]) -> f64 {
    let mut ss = 0f64;
    for &v in x {
        ss += v as f64 * v as f64;
    }
    ss
}

/// `1 / sqrt(Σx²/n + eps)` computed in f64, rounded to f32.
#[inline]
pub fn rms_inv(x: &[f32], eps: f64) -> f32 {
    (1.0 / (sum_squares(x) / x.len() as f64 + eps).sqrt()) as f32
}

/// `y_i = (w_i · x_i) · inv` with `inv = rms_inv(x)`.
pub fn rmsnorm(y: &mut [f32], x: &[f32], w: &[f32], eps: f64) {
    assert_eq!(y.len(), x.len(), "rmsnorm output length");
    assert_eq!(w.len(), x.len(), "rmsnorm weight length");
    let inv = rms_inv(x, eps);
    for ((o, &xi), &wi) in y.iter_mut().zip(x).zip(w) {
        *o = (wi * xi) * inv;
    }
}

/// In-place RMSNorm (the scale is computed before any write).
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f64) {
    assert_eq!(w.len(), x.len(), "rmsnorm weight length");
    let inv = rms_inv(x, eps);
    for (xi, &wi) in x.iter_mut().zip(w) {
        *xi = (wi * *xi) * inv;
    }
}

/// Epsilon of the KDA q/k L2 norm (FLA convention `x / sqrt(Σx² + eps)`).
pub const L2_EPS: f64 = 1e-6;

/// In-place L2 normalisation: `x_i *= (f32)(1/sqrt(Σx² + eps))` (sum, not mean).
pub fn l2norm_inplace(x: &mut [f32], eps: f64) {
    let inv = (1.0 / (sum_squares(x) + eps).sqrt()) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_of_constant_vector_is_gain() {
        let x = [2.0f32; 8];
        let w = [1.5f32; 8];
        let mut y = [0f32; 8];
        rmsnorm(&mut y, &x, &w, 0.0);
        assert!(y.iter().all(|v| (*v - 1.5).abs() < 1e-7));
    }

    #[test]
    fn l2norm_gives_unit_length() {
        let mut x = [3.0f32, 4.0];
        l2norm_inplace(&mut x, 0.0);
        assert_eq!(x, [0.6, 0.8]);
    }
}
