//! The block drafter's cost model (docs/STREAMING.md#dspark-block-drafts): what a verifying
//! pass of `n` drafts costs and what it is expected to yield. One model serves the drafter's
//! rule ([`PassCost::choose`]) and the benchmark's prediction ([`PassCost::per_token`]).
//!
//! Bytes: a pass over `m = n+1` positions reads `S + u(m)·X` — `S` the trunk, once whatever
//! its positions, `X` one position's routed experts, and `u(m)` the union of the positions'
//! experts in units of one position's ([`Routing::positions`]: each expert a pass routes to
//! is read once; `E·(1 − (1 − k/E)^m)/k` under independent routing, `m` when positions never
//! share an expert). Time, when the rates are known (measured by `cargo xtask bench-dspark`):
//! `T_S + u(m)·T_X + m·T_c + T_d` with `T_X = X / expert read rate`, `T_c` the compute each
//! position adds, `T_d` one DSpark block pass, and `T_S` the rest of a pass: measured as a
//! one-position pass's wall time less its expert and position terms when known
//! ([`Rates::pass_wall`]) — the trunk's reads overlap compute (read-ahead of the next piece)
//! and may come from a cache, so they are not `S / disk rate` added to compute — else
//! `S / disk rate + the pass's shared compute`. Expected tokens: `1 + Σ_{i≤n} Π_{j≤i} c_j` for per-draft acceptance
//! estimates `c_j`. The drafter verifies the `n` that maximises tokens per second when the
//! time terms are known, else tokens per byte.

use super::routing::Routing;

/// The cost of one verifying pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassCost {
    /// Bytes a pass reads whatever its positions (the trunk).
    pub shared: f64,
    /// Bytes of one position's routed experts (`X`).
    pub per_position: f64,
    /// How the positions' experts overlap (`None`: never — each position's read apart).
    pub routing: Option<Routing>,
    /// The time terms, when the rates are known.
    pub seconds: Option<PassSeconds>,
}

/// Seconds of a verifying pass over `m` positions: `shared + u(m)·experts + m·per_position
/// + draft` (`u(m)`: [`PassCost::expert_positions`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassSeconds {
    /// Seconds a pass takes whatever its positions (the trunk's reads and shared compute).
    pub shared: f64,
    /// Seconds of reading one position's experts (`X / expert read rate`).
    pub experts: f64,
    /// Compute seconds each position adds.
    pub per_position: f64,
    /// Seconds of the DSpark pass that proposes the block.
    pub draft: f64,
}

/// Measured rates the time terms come from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Trunk bytes per second read from disk (whole layer runs).
    pub trunk_disk: f64,
    /// Expert bytes per second read from disk (one expert per read, the store's depth).
    pub expert_disk: f64,
    /// Compute seconds of a pass whatever its positions.
    pub compute_shared: f64,
    /// Compute seconds each position adds.
    pub compute_per_position: f64,
    /// Seconds of one DSpark block pass.
    pub draft: f64,
    /// Wall seconds of a one-position pass as the engine runs it (trunk reads however they
    /// overlap compute or hit a cache, its experts, its compute); 0 when not measured.
    pub pass_wall: f64,
}

/// What the model predicts per generated token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerToken {
    /// Bytes read per generated token.
    pub bytes: f64,
    /// Seconds per generated token (when the time terms are known).
    pub seconds: Option<f64>,
}

impl PassCost {
    /// The byte model alone, each position's experts read apart (`u(m) = m`).
    pub fn bytes_only(shared: f64, per_position: f64) -> PassCost {
        PassCost {
            shared,
            per_position,
            routing: None,
            seconds: None,
        }
    }

    /// This model with a pass reading the union of its positions' experts under `routing`.
    pub fn with_routing(self, routing: Routing) -> PassCost {
        PassCost {
            routing: Some(routing),
            ..self
        }
    }

    /// `u(m)`: the expert bytes of a pass over `m` positions in units of one position's
    /// (`m` may be fractional, an average).
    pub fn expert_positions(&self, m: f64) -> f64 {
        match self.routing {
            Some(r) => r.positions(m),
            None => m.max(1.0),
        }
    }

