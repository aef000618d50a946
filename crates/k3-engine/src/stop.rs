//! When generation ends: end ids, stop strings, a length limit, or the caller's callback.

use crate::Engine;
use serde::Serialize;

/// What ends a generation besides its length limit and the callback.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopConditions {
    /// Generated ids that end the generation (kept as its last id, never decoded into text).
    pub end_ids: Vec<u32>,
    /// Texts that end the generation when they appear in the decoded text so far, even split
    /// across tokens; the returned text stops just before the earliest match. Needs a
    /// tokenizer.
    pub stop_strings: Vec<String>,
}

impl StopConditions {
    /// Nothing but the length limit and the callback (what [`crate::Session::generate`] uses).
    pub fn none() -> Self {
        StopConditions::default()
    }

    /// The model's end ids from its tokenizer (EOS, then `<|end_of_msg|>` when present);
    /// none when the engine has no tokenizer.
    pub fn for_engine(engine: &Engine) -> Self {
        let end_ids = engine.tokenizer().map(|t| t.end_ids()).unwrap_or_default();
        StopConditions {
            end_ids,
            stop_strings: Vec::new(),
        }
    }

    /// Adds stop strings (empty strings are ignored).
    pub fn with_stop_strings<S: Into<String>>(
        mut self,
        stops: impl IntoIterator<Item = S>,
    ) -> Self {
        self.stop_strings.extend(
            stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty()),
        );
        self
    }
}

/// Why a generation ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum StopReason {
    /// It produced the requested number of tokens.
    Length,
    /// It produced this end id (the last of [`Generation::ids`]).
    EndToken(u32),
    /// The decoded text reached this stop string.
    StopText(String),
    /// The `on_token` callback returned `false`.
    Callback,
}

impl StopReason {
    /// A short name: `length`, `end_token`, `stop_text` or `callback`.
    pub fn name(&self) -> &'static str {
        match self {
            StopReason::Length => "length",
            StopReason::EndToken(_) => "end_token",
            StopReason::StopText(_) => "stop_text",
            StopReason::Callback => "callback",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Length => write!(f, "length limit"),
            StopReason::EndToken(id) => write!(f, "end token {id}"),
            StopReason::StopText(s) => write!(f, "stop text {s:?}"),
            StopReason::Callback => write!(f, "stopped by the caller"),
        }
    }
}

/// The result of [`crate::Session::generate_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    /// Every generated id, including an end id or the tokens that completed a stop string.
    pub ids: Vec<u32>,
    /// The decoded text of `ids` (without an end id, cut before a stop string); `None` when
    /// the engine has no tokenizer.
    pub text: Option<String>,
    /// Why it ended.
    pub stop_reason: StopReason,
}

/// Finds stop strings in text that arrives piece by piece, and says which text is safe to show.
///
/// Text that might be the start of a stop string is held back until the next piece settles
/// it, so a streaming front end never prints part of a stop string. The concatenation of every
/// `emit` (plus [`StopScanner::finish`] when no stop string matched) is the generation's text.
#[derive(Clone, Debug)]
pub struct StopScanner {
    stops: Vec<String>,
    held: String,
    done: bool,
}

/// What [`StopScanner::push`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanStep {
    /// Text now known not to be part of a stop string.
    pub emit: String,
    /// The stop string that matched (earliest start; the first listed among equal starts).
    pub hit: Option<String>,
}

impl StopScanner {
    /// A scanner for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        StopScanner {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            done: false,
        }
    }

    /// Adds `piece`; after a hit, further pieces are ignored.
    pub fn push(&mut self, piece: &str) -> ScanStep {
        if self.done {
            return ScanStep::default();
        }
        self.held.push_str(piece);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, s)) = hit {
            let hit = Some(s.clone());
            let emit = self.held[..at].to_string();
            self.held.clear();
            self.done = true;
            return ScanStep { emit, hit };
        }
        let keep = self.longest_stop_prefix_suffix();
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        ScanStep { emit, hit: None }
    }

    /// The text still held back (a possible stop-string start); empty after a hit.
    pub fn finish(self) -> String {
        self.held
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop string
    /// (always at a character boundary, since stop strings are valid UTF-8).
    fn longest_stop_prefix_suffix(&self) -> usize {
        let h = self.held.as_str();
        let mut best = 0;
        for s in &self.stops {
            for (len, _) in s.char_indices().skip(1) {
                if len > best
                    && len <= h.len()
                    && h.is_char_boundary(h.len() - len)
                    && h.ends_with(&s[..len])
                {
                    best = len;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut sc = StopScanner::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let step = sc.push(p);
            out.push_str(&step.emit);
            if step.hit.is_some() {
                return (out, step.hit);
            }
        }
        out.push_str(&sc.finish());
        (out, None)
    }

    #[test]
    fn matches_across_pieces_and_cuts_before_the_stop() {
        assert_eq!(
            scan(&["END"], &["abc E", "N", "Dxyz"]),
            ("abc ".into(), Some("END".into()))
        );
        assert_eq!(scan(&["END"], &["abc EN", "x"]), ("abc ENx".into(), None));
        assert_eq!(scan(&["END"], &["abc EN"]), ("abc EN".into(), None));
        assert_eq!(
            scan(&["zz", "b"], &["abzz"]),
            ("a".into(), Some("b".into()))
        );
        assert_eq!(
            scan(&["ab", "a"], &["xab"]),
            ("x".into(), Some("ab".into())),
            "first listed among equal starts"
        );
        assert_eq!(scan(&[], &["a", "b"]), ("ab".into(), None));
        assert_eq!(
            scan(&["火车"], &["的火", "车"]),
            ("的".into(), Some("火车".into()))
        );
    }

    #[test]
    fn holds_back_only_possible_stop_starts() {
        let mut sc = StopScanner::new(&["<stop>".to_string()]);
        assert_eq!(sc.push("hello <st").emit, "hello ");
        assert_eq!(sc.push("ale").emit, "<stale");
        assert_eq!(sc.push("é<").emit, "é");
        assert_eq!(sc.finish(), "<");
    }
}
