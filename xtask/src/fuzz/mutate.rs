//! Byte- and structure-level mutations for the fuzzer: bit flips, interesting values,
//! splices, length-field edits, JSON-aware token edits, truncations and repetitions.

/// SplitMix64: small, seedable, good enough to drive mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Integers that break length and count fields.
pub fn interesting_u64(rng: &mut Rng, len: usize) -> u64 {
    let l = len as u64;
    let (small, any) = (rng.next() % 4096, rng.next());
    *rng.pick(&[
        0,
        1,
        2,
        7,
        8,
        l,
        l.wrapping_sub(1),
        l + 1,
        l / 2,
        255,
        256,
        65535,
        65536,
        u32::MAX as u64,
        u32::MAX as u64 + 1,
        i64::MAX as u64,
        1 << 63,
        u64::MAX,
        u64::MAX - 7,
        small,
        any,
    ])
}

/// Numbers as JSON text that break numeric fields.
const JSON_NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "-0",
    "0.5",
    "1.5",
    "96.0",
    "1e300",
    "-1e300",
    "1e-300",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1e19",
    "NaN",
    "Infinity",
    "-9.9e999",
    "123456789012345678901234567890",
    "3",
];

/// Other JSON values to drop in place of a token.
const JSON_VALUES: &[&str] = &[
    "null",
    "true",
    "false",
    "\"\"",
    "[]",
    "{}",
    "[0]",
    "[[]]",
    "{\"a\":1}",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"x\"",
    "[1,2,3]",
    "[-1]",
    "\"BF16\"",
];

/// One mutation of `input`; `corpus` feeds splices, `dict` holds target keywords.
pub fn mutate(input: &[u8], corpus: &[Vec<u8>], dict: &[&[u8]], rng: &mut Rng) -> Vec<u8> {
    let mut out = input.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        out = mutate_once(&out, corpus, dict, rng);
    }
    out
}

