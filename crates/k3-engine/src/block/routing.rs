//! How many distinct routed experts a pass over `m` positions reads
//! (docs/STREAMING.md#dspark-block-drafts). A verifying pass runs its positions' MoE as one
//! union per layer, so it reads each expert its positions route to once, not once per
//! position.
//!
//! Model, per MoE layer: `E` experts, `k` routed per position, `p = k/E`. Whether a given
//! expert is routed at position `t` is a two-state Markov chain with stationary probability
//! `p`: with probability `ρ` a position keeps the previous position's choice for that
//! expert, otherwise it draws it afresh (stationary):
//!
//! ```text
//! P(in_t | in_{t-1})  = ρ + (1−ρ)·p        P(in_t | out_{t-1}) = (1−ρ)·p
//! P(out at all m positions) = (1−p) · (1 − (1−ρ)·p)^(m−1)
//! distinct(m) = E · (1 − (1−p) · (1 − (1−ρ)·p)^(m−1))
//! ```
//!
//! `ρ = 0` is independent routing, `E·(1 − (1 − k/E)^m)`; `ρ = 1` repeats one position's
//! experts (`k` whatever `m`); `m = 1` gives `k`; `E = k` gives `k`; `E → ∞` gives
//! `k·(1 + (m−1)(1−ρ))`, every position's experts apart but the kept fraction `ρ`. The
//! fraction of a position's experts shared with the previous one is `ρ + (1−ρ)·k/E`.

/// The routing geometry of one MoE layer and the correlation between consecutive positions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    /// Routed experts per layer (`E`, `num_experts`).
    pub experts: f64,
    /// Experts routed per position (`k`, `num_experts_per_token`).
    pub top_k: f64,
    /// Routing correlation `ρ` in `[0, 1]`: the fraction of a position's routing kept from
    /// the previous position (0: independent).
    pub correlation: f64,
}

impl Routing {
    /// Independent routing of `top_k` of `experts`.
    pub fn independent(experts: usize, top_k: usize) -> Routing {
        Routing {
            experts: experts as f64,
            top_k: top_k as f64,
            correlation: 0.0,
        }
    }

    /// The same geometry with correlation `rho` (clamped to `[0, 1]`).
    pub fn with_correlation(self, rho: f64) -> Routing {
        Routing {
            correlation: rho.clamp(0.0, 1.0),
            ..self
        }
    }

    /// Expected distinct experts per layer a pass over `m ≥ 1` positions reads (`m` may be
    /// fractional: an average). Degenerate geometry (`k = 0`, `E ≤ 0`) reads none.
    pub fn distinct(&self, m: f64) -> f64 {
        let (e, k) = (self.experts, self.top_k.min(self.experts));
        if e <= 0.0 || k <= 0.0 {
            return 0.0;
        }
        let p = k / e;
        let m = m.max(1.0);
        // 1 − (1−p)·(1 − (1−ρ)p)^(m−1) in logs: exact to rounding when p is tiny
        let first = (-p).ln_1p();
        let rest = if m > 1.0 {
            (m - 1.0) * (-(1.0 - self.correlation) * p).ln_1p()
        } else {
            0.0
        };
        -e * (first + rest).exp_m1()
    }

    /// [`Routing::distinct`] in units of one position's experts: what `m` positions cost
    /// against one (`m` when no expert is ever shared, 1 when all are).
    pub fn positions(&self, m: f64) -> f64 {
        let k = self.top_k.min(self.experts);
        if k <= 0.0 {
            return m.max(1.0);
        }
        self.distinct(m) / k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1.0)
    }

    #[test]
    fn one_position_reads_its_top_k() {
        for (e, k) in [(896, 16), (32, 16), (8, 2), (16, 16)] {
            for rho in [0.0, 0.3, 1.0] {
                let r = Routing::independent(e, k).with_correlation(rho);
                assert!(close(r.distinct(1.0), k as f64, 1e-12), "{e} {k} {rho}");
                assert!(close(r.positions(1.0), 1.0, 1e-12));
            }
        }
    }

    #[test]
    fn independent_routing_is_the_expected_union() {
        let r = Routing::independent(32, 16);
        // E·(1 − (1 − k/E)^m): 16, 24, 28, 30 … 32 · (1 − 2^−m)
        for m in 1..=8 {
            let want = 32.0 * (1.0 - 0.5f64.powi(m));
            assert!(close(r.distinct(m as f64), want, 1e-12), "m = {m}");
        }
        // released geometry: 8 positions read 120.3 distinct experts of 896, not 128
        let released = Routing::independent(896, 16);
        let want = 896.0 * (1.0 - (1.0 - 16.0 / 896.0f64).powi(8));
        assert!(close(released.distinct(8.0), want, 1e-12));
        assert!((released.distinct(8.0) - 120.27).abs() < 0.01);
    }

    #[test]
    fn every_expert_routed_reads_k_whatever_m() {
        let r = Routing::independent(16, 16);
        for m in [1.0, 2.0, 8.0, 3.5] {
            assert!(close(r.distinct(m), 16.0, 1e-12));
        }
        // full correlation: one position's experts repeated
        let same = Routing::independent(896, 16).with_correlation(1.0);
        assert!(close(same.distinct(8.0), 16.0, 1e-12));
    }

    #[test]
    fn without_bound_on_experts_positions_add_minus_the_kept_fraction() {
        // E → ∞: m·k independent, k·(1 + (m−1)(1−ρ)) correlated
        let huge = 1e12;
        for m in 1..=8 {
            let mf = m as f64;
            let r = Routing::independent(huge as usize, 16);
            assert!(close(r.distinct(mf), 16.0 * mf, 1e-6), "m = {m}");
            let c = r.with_correlation(0.3);
            assert!(close(c.distinct(mf), 16.0 * (1.0 + (mf - 1.0) * 0.7), 1e-6));
        }
    }

    #[test]
    fn correlation_only_lowers_the_union_and_it_never_exceeds_e() {
        let base = Routing::independent(32, 4);
        for m in 1..=12 {
            let mf = m as f64;
            let mut last = f64::INFINITY;
            for rho in [0.0, 0.2, 0.5, 0.9, 1.0] {
                let d = base.with_correlation(rho).distinct(mf);
                assert!(d <= last + 1e-12 && (4.0 - 1e-12..=32.0).contains(&d));
                last = d;
            }
        }
        // a Monte Carlo of the chain agrees with the closed form (fixed seed, 20k trials)
        let (e, k, rho, m) = (32usize, 4usize, 0.5f64, 5usize);
        let mut rng = 0x1234_5678u64;
        let mut uniform = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let p = k as f64 / e as f64;
        let trials = 20_000;
        let mut total = 0usize;
        for _ in 0..trials {
            let mut seen = vec![false; e];
            let mut now: Vec<bool> = (0..e).map(|_| uniform() < p).collect();
            for step in 0..m {
                if step > 0 {
                    for x in now.iter_mut() {
                        if uniform() >= rho {
                            *x = uniform() < p;
                        }
                    }
                }
                for (s, &x) in seen.iter_mut().zip(&now) {
                    *s |= x;
                }
            }
            total += seen.iter().filter(|&&s| s).count();
        }
        let mc = total as f64 / trials as f64;
        let want = base.with_correlation(rho).distinct(m as f64);
        assert!((mc - want).abs() < 0.1, "monte carlo {mc} vs {want}");
    }
}
