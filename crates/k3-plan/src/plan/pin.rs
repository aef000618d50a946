//! Which trunk layers to pin, and the streaming ring that serves the rest.
//!
//! # The choice
//!
//! Every token walks layers 0..93 in order, so a pinned layer is a guaranteed hit and an
//! unpinned one is a guaranteed read (`align4096(run)` bytes per token). The ring slot must
//! hold the largest *unpinned* layer, so pinning a big layer can shrink every ring slot.
//! [`plan_trunk`] minimises the bytes streamed per token exactly: for every candidate slot
//! size `S` (each distinct per-layer slot need, i.e. each layer as "largest unpinned") it
//! pins every layer needing more than `S`, then fills the remaining budget with the subset
//! of the other layers that streams the fewest bytes — a bounded knapsack over classes of
//! identical layers (the released model has three: the dense layer 0, KDA+MoE, MLA+MoE), so
//! the search is exhaustive and instant. It keeps the best candidate (ties: least memory).
//!
//! Measured on the released layer profile ([`ModelSizes::k3_estimate`]: layer 0 2.341 GB,
//! 68 KDA+MoE layers 1.268 GB, 24 MLA+MoE layers 0.844 GB, widen bound 25.9 MB per layer —
//! the per-class sizes are computed from the released tensor shapes and reproduce the
//! 108.81 GB total; upstream's "runs 1.15 GB minimum" does not fit that total, so MLA layers
//! are taken at their computed 0.844 GB), 2 ring slots, GB/token streamed:
//!
//! | trunk budget | prefix (Rust port) | largest-first (C v1.0.0) | optimal (this) | optimal plan |
//! |---|---|---|---|---|
//! | 3 GB | 108.81 | 108.81 | 108.81 | ring of 2 pieces (0.89 + 1.48 GB), 0 pinned |
//! | 5 GB | 108.81 | 108.81 | 106.47 | ring 2 x 1.29 GB, 1 pinned |
//! | 10 GB | 101.82 | 102.67 | 101.82 | ring 2 x 1.29 GB, 5 pinned |
//! | 16 GB | 95.91 | 96.33 | 95.91 | ring 2 x 1.29 GB, 10 pinned |
//! | 30 GB | 83.23 | 82.38 | 81.96 | ring 2 x 1.29 GB, 21 pinned |
//! | 60 GB | 52.81 | 53.23 | 52.80 | ring 2 x 1.29 GB, 44 pinned |
//! | 100 GB | 13.52 | 12.67 | 12.67 | ring 2 x 0.87 GB, 78 pinned |
//! | 110 GB | 4.22 | 3.38 | 3.38 | ring 2 x 0.87 GB, 89 pinned |
//!
//! (From the `real_profile_comparison` test in `tests/plan.rs`.) Neither upstream order is
//! best everywhere: largest-first ends streaming the big KDA layers but stops at the first
//! layer that does not fit, while prefix happens to mix in MLA layers (every 4th) that fill
//! the leftover. At 5 GB both keep the 2.37 GB dense layer in a 2-slot ring and pin nothing;
//! pinning it halves the slot and frees room. The exact choice is never worse (proptest
//! against brute force in `tests/plan.rs`) and saves up to 2.3 GB/token here.
//!
//! [`ModelSizes::k3_estimate`]: crate::ModelSizes::k3_estimate

use super::align4096;

/// Per-layer costs seen by the pinning choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LayerCost {
    /// Bytes of memory when pinned: `align4096(run) + widen`.
    pub pinned: u64,
    /// Bytes read per token when streamed: `align4096(run)`.
    pub streamed: u64,
    /// Ring-slot size this layer needs when streamed: `align4096(align4096(run) + widen)`.
    pub slot: u64,
    /// Slot sizes of the layer's two pieces when it can stream in pieces (the token mixer's
    /// tensors, then the channel mixer's: docs/STREAMING.md#trunk-pieces), in the order the
    /// pass uses them; the widen area is counted with the second. `None`: whole layers only.
    pub pieces: Option<[u64; 2]>,
}

impl LayerCost {
    /// Costs of a layer whose run is `run` bytes with a widen area of `widen` bytes.
    pub fn new(run: u64, widen: u64) -> Self {
        let a = align4096(run);
        Self {
            pinned: a + widen,
            streamed: a,
            slot: align4096(a + widen),
            pieces: None,
        }
    }

