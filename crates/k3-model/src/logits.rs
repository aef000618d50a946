//! What a forward call returns: which positions get logits ([`LogitsMode`]), the logits
//! themselves ([`Logits`]) and the greedy choice over a row ([`argmax`]). A leaf.

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsMode {
    /// Only the last token of the call (generation).
    Last,
    /// Every token of the call (teacher forcing, speculative verification).
    All,
    /// None (a prefill chunk whose logits are not needed).
    None,
    /// The last `n` tokens of the call (speculative verification: the last fed token and the
    /// drafts after it); `n` is clamped to the call's length.
    Tail(usize),
}

impl LogitsMode {
    /// Rows of logits a call of `t` tokens produces.
    pub fn rows(self, t: usize) -> usize {
        match self {
            LogitsMode::Last => t.min(1),
            LogitsMode::All => t,
            LogitsMode::None => 0,
            LogitsMode::Tail(n) => n.min(t),
        }
    }
}

/// Logits of a call: `rows` positions × `vocab`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    /// Positions with logits (0, 1, T or the tail asked for).
    pub rows: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// `[rows][vocab]`.
    pub data: Vec<f32>,
}

impl Logits {
    /// Logits of row `r`.
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.vocab..(r + 1) * self.vocab]
    }
    /// Logits of the last row (empty when `rows == 0`).
    pub fn last(&self) -> &[f32] {
        match self.rows {
            0 => &[],
            n => self.row(n - 1),
        }
    }
}

/// Greedy choice: the index of the largest logit, ties → lowest id (strict `>` scan; NaNs never
/// win). Returns 0 for an empty slice.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate().skip(1) {
        if v > logits[best] || logits[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best as u32
}