    /// This model with the time terms of `rates` (`shared` and `per_position` are the bytes
    /// read from disk).
    pub fn with_rates(self, r: &Rates) -> PassCost {
        let per = |bytes: f64, rate: f64| if rate > 0.0 { bytes / rate } else { 0.0 };
        let experts = per(self.per_position, r.expert_disk);
        let shared = match r.pass_wall > 0.0 {
            // a one-position pass reads u(1) = 1 position's experts
            true => (r.pass_wall - experts - r.compute_per_position).max(r.compute_shared),
            false => per(self.shared, r.trunk_disk) + r.compute_shared,
        };
        PassCost {
            seconds: Some(PassSeconds {
                shared,
                experts,
                per_position: r.compute_per_position,
                draft: r.draft,
            }),
            ..self
        }
    }

    /// Bytes of a pass over `m` positions.
    fn bytes_of(&self, m: f64) -> f64 {
        self.shared + self.expert_positions(m) * self.per_position
    }

    /// Seconds of a pass over `m` positions (`drafted`: a DSpark pass proposed its drafts).
    fn seconds_of(&self, m: f64, drafted: bool) -> Option<f64> {
        let u = self.expert_positions(m);
        self.seconds.map(|s| {
            s.shared + u * s.experts + m * s.per_position + if drafted { s.draft } else { 0.0 }
        })
    }

    /// Bytes of a pass verifying `n` drafts.
    pub fn bytes(&self, n: usize) -> f64 {
        self.bytes_of((n + 1) as f64)
    }

    /// Seconds of a pass verifying `n` drafts (`drafted`: a DSpark pass proposed them).
    pub fn seconds(&self, n: usize, drafted: bool) -> Option<f64> {
        self.seconds_of((n + 1) as f64, drafted)
    }

    /// Expected tokens of a pass verifying `n` drafts with acceptance estimates `conf[..n]`.
    pub fn expected_tokens(conf: &[f32], n: usize) -> f64 {
        let mut alive = 1.0f64;
        let mut tokens = 1.0f64;
        for &c in &conf[..n] {
            alive *= c.clamp(0.0, 1.0) as f64;
            tokens += alive;
        }
        tokens
    }

    /// Expected tokens per byte when `n` drafts with confidences `conf[..n]` are verified.
    pub fn tokens_per_byte(&self, conf: &[f32], n: usize) -> f64 {
        Self::expected_tokens(conf, n) / self.bytes(n)
    }

    /// The number of drafts to verify, `0 ..= cap.min(conf.len())`, maximising
    /// [`PassCost::gain`] (ties go to fewer).
    pub fn choose(&self, conf: &[f32], cap: usize) -> usize {
        let cap = cap.min(conf.len());
        let mut best = (0, self.gain(conf, 0));
        for n in 1..=cap {
            let g = self.gain(conf, n);
            if g > best.1 {
                best = (n, g);
            }
        }
        best.0
    }

    /// Expected tokens per second (per byte without time terms) of a pass feeding its own
    /// token and `n` drafts with acceptance estimates `conf[..n]`. A rejection costs only
    /// this pass's positions past it: the drafts are tentative (k3_model::journal), the
    /// accepted ones enter the state without another pass, and the next pass feeds nothing
    /// again.
    pub fn gain(&self, conf: &[f32], n: usize) -> f64 {
        let m = (n + 1) as f64;
        let tokens = Self::expected_tokens(conf, n);
        match self.seconds_of(m, true) {
            Some(t) if t > 0.0 => tokens / t,
            _ => tokens / self.bytes_of(m),
        }
    }

    /// Bytes and seconds per generated token when passes verify `verified` drafts on average
    /// and yield `tau` tokens each (`drafted`: every pass runs the DSpark draft; plain
    /// decoding is `tau = 1, verified = 0, drafted = false`): [`Self::per_token_at`] with
    /// `verified + 1` positions per pass.
    pub fn per_token(&self, tau: f64, verified: f64, drafted: bool) -> PerToken {
        self.per_token_at(tau, verified.max(0.0) + 1.0, drafted)
    }

