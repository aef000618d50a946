//! Lossless compression of bf16 weights by byte planes (docs/FORMATS.md#compressed-trunk).
//!
//! A bf16 value is `sign:1 | exponent:8 | mantissa:7`. Trained weights spend ~2.6–2.8 bits of
//! information in the exponent and nearly 8 in sign + mantissa, so a chunk of `n` values is
//! stored as:
//!
//! ```text
//! [u32 LE len0..len3]      byte lengths of the four exponent streams
//! [stream 0..3]            exponents of values [s·q, (s+1)·q), q = ceil(n / 4), Huffman-coded
//! [n bytes]                sign << 7 | mantissa, one byte per value, raw
//! ```
//!
//! The Huffman code ([`CodeLengths`]) belongs to the caller (one per tensor in a pack), so a
//! chunk carries no table. The four streams are decoded interleaved, which keeps four
//! independent dependency chains in flight (docs/PERFORMANCE.md#trunk-compression).
//! Decoding never panics on bad input: a chunk that does not decode to exactly `n` values,
//! consuming exactly its streams' bits, is an error. The decoder is one body of safe Rust,
//! compiled once per instruction-set level and chosen at run time (`level.rs`); every level
//! gives the same bytes.

// The only unsafe code is `level.rs`'s calls into the per-level builds of the decoder.
#![deny(unsafe_code)]

pub mod huffman;
mod level;

pub use huffman::{CodeLengths, DecodeTable, MAX_LEN};
use level::join_planes_at;
pub use level::{build_name, decode_chunk_at, decoder_build};

use huffman::BitWriter;

/// Exponent streams per chunk.
pub const STREAMS: usize = 4;
/// Bytes of a chunk's header (the stream lengths).
pub const HEADER: usize = 4 * STREAMS;

/// Why a chunk or a table was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// The code lengths are not a valid length-limited prefix code.
    #[error("bad code table: {0}")]
    Table(String),
    /// The chunk's bytes do not decode to its values.
    #[error("corrupt chunk: {0}")]
    Chunk(String),
}

/// The exponent byte of a bf16 value.
#[inline]
fn exponent(v: u16) -> u8 {
    (v >> 7) as u8
}

/// Sign and mantissa of a bf16 value in one byte.
#[inline]
fn sign_mantissa(v: u16) -> u8 {
    ((v >> 8) as u8 & 0x80) | (v as u8 & 0x7f)
}

/// The bf16 values of little-endian bytes (an odd last byte is ignored).
fn values(bf16: &[u8]) -> impl Iterator<Item = u16> + '_ {
    bf16.chunks_exact(2)
        .map(|p| u16::from_le_bytes([p[0], p[1]]))
}

/// Adds the exponent counts of `bf16` (little-endian values) to `hist`.
pub fn add_exponents(bf16: &[u8], hist: &mut [u64; 256]) {
    for v in values(bf16) {
        hist[exponent(v) as usize] += 1;
    }
}

/// Adds the sign+mantissa byte counts of `bf16` to `hist`.
pub fn add_sign_mantissa(bf16: &[u8], hist: &mut [u64; 256]) {
    for v in values(bf16) {
        hist[sign_mantissa(v) as usize] += 1;
    }
}

/// Shannon entropy of a histogram, in bits per symbol.
pub fn entropy(hist: &[u64; 256]) -> f64 {
    let n: u64 = hist.iter().sum();
    if n == 0 {
        return 0.0;
    }
    hist.iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n as f64;
            -p * p.log2()
        })
        .sum()
}

/// Splits `bf16` into its exponent plane and sign+mantissa plane.
pub fn split_planes(bf16: &[u8]) -> (Vec<u8>, Vec<u8>) {
    values(bf16)
        .map(|v| (exponent(v), sign_mantissa(v)))
        .unzip()
}

/// Interleaves an exponent plane and a sign+mantissa plane back into bf16 bytes
/// (`out.len() == 2 · exp.len()`), on the instruction-set level in use.
pub fn join_planes(exp: &[u8], sm: &[u8], out: &mut [u8]) {
    join_planes_at(k3_kernels::simd::active_level(), exp, sm, out)
}

