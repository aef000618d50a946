//! Round trips, corruption refused, table checks.

use super::*;
use proptest::prelude::*;

/// Trained-like bf16 bytes: Gaussian-ish values (sum of uniforms) at a few scales.
fn weights(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(2 * n);
    for i in 0..n {
        let g: f64 = (0..4).map(|_| next()).sum::<f64>() - 2.0;
        let scale = [0.02, 0.005, 0.1][i % 3];
        let v = (g * scale) as f32;
        out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
    }
    out
}

fn lens_of(bf16: &[u8]) -> CodeLengths {
    let mut h = [0u64; 256];
    add_exponents(bf16, &mut h);
    CodeLengths::for_histogram(&h)
}

fn round_trip(bf16: &[u8]) -> Vec<u8> {
    let lens = lens_of(bf16);
    let mut chunk = Vec::new();
    encode_chunk(bf16, &lens, &mut chunk).unwrap();
    let table = DecodeTable::new(&lens).unwrap();
    let mut out = vec![0u8; bf16.len()];
    decode_chunk(&chunk, bf16.len() / 2, &table, &mut out, &mut Vec::new()).unwrap();
    out
}

#[test]
fn trained_like_weights_round_trip_and_shrink() {
    let w = weights(100_003, 1);
    assert_eq!(round_trip(&w), w);
    let lens = lens_of(&w);
    let mut chunk = Vec::new();
    encode_chunk(&w, &lens, &mut chunk).unwrap();
    let ratio = chunk.len() as f64 / w.len() as f64;
    assert!(ratio < 0.72, "ratio {ratio}");
}

#[test]
fn tiny_and_single_symbol_chunks_round_trip() {
    for n in [0usize, 1, 2, 3, 4, 5, 7, 15, 16, 17, 33] {
        let w = weights(n, 7);
        assert_eq!(round_trip(&w), w, "n = {n}");
    }
    let same: Vec<u8> = std::iter::repeat_n([0x80u8, 0x3f], 1000)
        .flatten()
        .collect();
    assert_eq!(round_trip(&same), same);
}

#[test]
fn length_limit_holds_for_skewed_counts() {
    let mut h = [0u64; 256];
    for (i, c) in h.iter_mut().enumerate() {
        *c = 1u64 << (i / 4).min(40);
    }
    let lens = CodeLengths::for_histogram(&h);
    assert!(lens.0.iter().all(|&l| (1..=MAX_LEN as u8).contains(&l)));
    lens.check().unwrap();
    assert_eq!(CodeLengths::from_hex(&lens.to_hex()).unwrap(), lens);
}

#[test]
fn bad_tables_are_refused() {
    let mut lens = [0u8; 256];
    lens[..3].copy_from_slice(&[1, 1, 1]);
    let hex: String = CodeLengths(lens).to_hex();
    assert_eq!(
        CodeLengths::from_hex(&hex).unwrap_err(),
        CodecError::Table(
            "code lengths over-subscribe the code space (Kraft sum 3072/2048)".into()
        )
    );
    lens[0] = 12;
    assert_eq!(
        CodeLengths(lens).check().unwrap_err(),
        CodecError::Table("symbol 0 has code length 12, longer than 11".into())
    );
    assert!(CodeLengths::from_hex("zz").is_err());
}

#[test]
fn truncated_and_padded_chunks_are_refused() {
    let w = weights(5000, 3);
    let lens = lens_of(&w);
    let table = DecodeTable::new(&lens).unwrap();
    let mut chunk = Vec::new();
    encode_chunk(&w, &lens, &mut chunk).unwrap();
    let mut out = vec![0u8; w.len()];
    let cut = &chunk[..chunk.len() - 1];
    let e = decode_chunk(cut, 5000, &table, &mut out, &mut Vec::new()).unwrap_err();
    assert!(
        matches!(e, CodecError::Chunk(ref m) if m.starts_with("header says")),
        "{e}"
    );
    let e = decode_chunk(&chunk[..10], 5000, &table, &mut out, &mut Vec::new()).unwrap_err();
    assert_eq!(
        e,
        CodecError::Chunk(
            "10 bytes cannot hold the 16-byte header and 5000 sign+mantissa bytes".into()
        )
    );
}

