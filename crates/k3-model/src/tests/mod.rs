//! Determinism and equivalence tests of the whole model on random weights.

mod batch;
mod dist;
mod draft;
mod journal;
mod ops;
mod share;

use crate::testing::*;
use crate::*;

const PROMPT: [u32; 9] = [5, 17, 3, 96, 0, 42, 42, 7, 61];

fn model() -> (Model, OwnedWeights, OwnedExperts) {
    let cfg = tiny_config();
    let (w, x) = random_model(&cfg, 7, Storage::Bf16, Storage::Mxfp4);
    (Model::new(&cfg).unwrap(), w, x)
}

fn decode_all(m: &Model, w: &OwnedWeights, x: &OwnedExperts, toks: &[u32]) -> Vec<Vec<f32>> {
    let mut st = m.new_state(32);
    toks.iter()
        .map(|&t| m.decode(w, x, t, &mut st).unwrap())
        .collect()
}

#[test]
fn prefill_equals_step_by_step_decode_bit_for_bit() {
    let (m, w, x) = model();
    let mut st = m.new_state(32);
    let all = m
        .forward(&w, &x, &PROMPT, &mut st, LogitsMode::All)
        .unwrap();
    assert_eq!((all.rows, st.pos()), (PROMPT.len(), PROMPT.len()));
    let steps = decode_all(&m, &w, &x, &PROMPT);
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(all.row(i), &s[..], "position {i}");
    }
    assert!(steps[8].iter().all(|v| v.is_finite()));
    assert_ne!(steps[7], steps[8]);
}

#[test]
fn chunked_prefill_then_decode_equals_one_prefill() {
    let (m, w, x) = model();
    let mut a = m.new_state(32);
    let one = m
        .forward(&w, &x, &PROMPT, &mut a, LogitsMode::Last)
        .unwrap();
    let mut b = m.new_state(32);
    m.forward(&w, &x, &PROMPT[..4], &mut b, LogitsMode::None)
        .unwrap();
    m.forward(&w, &x, &PROMPT[4..8], &mut b, LogitsMode::Last)
        .unwrap();
    let last = m.decode(&w, &x, PROMPT[8], &mut b).unwrap();
    assert_eq!(one.data, last);
}

#[test]
fn full_recompute_equals_incremental() {
    let (m, w, x) = model();
    let steps = decode_all(&m, &w, &x, &PROMPT);
    let mut st = m.new_state(32);
    for n in 1..=PROMPT.len() {
        let r = m
            .recompute(&w, &x, &PROMPT[..n], &mut st, LogitsMode::Last)
            .unwrap();
        assert_eq!(r.data, steps[n - 1], "prefix of {n}");
    }
}

#[test]
fn logits_identical_in_pools_of_one_and_two_threads() {
    let (m, w, x) = model();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut st = m.new_state(32);
            let mut out = m
                .forward(&w, &x, &PROMPT, &mut st, LogitsMode::All)
                .unwrap()
                .data;
            out.extend(m.decode(&w, &x, 11, &mut st).unwrap());
            out
        })
    };
    assert_eq!(run(1), run(2));
    assert_eq!(run(1), run(3));
}

#[test]
fn expert_arrival_order_does_not_change_a_bit() {
    let cfg = tiny_config();
    let m = Model::new(&cfg).unwrap();
    let (w, mut x) = random_model(&cfg, 7, Storage::Bf16, Storage::Mxfp4);
    let mut run = |arrival| {
        x.arrival = arrival;
        let mut st = m.new_state(32);
        m.forward(&w, &x, &PROMPT, &mut st, LogitsMode::All)
            .unwrap()
            .data
    };
    let base = run(Arrival::InOrder);
    assert_eq!(base, run(Arrival::Reverse));
    assert_eq!(base, run(Arrival::Shuffled(1)));
    assert_eq!(base, run(Arrival::Shuffled(99)));
}

#[test]
fn prefill_fetches_each_layers_union_once() {
    let (m, w, x) = model();
    let mut st = m.new_state(32);
    m.forward(&w, &x, &PROMPT, &mut st, LogitsMode::Last)
        .unwrap();
    let log = x.take_log();
    let moe_layers: Vec<usize> = (0..m.dims().n_layers)
        .filter(|&l| !m.dims().dense[l])
        .collect();
    assert_eq!(log.iter().map(|(l, _)| *l).collect::<Vec<_>>(), moe_layers);
    for (_, req) in &log {
        let mut u = req.clone();
        u.sort_unstable();
        u.dedup();
        assert_eq!(u.len(), req.len(), "duplicate expert in one fetch");
        assert!(req.len() >= m.dims().topk);
    }
}

#[test]
fn latent_mla_equals_expanded_whole_model() {
    let (m, w, x) = model();
    let mut a = m.new_state(32);
    let lat = m
        .forward(&w, &x, &PROMPT, &mut a, LogitsMode::All)
        .unwrap()
        .data;
    let e = m.clone().with_mla_path(MlaPath::Expanded);
    let mut b = e.new_state(32);
    let exp = e
        .forward(&w, &x, &PROMPT, &mut b, LogitsMode::All)
        .unwrap()
        .data;
    let max = exp.iter().fold(0f32, |a, v| a.max(v.abs()));
    let worst = lat
        .iter()
        .zip(&exp)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-4 * max + 1e-5, "worst {worst} max {max}");
}

