//! Replacement policies for the routed-expert cache.
//!
//! A policy only decides *which* resident expert to evict; the slot bookkeeping (which key
//! lives in which slot, which slots are pinned or in flight) lives in
//! [`SlotTable`](crate::SlotTable). The contract, per request, is:
//!
//! * resident key requested → [`ReplacementPolicy::on_hit`];
//! * missing key, cache full → [`ReplacementPolicy::choose_victim`] (never a pinned key),
//!   then [`ReplacementPolicy::on_evict`] for the victim;
//! * missing key becomes resident → [`ReplacementPolicy::on_insert`].
//!
//! Exactly one of `on_hit` / `on_insert` is called per request, in request order (the
//! offline [`Belady`] policy relies on that to know "now").

mod arc;
mod belady;
mod layer_lru;
mod lfu;
mod list;
mod lru;

pub use arc::Arc;
pub use belady::Belady;
pub use layer_lru::LayerLru;
pub use lfu::LfuDecay;
pub use lru::Lru;

use std::fmt;
use std::str::FromStr;

/// One routed expert: `(layer, expert)`, layer zero-based over all decoder layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertKey {
    /// Decoder layer index (zero-based; MoE layers are 1..=92 in the released model).
    pub layer: u32,
    /// Expert index within the layer (0..896 in the released model).
    pub expert: u32,
}

impl ExpertKey {
    /// Builds a key.
    pub fn new(layer: u32, expert: u32) -> Self {
        Self { layer, expert }
    }
}

/// The dense key space `layers × experts`, mapping keys to array indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySpace {
    /// Number of layers (keys use `layer < n_layers`).
    pub n_layers: u32,
    /// Experts per layer.
    pub n_experts: u32,
}

impl KeySpace {
    /// The released Kimi K3 model: 93 decoder layers (layer 0 is dense), 896 experts.
    pub const K3: KeySpace = KeySpace {
        n_layers: 93,
        n_experts: 896,
    };

    /// Number of keys in the space.
    pub fn len(&self) -> usize {
        self.n_layers as usize * self.n_experts as usize
    }

    /// True if the space holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `key` lies inside the space.
    pub fn contains(&self, key: ExpertKey) -> bool {
        key.layer < self.n_layers && key.expert < self.n_experts
    }

    /// Dense index of `key` (caller guarantees [`KeySpace::contains`]).
    pub fn index(&self, key: ExpertKey) -> usize {
        key.layer as usize * self.n_experts as usize + key.expert as usize
    }

    /// Inverse of [`KeySpace::index`].
    pub fn key(&self, index: usize) -> ExpertKey {
        let n = self.n_experts as usize;
        ExpertKey::new((index / n) as u32, (index % n) as u32)
    }
}

/// Pin counts: a pinned key (handed out for the batch being computed, or with a read in
/// flight) is never chosen as a victim.
#[derive(Clone, Debug)]
pub struct Pins {
    space: KeySpace,
    count: Vec<u16>,
}

impl Pins {
    /// No key pinned.
    pub fn new(space: KeySpace) -> Self {
        Self {
            space,
            count: vec![0; space.len()],
        }
    }

    /// Adds one pin to `key`.
    pub fn pin(&mut self, key: ExpertKey) {
        self.count[self.space.index(key)] += 1;
    }

    /// Removes one pin from `key` (no-op if it holds none).
    pub fn unpin(&mut self, key: ExpertKey) {
        let c = &mut self.count[self.space.index(key)];
        *c = c.saturating_sub(1);
    }

    /// Whether `key` holds at least one pin.
    pub fn is_pinned(&self, key: ExpertKey) -> bool {
        self.count[self.space.index(key)] > 0
    }

    /// Whether the key with dense index `index` is pinned.
    pub fn is_pinned_index(&self, index: usize) -> bool {
        self.count[index] > 0
    }
}