fn mutate_once(input: &[u8], corpus: &[Vec<u8>], dict: &[&[u8]], rng: &mut Rng) -> Vec<u8> {
    let mut b = input.to_vec();
    let len = b.len();
    match rng.below(13) {
        0 if len > 0 => {
            let i = rng.below(len);
            b[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            b[i] = *rng.pick(&[0u8, 0xff, 0x7f, 0x80, b'"', b'{', b'[', b'\n', b' ', b'9']);
        }
        2 => {
            // Truncate (often near the end, where shards and files get cut).
            let cut = if rng.chance(2) {
                len.saturating_sub(1 + rng.below(64))
            } else {
                rng.below(len + 1)
            };
            b.truncate(cut);
        }
        3 if len > 0 => {
            // Repeat a chunk in place.
            let s = rng.below(len);
            let n = 1 + rng.below((len - s).min(256));
            let chunk = b[s..s + n].to_vec();
            let most = if rng.chance(8) { 200 } else { 4 };
            let times = 1 + rng.below(most);
            let at = s + n;
            let tail = b.split_off(at);
            for _ in 0..times {
                b.extend_from_slice(&chunk);
            }
            b.extend_from_slice(&tail);
        }
        4 if len > 0 => {
            // Delete a range.
            let s = rng.below(len);
            let n = 1 + rng.below((len - s).min(128));
            b.drain(s..s + n);
        }
        5 if !corpus.is_empty() => {
            // Splice: our prefix, another input's suffix.
            let other = rng.pick(corpus);
            let a = rng.below(len + 1);
            let c = rng.below(other.len() + 1);
            b.truncate(a);
            b.extend_from_slice(&other[c..]);
        }
        6 if len >= 4 => {
            // Length-field edit: a little-endian u32/u64 at an aligned or random offset.
            let width = if rng.chance(2) { 8 } else { 4 };
            if len >= width {
                let at = if rng.chance(2) {
                    rng.below(len / width) * width
                } else {
                    rng.below(len - width + 1)
                };
                let v = interesting_u64(rng, len);
                b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
            }
        }
        7 | 8 => return json_edit(&b, dict, rng),
        9 if !dict.is_empty() => {
            let word = *rng.pick(dict);
            let at = rng.below(len + 1);
            b.splice(at..at, word.iter().copied());
        }
        10 => return number_edit(&b, rng),
        11 if len > 1 => {
            // Swap two ranges of lines (reorders tiktoken ranks, JSON members).
            let lines: Vec<&[u8]> = b.split(|&c| c == b'\n').collect();
            if lines.len() > 2 {
                let mut l: Vec<Vec<u8>> = lines.iter().map(|s| s.to_vec()).collect();
                let (i, j) = (rng.below(l.len()), rng.below(l.len()));
                l.swap(i, j);
                if rng.chance(3) {
                    let k = rng.below(l.len());
                    let dup = l[k].clone();
                    l.insert(rng.below(l.len()), dup);
                }
                return l.join(&b'\n');
            }
        }
        _ if len > 0 => {
            let i = rng.below(len);
            b[i] = rng.next() as u8;
        }
        _ => b.extend_from_slice(rng.pick(JSON_VALUES).as_bytes()),
    }
    b
}

/// A JSON token: its byte range and kind.
#[derive(Clone, Copy, PartialEq)]
enum Tok {
    Str,
    Num,
    Word,
    Punct,
}

fn json_tokens(b: &[u8]) -> Vec<(usize, usize, Tok)> {
    let mut toks = Vec::new();
    let mut i = 0;
    while i < b.len() && toks.len() < 200_000 {
        let c = b[i];
        let start = i;
        let kind = match c {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(b.len());
                Tok::Str
            }
            b'-' | b'0'..=b'9' => {
                while i < b.len() && matches!(b[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                Tok::Num
            }
            b'a'..=b'z' | b'A'..=b'Z' => {
                while i < b.len() && b[i].is_ascii_alphanumeric() {
                    i += 1;
                }
                Tok::Word
            }
            b'{' | b'}' | b'[' | b']' | b',' | b':' => {
                i += 1;
                Tok::Punct
            }
            _ => {
                i += 1;
                continue;
            }
        };
        toks.push((start, i, kind));
    }
    toks
}

/// Replaces, deletes or duplicates one JSON token (keeps the rest of the text intact).
fn json_edit(b: &[u8], dict: &[&[u8]], rng: &mut Rng) -> Vec<u8> {
    let toks = json_tokens(b);
    if toks.is_empty() {
        return b.to_vec();
    }
    // Prefer values over punctuation most of the time.
    let mut t = *rng.pick(&toks);
    for _ in 0..4 {
        if t.2 != Tok::Punct {
            break;
        }
        t = *rng.pick(&toks);
    }
    let (s, e, kind) = t;
    let replacement: Vec<u8> = match rng.below(7) {
        0 => Vec::new(),
        1 => b[s..e].repeat(2),
        2 => rng.pick(JSON_VALUES).as_bytes().to_vec(),
        3 if kind == Tok::Str && !dict.is_empty() => {
            let w = *rng.pick(dict);
            let mut q = vec![b'"'];
            q.extend_from_slice(w);
            q.push(b'"');
            q
        }
        4 if kind == Tok::Punct => rng
            .pick(&["{", "}", "[", "]", ",", ":", ",,", ""])
            .as_bytes()
            .to_vec(),
        5 => {
            // Copy another token of the same document here (keys into values, etc.).
            let (s2, e2, _) = *rng.pick(&toks);
            b[s2..e2].to_vec()
        }
        _ => rng.pick(JSON_NUMBERS).as_bytes().to_vec(),
    };
    let mut out = Vec::with_capacity(b.len() + replacement.len());
    out.extend_from_slice(&b[..s]);
    out.extend_from_slice(&replacement);
    out.extend_from_slice(&b[e..]);
    out
}

/// Rewrites one run of ASCII digits (ranks, ids, offsets in text formats).
fn number_edit(b: &[u8], rng: &mut Rng) -> Vec<u8> {
    let runs: Vec<(usize, usize)> = {
        let mut v = Vec::new();
        let mut i = 0;
        while i < b.len() && v.len() < 100_000 {
            if b[i].is_ascii_digit() {
                let s = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                v.push((s, i));
            } else {
                i += 1;
            }
        }
        v
    };
    if runs.is_empty() {
        return b.to_vec();
    }
    let (s, e) = *rng.pick(&runs);
    let old: u64 = std::str::from_utf8(&b[s..e])
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let new = match rng.below(4) {
        0 => old.wrapping_add(1).to_string(),
        1 => old.wrapping_sub(1).to_string(),
        2 => rng.pick(JSON_NUMBERS).to_string(),
        _ => interesting_u64(rng, b.len()).to_string(),
    };
    let mut out = b[..s].to_vec();
    out.extend_from_slice(new.as_bytes());
    out.extend_from_slice(&b[e..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_deterministic_for_a_seed() {
        let seed = br#"{"a":[1,2],"b":"x"}"#.to_vec();
        let run = |s| {
            let mut rng = Rng::new(s);
            (0..50)
                .map(|_| mutate(&seed, std::slice::from_ref(&seed), &[b"dtype"], &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        assert!(
            run(7).iter().any(|m| m != &seed),
            "mutations change the input"
        );
    }

    #[test]
    fn json_tokens_find_values() {
        let t = json_tokens(br#"{"k": -1.5e3, "s": [true]}"#);
        let kinds: Vec<Tok> = t.iter().map(|x| x.2).collect();
        assert!(kinds.contains(&Tok::Num) && kinds.contains(&Tok::Word));
        assert_eq!(t.iter().filter(|x| x.2 == Tok::Str).count(), 2);
    }
}
