//! Canonical, length-limited Huffman codes over bytes, written least-significant bit first.
//!
//! A code is fully described by its 256 code lengths ([`CodeLengths`], 0 = symbol absent);
//! codes are assigned canonically (by length, then symbol). Lengths are limited to
//! [`MAX_LEN`] bits so the decoder needs one table lookup of `2^MAX_LEN` entries per symbol.

use crate::CodecError;

/// Longest code, in bits. 11 bits keep the decode table (2,048 × u16 = 4 KiB) in L1 and cost
/// nothing measurable on exponent planes (their codes rarely pass 9 bits).
pub const MAX_LEN: u32 = 11;

/// The code lengths of the 256 byte symbols (0 = absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeLengths(pub [u8; 256]);

impl CodeLengths {
    /// Optimal lengths for `hist` (symbol counts), limited to [`MAX_LEN`] bits by halving the
    /// counts (never below 1) until they fit. A single present symbol gets length 1; an
    /// empty histogram gives all zeros.
    pub fn for_histogram(hist: &[u64; 256]) -> CodeLengths {
        let mut counts = *hist;
        loop {
            let lens = huffman_lengths(&counts);
            if lens.iter().all(|&l| u32::from(l) <= MAX_LEN) {
                return CodeLengths(lens);
            }
            for c in counts.iter_mut().filter(|c| **c > 0) {
                *c = (*c >> 1).max(1);
            }
        }
    }

    /// Parses 256 hexadecimal digits, one length per symbol (the `trunk.json` spelling).
    pub fn from_hex(s: &str) -> Result<CodeLengths, CodecError> {
        let bytes = s.as_bytes();
        if bytes.len() != 256 {
            return Err(CodecError::Table(format!(
                "code lengths are {} hex digits, expected 256",
                bytes.len()
            )));
        }
        let mut lens = [0u8; 256];
        for (l, &c) in lens.iter_mut().zip(bytes) {
            *l = (c as char)
                .to_digit(16)
                .ok_or_else(|| CodecError::Table(format!("{:?} is not a hex digit", c as char)))?
                as u8;
        }
        let lens = CodeLengths(lens);
        lens.check()?;
        Ok(lens)
    }

    /// 256 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.0
            .iter()
            .map(|&l| char::from_digit(u32::from(l), 16).unwrap_or('0'))
            .collect()
    }

    /// Every length at most [`MAX_LEN`], and the Kraft sum at most 1 (a prefix code exists).
    pub fn check(&self) -> Result<(), CodecError> {
        if let Some((s, &l)) = self
            .0
            .iter()
            .enumerate()
            .find(|(_, &l)| u32::from(l) > MAX_LEN)
        {
            return Err(CodecError::Table(format!(
                "symbol {s} has code length {l}, longer than {MAX_LEN}"
            )));
        }
        let kraft: u64 = self
            .0
            .iter()
            .filter(|&&l| l > 0)
            .map(|&l| 1u64 << (MAX_LEN - u32::from(l)))
            .sum();
        if kraft > 1 << MAX_LEN {
            return Err(CodecError::Table(format!(
                "code lengths over-subscribe the code space (Kraft sum {kraft}/{})",
                1u64 << MAX_LEN
            )));
        }
        Ok(())
    }

    /// Canonical codes, bit-reversed for LSB-first writing: `(code, len)` per symbol.
    pub fn codes(&self) -> [(u32, u8); 256] {
        let mut order: Vec<usize> = (0..256).filter(|&s| self.0[s] > 0).collect();
        order.sort_by_key(|&s| (self.0[s], s));
        let mut out = [(0u32, 0u8); 256];
        let (mut code, mut prev_len) = (0u32, 0u8);
        for s in order {
            let l = self.0[s];
            code <<= l - prev_len;
            prev_len = l;
            out[s] = (reverse(code, l), l);
            code += 1;
        }
        out
    }

    /// Expected bits per symbol under `hist`.
    pub fn mean_bits(&self, hist: &[u64; 256]) -> f64 {
        let n: u64 = hist.iter().sum();
        let bits: u64 = hist
            .iter()
            .zip(&self.0)
            .map(|(&c, &l)| c * u64::from(l))
            .sum();
        bits as f64 / n.max(1) as f64
    }
}

/// The low `len` bits of `code`, reversed.
fn reverse(code: u32, len: u8) -> u32 {
    if len == 0 {
        return 0;
    }
    code.reverse_bits() >> (32 - u32::from(len))
}