/// An expert-cache replacement policy over `(layer, expert)` keys. `Send`, so the expert
/// store's slot table can live behind a mutex shared with its I/O threads.
pub trait ReplacementPolicy: Send {
    /// Short name used in reports (`lru`, `opt`, …).
    fn name(&self) -> &str;
    /// A resident key was requested.
    fn on_hit(&mut self, key: ExpertKey);
    /// A key that missed has been made resident.
    fn on_insert(&mut self, key: ExpertKey);
    /// Chooses a resident, unpinned key to evict so that `incoming` can be inserted;
    /// `None` when every resident key is pinned.
    fn choose_victim(&mut self, incoming: ExpertKey, pins: &Pins) -> Option<ExpertKey>;
    /// `key` (returned by `choose_victim`) has been evicted.
    fn on_evict(&mut self, key: ExpertKey);
}

/// The policies this crate implements, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// Least recently used.
    Lru,
    /// Least frequently used with exponential decay (half-life in requests).
    Lfu {
        /// Requests after which an old use counts half.
        half_life: u32,
    },
    /// Adaptive Replacement Cache (Megiddo & Modha); the engine's default.
    Arc,
    /// LRU inside per-layer quotas of `capacity / layers` slots.
    LayerLru,
    /// Belady's optimal policy; needs the whole future, so simulator-only.
    Opt,
}

impl PolicyKind {
    /// The engine's default, chosen by replaying the upstream trace (docs/PERFORMANCE.md,
    /// "Expert cache policy"): ARC is never far below LRU and well above it at most preset
    /// cache sizes.
    pub const DEFAULT: PolicyKind = PolicyKind::Arc;

    /// The online policies plus OPT, in report order.
    pub fn all() -> Vec<PolicyKind> {
        vec![
            PolicyKind::Lru,
            PolicyKind::Lfu {
                half_life: LfuDecay::DEFAULT_HALF_LIFE,
            },
            PolicyKind::Arc,
            PolicyKind::LayerLru,
            PolicyKind::Opt,
        ]
    }

    /// Builds the policy for a cache of `capacity` keys. `future` is the whole request
    /// sequence, used only by [`PolicyKind::Opt`].
    pub fn build(
        self,
        space: KeySpace,
        capacity: usize,
        future: &[ExpertKey],
    ) -> Box<dyn ReplacementPolicy> {
        match self {
            PolicyKind::Lru => Box::new(Lru::new(space)),
            PolicyKind::Lfu { half_life } => Box::new(LfuDecay::new(space, half_life)),
            PolicyKind::Arc => Box::new(Arc::new(space, capacity)),
            PolicyKind::LayerLru => Box::new(LayerLru::new(space, capacity)),
            PolicyKind::Opt => Box::new(Belady::new(space, future)),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyKind::Lru => write!(f, "lru"),
            PolicyKind::Lfu { half_life } if *half_life == LfuDecay::DEFAULT_HALF_LIFE => {
                write!(f, "lfu")
            }
            PolicyKind::Lfu { half_life } => write!(f, "lfu:{half_life}"),
            PolicyKind::Arc => write!(f, "arc"),
            PolicyKind::LayerLru => write!(f, "layer-lru"),
            PolicyKind::Opt => write!(f, "opt"),
        }
    }
}

/// A policy name that [`PolicyKind::from_str`] does not know.
#[derive(Debug, thiserror::Error)]
#[error("unknown cache policy `{0}` (known: lru, lfu, lfu:HALF_LIFE, arc, layer-lru, opt)")]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || UnknownPolicy(s.to_string());
        Ok(match s {
            "lru" => PolicyKind::Lru,
            "lfu" => PolicyKind::Lfu {
                half_life: LfuDecay::DEFAULT_HALF_LIFE,
            },
            "arc" => PolicyKind::Arc,
            "layer-lru" => PolicyKind::LayerLru,
            "opt" | "belady" => PolicyKind::Opt,
            _ => {
                let h = s.strip_prefix("lfu:").ok_or_else(bad)?;
                let half_life = h.parse().map_err(|_| bad())?;
                if half_life == 0 {
                    return Err(bad());
                }
                PolicyKind::Lfu { half_life }
            }
        })
    }
}