    /// [`LayerCost::new`] for a layer whose run splits into a token-mixer piece of `mixer`
    /// bytes and a channel-mixer piece of `channel` bytes. A piece keeps its file offset
    /// modulo 4096 in its slot, so each slot has one page of margin.
    pub fn with_pieces(run: u64, widen: u64, mixer: u64, channel: u64) -> Self {
        let slot = |b: u64| align4096(b) + 4096;
        Self {
            pieces: Some([slot(mixer), align4096(slot(channel) + widen)]),
            ..Self::new(run, widen)
        }
    }
}

/// Where the trunk lives: pinned layers and the ring that streams the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrunkPlan {
    /// Pinned layer indices, ascending.
    pub pinned: Vec<usize>,
    /// Ring slots (0 when every layer is pinned).
    pub ring_slots: usize,
    /// Bytes per ring slot (0 when every layer is pinned; a ring of pieces: its largest).
    pub ring_slot_bytes: u64,
    /// Bytes of the pinned layers.
    pub pinned_bytes: u64,
    /// Bytes read from disk per token (all unpinned layers).
    pub streamed_per_token: u64,
    /// True when the ring was held at 1 slot (no background reader) because 2 did not fit.
    pub single_slot_forced: bool,
    /// A ring of pieces instead of whole layers: one slot per piece class (token mixer, then
    /// channel mixer), these bytes each; the next piece is read while the current one
    /// computes. Empty: a ring of `ring_slots` whole-layer slots.
    pub piece_slot_bytes: Vec<u64>,
}

impl TrunkPlan {
    /// Bytes of the ring.
    pub fn ring_bytes(&self) -> u64 {
        if self.piece_slot_bytes.is_empty() {
            self.ring_slots as u64 * self.ring_slot_bytes
        } else {
            self.piece_slot_bytes.iter().sum()
        }
    }

    /// Whether a background reader reads the next layer or piece while the current one
    /// computes (a ring of ≥ 2 slots of any kind).
    pub fn reads_ahead(&self) -> bool {
        self.ring_slots >= 2
    }

    /// Bytes of the whole trunk allocation (pinned + ring).
    pub fn total_bytes(&self) -> u64 {
        self.pinned_bytes + self.ring_bytes()
    }

    /// Builds the plan for `pinned` (a mask over `layers`) with `ring` slots (`Ring::Pieces`:
    /// one slot per piece class).
    fn from_mask(layers: &[LayerCost], pinned: &[bool], ring: Ring, forced: bool) -> Self {
        let unpinned = || {
            layers
                .iter()
                .zip(pinned)
                .filter(|(_, &p)| !p)
                .map(|(l, _)| l)
        };
        let slot = unpinned().map(|l| l.slot).max().unwrap_or(0);
        let piece_slot_bytes = match ring {
            Ring::Pieces if slot > 0 => piece_maxima(unpinned()).to_vec(),
            _ => Vec::new(),
        };
        let ring = match ring {
            _ if slot == 0 => 0,
            Ring::Whole(r) => r,
            Ring::Pieces => piece_slot_bytes.len(),
        };
        Self {
            pinned: (0..layers.len()).filter(|&i| pinned[i]).collect(),
            ring_slots: ring,
            ring_slot_bytes: match (ring, piece_slot_bytes.iter().max()) {
                (0, _) => 0,
                (_, Some(&largest)) => largest,
                (_, None) => slot,
            },
            pinned_bytes: layers
                .iter()
                .zip(pinned)
                .filter(|p| *p.1)
                .map(|p| p.0.pinned)
                .sum(),
            streamed_per_token: unpinned().map(|l| l.streamed).sum(),
            single_slot_forced: forced,
            piece_slot_bytes,
        }
    }

    fn better_than(&self, other: &TrunkPlan) -> bool {
        (self.streamed_per_token, self.total_bytes())
            < (other.streamed_per_token, other.total_bytes())
    }
}

/// The ring's kind: `R` whole-layer slots, or one slot per piece class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ring {
    Whole(usize),
    Pieces,
}

/// Largest piece slot of each class among `layers` (every layer must have pieces).
fn piece_maxima<'a>(layers: impl Iterator<Item = &'a LayerCost>) -> [u64; 2] {
    layers.fold([0, 0], |m, l| {
        let p = l.pieces.unwrap_or([l.slot, 0]);
        [m[0].max(p[0]), m[1].max(p[1])]
    })
}

/// Which layers to pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinStrategy {
    /// Exact minimum of streamed bytes (the engine's choice; see the module docs).
    Optimal,
    /// Upstream Rust port: layers 0, 1, 2, … while they fit.
    Prefix,
    /// Upstream C v1.0.0: largest runs first while they fit.
    LargestFirst,
}

