//! Log-probabilities of generated tokens under the model's own distribution: log-softmax of
//! the raw logits (temperature 1, before penalties and truncation), as OpenAI's `logprobs`
//! report them. The normaliser is summed in f64 in index order, so the numbers are the same
//! on every run.

/// A generated token's log-probability and the most probable alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The generated id.
    pub id: u32,
    /// `ln p(id)`.
    pub logprob: f64,
    /// The `top` most probable ids with their log-probabilities, most probable first (ties:
    /// lower id first).
    pub top: Vec<(u32, f64)>,
}

/// `ln p(id)` and the `top` most probable ids of `logits` (NaN logits count as −∞).
pub fn token_logprob(logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let val = |i: usize| {
        let v = logits[i];
        if v.is_nan() {
            f64::NEG_INFINITY
        } else {
            v as f64
        }
    };
    let max = (0..logits.len()).map(val).fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = (0..logits.len()).map(|i| (val(i) - max).exp()).sum();
    let lse = max + z.ln();
    let lp = |i: usize| val(i) - lse;
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = top.min(order.len());
    let by_prob = |a: &usize, b: &usize| val(*b).total_cmp(&val(*a)).then(a.cmp(b));
    if k > 0 && k < order.len() {
        order.select_nth_unstable_by(k - 1, by_prob);
    }
    order.truncate(k);
    order.sort_by(by_prob);
    TokenLogprob {
        id,
        logprob: logits
            .get(id as usize)
            .map_or(f64::NEG_INFINITY, |_| lp(id as usize)),
        top: order.into_iter().map(|i| (i as u32, lp(i))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::token_logprob;

    #[test]
    fn probabilities_sum_to_one_and_the_top_list_is_ordered() {
        let logits = [1.0f32, 3.0, 3.0, -2.0, 0.5];
        let all = token_logprob(&logits, 2, 5);
        let sum: f64 = all.top.iter().map(|(_, lp)| lp.exp()).sum();
        assert!((sum - 1.0).abs() < 1e-12, "{sum}");
        let ids: Vec<u32> = all.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 2, 0, 4, 3], "most probable first, ties by id");
        assert_eq!(all.logprob, all.top[1].1);
        let two = token_logprob(&logits, 3, 2);
        assert_eq!(two.top.len(), 2);
        assert_eq!(two.top, all.top[..2]);
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
        let p3 =
            (-2.0f64 - (1f64.exp() + 2.0 * 3f64.exp() + (-2f64).exp() + 0.5f64.exp()).ln()).exp();
        assert!((two.logprob.exp() - p3).abs() < 1e-12);
    }
}