    /// Bytes and seconds per generated token when passes carry `positions` positions on
    /// average and yield `tau` tokens each (a pass carries its own token and its verified
    /// drafts). The union is taken at the average pass (`u(positions)`); `u` is concave, so
    /// passes of unequal sizes read a little less than this.
    pub fn per_token_at(&self, tau: f64, positions: f64, drafted: bool) -> PerToken {
        let tau = tau.max(f64::MIN_POSITIVE);
        let m = positions.max(1.0);
        PerToken {
            bytes: self.bytes_of(m) / tau,
            seconds: self.seconds_of(m, drafted).map(|s| s / tau),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The released model's ratio: trunk 108.8 GB read once per pass, 16 experts × 92 MoE
    /// layers × 17.5 MB = 25.8 GB per position (docs/STREAMING.md#dspark-block-drafts).
    const RELEASED: PassCost = PassCost {
        shared: 108.8e9,
        per_position: 25.8e9,
        routing: None,
        seconds: None,
    };

    #[test]
    fn the_cost_model_verifies_while_the_expected_gain_pays() {
        // confident drafts: every one pays at 0.97 and at 0.9 (a pass's 7th draft at 0.9 adds
        // 0.9^7 = 0.48 token for 25.8 GB beside the 289 GB pass: 1.807 vs 1.803 per 100 GB)
        assert_eq!(RELEASED.choose(&[0.97; 7], 7), 7);
        assert_eq!(RELEASED.choose(&[0.9; 7], 7), 7);
        assert_eq!(RELEASED.choose(&[0.9; 7], 3), 3, "draft_max caps");
        // hopeless drafts: none pays (the first costs 25.8 GB for an expected 0.05 token)
        assert_eq!(RELEASED.choose(&[0.05; 7], 7), 0);
        // falling confidence: stop where the next draft's survival is worth less than its
        // bytes (tokens per 100 GB 0.74, 1.19, 1.41, 1.44, 1.34: the fourth does not pay)
        let falling = [0.9, 0.8, 0.6, 0.3, 0.1, 0.1, 0.1];
        let n = RELEASED.choose(&falling, 7);
        assert_eq!(n, 3);
        assert!(RELEASED.gain(&falling, 3) > RELEASED.gain(&falling, 4));
        assert_eq!(
            RELEASED.gain(&falling, 3),
            RELEASED.tokens_per_byte(&falling, 3),
            "without time terms: tokens per byte"
        );
        // with every byte per position (shared = 0) a draft pays only when certain
        let flat = PassCost::bytes_only(0.0, 1.0);
        assert_eq!(flat.choose(&[0.99; 7], 7), 0);
    }

    #[test]
    fn time_terms_follow_the_rates_and_steer_the_choice() {
        // 3 GB/s disk: the trunk 36.3 s, a position's experts 8.6 s (+ 0.5 s compute)
        let rates = Rates {
            trunk_disk: 3e9,
            expert_disk: 3e9,
            compute_shared: 1.0,
            compute_per_position: 0.5,
            draft: 0.2,
            pass_wall: 0.0,
        };
        let timed = RELEASED.with_rates(&rates);
        let s = timed.seconds.unwrap();
        assert!((s.shared - (108.8e9 / 3e9 + 1.0)).abs() < 1e-9);
        assert!((s.experts - 25.8e9 / 3e9).abs() < 1e-9);
        assert_eq!(s.per_position, 0.5);
        let pos = s.experts + s.per_position;
        assert_eq!(timed.seconds(0, false), Some(s.shared + pos));
        assert_eq!(timed.seconds(2, true), Some(s.shared + 3.0 * pos + 0.2));
        // plain decoding: one pass per token, no draft
        let plain = timed.per_token(1.0, 0.0, false);
        assert_eq!(plain.bytes, 108.8e9 + 25.8e9);
        assert_eq!(plain.seconds, Some(s.shared + pos));
        // τ = 3.3 with 7 verified: (S + 8X)/3.3 bytes, (T_S + 8 T_X + T_d)/3.3 seconds
        let block = timed.per_token(3.3, 7.0, true);
        assert!((block.bytes - (108.8e9 + 8.0 * 25.8e9) / 3.3).abs() < 1.0);
        let want = (s.shared + 8.0 * pos + 0.2) / 3.3;
        assert!((block.seconds.unwrap() - want).abs() < 1e-9);
        // the draft pass is paid whatever is verified: a dear one makes verifying more pay
        let dear = RELEASED.with_rates(&Rates {
            draft: 1e3,
            ..rates
        });
        assert_eq!(timed.choose(&[0.15; 7], 7), 0);
        assert_eq!(dear.choose(&[0.15; 7], 7), 2);
        assert_eq!(timed.choose(&[0.3; 7], 7), 1);
        assert_eq!(timed.choose(&[0.9; 7], 7), 7);
        // expensive compute per position pushes the choice down
        let busy = PassCost::bytes_only(1e9, 1e6).with_rates(&Rates {
            compute_per_position: 10.0,
            ..rates
        });
        assert_eq!(busy.choose(&[0.6; 7], 7), 0);
        assert!(PassCost::bytes_only(1e9, 1e6).choose(&[0.6; 7], 7) > 0);
    }

    /// A measured one-position pass replaces `S / disk + shared compute`: plain decoding is
    /// predicted at that wall time, and a longer pass adds its experts, positions and draft.
    #[test]
    fn a_measured_pass_sets_the_shared_term() {
        let rates = Rates {
            trunk_disk: 1e9,
            expert_disk: 1e9,
            compute_shared: 0.25,
            compute_per_position: 0.15,
            draft: 0.5,
            pass_wall: 1.8,
        };
        let union = PassCost::bytes_only(6.5e9, 0.25e9).with_routing(Routing::independent(32, 16));
        let timed = union.with_rates(&rates);
        let s = timed.seconds.unwrap();
        assert!((s.shared - (1.8 - 0.25 - 0.15)).abs() < 1e-12);
        let plain = timed.per_token(1.0, 0.0, false).seconds.unwrap();
        assert!((plain - 1.8).abs() < 1e-12);
        let two = timed.seconds(1, true).unwrap();
        assert!((two - (1.8 + 0.5 * 0.25 + 0.15 + 0.5)).abs() < 1e-12);
        // a wall below the pass's own compute keeps the compute
        let fast = union.with_rates(&Rates {
            pass_wall: 0.1,
            ..rates
        });
        assert_eq!(fast.seconds.unwrap().shared, 0.25);
    }

    #[test]
    fn a_pass_reads_the_union_of_its_positions_experts() {
        // the bench model's layer: 32 experts, top 16 — two positions read 24, not 32
        let x = 1.0e9;
        let union = PassCost::bytes_only(6.5e9, x).with_routing(Routing::independent(32, 16));
        assert_eq!(union.bytes(0), 6.5e9 + x, "one position: its own experts");
        assert!((union.bytes(1) - (6.5e9 + 1.5 * x)).abs() < 1e-3);
        assert!((union.bytes(7) - (6.5e9 + 2.0 * (1.0 - 0.5f64.powi(8)) * x)).abs() < 1e-3);
        // per_token takes the union at the average pass; plain decoding is unchanged
        assert_eq!(union.per_token(1.0, 0.0, false).bytes, 6.5e9 + x);
        let m = 3.4 + 1.0;
        let want = (6.5e9 + 2.0 * (1.0 - 0.5f64.powf(m)) * x) / 2.2;
        assert!((union.per_token(2.2, 3.4, true).bytes - want).abs() < 1e-3);
        // the timed model: expert reads follow the union, compute every position
        let rates = Rates {
            trunk_disk: 1e9,
            expert_disk: 1e9,
            compute_shared: 1.0,
            compute_per_position: 0.25,
            draft: 2.0,
            pass_wall: 0.0,
        };
        let timed = union.with_rates(&rates);
        let want = 6.5 + 1.0 + 1.5 * 1.0 + 2.0 * 0.25 + 2.0;
        assert!((timed.seconds(1, true).unwrap() - want).abs() < 1e-12);
        // a draft's expert bytes fall as the union fills: verifying pays sooner than the
        // per-position model says (a draft at 0.1 pays with the union, not apart)
        let apart = PassCost::bytes_only(6.5e9, x);
        assert_eq!(apart.choose(&[0.1; 7], 7), 0);
        assert!(union.choose(&[0.1; 7], 7) > 0);
        // released geometry: 8 positions read 7.52 positions' experts
        let released = RELEASED.with_routing(Routing::independent(896, 16));
        let u = released.expert_positions(8.0);
        assert!((u - 7.517).abs() < 0.001, "{u}");
        assert!(released.bytes(7) < RELEASED.bytes(7));
        // the rule's choices at the released geometry stay those of the docs' example
        assert_eq!(released.choose(&[0.9, 0.8, 0.6, 0.3, 0.1, 0.1, 0.1], 7), 3);
        assert_eq!(released.choose(&[0.9; 7], 7), 7);
        assert_eq!(released.choose(&[0.05; 7], 7), 0);
        // correlation ρ lowers it further, and ρ = 1 reads one position's experts
        let rho = RELEASED.with_routing(Routing::independent(896, 16).with_correlation(0.3));
        assert!(rho.bytes(7) < released.bytes(7));
        let same = RELEASED.with_routing(Routing::independent(896, 16).with_correlation(1.0));
        assert!((same.bytes(7) - RELEASED.bytes(0)).abs() < 1.0);
    }
}
