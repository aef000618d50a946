//! Kimi's pre-tokenizer: a hand-written scanner that splits text exactly like tiktoken's
//! regex engine (fancy-regex, leftmost-first backtracking) runs [`KIMI_PAT_STR`].
//!
//! The pattern is tried alternative by alternative at each position; every alternative needs at
//! least one character and every character is matched by some alternative, so the pieces are a
//! contiguous partition of the text. The Unicode classes are derived at start-up from
//! `regex-syntax` (the parser under tiktoken's regex engine), so `\p{Han}`, `\p{L}`, `\s`, …
//! mean exactly what they mean to tiktoken.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

/// Kimi's split regex (`pat_str` of `tokenization_kimi.py`, docs/TOKENIZER.md#how-it-encodes), alternatives in order.
/// This is the string written into an exported `tokenizer.json` and the only pattern accepted
/// when one is loaded.
pub const KIMI_PAT_STR: &str = concat!(
    r"[\p{Han}]+",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    "|",
    r"\s*[\r\n]+",
    "|",
    r"\s+(?!\S)",
    "|",
    r"\s+",
);

/// `[\p{Han}]`
const HAN: u8 = 1;
/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]` ("upper" letters of rules B/C)
const UPPER: u8 = 2;
/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]` ("lower" letters of rules B/C)
const LOWER: u8 = 4;
/// `\p{L}`
const LETTER: u8 = 8;
/// `\p{N}`
const NUMBER: u8 = 16;
/// `\s` (Unicode White_Space)
const SPACE: u8 = 32;

/// One flag byte per code point (1.1 MB), built once per process.
struct ClassTable(Vec<u8>);

static TABLE: OnceLock<ClassTable> = OnceLock::new();

impl ClassTable {
    fn get() -> &'static ClassTable {
        TABLE.get_or_init(ClassTable::build)
    }

    fn build() -> ClassTable {
        let mut flags = vec![0u8; 0x11_0000];
        let classes = [
            (r"[\p{Han}]", HAN),
            (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", UPPER),
            (r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", LOWER),
            (r"\p{L}", LETTER),
            (r"\p{N}", NUMBER),
            (r"\s", SPACE),
        ];
        for (expr, flag) in classes {
            for (lo, hi) in class_ranges(expr) {
                for f in &mut flags[lo as usize..=hi as usize] {
                    *f |= flag;
                }
            }
        }
        ClassTable(flags)
    }

    #[inline]
    fn flags(&self, c: u32) -> u8 {
        self.0[c as usize]
    }
}

/// The code-point ranges of a constant character-class expression, as regex-syntax reads it.
// The argument is always a constant of this module (never input): a parse failure is a bug here.
#[allow(clippy::expect_used)]
fn class_ranges(expr: &str) -> Vec<(u32, u32)> {
    // The expressions are compile-time constants of this module; failing to parse one is a bug
    // in this file, not a property of any input.
    let hir = regex_syntax::Parser::new()
        .parse(expr)
        .expect("constant class expression parses");
    match hir.kind() {
        HirKind::Class(Class::Unicode(cls)) => cls
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        other => panic!("constant class expression {expr} is not a Unicode class: {other:?}"),
    }
}

/// Kimi's pre-tokenizer. Cheap to copy; the class table is shared process-wide.
#[derive(Clone, Copy)]
pub struct KimiSplitter {
    table: &'static ClassTable,
}

impl std::fmt::Debug for KimiSplitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KimiSplitter")
    }
}

impl Default for KimiSplitter {
    fn default() -> Self {
        Self::new()
    }
}

impl KimiSplitter {
    /// Builds (once per process) the Unicode class table and returns the splitter.
    pub fn new() -> Self {
        KimiSplitter {
            table: ClassTable::get(),
        }
    }