#[test]
fn context_overflow_is_an_error_and_leaves_state_usable() {
    let (m, w, x) = model();
    let mut st = m.new_state(4);
    m.forward(&w, &x, &PROMPT[..3], &mut st, LogitsMode::None)
        .unwrap();
    let err = m
        .forward(&w, &x, &PROMPT[3..5], &mut st, LogitsMode::Last)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::ContextOverflow {
                pos: 3,
                tokens: 2,
                max_ctx: 4
            }
        ),
        "{err}"
    );
    assert_eq!(st.pos(), 3);
    m.decode(&w, &x, PROMPT[3], &mut st).unwrap();
    let err = m.decode(&w, &x, 1, &mut st).unwrap_err();
    assert!(matches!(err, ModelError::ContextOverflow { .. }));
}

#[test]
fn bad_inputs_are_refused_before_touching_state() {
    let (m, w, x) = model();
    let mut st = m.new_state(8);
    let err = m
        .forward(&w, &x, &[1, 97], &mut st, LogitsMode::Last)
        .unwrap_err();
    assert!(matches!(
        err,
        ModelError::TokenOutOfRange {
            id: 97,
            index: 1,
            vocab: 97
        }
    ));
    assert!(matches!(
        m.forward(&w, &x, &[], &mut st, LogitsMode::Last),
        Err(ModelError::NoTokens)
    ));
    assert!(!st.is_poisoned());
}

#[test]
fn expert_failure_names_layer_and_expert_and_poisons_state() {
    let cfg = tiny_config();
    let m = Model::new(&cfg).unwrap();
    let (w, mut x) = random_model(&cfg, 7, Storage::Bf16, Storage::Mxfp4);
    let mut st = m.new_state(32);
    m.forward(&w, &x, &PROMPT, &mut st, LogitsMode::None)
        .unwrap();
    let (layer, req) = x.take_log()[1].clone();
    x.fail = Some((layer, req[0]));
    st.reset();
    let err = m
        .forward(&w, &x, &PROMPT, &mut st, LogitsMode::Last)
        .unwrap_err();
    match err {
        ModelError::Expert {
            layer: l, expert, ..
        } => assert_eq!((l, expert), (layer, req[0])),
        other => panic!("unexpected {other}"),
    }
    assert!(st.is_poisoned());
    x.fail = None;
    assert!(matches!(
        m.decode(&w, &x, 1, &mut st),
        Err(ModelError::StatePoisoned)
    ));
    st.reset();
    m.decode(&w, &x, 1, &mut st).unwrap();
}

#[test]
fn state_buffers_round_trip() {
    let (m, w, x) = model();
    let mut a = m.new_state(16);
    m.forward(&w, &x, &PROMPT[..6], &mut a, LogitsMode::None)
        .unwrap();
    let mut b = m.new_state(16);
    for (d, s) in b.kda_states_mut().iter_mut().zip(a.kda_states()) {
        d.recurrent_mut().copy_from_slice(s.recurrent());
        d.conv_mut().copy_from_slice(s.conv());
    }
    for (d, s) in b.mla_caches_mut().iter_mut().zip(a.mla_caches()) {
        d.rows_mut(6).copy_from_slice(s.rows(6));
    }
    b.set_pos(6).unwrap();
    assert_eq!(
        m.decode(&w, &x, 9, &mut a).unwrap(),
        m.decode(&w, &x, 9, &mut b).unwrap()
    );
    assert_eq!(a.mla_caches()[0].row_width(), 20);
}

#[test]
fn f32_storage_runs_and_is_deterministic() {
    let cfg = tiny_config();
    let m = Model::new(&cfg).unwrap();
    let (w, x) = random_model(&cfg, 3, Storage::F32, Storage::F32);
    let mut st = m.new_state(16);
    let a = m
        .forward(&w, &x, &PROMPT, &mut st, LogitsMode::All)
        .unwrap();
    let b = m
        .recompute(&w, &x, &PROMPT, &mut st, LogitsMode::All)
        .unwrap();
    assert_eq!(a, b);
}

#[test]
fn argmax_ties_go_to_lowest_id() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(argmax(&[f32::NAN, 0.5, 0.5]), 1);
    assert_eq!(argmax(&[-1.0]), 0);
}

#[test]
fn wrong_weight_shape_is_a_shape_error() {
    let cfg = tiny_config();
    let m = Model::new(&cfg).unwrap();
    let (mut w, x) = random_model(&cfg, 7, Storage::F32, Storage::F32);
    w.layers[2].input_norm.pop();
    let mut st = m.new_state(8);
    let err = m
        .forward(&w, &x, &[1], &mut st, LogitsMode::Last)
        .unwrap_err();
    assert!(
        matches!(err, ModelError::Shape { layer: Some(2), .. }),
        "{err}"
    );
}

#[test]
fn a_reused_scratch_gives_a_fresh_sessions_bits() {
    let (m, w, x) = model();
    let run = |st: &mut State| {
        let mut out = m
            .forward(&w, &x, &PROMPT, st, LogitsMode::All)
            .unwrap()
            .data;
        out.extend(m.decode(&w, &x, 11, st).unwrap());
        out
    };
    let fresh = run(&mut m.new_state(32));
    // An earlier session of other tokens, a longer prefill and decode steps leaves its
    // values in every buffer it grew.
    let mut old = m.new_state(40);
    let longer: Vec<u32> = (0..23).map(|i| (i * 37 + 5) % 97).collect();
    m.forward(&w, &x, &longer, &mut old, LogitsMode::All)
        .unwrap();
    m.decode(&w, &x, 3, &mut old).unwrap();
    let mut reused = m.new_state_with(32, old.take_scratch());
    assert_eq!(bits(&run(&mut reused)), bits(&fresh));
    // Nothing is read before it is written: not even NaN everywhere reaches a result.
    let mut scratch = reused.take_scratch();
    scratch.poison();
    let mut poisoned = m.new_state_with(32, scratch);
    assert_eq!(bits(&run(&mut poisoned)), bits(&fresh));
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}
