//! A deterministic random model for any config (all-f32 vectors, chosen matrix storage).

use super::*;
use k3_format::{ConfigShape, K3Config};

/// A small config with every feature of the released one: KDA + dense layer 0, MLA at
/// zero-based layers 3 and 6 (6 is the last), block size 3 (boundaries 0, 3, 6), 8 experts top-3.
pub fn tiny_config() -> K3Config {
    K3Config {
        hidden_size: 64,
        num_hidden_layers: 7,
        vocab_size: 97,
        rms_norm_eps: 1e-5,
        kda_num_heads: 4,
        kda_head_dim: 8,
        short_conv_kernel_size: 4,
        gate_lower_bound: -5.0,
        num_attention_heads: 4,
        q_lora_rank: 32,
        kv_lora_rank: 16,
        qk_nope_head_dim: 8,
        qk_rope_head_dim: 4,
        v_head_dim: 8,
        mla_use_output_gate: true,
        num_experts: 8,
        num_experts_per_token: 3,
        num_shared_experts: 2,
        routed_expert_hidden_size: 32,
        moe_intermediate_size: 32,
        routed_scaling_factor: 1.0,
        moe_renormalize: true,
        latent_moe_use_norm: true,
        first_k_dense_replace: 1,
        intermediate_size: 48,
        attn_res_block_size: 3,
        activation_situ_beta: 4.0,
        activation_situ_linear_beta: 25.0,
        full_attn_layers: vec![4, 7],
        shape: ConfigShape::Flat,
    }
}

/// Generates a random model for `cfg`: trunk matrices in `trunk` storage, routed experts in
/// `experts` storage, vectors f32. Deterministic in `seed`.
pub fn random_model(
    cfg: &K3Config,
    seed: u64,
    trunk: Storage,
    experts: Storage,
) -> (OwnedWeights, OwnedExperts) {
    let mut g = Rng::new(seed);
    let e = cfg.hidden_size;
    let layers = (0..cfg.num_hidden_layers)
        .map(|l| random_layer(cfg, l, &mut g, trunk))
        .collect();
    let head = OwnedHead {
        norm: g.vec(e, 1.0, 0.1),
        out_res_norm: g.vec(e, 1.0, 0.1),
        out_res_proj: g.vec(e, 0.0, 0.5),
        lm_head: OwnedMatrix::random(&mut g, cfg.vocab_size, e, trunk),
    };
    let embed = OwnedMatrix::random(&mut g, cfg.vocab_size, e, trunk);
    let (l, i) = (cfg.routed_expert_hidden_size, cfg.moe_intermediate_size);
    let ex = (0..cfg.num_hidden_layers)
        .map(|layer| {
            if cfg.is_dense(layer) {
                return Vec::new();
            }
            (0..cfg.num_experts)
                .map(|_| OwnedExpert {
                    w1: OwnedMatrix::random(&mut g, i, l, experts),
                    w2: OwnedMatrix::random(&mut g, l, i, experts),
                    w3: OwnedMatrix::random(&mut g, i, l, experts),
                })
                .collect()
        })
        .collect();
    (
        OwnedWeights {
            embed,
            layers,
            head,
        },
        OwnedExperts::new(ex),
    )
}

fn random_layer(c: &K3Config, l: usize, g: &mut Rng, s: Storage) -> OwnedLayer {
    let e = c.hidden_size;
    let m = |g: &mut Rng, r, cols| OwnedMatrix::random(g, r, cols, s);
    let attn = if c.is_mla(l) {
        let (h, qh, hv) = (
            c.num_attention_heads,
            c.mla_qk_head(),
            c.num_attention_heads * c.v_head_dim,
        );
        OwnedAttn::Mla(OwnedMla {
            q_a_proj: m(g, c.q_lora_rank, e),
            q_a_norm: g.vec(c.q_lora_rank, 1.0, 0.1),
            q_b_proj: OwnedMatrix::random(g, h * qh, c.q_lora_rank, s),
            kv_a_proj: m(g, c.mla_kv_a_width(), e),
            kv_a_norm: g.vec(c.kv_lora_rank, 1.0, 0.1),
            kv_b_proj: m(g, h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
            o_proj: m(g, e, hv),
            g_proj: c
                .mla_use_output_gate
                .then(|| OwnedMatrix::random(g, hv, e, s)),
        })
    } else {
        let (p, h, d, k) = (
            c.kda_proj(),
            c.kda_num_heads,
            c.kda_head_dim,
            c.short_conv_kernel_size,
        );
        OwnedAttn::Kda(OwnedKda {
            q_proj: m(g, p, e),
            k_proj: m(g, p, e),
            v_proj: m(g, p, e),
            g_proj: m(g, p, e),
            o_proj: m(g, e, p),
            q_conv: g.vec(p * k, 0.0, 0.6),
            k_conv: g.vec(p * k, 0.0, 0.6),
            v_conv: g.vec(p * k, 0.0, 0.6),
            f_a_proj: m(g, d, e),
            f_b_proj: m(g, p, d),
            b_proj: m(g, h, e),
            a_log: (0..d.max(h))
                .map(|i| if i < h { g.uniform(1.5) } else { 0.0 })
                .collect(),
            dt_bias: g.vec(p, 0.0, 1.0),
            o_norm: g.vec(d, 1.0, 0.1),
        })
    };
    let ffn = if c.is_dense(l) {
        let di = c.intermediate_size;
        OwnedFfn::Dense(OwnedDense {
            gate_proj: m(g, di, e),
            up_proj: m(g, di, e),
            down_proj: m(g, e, di),
        })
    } else {
        let (ne, lat, si) = (c.num_experts, c.routed_expert_hidden_size, c.shared_inter());
        OwnedFfn::Moe(OwnedMoe {
            router: m(g, ne, e),
            router_bias: g.vec(ne, 0.0, 0.05),
            down_proj: m(g, lat, e),
            latent_norm: g.vec(lat, 1.0, 0.1),
            up_proj: m(g, e, lat),
            shared_gate: m(g, si, e),
            shared_up: m(g, si, e),
            shared_down: m(g, e, si),
        })
    };
    OwnedLayer {
        input_norm: g.vec(e, 1.0, 0.1),
        post_attn_norm: g.vec(e, 1.0, 0.1),
        attn_res_norm: g.vec(e, 1.0, 0.1),
        attn_res_proj: g.vec(e, 0.0, 0.5),
        mlp_res_norm: g.vec(e, 1.0, 0.1),
        mlp_res_proj: g.vec(e, 0.0, 0.5),
        attn,
        ffn,
    }
}
