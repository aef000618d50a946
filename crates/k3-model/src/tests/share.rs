//! The share rule (crate::share) is what the model reads: every rank of an in-process group,
//! handed weights whose rows outside its share are NaN (or removed: the store's compact
//! form), gives one process's logits bit for bit (docs/DISTRIBUTED.md#shares).

use super::*;
use crate::share::{kda_split, mla_split, Split, FFN_SPLIT};
use half::bf16;
use std::ops::Range;
use std::sync::Arc;

/// How a rank's weights are handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Form {
    /// Whole tensors with every row outside the share overwritten by NaN.
    Poisoned,
    /// Exactly the share's rows (what a per-rank store holds).
    Compact,
}

/// Rows `keep` of `m` (`[rows][cols]`), poisoned outside or cut down to them.
fn cut_matrix(m: &mut OwnedMatrix, keep: Range<usize>, form: Form) {
    let cols = m.view().cols;
    let total = m.view().rows;
    match m {
        OwnedMatrix::F32 { rows, data, .. } => {
            cut_rows(data, cols, total, &keep, form, f32::NAN);
            *rows = if form == Form::Compact {
                keep.len()
            } else {
                total
            };
        }
        OwnedMatrix::Bf16 { rows, data, .. } => {
            cut_rows(data, cols, total, &keep, form, bf16::NAN);
            *rows = if form == Form::Compact {
                keep.len()
            } else {
                total
            };
        }
        OwnedMatrix::Mxfp4 {
            rows,
            packed,
            scales,
            ..
        } => {
            // no NaN in MXFP4 here (scale 255 decodes as 0): the largest scale, 2^127
            cut_rows(packed, cols / 2, total, &keep, form, 0x77);
            cut_rows(scales, cols / 32, total, &keep, form, 254);
            *rows = if form == Form::Compact {
                keep.len()
            } else {
                total
            };
        }
    }
}

fn cut_rows<T: Copy>(
    data: &mut Vec<T>,
    width: usize,
    total: usize,
    keep: &Range<usize>,
    form: Form,
    poison: T,
) {
    match form {
        Form::Compact => *data = data[keep.start * width..keep.end * width].to_vec(),
        Form::Poisoned => {
            for r in (0..total).filter(|r| !keep.contains(r)) {
                data[r * width..(r + 1) * width].fill(poison);
            }
        }
    }
}

/// `split`'s share for `rank` of `size` applied to a matrix.
fn deal(m: &mut OwnedMatrix, split: Split, rank: usize, size: usize, form: Form) {
    let keep = split.rows(m.view().rows, rank, size);
    cut_matrix(m, keep, form);
}

/// `split`'s share applied to a flat `[total][width]` vector.
fn deal_vec(v: &mut Vec<f32>, total: usize, split: Split, rank: usize, size: usize, form: Form) {
    let width = v.len() / total;
    let keep = split.rows(total, rank, size);
    cut_rows(v, width, total, &keep, form, f32::NAN);
}

/// What `rank` of `size` is handed: `w` with every dealt tensor cut to its share
/// (crate::share::{kda_split, mla_split, FFN_SPLIT}).
pub(super) fn rank_weights(
    w: &OwnedWeights,
    d: &Dims,
    rank: usize,
    size: usize,
    form: Form,
) -> OwnedWeights {
    let mut w = w.clone();
    let f = |m: &mut OwnedMatrix, s| deal(m, s, rank, size, form);
    for layer in &mut w.layers {
        match &mut layer.attn {
            OwnedAttn::Kda(a) => {
                let s = kda_split(d.kda_heads);
                for m in [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.g_proj] {
                    f(m, s.qkvg);
                }
                f(&mut a.o_proj, s.o);
                f(&mut a.f_a_proj, s.f_a);
                f(&mut a.f_b_proj, s.f_b);
                f(&mut a.b_proj, s.b);
                let p = d.kda_proj();
                for v in [&mut a.q_conv, &mut a.k_conv, &mut a.v_conv, &mut a.dt_bias] {
                    deal_vec(v, p, s.small, rank, size, form);
                }
            }
            OwnedAttn::Mla(a) => {
                let s = mla_split(d.mla_heads);
                f(&mut a.q_a_proj, s.q_a);
                f(&mut a.q_b_proj, s.q_b);
                f(&mut a.kv_a_proj, s.kv_a);
                f(&mut a.kv_b_proj, s.kv_b);
                f(&mut a.o_proj, s.o);
                if let Some(g) = &mut a.g_proj {
                    f(g, s.g);
                }
            }
        }
        match &mut layer.ffn {
            OwnedFfn::Dense(m) => {
                for x in [&mut m.gate_proj, &mut m.up_proj, &mut m.down_proj] {
                    f(x, FFN_SPLIT);
                }
            }
            OwnedFfn::Moe(m) => {
                for x in [
                    &mut m.down_proj,
                    &mut m.up_proj,
                    &mut m.shared_gate,
                    &mut m.shared_up,
                    &mut m.shared_down,
                ] {
                    f(x, FFN_SPLIT);
                }
            }
        }
    }
    f(&mut w.head.lm_head, FFN_SPLIT);
    w
}