/// Plans the trunk for a budget of `budget` bytes with the exact strategy. See
/// [`plan_trunk_with`].
pub fn plan_trunk(layers: &[LayerCost], budget: u64, ring_want: usize) -> Option<TrunkPlan> {
    plan_trunk_with(layers, budget, ring_want, PinStrategy::Optimal)
}

/// Plans the trunk: everything pinned if it fits; otherwise the most ring slots up to
/// `ring_want` (≥ 1) that fit, and the strategy's pinned set. Where `ring_want` whole-layer
/// slots do not fit but every layer streams in pieces, a ring of one slot per piece class
/// (about one layer's bytes, read-ahead on) is tried before a single whole-layer slot; a
/// 1-slot ring when 2 were wanted is flagged. `None` when not even one ring slot fits.
pub fn plan_trunk_with(
    layers: &[LayerCost],
    budget: u64,
    ring_want: usize,
    strategy: PinStrategy,
) -> Option<TrunkPlan> {
    if layers.iter().map(|l| l.pinned).sum::<u64>() <= budget {
        let all = vec![true; layers.len()];
        return Some(TrunkPlan::from_mask(layers, &all, Ring::Whole(0), false));
    }
    let ring_want = ring_want.max(1);
    let pieces = ring_want > 1 && layers.iter().all(|l| l.pieces.is_some());
    let mut rings: Vec<Ring> = (2..=ring_want).rev().map(Ring::Whole).collect();
    rings.extend(pieces.then_some(Ring::Pieces));
    rings.push(Ring::Whole(1));
    rings.into_iter().find_map(|ring| {
        let forced = ring == Ring::Whole(1) && ring_want > 1;
        let mask = match strategy {
            PinStrategy::Optimal => optimal_mask(layers, budget, ring)?,
            PinStrategy::Prefix => ordered_mask(layers, budget, ring, &prefix_order(layers))?,
            PinStrategy::LargestFirst => {
                ordered_mask(layers, budget, ring, &largest_first_order(layers))?
            }
        };
        Some(TrunkPlan::from_mask(layers, &mask, ring, forced))
    })
}

/// Ring bytes when the layers streamed are `unpinned` (for `Ring::Whole(r)`, `r` slots of
/// the largest).
fn ring_cost<'a>(ring: Ring, unpinned: impl Iterator<Item = &'a LayerCost>) -> u64 {
    match ring {
        Ring::Whole(r) => r as u64 * unpinned.map(|l| l.slot).max().unwrap_or(0),
        Ring::Pieces => piece_maxima(unpinned).iter().sum(),
    }
}

/// The smallest trunk budget for which any plan exists (one ring slot, or one slot per piece
/// class when every layer streams in pieces, with every layer whose slot need exceeds the
/// chosen slot pinned).
pub fn min_trunk_budget(layers: &[LayerCost]) -> u64 {
    let all: u64 = layers.iter().map(|l| l.pinned).sum();
    let pieces = layers.iter().all(|l| l.pieces.is_some());
    distinct_slots(layers)
        .into_iter()
        .map(|s| {
            let streamable = || layers.iter().filter(move |l| l.slot <= s);
            let ring = match pieces {
                true => s.min(ring_cost(Ring::Pieces, streamable())),
                false => s,
            };
            ring + forced_cost(layers, s)
        })
        .min()
        .unwrap_or(0)
        .min(all)
}

fn distinct_slots(layers: &[LayerCost]) -> Vec<u64> {
    let mut s: Vec<u64> = layers.iter().map(|l| l.slot).collect();
    s.sort_unstable();
    s.dedup();
    s
}

fn forced_cost(layers: &[LayerCost], slot: u64) -> u64 {
    layers
        .iter()
        .filter(|l| l.slot > slot)
        .map(|l| l.pinned)
        .sum()
}

/// Exact choice for `ring` slots: best over every candidate slot size. (A piece ring is
/// costed from every layer that may stream at that size, a bound the plan never exceeds.)
fn optimal_mask(layers: &[LayerCost], budget: u64, ring: Ring) -> Option<Vec<bool>> {
    let mut best: Option<(TrunkPlan, Vec<bool>)> = None;
    for s in distinct_slots(layers) {
        let streamable = layers.iter().filter(|l| l.slot <= s);
        let fixed = ring_cost(ring, streamable) + forced_cost(layers, s);
        let Some(room) = budget.checked_sub(fixed) else {
            continue;
        };
        let eligible: Vec<usize> = (0..layers.len()).filter(|&i| layers[i].slot <= s).collect();
        let mut mask: Vec<bool> = layers.iter().map(|l| l.slot > s).collect();
        for i in knapsack(layers, &eligible, room) {
            mask[i] = true;
        }
        let plan = TrunkPlan::from_mask(layers, &mask, ring, false);
        if best.as_ref().is_none_or(|(b, _)| plan.better_than(b)) {
            best = Some((plan, mask));
        }
    }
    best.map(|(_, m)| m)
}

