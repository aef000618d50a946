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
