//! Batched forward: every sequence of a [`Model::forward_batch`] call gets the logits and
//! the state it would get alone (docs/SERVER.md "Batching").

use super::model;
use crate::testing::*;
use crate::*;
use proptest::prelude::*;

/// One sequence of a test batch: the history already in its state, the tokens the batched
/// call feeds, which logits it asks for.
#[derive(Clone, Debug)]
struct Case {
    history: Vec<u32>,
    call: Vec<u32>,
    mode: LogitsMode,
}

fn mode_of(k: u8, n: usize) -> LogitsMode {
    match k % 4 {
        0 => LogitsMode::Last,
        1 => LogitsMode::All,
        2 => LogitsMode::None,
        _ => LogitsMode::Tail(1 + n / 2),
    }
}

fn cases() -> impl Strategy<Value = Vec<Case>> {
    let one = (
        proptest::collection::vec(0u32..96, 0..6),
        proptest::collection::vec(0u32..96, 1..5),
        any::<u8>(),
    )
        .prop_map(|(history, call, k)| {
            let mode = mode_of(k, call.len());
            Case {
                history,
                call,
                mode,
            }
        });
    proptest::collection::vec(one, 1..5)
}

/// A state that has consumed `history` (one prefill call, or none).
pub(super) fn fed(m: &Model, w: &OwnedWeights, x: &OwnedExperts, history: &[u32]) -> State {
    let mut st = m.new_state(16);
    if !history.is_empty() {
        m.forward(w, x, history, &mut st, LogitsMode::None).unwrap();
    }
    st
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn every_sequence_of_a_batch_equals_its_solo_run(batch in cases()) {
        let (m, w, x) = model();
        let mut solo_states = Vec::new();
        let mut solo = Vec::new();
        for c in &batch {
            let mut st = fed(&m, &w, &x, &c.history);
            solo.push(m.forward(&w, &x, &c.call, &mut st, c.mode).unwrap());
            solo_states.push(st);
        }
        let mut states: Vec<State> = batch.iter().map(|c| fed(&m, &w, &x, &c.history)).collect();
        let mut items: Vec<BatchItem<'_>> = batch
            .iter()
            .zip(states.iter_mut())
            .map(|(c, state)| BatchItem { tokens: &c.call, state, mode: c.mode })
            .collect();
        let got = m.forward_batch(&w, &x, &mut items, &mut |_| {}).unwrap();
        drop(items);
        prop_assert_eq!(got.len(), batch.len());
        for (i, (g, s)) in got.iter().zip(&solo).enumerate() {
            prop_assert_eq!(g, s, "sequence {} logits", i);
        }
        // the carried states continue identically: one more decode step each
        for (i, (a, b)) in states.iter_mut().zip(solo_states.iter_mut()).enumerate() {
            prop_assert_eq!(a.pos(), b.pos());
            let (la, lb) = (m.decode(&w, &x, 11, a).unwrap(), m.decode(&w, &x, 11, b).unwrap());
            prop_assert_eq!(la, lb, "sequence {} after the batch", i);
        }
    }
}

#[test]
fn a_bad_item_refuses_the_whole_batch_before_touching_any_state() {
    let (m, w, x) = model();
    let mut a = fed(&m, &w, &x, &[1, 2]);
    let mut b = fed(&m, &w, &x, &[3]);
    let before = (a.kda_states()[0].recurrent().to_vec(), a.pos(), b.pos());
    let vocab = m.dims().vocab as u32;
    let mut items = [
        BatchItem {
            tokens: &[4],
            state: &mut a,
            mode: LogitsMode::Last,
        },
        BatchItem {
            tokens: &[vocab],
            state: &mut b,
            mode: LogitsMode::Last,
        },
    ];
    let err = m
        .forward_batch(&w, &x, &mut items, &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, ModelError::TokenOutOfRange { .. }), "{err}");
    assert_eq!(
        (a.kda_states()[0].recurrent().to_vec(), a.pos(), b.pos()),
        before
    );
    assert!(!a.is_poisoned() && !b.is_poisoned());
    let mut none: [BatchItem<'_>; 0] = [];
    assert!(m.forward_batch(&w, &x, &mut none, &mut |_| {}).is_err());
}

#[test]
fn a_batch_reads_each_layers_expert_union_once() {
    let (m, w, x) = model();
    let mut a = fed(&m, &w, &x, &[]);
    let mut b = fed(&m, &w, &x, &[]);
    x.take_log();
    let mut items = [
        BatchItem {
            tokens: &[5, 6],
            state: &mut a,
            mode: LogitsMode::Last,
        },
        BatchItem {
            tokens: &[7],
            state: &mut b,
            mode: LogitsMode::Last,
        },
    ];
    m.forward_batch(&w, &x, &mut items, &mut |_| {}).unwrap();
    let d = m.dims();
    let moe_layers: Vec<usize> = (0..d.n_layers).filter(|&l| !d.dense[l]).collect();
    let log = x.take_log();
    assert_eq!(log.iter().map(|(l, _)| *l).collect::<Vec<_>>(), moe_layers);
    for (_, req) in &log {
        let mut u = req.clone();
        u.sort_unstable();
        u.dedup();
        assert_eq!(u.len(), req.len(), "an expert fetched twice in one layer");
    }
}