/// Layers of `eligible` to pin within `room` bytes, maximising the streamed bytes saved.
/// Identical layers form classes; a depth-first search over per-class counts with a
/// fractional upper bound is exact (bounded by `NODE_LIMIT` nodes, which instances with a
/// handful of classes — the real model — never approach; past it the best found is kept).
fn knapsack(layers: &[LayerCost], eligible: &[usize], room: u64) -> Vec<usize> {
    let mut classes: Vec<(LayerCost, Vec<usize>)> = Vec::new();
    for &i in eligible {
        match classes.iter_mut().find(|(c, _)| *c == layers[i]) {
            Some((_, members)) => members.push(i),
            None => classes.push((layers[i], vec![i])),
        }
    }
    // Best value density first, then larger first.
    classes.sort_by(|(a, _), (b, _)| {
        let (x, y) = (
            a.streamed as u128 * b.pinned as u128,
            b.streamed as u128 * a.pinned as u128,
        );
        y.cmp(&x).then(b.streamed.cmp(&a.streamed))
    });
    let mut search = Search {
        classes: &classes,
        counts: vec![0; classes.len()],
        best_counts: vec![0; classes.len()],
        best_value: 0,
        nodes: 0,
    };
    search.dfs(0, room, 0);
    let counts = search.best_counts;
    classes
        .iter()
        .zip(counts)
        .flat_map(|((_, members), n)| members[..n].to_vec())
        .collect()
}

const NODE_LIMIT: u64 = 2_000_000;

struct Search<'a> {
    classes: &'a [(LayerCost, Vec<usize>)],
    counts: Vec<usize>,
    best_counts: Vec<usize>,
    best_value: u64,
    nodes: u64,
}

impl Search<'_> {
    fn dfs(&mut self, k: usize, room: u64, value: u64) {
        self.nodes += 1;
        if value > self.best_value {
            self.best_value = value;
            self.best_counts.clone_from(&self.counts);
        }
        if k == self.classes.len() || self.nodes > NODE_LIMIT {
            return;
        }
        if value + self.bound(k, room) <= self.best_value {
            return;
        }
        let (cost, members) = &self.classes[k];
        let max_n = (room / cost.pinned.max(1)).min(members.len() as u64) as usize;
        for n in (0..=max_n).rev() {
            self.counts[k] = n;
            let used = n as u64 * cost.pinned;
            self.dfs(k + 1, room - used, value + n as u64 * cost.streamed);
        }
        self.counts[k] = 0;
    }

    /// Fractional-knapsack upper bound of the value still obtainable from classes `k..`.
    fn bound(&self, k: usize, mut room: u64) -> u64 {
        let mut v = 0u128;
        for (c, members) in &self.classes[k..] {
            let total = c.pinned * members.len() as u64;
            if total <= room {
                room -= total;
                v += c.streamed as u128 * members.len() as u128;
            } else {
                v += (c.streamed as u128 * room as u128).div_ceil(c.pinned.max(1) as u128);
                break;
            }
        }
        v.min(u64::MAX as u128) as u64
    }
}

fn prefix_order(layers: &[LayerCost]) -> Vec<usize> {
    (0..layers.len()).collect()
}

fn largest_first_order(layers: &[LayerCost]) -> Vec<usize> {
    let mut o = prefix_order(layers);
    o.sort_by(|&a, &b| layers[b].streamed.cmp(&layers[a].streamed).then(a.cmp(&b)));
    o
}

/// Upstream's fixed point: slot from the largest unpinned layer, pin in `order` while the
/// next layer fits, repeat until stable (≤ 4 passes).
fn ordered_mask(
    layers: &[LayerCost],
    budget: u64,
    ring: Ring,
    order: &[usize],
) -> Option<Vec<bool>> {
    let mut mask = vec![false; layers.len()];
    let mut feasible = false;
    for _ in 0..4 {
        let unpinned = (0..layers.len()).filter(|&i| !mask[i]).map(|i| &layers[i]);
        let mut spent = ring_cost(ring, unpinned);
        if spent > budget {
            break;
        }
        feasible = true;
        let mut next = vec![false; layers.len()];
        for &i in order {
            if spent + layers[i].pinned > budget {
                break;
            }
            spent += layers[i].pinned;
            next[i] = true;
        }
        if next == mask {
            break;
        }
        mask = next;
    }
    feasible.then_some(mask)
}
