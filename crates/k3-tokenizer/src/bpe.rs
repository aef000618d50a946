//! tiktoken's rank-BPE on raw bytes: starting from single bytes, repeatedly merge the adjacent
//! pair whose concatenated bytes have the lowest rank (leftmost on ties) until no adjacent pair
//! is a token. Whole-piece lookup comes first, as in tiktoken.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub(crate) use crate::ranks::Ranks;

/// Pieces up to this many bytes use the O(n²) scan on the stack; longer ones the heap merge.
const SCAN_LIMIT: usize = 64;

const NONE: u32 = u32::MAX;

/// One part of a piece during the scan: where it starts, its own rank, and the rank of its
/// concatenation with the next part (`NONE` if that is not a token).
#[derive(Clone, Copy, Default)]
struct Part {
    start: u32,
    rank: u32,
    pair: u32,
}

impl Ranks {
    /// Appends the ids of one pre-tokenized piece to `out`.
    pub(crate) fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        match self.rank(piece) {
            Some(rank) => out.push(rank),
            None => self.merge(piece, out),
        }
    }

    /// Appends the rank-BPE ids of a piece that is not itself a token.
    pub(crate) fn merge(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.len() <= SCAN_LIMIT {
            self.merge_scan(piece, out);
        } else {
            self.merge_heap(piece, out);
        }
    }

    #[inline]
    fn rank_or_none(&self, bytes: &[u8]) -> u32 {
        self.rank(bytes).unwrap_or(NONE)
    }

    /// Short pieces (2..=SCAN_LIMIT bytes): scan the parts for the lowest pair rank.
    fn merge_scan(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        let mut parts = [Part::default(); SCAN_LIMIT + 1];
        for (i, part) in parts[..n].iter_mut().enumerate() {
            let pair = piece.get(i + 1).and_then(|&b| self.pair(piece[i], b));
            *part = Part {
                start: i as u32,
                rank: self.byte(piece[i]),
                pair: pair.unwrap_or(NONE),
            };
        }
        parts[n].start = n as u32; // sentinel: end of the last part
        let mut len = n;
        let end_of = |parts: &[Part], k: usize, len: usize| -> usize {
            if k + 2 <= len {
                parts[k + 2].start as usize
            } else {
                n + 1 // no next part
            }
        };
        loop {
            let (mut best, mut at) = (NONE, 0);
            for (k, p) in parts[..len].iter().enumerate() {
                if p.pair < best {
                    (best, at) = (p.pair, k);
                }
            }
            if best == NONE {
                break;
            }
            // Merge part `at` with part `at + 1`; the merged part's rank is the pair's rank.
            parts.copy_within(at + 2..=len, at + 1);
            len -= 1;
            parts[at].rank = best;
            for k in [at, at.wrapping_sub(1)] {
                if k < len {
                    let end = end_of(&parts, k, len);
                    let start = parts[k].start as usize;
                    parts[k].pair = piece.get(start..end).map_or(NONE, |b| self.rank_or_none(b));
                }
            }
        }
        out.extend(parts[..len].iter().map(|p| p.rank));
    }

    /// Long pieces: doubly linked parts and a min-heap of `(pair rank, left start, right end)`;
    /// stale heap entries are skipped. Same result as the scan (lowest rank, then leftmost).
    fn merge_heap(&self, piece: &[u8], out: &mut Vec<u32>) {
        let n = piece.len();
        // end[i]: end of the part starting at i (0 once i is no longer a part start).
        let mut end: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut rank: Vec<u32> = piece.iter().map(|&b| self.byte(b)).collect();
        let mut heap = BinaryHeap::with_capacity(n);
        for i in 0..n - 1 {
            if let Some(r) = self.pair(piece[i], piece[i + 1]) {
                heap.push(Reverse((r, i, i + 2)));
            }
        }
        while let Some(Reverse((r, left, right_end))) = heap.pop() {
            let mid = end[left];
            if mid == 0 || mid >= n || end[mid] != right_end {
                continue; // stale: one side was merged since this entry was pushed
            }
            end[left] = right_end;
            end[mid] = 0;
            rank[left] = r;
            if right_end < n {
                prev[right_end] = left;
                let r = self.rank_or_none(&piece[left..end[right_end]]);
                if r != NONE {
                    heap.push(Reverse((r, left, end[right_end])));
                }
            }
            let p = prev[left];
            if p != usize::MAX {
                let r = self.rank_or_none(&piece[p..right_end]);
                if r != NONE {
                    heap.push(Reverse((r, p, right_end)));
                }
            }
        }
        let mut i = 0;
        while i < n {
            out.push(rank[i]);
            i = end[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn toy() -> Ranks {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for t in [
            "ab", "ba", "aba", "abab", "cd", "abcd", "bab", "aab", "aaaa", "aa",
        ] {
            tokens.push(t.as_bytes().to_vec());
        }
        Ranks::from_tokens(&tokens).expect("distinct tokens")
    }

    #[test]
    fn lowest_rank_leftmost() {
        let r = toy();
        let mut out = Vec::new();
        // a|b|a|b|a -> ab|a|b|a (leftmost 256) -> ab|ab|a -> ab|aba (258 beats abab's 259).
        r.encode_piece(b"ababa", &mut out);
        assert_eq!(out, vec![256, 258]);
    }

    proptest! {
        #[test]
        fn scan_and_heap_agree(text in "[abcd]{2,64}") {
            let r = toy();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            r.merge_scan(text.as_bytes(), &mut a);
            r.merge_heap(text.as_bytes(), &mut b);
            prop_assert_eq!(a, b);
        }
    }
}