    /// The pieces of `text`, in order; their concatenation is `text`.
    pub fn split<'t>(&self, text: &'t str) -> Pieces<'t> {
        Pieces {
            splitter: *self,
            text,
            pos: 0,
        }
    }

    /// Decodes the char at byte `i` (which must be a char boundary of valid UTF-8).
    #[inline]
    fn char_at(&self, s: &[u8], i: usize) -> (u32, usize, u8) {
        let b0 = s[i] as u32;
        let (c, n) = if b0 < 0x80 {
            (b0, 1)
        } else if b0 < 0xE0 {
            (((b0 & 0x1F) << 6) | (s[i + 1] as u32 & 0x3F), 2)
        } else if b0 < 0xF0 {
            let c = ((b0 & 0x0F) << 12) | ((s[i + 1] as u32 & 0x3F) << 6);
            (c | (s[i + 2] as u32 & 0x3F), 3)
        } else {
            let c = ((b0 & 0x07) << 18) | ((s[i + 1] as u32 & 0x3F) << 12);
            (
                c | ((s[i + 2] as u32 & 0x3F) << 6) | (s[i + 3] as u32 & 0x3F),
                4,
            )
        };
        (c, n, self.table.flags(c))
    }

    /// End of the run of chars starting at `i` whose flags satisfy `pred`.
    #[inline]
    fn run_end(&self, s: &[u8], mut i: usize, pred: impl Fn(u32, u8) -> bool) -> usize {
        while i < s.len() {
            let (c, n, f) = self.char_at(s, i);
            if !pred(c, f) {
                break;
            }
            i += n;
        }
        i
    }

    /// End of the piece that starts at byte `i` (< `s.len()`).
    fn piece_end(&self, s: &[u8], i: usize) -> usize {
        let (c, n, f) = self.char_at(s, i);
        if f & HAN != 0 {
            return self.run_end(s, i, |_, f| f & HAN != 0);
        }
        // Rule B, then rule C; each first with the optional one-char prefix, then without.
        let prefixed = is_letter_prefix(c, f);
        for lower_required in [true, false] {
            if prefixed {
                if let Some(end) = self.letters(s, i + n, lower_required) {
                    return end;
                }
            }
            if let Some(end) = self.letters(s, i, lower_required) {
                return end;
            }
        }
        if f & NUMBER != 0 {
            return self.digits(s, i);
        }
        if let Some(end) = self.punctuation(s, i, c) {
            return end;
        }
        self.whitespace(s, i)
    }

    /// Rule B (`lower_required`: `U*L+`) or rule C (`U+L*`) from `j`, after the optional
    /// prefix, followed by an optional contraction. `None` when the rule does not match at `j`.
    fn letters(&self, s: &[u8], j: usize, lower_required: bool) -> Option<usize> {
        // Greedy U*, remembering where the last char that is also in L ends (for backtracking).
        let mut k = j;
        let mut last_lower_end = None;
        while k < s.len() {
            let (_, n, f) = self.char_at(s, k);
            if f & UPPER == 0 {
                break;
            }
            if f & LOWER != 0 {
                last_lower_end = Some(k + n);
            }
            k += n;
        }
        if !lower_required && k == j {
            return None; // rule C needs at least one U
        }
        let lower_follows = k < s.len() && self.char_at(s, k).2 & LOWER != 0;
        let end = if lower_follows {
            self.run_end(s, k, |_, f| f & LOWER != 0)
        } else if !lower_required {
            k // rule C: the whole (non-empty) U run, no L follows
        } else {
            last_lower_end? // rule B backtracks U* to end at its last char that is also in L
        };
        Some(self.contraction(s, end))
    }

    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` at `i`; returns the new end.
    fn contraction(&self, s: &[u8], i: usize) -> usize {
        if s.get(i) != Some(&b'\'') {
            return i;
        }
        let rest = &s[i + 1..];
        let lower = |k: usize| rest.get(k).map(|b| b.to_ascii_lowercase());
        match lower(0) {
            // Unicode case folding makes U+017F (long s) match `s` too.
            Some(b's' | b't' | b'm' | b'd') => i + 2,
            Some(b'r' | b'v') if lower(1) == Some(b'e') => i + 3,
            Some(b'l') if lower(1) == Some(b'l') => i + 3,
            _ if rest.starts_with("\u{17F}".as_bytes()) => i + 3,
            _ => i,
        }
    }

    /// Rule D: `\p{N}{1,3}`.
    fn digits(&self, s: &[u8], mut i: usize) -> usize {
        for _ in 0..3 {
            if i >= s.len() {
                break;
            }
            let (_, n, f) = self.char_at(s, i);
            if f & NUMBER == 0 {
                break;
            }
            i += n;
        }
        i
    }

    /// Rule E: ` ?[^\s\p{L}\p{N}]+[\r\n]*`.
    fn punctuation(&self, s: &[u8], i: usize, c: u32) -> Option<usize> {
        let symbol = |_: u32, f: u8| f & (SPACE | LETTER | NUMBER) == 0;
        let j = if c == u32::from(b' ') { i + 1 } else { i };
        if j >= s.len() || {
            let (c, _, f) = self.char_at(s, j);
            !symbol(c, f)
        } {
            return None;
        }
        let end = self.run_end(s, j, symbol);
        Some(self.run_end(s, end, |c, _| c == 0x0A || c == 0x0D))
    }

    /// Rules F, G, H on the whitespace run at `i`: up to its last CR/LF; else the run minus its
    /// last char when a non-space follows (`(?!\S)`); else the whole run.
    fn whitespace(&self, s: &[u8], i: usize) -> usize {
        let mut k = i;
        let mut last_newline_end = None;
        let mut last_start = i;
        while k < s.len() {
            let (c, n, f) = self.char_at(s, k);
            if f & SPACE == 0 {
                break;
            }
            if c == 0x0A || c == 0x0D {
                last_newline_end = Some(k + n);
            }
            last_start = k;
            k += n;
        }
        if k == i {
            // Unreachable for valid UTF-8 (every char matches some rule); never stall.
            return i + self.char_at(s, i).1;
        }
        match last_newline_end {
            Some(end) => end,
            None if k < s.len() && last_start > i => last_start,
            None => k,
        }
    }
}

/// `[^\r\n\p{L}\p{N}]`: the optional one-char prefix of rules B and C.
#[inline]
fn is_letter_prefix(c: u32, f: u8) -> bool {
    c != 0x0A && c != 0x0D && f & (LETTER | NUMBER) == 0
}

/// Iterator over the pieces of a text (see [`KimiSplitter::split`]).
pub struct Pieces<'t> {
    splitter: KimiSplitter,
    text: &'t str,
    pos: usize,
}

impl<'t> Iterator for Pieces<'t> {
    type Item = &'t str;

    fn next(&mut self) -> Option<&'t str> {
        if self.pos >= self.text.len() {
            return None;
        }
        let start = self.pos;
        let end = self.splitter.piece_end(self.text.as_bytes(), start);
        self.pos = end;
        // `end` is always a char boundary: every rule advances whole chars.
        self.text.get(start..end)
    }
}