/// [`join_planes`]' body, inlined into each level's build.
#[inline(always)]
fn join_planes_body(exp: &[u8], sm: &[u8], out: &mut [u8]) {
    for ((o, &e), &m) in out.chunks_exact_mut(2).zip(exp).zip(sm) {
        let v = (u16::from(m & 0x80) << 8) | (u16::from(e) << 7) | u16::from(m & 0x7f);
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// Symbols of stream `s` of a chunk of `n` values: `[s·q, min(n, (s+1)·q))`.
fn stream_range(n: usize, s: usize) -> std::ops::Range<usize> {
    let q = n.div_ceil(STREAMS);
    (s * q).min(n)..((s + 1) * q).min(n)
}

/// Encodes the bf16 values `bf16` (little-endian, even length) with `lens`, appending the
/// chunk to `out`. Every exponent present must have a code (lengths from a histogram that
/// counted these values); returns the chunk's length.
pub fn encode_chunk(
    bf16: &[u8],
    lens: &CodeLengths,
    out: &mut Vec<u8>,
) -> Result<usize, CodecError> {
    let codes = lens.codes();
    let (exp, sm) = split_planes(bf16);
    let start = out.len();
    out.resize(start + HEADER, 0);
    for s in 0..STREAMS {
        let before = out.len();
        let mut w = BitWriter::new(out);
        for &e in &exp[stream_range(exp.len(), s)] {
            let (code, len) = codes[e as usize];
            if len == 0 {
                return Err(CodecError::Table(format!("exponent {e} has no code")));
            }
            w.put(code, len);
        }
        w.finish();
        let n = (out.len() - before) as u32;
        out[start + 4 * s..start + 4 * s + 4].copy_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&sm);
    Ok(out.len() - start)
}

/// One exponent stream being decoded.
#[derive(Clone, Copy)]
struct Reader {
    buf: u64,
    bits: u32,
    pos: usize,
    end: usize,
    start: usize,
}

impl Reader {
    /// Tops `buf` up to ≥ 56 bits with one unaligned 8-byte load (`pos + 8 ≤ data.len()`).
    #[inline(always)]
    fn refill_fast(&mut self, data: &[u8]) {
        let mut w = [0u8; 8];
        w.copy_from_slice(&data[self.pos..self.pos + 8]);
        self.buf |= u64::from_le_bytes(w) << self.bits;
        self.pos += ((63 - self.bits) >> 3) as usize;
        self.bits |= 56;
    }

    /// Tops `buf` up byte by byte, never past the stream's end.
    fn refill_slow(&mut self, data: &[u8]) {
        while self.bits <= 56 && self.pos < self.end {
            self.buf |= u64::from(data[self.pos]) << self.bits;
            self.pos += 1;
            self.bits += 8;
        }
    }

    /// One symbol; `None` for a bit pattern no code starts or bits the stream lacks.
    #[inline(always)]
    fn symbol(&mut self, table: &DecodeTable) -> Option<u8> {
        let e = table.entries[(self.buf & ((1 << MAX_LEN) - 1)) as usize];
        let l = u32::from(e >> 8);
        if l == 0 || l > self.bits {
            return None;
        }
        self.buf >>= l;
        self.bits -= l;
        Some(e as u8)
    }

    /// Bits taken from the stream so far.
    fn consumed_bits(&self) -> usize {
        (self.pos - self.start) * 8 - self.bits as usize
    }
}

/// Decodes a chunk of `n` values encoded with `table` into `out` (`2n` bytes of bf16), on the
/// instruction-set level in use (`K3_FORCE_SCALAR=1` selects the portable build). `scratch`
/// holds the exponent plane (reused between calls). Refuses, without a partial result being
/// meaningful, a chunk whose length, stream lengths or bits do not add up.
pub fn decode_chunk(
    chunk: &[u8],
    n: usize,
    table: &DecodeTable,
    out: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Result<(), CodecError> {
    decode_chunk_at(
        k3_kernels::simd::active_level(),
        chunk,
        n,
        table,
        out,
        scratch,
    )
}

/// [`decode_chunk`]'s body, inlined into each level's build.
#[inline(always)]
fn decode_chunk_body(
    chunk: &[u8],
    n: usize,
    table: &DecodeTable,
    out: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Result<(), CodecError> {
    if out.len() != 2 * n {
        return Err(CodecError::Chunk(format!(
            "output is {} bytes for {n} values",
            out.len()
        )));
    }
    let mut readers = stream_readers(chunk, n)?;
    // Every one of the n exponents is written below (fast loop, then the slow one), so the
    // scratch is grown but not cleared (zeroing it cost 2 % of a decode).
    if scratch.len() < n {
        scratch.resize(n, 0);
    }
    let exp = &mut scratch[..n];
    let done = decode_fast(chunk, n, table, &mut readers, exp)?;
    for (s, r) in readers.iter_mut().enumerate() {
        let range = stream_range(n, s);
        let from = done[s].clamp(range.start, range.end);
        for (i, e) in exp[from..range.end].iter_mut().enumerate() {
            r.refill_slow(chunk);
            *e = r.symbol(table).ok_or_else(|| {
                let at = from + i;
                CodecError::Chunk(format!("exponent stream {s} ends or breaks at value {at}"))
            })?;
        }
        let want = r.end - r.start;
        if r.consumed_bits().div_ceil(8) != want {
            return Err(CodecError::Chunk(format!(
                "exponent stream {s} is {want} bytes but its {} values take {} bits",
                range.len(),
                r.consumed_bits()
            )));
        }
    }
    let sm = &chunk[chunk.len() - n..];
    join_planes_body(exp, sm, out);
    Ok(())
}

/// The interleaved fast loop: five lookups per stream per 8-byte refill (5 × 11 ≤ 56 bits),
/// each yielding every code that fits whole in its 11 bits, up to four ([`DecodeTable`]'s
/// runs: 1.43× the decode rate of two per lookup, measured on Gaussian bf16 with 2.7-bit
/// exponent codes), the four streams' dependency chains side by side, while every stream
/// can load 8 bytes and has room for 20 more symbols. Returns how many values of each stream it
/// decoded (stream `s` from `s·q`).
#[inline(always)]
fn decode_fast(
    chunk: &[u8],
    n: usize,
    table: &DecodeTable,
    readers: &mut [Reader; STREAMS],
    exp: &mut [u8],
) -> Result<[usize; STREAMS], CodecError> {
    const LOOKUPS: usize = 5;
    let fast_end = chunk.len().saturating_sub(8);
    // Local copies, so the four states live in registers (measured: through `&mut` they
    // were spilled to the stack on every symbol).
    let [mut r0, mut r1, mut r2, mut r3] = *readers;
    let mut out = [0usize; STREAMS];
    for (s, o) in out.iter_mut().enumerate() {
        *o = stream_range(n, s).start;
    }
    let [mut o0, mut o1, mut o2, mut o3] = out;
    // Room for the most symbols one round can write (four per lookup, each lookup storing
    // four bytes).
    let ends = [0, 1, 2, 3].map(|s| stream_range(n, s).end);
    let room = huffman::RUN * LOOKUPS;
    let runs = &*table.runs;
    let mut bad = false;
    macro_rules! step {
        ($r:ident, $o:ident) => {{
            let t = runs[($r.buf & ((1 << MAX_LEN) - 1)) as usize];
            let l = ((t >> 32) & 0xff) as u32;
            bad |= t >> 40 == 0;
            $r.buf >>= l;
            $r.bits -= l;
            exp[$o..$o + 4].copy_from_slice(&(t as u32).to_le_bytes());
            $o += (t >> 40) as usize;
        }};
    }
    while o0 + room <= ends[0]
        && o1 + room <= ends[1]
        && o2 + room <= ends[2]
        && o3 + room <= ends[3]
        && r0.pos.max(r1.pos).max(r2.pos).max(r3.pos) <= fast_end
    {
        r0.refill_fast(chunk);
        r1.refill_fast(chunk);
        r2.refill_fast(chunk);
        r3.refill_fast(chunk);
        for _ in 0..LOOKUPS {
            step!(r0, o0);
            step!(r1, o1);
            step!(r2, o2);
            step!(r3, o3);
        }
        if bad {
            return Err(CodecError::Chunk(format!(
                "an exponent stream holds a bit pattern no code starts (near value {o0})"
            )));
        }
    }
    *readers = [r0, r1, r2, r3];
    Ok([o0, o1, o2, o3])
}

/// The four stream readers of a chunk, after checking that the header's lengths plus the
/// raw plane add up to the chunk's length.
fn stream_readers(chunk: &[u8], n: usize) -> Result<[Reader; STREAMS], CodecError> {
    if chunk.len() < HEADER + n {
        return Err(CodecError::Chunk(format!(
            "{} bytes cannot hold the {HEADER}-byte header and {n} sign+mantissa bytes",
            chunk.len()
        )));
    }
    let mut lens = [0usize; STREAMS];
    for (s, l) in lens.iter_mut().enumerate() {
        let mut w = [0u8; 4];
        w.copy_from_slice(&chunk[4 * s..4 * s + 4]);
        *l = u32::from_le_bytes(w) as usize;
    }
    let coded: usize = lens.iter().sum();
    if HEADER + coded + n != chunk.len() {
        return Err(CodecError::Chunk(format!(
            "header says {coded} bytes of exponent streams, the chunk has {} (length {})",
            chunk.len() as i64 - HEADER as i64 - n as i64,
            chunk.len()
        )));
    }
    let mut start = HEADER;
    Ok(lens.map(|l| {
        let r = Reader {
            buf: 0,
            bits: 0,
            pos: start,
            end: start + l,
            start,
        };
        start += l;
        r
    }))
}

#[cfg(test)]
mod tests;
