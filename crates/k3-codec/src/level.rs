//! The decoder compiled per instruction-set level, chosen at run time.
//!
//! One body of safe Rust (`decode_chunk_body`, `join_planes_body`) is inlined into a function
//! with the level's `target_feature`s, so the compiler may use them: BMI2's flag-free shifts
//! (`shrx`) in the four streams' bit buffers, and wider vectors in the plane join. The levels
//! are those of the kernels ([`Level`], with `K3_FORCE_SCALAR`); a level also needs the
//! features named in [`features_present`], and runs the portable build where the CPU lacks
//! them. Every build decodes the same bytes and refuses the same chunks (tested per level).

// SAFETY (the whole module): each `unsafe` block calls a `#[target_feature]` build only after
// `features_present` has detected every feature that build enables on this CPU.
#![allow(unsafe_code)]

use crate::{decode_chunk_body, join_planes_body, CodecError, DecodeTable};
use k3_kernels::simd::Level;

/// Whether this CPU has every feature the level's build of the decoder enables.
pub fn features_present(level: Level) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let v3 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("bmi1")
            && is_x86_feature_detected!("bmi2")
            && is_x86_feature_detected!("lzcnt");
        match level {
            Level::Avx2 => v3,
            Level::Avx512 => {
                v3 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
            }
            Level::Scalar | Level::Neon => true,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        true
    }
}

/// The build of the decoder [`decode_chunk_at`] runs for `level` on this CPU, by name.
pub fn build_name(level: Level) -> &'static str {
    match level {
        Level::Avx512 if features_present(level) => "AVX-512 build (AVX-512F/BW, BMI2)",
        Level::Avx2 if features_present(level) => "x86-64-v3 build (AVX2, BMI2)",
        _ => "portable build",
    }
}

/// The build of the decoder [`crate::decode_chunk`] runs on this CPU now, as `k3 doctor`
/// prints it.
pub fn decoder_build() -> &'static str {
    build_name(k3_kernels::simd::active_level())
}

/// [`crate::decode_chunk`] built for `level` (the portable build where the CPU lacks the
/// level's features): for benchmarks and tests that compare levels.
pub fn decode_chunk_at(
    level: Level,
    chunk: &[u8],
    n: usize,
    table: &DecodeTable,
    out: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Result<(), CodecError> {
    #[cfg(target_arch = "x86_64")]
    if features_present(level) {
        match level {
            // SAFETY: see the module comment.
            Level::Avx512 => return unsafe { x86::decode_avx512(chunk, n, table, out, scratch) },
            // SAFETY: see the module comment.
            Level::Avx2 => return unsafe { x86::decode_avx2(chunk, n, table, out, scratch) },
            Level::Scalar | Level::Neon => {}
        }
    }
    decode_chunk_body(chunk, n, table, out, scratch)
}

/// [`crate::join_planes`] built for `level` (the portable build where the CPU lacks it).
pub fn join_planes_at(level: Level, exp: &[u8], sm: &[u8], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if features_present(level) {
        match level {
            // SAFETY: see the module comment.
            Level::Avx512 => return unsafe { x86::join_avx512(exp, sm, out) },
            // SAFETY: see the module comment.
            Level::Avx2 => return unsafe { x86::join_avx2(exp, sm, out) },
            Level::Scalar | Level::Neon => {}
        }
    }
    join_planes_body(exp, sm, out)
}

/// One build per level: `decode_NAME` and `join_NAME`, the bodies compiled with `FEATURES`.
#[cfg(target_arch = "x86_64")]
macro_rules! level_build {
    ($decode:ident, $join:ident, $features:literal) => {
        #[target_feature(enable = $features)]
        pub(super) fn $decode(
            chunk: &[u8],
            n: usize,
            table: &DecodeTable,
            out: &mut [u8],
            scratch: &mut Vec<u8>,
        ) -> Result<(), CodecError> {
            decode_chunk_body(chunk, n, table, out, scratch)
        }

        #[target_feature(enable = $features)]
        pub(super) fn $join(exp: &[u8], sm: &[u8], out: &mut [u8]) {
            join_planes_body(exp, sm, out)
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;

    level_build!(decode_avx2, join_avx2, "avx2,bmi1,bmi2,lzcnt");
    level_build!(
        decode_avx512,
        join_avx512,
        "avx512f,avx512bw,avx2,bmi1,bmi2,lzcnt"
    );
}