/// Every rank of `size`, handed its weights in `form`, gives `want`'s logits bit for bit
/// (prefill of the prompt, then two decode steps).
fn ranks_match_one_process(size: usize, form: Form) {
    let (m, w, x) = model();
    let run = |m: &Model, w: &OwnedWeights| {
        let mut st = m.new_state(32);
        let mut all = m
            .forward(w, &x, &PROMPT, &mut st, LogitsMode::All)
            .unwrap()
            .data;
        for tok in [3, 77] {
            all.extend(m.decode(w, &x, tok, &mut st).unwrap());
        }
        all
    };
    let want = run(&m, &w);
    let comms = LocalComm::group(size);
    std::thread::scope(|s| {
        for c in comms {
            let (m, w, want, run) = (&m, &w, &want, &run);
            s.spawn(move || {
                let rank = c.rank();
                let mine = rank_weights(w, m.dims(), rank, size, form);
                let ranked = m.clone().with_comm(Arc::new(c));
                let got = run(&ranked, &mine);
                let same = got.len() == want.len()
                    && got
                        .iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{form:?} N={size} rank {rank}: logits differ");
            });
        }
    });
}

fn first_kda(w: &OwnedWeights) -> usize {
    let kda = |l: &OwnedLayer| matches!(l.attn, OwnedAttn::Kda(_));
    w.layers.iter().position(kda).unwrap()
}

#[test]
fn poisoned_rows_outside_the_share_change_nothing() {
    // 5 ranks over 4 heads: rank 0 runs no KDA or MLA head at all
    for n in [2, 3, 5] {
        ranks_match_one_process(n, Form::Poisoned);
    }
}

#[test]
fn weights_cut_to_the_rank_share_give_one_process_logits() {
    for n in [2, 3] {
        ranks_match_one_process(n, Form::Compact);
    }
}

#[test]
fn poison_reaches_the_logits_when_a_share_is_wrong() {
    // the guard itself: a rank handed rows poisoned INSIDE its share must not match
    let (m, w, x) = model();
    let mut bad = w.clone();
    match &mut bad.layers[first_kda(&w)].attn {
        OwnedAttn::Kda(a) => deal(&mut a.q_proj, Split::Rows, 1, 2, Form::Poisoned),
        OwnedAttn::Mla(_) => unreachable!(),
    }
    let mut st = m.new_state(32);
    let got = m.forward(&bad, &x, &PROMPT, &mut st, LogitsMode::Last);
    let mut st = m.new_state(32);
    let want = m
        .forward(&w, &x, &PROMPT, &mut st, LogitsMode::Last)
        .unwrap();
    assert!(got.map_or(true, |g| g.data != want.data));
}

#[test]
fn a_tensor_neither_whole_nor_the_share_is_refused_by_name() {
    let (m, w, x) = model();
    let mut bad = w.clone();
    let l = first_kda(&w);
    if let OwnedAttn::Kda(a) = &mut bad.layers[l].attn {
        cut_matrix(&mut a.k_proj, 0..3, Form::Compact);
    }
    let group = LocalComm::group(2);
    std::thread::scope(|s| {
        for c in group {
            let (m, bad, x) = (&m, &bad, &x);
            s.spawn(move || {
                let ranked = m.clone().with_comm(Arc::new(c));
                let mut st = ranked.new_state(32);
                let err = ranked
                    .forward(bad, x, &PROMPT, &mut st, LogitsMode::Last)
                    .unwrap_err()
                    .to_string();
                let named = err.contains("kda k_proj") && err.contains(&format!("layer {l}"));
                assert!(named, "{err}");
            });
        }
    });
}

#[test]
fn the_store_shares_of_both_fixtures_read_the_config_heads_and_cover_every_row() {
    use crate::share::{heads_of, layer_shares};
    use k3_format::bind::AttnTensors;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    for name in ["tiny-k3", "tiny-k3-wide"] {
        let dir = root.join(name);
        let cfg = k3_format::K3Config::load(dir.join("config.json")).unwrap();
        let ck = k3_format::Checkpoint::open(&dir).unwrap();
        let binding = k3_format::bind_model(&ck, &cfg).unwrap();
        for lt in &binding.layers {
            let heads = heads_of(lt);
            match lt.attn {
                AttnTensors::Kda(_) => assert_eq!(heads.kda, cfg.kda_num_heads, "{name}"),
                AttnTensors::Mla(_) => assert_eq!(heads.mla, cfg.num_attention_heads, "{name}"),
            }
            for n in 1..=5 {
                let per_rank: Vec<_> = (0..n).map(|r| layer_shares(lt, r, n)).collect();
                for (i, t) in per_rank[0].iter().enumerate() {
                    let rows = t.tensor.shape.first().copied().unwrap_or(1);
                    let ranges: Vec<_> = per_rank.iter().map(|s| s[i].rows.clone()).collect();
                    let whole = ranges.iter().all(|r| *r == (0..rows));
                    let tiled = ranges[0].start == 0
                        && ranges[n - 1].end == rows
                        && ranges.windows(2).all(|w| w[0].end == w[1].start);
                    assert!(whole || tiled, "{name} {} N={n}: {ranges:?}", t.tensor.name);
                }
            }
        }
    }
}
