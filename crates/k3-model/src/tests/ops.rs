//! Op-level equivalences on random weights.

use crate::mla::{mla_forward, MlaPath, MlaScratch};
use crate::moe::{moe_forward, MoeScratch};
use crate::testing::*;
use crate::{Dims, MlaCache, Pass};

fn tiny() -> (Dims, OwnedWeights, OwnedExperts) {
    let cfg = tiny_config();
    let (w, x) = random_model(&cfg, 11, Storage::Bf16, Storage::Mxfp4);
    (Dims::new(&cfg).unwrap(), w, x)
}

fn moe_of(w: &OwnedWeights, l: usize) -> &OwnedMoe {
    match &w.layers[l].ffn {
        OwnedFfn::Moe(m) => m,
        OwnedFfn::Dense(_) => panic!("layer {l} is dense"),
    }
}

#[test]
fn moe_union_prefill_equals_per_token_bit_for_bit() {
    let (d, w, x) = tiny();
    let t = 6;
    let input = Rng::new(5).vec(t * d.hidden, 0.0, 1.5);
    let mw = moe_of(&w, 2).view();
    let mut sc = MoeScratch::default();
    let mut batched = vec![0f32; t * d.hidden];
    let pass = Pass::new(&d, t, 0, &x);
    moe_forward(&pass, 2, &mw, &input, &mut batched, &mut sc).unwrap();
    let log = x.take_log();
    assert_eq!(log.len(), 1, "one fetch for the whole batch");
    assert!(log[0].1.len() > d.topk, "tokens chose different experts");
    for tok in 0..t {
        let mut one = vec![0f32; d.hidden];
        let xi = &input[tok * d.hidden..(tok + 1) * d.hidden];
        let pass = Pass::new(&d, 1, tok, &x);
        moe_forward(&pass, 2, &mw, xi, &mut one, &mut sc).unwrap();
        assert_eq!(
            &batched[tok * d.hidden..(tok + 1) * d.hidden],
            &one[..],
            "token {tok}"
        );
    }
}

#[test]
fn latent_mla_op_equals_expanded_within_tolerance() {
    let (d, w, x) = tiny();
    let mw = match &w.layers[3].attn {
        OwnedAttn::Mla(m) => m.view(),
        OwnedAttn::Kda(_) => panic!("layer 3 is KDA"),
    };
    let t = 7;
    let input = Rng::new(9).vec(t * d.hidden, 0.0, 2.0);
    let run = |path| {
        let mut cache = MlaCache::new(16, d.kv_row());
        let mut out = vec![0f32; t * d.hidden];
        let mut sc = MlaScratch::default();
        let (head, tail) = out.split_at_mut(3 * d.hidden);
        let first = Pass {
            mla_path: path,
            ..Pass::new(&d, 3, 0, &x)
        };
        mla_forward(
            &first,
            3,
            &mw,
            &input[..3 * d.hidden],
            &mut cache,
            head,
            &mut sc,
        )
        .unwrap();
        let rest = Pass {
            mla_path: path,
            ..Pass::new(&d, t - 3, 3, &x)
        };
        mla_forward(
            &rest,
            3,
            &mw,
            &input[3 * d.hidden..],
            &mut cache,
            tail,
            &mut sc,
        )
        .unwrap();
        out
    };
    let (lat, exp) = (run(MlaPath::Latent), run(MlaPath::Expanded));
    let max = exp.iter().fold(0f32, |a, v| a.max(v.abs()));
    for (i, (a, b)) in lat.iter().zip(&exp).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * max + 1e-5,
            "element {i}: {a} vs {b} (max {max})"
        );
    }
    assert!(lat != exp || max > 0.0);
}

/// Batched prefill attention is token-by-token attention bit for bit: a chunk of
/// 37 queries after 5 cached positions (three tiles, the last one partial), all heads and a
/// subset of heads (one rank's).
#[test]
fn chunked_latent_attention_equals_token_by_token_bit_for_bit() {
    use crate::dist::row_slice;
    use crate::mla::{attend_latent, attend_latent_chunk, LatentScratch};
    let (d, w, _) = tiny();
    let mw = match &w.layers[3].attn {
        OwnedAttn::Mla(m) => m.view(),
        OwnedAttn::Kda(_) => panic!("layer 3 is KDA"),
    };
    let (pos, n, kvr, qh, vh) = (5, 37, d.kv_row(), d.qk_head(), d.v_head);
    let mut g = Rng::new(3);
    let rows = g.vec((pos + n) * kvr, 0.0, 1.0);
    for heads in [0..d.mla_heads, 1..3] {
        let hn = heads.len();
        let block = d.nope + vh;
        let kv_b = row_slice(&mw.kv_b_proj, heads.start * block, heads.end * block);
        let q = g.vec(n * hn * qh, 0.0, 1.0);
        let mut chunked = vec![0f32; n * hn * vh];
        attend_latent_chunk(&d, &kv_b, &rows, pos, &q, &mut chunked);
        let (mut q_lat, mut ctx) = (vec![0f64; hn * d.kv_lora], vec![0f32; hn * d.kv_lora]);
        let mut scores = vec![0f32; hn * (pos + n)];
        for j in 0..n {
            let mut o = vec![0f32; hn * vh];
            let sc = LatentScratch {
                q_lat: &mut q_lat,
                ctx: &mut ctx,
                scores: &mut scores,
            };
            let q_t = &q[j * hn * qh..(j + 1) * hn * qh];
            attend_latent(&d, &kv_b, &rows[..(pos + j + 1) * kvr], q_t, &mut o, sc);
            let got = &chunked[j * hn * vh..(j + 1) * hn * vh];
            let same = got.iter().zip(&o).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "heads {heads:?}, query {j}");
        }
        assert!(hn == 0 || chunked.iter().any(|v| *v != 0.0));
    }
}
