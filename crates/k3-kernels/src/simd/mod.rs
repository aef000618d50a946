//! Run-time selected SIMD paths for the row dots, bit-identical to the scalar definitions
//! in [`crate::dot`] (docs/NUMERICS.md#simd-paths).
//!
//! Every path keeps the contract's *lane assignment* (element `i` → lane `i % 16`, one fused
//! f32 multiply-add per element, ascending) and hands the 16 lanes to the one scalar tree
//! [`crate::dot::reduce16`]; only the way the lanes are held in registers differs:
//!
//! * AVX-512F: one `zmm` (natural order) — `avx512.rs`;
//! * AVX2 + FMA: two `ymm` (natural order for f32/bf16; MXFP4 decodes each 16-element block
//!   in the order `avx2_mx::Q16`, so the activation is read in that order too) —
//!   `avx2.rs`, `avx2_mx.rs`;
//! * NEON: four `float32x4_t` (natural order) — `neon.rs`.
//!
//! A partial last block is padded so that every padded product is `−0`, the exact additive
//! identity: `w = −0`, `x = +0` for f32/bf16 weights, `w = 0` (int8, widened to `+0`),
//! `x = −0` for Q8 weights. So every lane keeps the bits of the scalar definition.
//!
//! The path is detected once (`is_x86_feature_detected!` / NEON is baseline on aarch64) and
//! cached. `K3_FORCE_SCALAR=1` (read once, at first use) or [`set_force_scalar`] selects the
//! scalar path instead.

use half::bf16;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_mx;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_mx;
pub(crate) mod gemm;
pub(crate) mod layout;
mod level;
#[cfg(target_arch = "aarch64")]
mod neon;

pub(crate) use layout::{layout, to_lanes, with_layout, Kind, Layout, Row};
use level::check;
pub(crate) use level::per_level;
pub use level::{
    active_level, available_levels, detected_level, force_scalar, set_force_scalar, simd_level,
    Level,
};

/// [`crate::dot::dot_f32`] on a given level. Panics if the CPU lacks the level or the
/// lengths differ.
#[inline]
pub fn dot_f32_at(level: Level, w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot length");
    crate::dot::def::reduce16(&lanes_natural(level, Row::F32(w), x))
}

