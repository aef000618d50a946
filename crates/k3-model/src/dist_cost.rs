//! What one forward pass exchanges between ranks (docs/DISTRIBUTED.md#memory-per-rank), counted
//! from the model's widths: every all-gather the graph makes over `N > 1` ranks, with the
//! floats it gathers. `k3 plan --ranks N` prints it; a k3-engine test runs the tiny models
//! through a counting `Comm` and compares call for call and byte for byte, so this cannot
//! drift from what [`crate::dist`], [`crate::kda`], [`crate::mla`], [`crate::dense`] and
//! [`crate::moe`] send.
//!
//! An all-gather of `F` floats (summed over ranks) costs each rank its share of `F` sent and
//! the rest received; the routed-expert gather's shares follow the routing, the trunk
//! gathers' follow the row deal.

use crate::dims::{Dims, LayerKind};

/// Floats per token of each all-gather layer `l` makes over ranks, in call order.
pub fn layer_gathers(d: &Dims, l: usize) -> Vec<u64> {
    let mut out = Vec::new();
    let (e, p) = (d.hidden as u64, d.kda_proj() as u64);
    match d.kinds[l] {
        LayerKind::Kda(_) => {
            // q, k, v, g, beta and f_b rows of a rank's heads stay on it (heads split)
            out.push(d.kda_dim as u64); // the decay's low-rank A, shared by every head
            out.push(p); // the gated head outputs, in head order
            out.push(e); // o_proj
        }
        LayerKind::Mla(_) => {
            // q_b and the gate rows of a rank's heads stay on it; the latent is replicated
            out.push(d.q_lora as u64 + d.kv_row() as u64); // q_a, kv_a
            out.push((d.mla_heads * d.v_head) as u64); // the gated head outputs
            out.push(e); // o_proj
        }
    }
    if d.dense[l] {
        out.push(2 * d.dense_inter as u64); // gate, up
        out.push(e); // down
    } else {
        let (lat, si) = (d.latent as u64, d.shared_inter as u64);
        out.push(lat + 2 * si); // latent down, shared gate, shared up
        out.push(d.topk as u64 * (lat + 1)); // every top-k slot's output and its flag
        out.push(e); // latent up
        out.push(e); // shared down
    }
    out
}

/// What one forward pass exchanges over `N > 1` ranks (nothing over one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassCost {
    /// Collective calls every rank makes.
    pub collectives: u64,
    /// Floats gathered, summed over ranks (each rank receives all but its own share).
    pub floats: u64,
}

impl PassCost {
    /// Bytes gathered, summed over ranks.
    pub fn bytes(&self) -> u64 {
        self.floats * 4
    }
    /// Bytes one rank receives, at an even share: `bytes · (N − 1) / N`.
    pub fn bytes_received_per_rank(&self, ranks: usize) -> u64 {
        let n = ranks.max(1) as u64;
        self.bytes() * (n - 1) / n
    }
}

/// One forward pass of `tokens` tokens with logits for `logit_rows` of them, over `ranks`.
pub fn pass_cost(d: &Dims, ranks: usize, tokens: usize, logit_rows: usize) -> PassCost {
    if ranks <= 1 {
        return PassCost::default();
    }
    let mut cost = PassCost::default();
    for l in 0..d.n_layers {
        for per_token in layer_gathers(d, l) {
            cost.collectives += 1;
            cost.floats += per_token * tokens as u64;
        }
    }
    if logit_rows > 0 {
        cost.collectives += 1;
        cost.floats += d.vocab as u64 * logit_rows as u64;
    }
    cost
}

/// One decoded token: a one-token pass with its logits, plus the broadcast of rank 0's
/// sampled id (one `u32`).
pub fn decode_token_cost(d: &Dims, ranks: usize) -> (PassCost, u64) {
    let pass = pass_cost(d, ranks, 1, 1);
    let broadcast_bytes = if ranks > 1 { 4 } else { 0 };
    (pass, broadcast_bytes)
}
