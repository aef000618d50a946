//! The released Kimi K3 sizes, computed from the tensor shapes in docs/MODEL.md#checkpoint-tensor-inventory (an estimate to
//! plan without a checkpoint; the engine replaces the run sizes with `trunk.json`'s).

use super::ModelSizes;

const E: u64 = 7168;
const P: u64 = 96 * 128;
const BF16: u64 = 2;
const F32: u64 = 4;

/// Six per-layer norm / attn-res vectors (bf16).
const COMMON: u64 = 6 * E * BF16;
/// KDA attention: q,k,v,g,o projections, three f32 conv taps, decay low-rank A/B, beta,
/// A_log, dt_bias, o_norm.
const KDA: u64 = 5 * P * E * BF16
    + 3 * P * 4 * F32
    + (128 * E + P * 128 + 96 * E) * BF16
    + (128 + P + 128) * F32;
/// Gated MLA: q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o, g.
const MLA: u64 =
    (1536 * E + 1536 + 18432 * 1536 + 576 * E + 512 + 24576 * 512) * BF16 + 2 * E * 12288 * BF16;
/// MoE trunk part: router gate (bf16) + f32 bias, latent down/up/norm, fused shared experts.
const MOE: u64 = 896 * E * BF16 + 896 * F32 + (2 * 3584 * E + 3584) * BF16 + 3 * 6144 * E * BF16;
/// Dense SiTU-GLU MLP of layer 0.
const DENSE: u64 = 3 * 33792 * E * BF16;
/// Widen-area bound per layer (docs/MODEL.md#binding-rules).
const WIDEN: u64 = (6 * E + 1536 + 512 + 3584 + 896 * E) * F32 + 4096;

/// Prefill scratch per token at released dims (k3-model's `Scratch::bytes_per_token`; a
/// k3-engine test checks the two agree).
pub const RELEASED_PREFILL_BYTES_PER_TOKEN: u64 = 1_955_160;

impl ModelSizes {
    /// Kimi K3 as released: 93 layers (layer 0 KDA + dense; MLA at 3, 7, …, 91 and 92),
    /// 17,547,264-byte MXFP4 experts, top-16, lm_head 2,348,810,240 B + three f32 final
    /// vectors (the embedding is read a row per token, never held), KDA
    /// state 1,683,456 f32 for each of the 69 KDA layers (only KDA layers have one,
    /// docs/MODEL.md#state-sizes), latent KV 24 layers × 576 f32 per position, 64 MiB scratch
    /// (placeholder until the engine measures its own).
    pub fn k3_estimate() -> Self {
        let is_mla = |l: usize| l % 4 == 3 || l == 92;
        // Token-mixer piece (the layer's vectors sit beside the attention tensors in the
        // checkpoint's name order), then the channel mixer's.
        let layer_piece_bytes: Vec<[u64; 2]> = (0..93)
            .map(|l| match l {
                0 => [COMMON + KDA, DENSE],
                l if is_mla(l) => [COMMON + MLA, MOE],
                _ => [COMMON + KDA, MOE],
            })
            .collect();
        let layer_run_bytes = layer_piece_bytes.iter().map(|p| p[0] + p[1]).collect();
        ModelSizes {
            layer_run_bytes,
            widen_bytes: vec![WIDEN; 93],
            layer_piece_bytes,
            expert_bytes: 17_547_264,
            top_k: 16,
            n_routed_experts: 92 * 896,
            head_bytes: 163_840 * E * BF16 + 3 * E * F32,
            kda_state_bytes: (93 - (0..93).filter(|&l| is_mla(l)).count() as u64) * 1_683_456 * F32,
            latent_kv_bytes_per_pos: 24 * 576 * F32,
            scratch_bytes: 64 << 20,
            prefill_bytes_per_token: RELEASED_PREFILL_BYTES_PER_TOKEN,
            // 69 KDA layers × (6 · 12,288 + 96) f32; one layer's 1,683,456 f32 of state
            journal_bytes_per_draft: 69 * (6 * 12_288 + 96) * F32,
            tentative_state_bytes: 1_683_456 * F32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_spec_totals() {
        let s = ModelSizes::k3_estimate();
        assert_eq!(s.layer_run_bytes[0], 2_341_213_184); // spec: 2.341 GB
        let total: u64 = s.layer_run_bytes.iter().sum();
        assert_eq!((total as f64 / 1e7).round() / 100.0, 108.81); // spec: 108.81 GB
        assert_eq!(s.head_bytes, 2_348_810_240 + 3 * 7168 * 4);
        assert_eq!(WIDEN, 25_888_768);
        assert_eq!(s.kda_state_bytes, 69 * 1_683_456 * 4); // 464.6 MB, not 93 layers' 626 MB
        assert_eq!(
            s.layer_run_bytes
                .iter()
                .filter(|&&b| b < 1_000_000_000)
                .count(),
            24
        );
    }
}