#[test]
fn a_flipped_bit_in_a_stream_never_decodes_silently_to_other_lengths() {
    // A flipped stream bit either fails to decode or decodes to different exponents; the
    // pack's per-chunk checksum is what catches the second case. Here: no panic, ever.
    let w = weights(4000, 5);
    let lens = lens_of(&w);
    let table = DecodeTable::new(&lens).unwrap();
    let mut chunk = Vec::new();
    encode_chunk(&w, &lens, &mut chunk).unwrap();
    let mut out = vec![0u8; w.len()];
    for bit in 0..(chunk.len() - 4000) * 8 {
        let mut c = chunk.clone();
        c[bit / 8] ^= 1 << (bit % 8);
        let _ = decode_chunk(&c, 4000, &table, &mut out, &mut Vec::new());
    }
}

proptest! {
    #[test]
    fn any_bf16_bytes_round_trip(v in proptest::collection::vec(any::<u16>(), 0..3000)) {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        prop_assert_eq!(round_trip(&bytes), bytes);
    }

    #[test]
    fn any_chunk_bytes_decode_without_panic(
        c in proptest::collection::vec(any::<u8>(), 0..600),
        n in 0usize..300,
    ) {
        let w = weights(300, 9);
        let table = DecodeTable::new(&lens_of(&w)).unwrap();
        let mut out = vec![0u8; 2 * n];
        let _ = decode_chunk(&c, n, &table, &mut out, &mut Vec::new());
    }
}

/// Each level's build of the decoder, as the CPU runs it (the portable build where it lacks a
/// level's features).
fn levels() -> Vec<k3_kernels::simd::Level> {
    k3_kernels::simd::available_levels()
}

/// The levels other than the portable one, to compare with it.
fn vector_levels() -> Vec<k3_kernels::simd::Level> {
    let mut l = levels();
    l.retain(|&l| l != k3_kernels::simd::Level::Scalar);
    l
}

/// What one level's decoder makes of `chunk`: the bf16 bytes or the refusal's message.
fn decode_at(
    level: k3_kernels::simd::Level,
    chunk: &[u8],
    n: usize,
    table: &DecodeTable,
) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![0u8; 2 * n];
    decode_chunk_at(level, chunk, n, table, &mut out, &mut Vec::new()).map(|()| out)
}

#[test]
fn every_level_decodes_and_refuses_alike() {
    let w = weights(70_001, 11);
    let lens = lens_of(&w);
    let table = DecodeTable::new(&lens).unwrap();
    let mut chunk = Vec::new();
    encode_chunk(&w, &lens, &mut chunk).unwrap();
    for level in levels() {
        assert_eq!(
            decode_at(level, &chunk, 70_001, &table).as_ref(),
            Ok(&w),
            "{}",
            level.name()
        );
    }
    // Damaged chunks: the same refusal (or the same wrong bytes) at every level.
    let coded = chunk.len() - 70_001;
    for bit in (0..coded * 8).step_by(997) {
        let mut c = chunk.clone();
        c[bit / 8] ^= 1 << (bit % 8);
        let portable = decode_at(k3_kernels::simd::Level::Scalar, &c, 70_001, &table);
        for level in vector_levels() {
            assert_eq!(
                decode_at(level, &c, 70_001, &table),
                portable,
                "{} bit {bit}",
                level.name()
            );
        }
    }
    let (exp, sm) = split_planes(&w);
    for level in levels() {
        let mut out = vec![0u8; w.len()];
        join_planes_at(level, &exp, &sm, &mut out);
        assert_eq!(out, w, "{}", level.name());
    }
}

proptest! {
    /// Any bf16 values, encoded, then (half the time) one bit of the chunk flipped: every
    /// build returns the portable build's bytes or its refusal. The chunks reach the fast loop
    /// (over 80 values) as well as the tail.
    #[test]
    fn every_level_agrees_on_any_chunk_intact_or_damaged(
        v in proptest::collection::vec(any::<u16>(), 0..3000),
        flip in any::<proptest::sample::Index>(),
        damaged in any::<bool>(),
    ) {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let lens = lens_of(&bytes);
        let table = DecodeTable::new(&lens).unwrap();
        let mut chunk = Vec::new();
        encode_chunk(&bytes, &lens, &mut chunk).unwrap();
        if damaged {
            let bit = flip.index(chunk.len() * 8);
            chunk[bit / 8] ^= 1 << (bit % 8);
        }
        let portable = decode_at(k3_kernels::simd::Level::Scalar, &chunk, v.len(), &table);
        if !damaged {
            prop_assert_eq!(portable.as_ref(), Ok(&bytes));
        }
        for level in vector_levels() {
            prop_assert_eq!(
                decode_at(level, &chunk, v.len(), &table),
                portable.clone(),
                "{}",
                level.name()
            );
        }
    }
}
