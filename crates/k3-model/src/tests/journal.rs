//! Tentative tokens (crate::journal): a pass's last tokens run through the model without
//! entering the carried state; keeping `j` of them leaves, bit for bit, the state that was
//! fed only the committed tokens and those `j`, and decoding continues identically.

use super::batch::fed;
use super::model;
use crate::*;
use proptest::prelude::*;

/// Every carried buffer that a prefix must reproduce: KDA states and conv histories, the
/// latent rows `0..pos`, the position.
fn carried(st: &State) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, usize) {
    let kda = st
        .kda_states()
        .iter()
        .flat_map(|k| [k.recurrent().to_vec(), k.conv().to_vec()])
        .collect();
    let mla = st
        .mla_caches()
        .iter()
        .map(|c| c.rows(st.pos()).to_vec())
        .collect();
    (kda, mla, st.pos())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn kept_tentative_tokens_equal_feeding_only_them(
        history in proptest::collection::vec(0u32..96, 0..6),
        committed in proptest::collection::vec(0u32..96, 0..3),
        tail in proptest::collection::vec(0u32..96, 1..6),
        keep in 0usize..6,
        next in 0u32..96,
    ) {
        let (m, w, x) = model();
        let keep = keep.min(tail.len());
        let pass = [committed.clone(), tail.clone()].concat();
        let mut st = fed(&m, &w, &x, &history);
        st.begin_tentative(tail.len());
        let rows = m.forward(&w, &x, &pass, &mut st, LogitsMode::All).unwrap();
        // the pass's logits are a whole pass's: tentative tokens change no output
        let mut whole = fed(&m, &w, &x, &history);
        let want_rows = m.forward(&w, &x, &pass, &mut whole, LogitsMode::All).unwrap();
        prop_assert_eq!(&rows.data, &want_rows.data);
        // the state holds the committed tokens only, until some tentative ones are kept
        let committed_ids = [history.clone(), committed.clone()].concat();
        prop_assert_eq!(carried(&st), carried(&fed(&m, &w, &x, &committed_ids)));
        st.keep_tentative(keep).unwrap();
        let kept_ids = [committed_ids, tail[..keep].to_vec()].concat();
        let mut want = fed(&m, &w, &x, &kept_ids);
        prop_assert_eq!(carried(&st), carried(&want));
        let a = m.decode(&w, &x, next, &mut st).unwrap();
        let b = m.decode(&w, &x, next, &mut want).unwrap();
        prop_assert_eq!(a, b, "the next token's logits");
    }
}

#[test]
fn only_the_armed_call_is_tentative() {
    let (m, w, x) = model();
    let mut st = fed(&m, &w, &x, &[9]);
    st.begin_tentative(2);
    m.forward(&w, &x, &[1, 2, 3], &mut st, LogitsMode::None)
        .unwrap();
    assert_eq!(st.pos(), 2, "the call's last two are tentative");
    st.keep_tentative(0).unwrap();
    m.forward(&w, &x, &[2, 3], &mut st, LogitsMode::None)
        .unwrap();
    assert_eq!(carried(&st), carried(&fed(&m, &w, &x, &[9, 1, 2, 3])));
    assert!(st.kda_states().iter().all(|k| k.journal_tokens() == 0));
}

#[test]
fn keeping_more_than_the_pass_left_is_refused() {
    let (m, w, x) = model();
    let mut st = fed(&m, &w, &x, &[4, 5]);
    st.begin_tentative(2);
    m.forward(&w, &x, &[6, 7], &mut st, LogitsMode::None)
        .unwrap();
    let err = st.keep_tentative(3).unwrap_err();
    assert!(
        err.to_string()
            .contains("3 tentative tokens kept but the last pass left 2"),
        "{err}"
    );
    st.keep_tentative(2).unwrap();
    assert_eq!(carried(&st), carried(&fed(&m, &w, &x, &[4, 5, 6, 7])));
}
