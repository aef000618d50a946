//! `trunk-chunk`: the compressed trunk's chunk decoder (`k3_codec::decode_chunk`, the code a
//! compressed pack runs on every stored chunk, docs/FORMATS.md#compressed-trunk).
//!
//! Input: 256 bytes of code lengths (each taken mod 12, so over-long and over-subscribed
//! codes occur), a u32 LE value count (mod 2^16), then the chunk's bytes. A table the codec
//! refuses, or a chunk it refuses, is fine; a panic is a crash, and so is a chunk that decodes
//! but whose values, re-encoded with the same code, decode to other values, and a chunk that
//! the decoder's builds for this CPU's instruction-set levels decode or refuse differently.

use super::Target;
use k3_codec::{CodeLengths, DecodeTable};
use k3_kernels::simd::Level;

pub struct TrunkChunk;

/// Gaussian-like bf16 values at a few row scales (a trained-weights stand-in).
fn values(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut out = Vec::with_capacity(2 * n);
    for i in 0..n {
        let mut g = 0.0f32;
        for _ in 0..4 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            g += (s >> 40) as f32 / (1u64 << 24) as f32;
        }
        let v = (g - 2.0) * [0.02, 0.003, 0.2][i % 3];
        out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
    }
    out
}

fn input(bf16: &[u8]) -> Vec<u8> {
    let mut h = [0u64; 256];
    k3_codec::add_exponents(bf16, &mut h);
    let lens = CodeLengths::for_histogram(&h);
    let mut out = lens.0.to_vec();
    out.extend_from_slice(&((bf16.len() / 2) as u32).to_le_bytes());
    let _ = k3_codec::encode_chunk(bf16, &lens, &mut out);
    out
}

impl Target for TrunkChunk {
    fn seeds(&self) -> Vec<Vec<u8>> {
        [0usize, 1, 5, 17, 64, 300, 4099]
            .iter()
            .map(|&n| input(&values(n, n as u64 + 7)))
            .collect()
    }

    fn run(&self, input: &[u8]) -> Result<(), String> {
        let (lens, rest) = input
            .split_at_checked(256)
            .ok_or("shorter than the code lengths")?;
        let (n, chunk) = rest.split_first_chunk::<4>().ok_or("no value count")?;
        let n = (u32::from_le_bytes(*n) % (1 << 16)) as usize;
        let mut l = [0u8; 256];
        for (d, s) in l.iter_mut().zip(lens) {
            *d = s % 12;
        }
        let lens = CodeLengths(l);
        let table = DecodeTable::new(&lens).map_err(|e| e.to_string())?;
        let mut out = vec![0u8; 2 * n];
        let mut scratch = Vec::new();
        let decoded =
            k3_codec::decode_chunk_at(Level::Scalar, chunk, n, &table, &mut out, &mut scratch);
        let builds = k3_kernels::simd::available_levels().into_iter();
        for level in builds.filter(|&l| l != Level::Scalar) {
            let mut other = vec![0u8; 2 * n];
            let res = k3_codec::decode_chunk_at(level, chunk, n, &table, &mut other, &mut scratch);
            assert!(
                res == decoded && (res.is_err() || other == out),
                "the {} decodes this chunk otherwise than the portable one",
                k3_codec::build_name(level)
            );
        }
        decoded.map_err(|e| e.to_string())?;
        // Decoded: the same code must carry these values through another round trip.
        let mut again = Vec::new();
        if let Err(e) = k3_codec::encode_chunk(&out, &lens, &mut again) {
            panic!("decoded values do not re-encode: {e}");
        }
        let mut back = vec![0u8; 2 * n];
        if let Err(e) = k3_codec::decode_chunk(&again, n, &table, &mut back, &mut scratch) {
            panic!("a re-encoded chunk does not decode: {e}");
        }
        assert!(back == out, "a re-encoded chunk decodes to other values");
        Ok(())
    }
}