/// Unlimited Huffman code lengths (two-queue merge over symbols sorted by count).
fn huffman_lengths(counts: &[u64; 256]) -> [u8; 256] {
    let mut lens = [0u8; 256];
    let mut leaves: Vec<(u64, usize)> = (0..256)
        .filter(|&s| counts[s] > 0)
        .map(|s| (counts[s], s))
        .collect();
    if leaves.len() == 1 {
        lens[leaves[0].1] = 1;
    }
    if leaves.len() < 2 {
        return lens;
    }
    leaves.sort();
    // Nodes 0..n are leaves; internal nodes follow. parent[i] links each to its parent.
    let n = leaves.len();
    let mut weight: Vec<u64> = leaves.iter().map(|l| l.0).collect();
    let mut parent = vec![usize::MAX; 2 * n - 1];
    let (mut next_leaf, mut next_inner) = (0usize, n);
    let pick = |weight: &Vec<u64>, next_leaf: &mut usize, next_inner: &mut usize| {
        let inner_ok = *next_inner < weight.len();
        if *next_leaf < n && (!inner_ok || weight[*next_leaf] <= weight[*next_inner]) {
            *next_leaf += 1;
            *next_leaf - 1
        } else {
            *next_inner += 1;
            *next_inner - 1
        }
    };
    for _ in 0..n - 1 {
        let a = pick(&weight, &mut next_leaf, &mut next_inner);
        let b = pick(&weight, &mut next_leaf, &mut next_inner);
        let id = weight.len();
        weight.push(weight[a] + weight[b]);
        parent[a] = id;
        parent[b] = id;
    }
    // Depth of each node: the root (last) is 0; parents come after children.
    let mut depth = vec![0u8; 2 * n - 1];
    for i in (0..2 * n - 2).rev() {
        depth[i] = depth[parent[i]].saturating_add(1);
    }
    for (i, &(_, s)) in leaves.iter().enumerate() {
        lens[s] = depth[i];
    }
    lens
}

/// One decode-table entry: `symbol | len << 8`; len 0 marks a bit pattern no code starts.
pub type Entry = u16;

/// Most symbols one [`DecodeTable::runs`] entry yields.
pub const RUN: usize = 4;

/// The `2^MAX_LEN`-entry lookup tables of a code: one symbol per lookup (`entries`), and up
/// to [`RUN`] (`runs`: symbols in bytes 0–3, then `bits << 32 | count << 40`, count 0 = no
/// code starts here) for the fast loop, which so decodes every code that fits in the next
/// `MAX_LEN` bits with one dependent lookup.
pub struct DecodeTable {
    pub(crate) entries: Box<[Entry; 1 << MAX_LEN]>,
    pub(crate) runs: Box<[u64; 1 << MAX_LEN]>,
}

impl DecodeTable {
    /// The table of `lens` (checked: a bad table is an error, never a wrong decode).
    pub fn new(lens: &CodeLengths) -> Result<DecodeTable, CodecError> {
        lens.check()?;
        let mut entries = Box::new([0u16; 1 << MAX_LEN]);
        for (s, &(code, l)) in lens.codes().iter().enumerate() {
            if l == 0 {
                continue;
            }
            let step = 1usize << l;
            let mut i = code as usize;
            while i < entries.len() {
                entries[i] = s as u16 | (u16::from(l) << 8);
                i += step;
            }
        }
        let mut runs = Box::new([0u64; 1 << MAX_LEN]);
        for (idx, run) in runs.iter_mut().enumerate() {
            *run = run_at(&entries, idx);
        }
        Ok(DecodeTable { entries, runs })
    }
}

/// The [`DecodeTable::runs`] entry of the `MAX_LEN` bits `idx`: the codes it starts with,
/// as many as fit whole (at most [`RUN`]).
fn run_at(entries: &[Entry; 1 << MAX_LEN], idx: usize) -> u64 {
    let (mut symbols, mut bits, mut count) = (0u64, 0u32, 0u64);
    while (count as usize) < RUN {
        let e = entries[idx >> bits];
        let l = u32::from(e >> 8);
        if l == 0 || bits + l > MAX_LEN {
            break;
        }
        symbols |= u64::from(e as u8) << (8 * count);
        bits += l;
        count += 1;
    }
    symbols | u64::from(bits) << 32 | count << 40
}

/// Appends LSB-first bits to a byte vector.
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    bits: u32,
}

impl<'a> BitWriter<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>) -> BitWriter<'a> {
        BitWriter {
            out,
            acc: 0,
            bits: 0,
        }
    }

    /// Writes the low `len` bits of `code` (`len` ≤ [`MAX_LEN`]).
    #[inline]
    pub(crate) fn put(&mut self, code: u32, len: u8) {
        self.acc |= u64::from(code) << self.bits;
        self.bits += u32::from(len);
        if self.bits >= 32 {
            self.out.extend_from_slice(&(self.acc as u32).to_le_bytes());
            self.acc >>= 32;
            self.bits -= 32;
        }
    }

    /// Flushes the last partial byte (zero-padded).
    pub(crate) fn finish(mut self) {
        while self.bits > 0 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.bits = self.bits.saturating_sub(8);
        }
    }
}