/// [`crate::dot::dot_bf16`] on a given level. Panics if the CPU lacks the level or the
/// lengths differ.
#[inline]
pub fn dot_bf16_at(level: Level, w: &[bf16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot length");
    crate::dot::def::reduce16(&lanes_natural(level, Row::Bf16(bytemuck::cast_slice(w)), x))
}

/// [`crate::dot::dot_mxfp4`] on a given level. Panics if the CPU lacks the level or the
/// lengths disagree (`packed.len() == x.len()/2`, `scales.len() == x.len()/32`).
#[inline]
pub fn dot_mxfp4_at(level: Level, packed: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    assert!(
        packed.len() * 2 == x.len() && scales.len() * crate::mxfp4::GROUP == x.len(),
        "mxfp4 row lengths"
    );
    crate::dot::def::reduce16(&lanes_natural(level, Row::Mxfp4(packed, scales), x))
}

/// [`crate::dot::dot_q8`] on a given level. Panics if the CPU lacks the level or the
/// lengths differ.
#[inline]
pub fn dot_q8_at(level: Level, values: &[i8], scale: f32, x: &[f32]) -> f32 {
    assert_eq!(values.len(), x.len(), "dot length");
    let d = crate::dot::def::reduce16(&lanes_natural(level, Row::Q8(values), x));
    crate::dot::def::q8_finish(scale, d)
}

/// The 16 lanes (contract order) of one row with an activation in natural order.
fn lanes_natural(level: Level, row: Row, x: &[f32]) -> [f32; 16] {
    check(level);
    #[cfg(target_arch = "x86_64")]
    if let (Level::Avx2, Row::Mxfp4(p, s)) = (level, row) {
        // SAFETY: `check` confirmed AVX2 and FMA.
        let reg = unsafe { avx2_mx::rows::<1, true>([p], [s], x) }[0];
        return to_lanes(Layout::Q16, reg);
    }
    rows_lanes::<1>(level, [row], x)[0]
}

/// Weight rows per mat-vec kernel call on `level` for `kind` rows.
pub(crate) fn matvec_rows(level: Level, kind: Kind) -> usize {
    match (level, kind) {
        #[cfg(target_arch = "x86_64")]
        (Level::Avx2, Kind::Mxfp4) => avx2_mx::ROWS,
        #[cfg(target_arch = "x86_64")]
        (Level::Avx2, _) => 4,
        #[cfg(target_arch = "x86_64")]
        (Level::Avx512, _) => avx512::ROWS,
        #[cfg(target_arch = "aarch64")]
        (Level::Neon, _) => neon::ROWS,
        _ => 1,
    }
}

/// The 16 lanes (contract order) of `R` rows of one storage and length dotted with `x`, which
/// is in [`layout`]`(level, kind)`. Panics on mixed storages, length mismatch or an
/// unsupported level.
pub(crate) fn rows_lanes<const R: usize>(
    level: Level,
    rows: [Row; R],
    x: &[f32],
) -> [[f32; 16]; R] {
    check(level);
    let kind = rows[0].kind();
    assert!(
        rows.iter().all(|r| r.kind() == kind && r.len() == x.len()),
        "rows of one storage and the activation's length"
    );
    if let Row::Mxfp4(p, _) = rows[0] {
        assert_eq!(p.len() * 2, x.len(), "mxfp4 row lengths");
    }
    let lay = layout(level, kind);
    let reg = rows_reg(level, rows, x);
    reg.map(|r| to_lanes(lay, r))
}

/// [`rows_lanes`] before the reorder to contract order (lengths already checked).
fn rows_reg<const R: usize>(level: Level, rows: [Row; R], x: &[f32]) -> [[f32; 16]; R] {
    use crate::dot::def::{lanes_f32_scalar, lanes_mxfp4_scalar};
    let kind = rows[0].kind();
    match level {
        Level::Scalar => rows.map(|r| match r {
            Row::F32(w) => lanes_f32_scalar(w, x),
            Row::Bf16(w) => crate::dot::def::lanes_bf16_scalar(bytemuck::cast_slice(w), x),
            Row::Mxfp4(p, s) => lanes_mxfp4_scalar(p, s, x),
            Row::Q8(w) => crate::dot::def::lanes_q8_scalar(w, x),
        }),
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => match kind {
            // SAFETY: `check` confirmed AVX2 and FMA.
            Kind::F32 => unsafe { avx2::rows16(rows.map(Row::f32s), x) },
            // SAFETY: as above.
            Kind::Bf16 => unsafe { avx2::rows16(rows.map(Row::bf16s), x) },
            // SAFETY: as above.
            Kind::Q8 => unsafe { avx2::rows16(rows.map(Row::q8s), x) },
            // SAFETY: as above.
            Kind::Mxfp4 => unsafe {
                avx2_mx::rows::<R, false>(rows.map(|r| r.mx().0), rows.map(|r| r.mx().1), x)
            },
        },
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => match kind {
            // SAFETY: `check` confirmed AVX-512F (detection requires AVX2 and FMA too).
            Kind::F32 => unsafe { avx512::rows16(rows.map(Row::f32s), x) },
            // SAFETY: as above.
            Kind::Bf16 => unsafe { avx512::rows16(rows.map(Row::bf16s), x) },
            // SAFETY: as above.
            Kind::Q8 => unsafe { avx512::rows16(rows.map(Row::q8s), x) },
            // SAFETY: as above.
            Kind::Mxfp4 => unsafe {
                avx512::rows_mx(rows.map(|r| r.mx().0), rows.map(|r| r.mx().1), x)
            },
        },
        #[cfg(target_arch = "aarch64")]
        Level::Neon => match kind {
            // SAFETY: NEON is baseline on aarch64.
            Kind::F32 => unsafe { neon::rows16(rows.map(Row::f32s), x) },
            // SAFETY: as above.
            Kind::Bf16 => unsafe { neon::rows16(rows.map(Row::bf16s), x) },
            // SAFETY: as above.
            Kind::Q8 => unsafe { neon::rows16(rows.map(Row::q8s), x) },
            // SAFETY: as above.
            Kind::Mxfp4 => unsafe {
                neon::rows_mx(rows.map(|r| r.mx().0), rows.map(|r| r.mx().1), x)
            },
        },
        #[allow(unreachable_patterns)]
        _ => unreachable!("no SIMD kernel for level {}", level.name()),
    }
}

#[cfg(test)]
mod tests;
