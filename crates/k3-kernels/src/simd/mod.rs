//! Run-time selected SIMD paths for the hot row dots, bit-identical to the scalar definitions
//! in [`crate::dot`].
//!
//! Every path keeps the scalar path's *lane assignment* and *reduction tree*; only the way
//! the lanes are held differs:
//!
//! * f32 / bf16 rows (16 f64 lanes, element `i` → lane `i % 16`): AVX2 holds the lanes in four
//!   `ymm` (lanes 0..4, 4..8, 8..12, 12..16), AVX-512 in two `zmm` (0..8, 8..16), NEON in eight
//!   `float64x2_t`. Every update is a fused f64 multiply-add, exactly as the scalar
//!   `f64::mul_add`. The tree `b_j = (a_j + a_{j+4}) + (a_{j+8} + a_{j+12})`,
//!   `(b0 + b1) + (b2 + b3)` is evaluated with the same pairings, then the tail is fused in
//!   sequentially.
//! * MXFP4 rows (per 32-group, 8 f64 lanes, element `i` → lane `i % 8`): the E2M1 codes are
//!   expanded by a table lookup to exactly the values of [`crate::mxfp4::E2M1`], the lanes are
//!   reduced `((s0+s4)+(s1+s5)) + ((s2+s6)+(s3+s7))` and the group is added as
//!   `acc += sub * scale` (separate multiply and add) in group order.
//!
//! The path is detected once (`is_x86_feature_detected!` / NEON is baseline on aarch64) and
//! cached. `K3_FORCE_SCALAR=1` (read once, at first use) or [`set_force_scalar`] selects the
//! scalar path instead.

use half::bf16;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_mx;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

/// A kernel path. Every level computes bit-identical results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// The portable definitions in [`crate::dot`].
    Scalar,
    /// x86-64 AVX2 + FMA (256-bit).
    Avx2,
    /// x86-64 AVX-512F (512-bit).
    Avx512,
    /// aarch64 Advanced SIMD (128-bit).
    Neon,
}

impl Level {
    /// Short name, as printed by `k3 doctor`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2+fma",
            Level::Avx512 => "avx512f",
            Level::Neon => "neon",
        }
    }

    /// Whether this CPU can run the level (the scalar level always can).
    pub fn is_supported(self) -> bool {
        self == Level::Scalar || hw_levels().contains(&self)
    }
}

/// Hardware levels present on this CPU, best first (detected once).
fn hw_levels() -> &'static [Level] {
    static HW: OnceLock<Vec<Level>> = OnceLock::new();
    HW.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Vec<Level> {
    let mut v = Vec::new();
    let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    if avx2 && is_x86_feature_detected!("avx512f") {
        v.push(Level::Avx512);
    }
    if avx2 {
        v.push(Level::Avx2);
    }
    v
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Vec<Level> {
    // Advanced SIMD (with f64 lanes and fused multiply-add) is part of the aarch64 baseline.
    vec![Level::Neon]
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Vec<Level> {
    Vec::new()
}

/// The best level this CPU supports, ignoring the forced-scalar switch.
pub fn detected_level() -> Level {
    hw_levels().first().copied().unwrap_or(Level::Scalar)
}

/// Every level this CPU can run: `Scalar` first, then the hardware levels (for tests/benches).
pub fn available_levels() -> Vec<Level> {
    let mut v = vec![Level::Scalar];
    v.extend(hw_levels().iter().rev());
    v
}

const FORCE_UNSET: u8 = 0;
const FORCE_OFF: u8 = 1;
const FORCE_ON: u8 = 2;
static FORCE: AtomicU8 = AtomicU8::new(FORCE_UNSET);

fn force_state() -> u8 {
    let f = FORCE.load(Ordering::Relaxed);
    if f != FORCE_UNSET {
        return f;
    }
    let env = std::env::var("K3_FORCE_SCALAR").is_ok_and(|v| v.trim() == "1");
    let want = if env { FORCE_ON } else { FORCE_OFF };
    // A concurrent `set_force_scalar` wins over the environment.
    match FORCE.compare_exchange(FORCE_UNSET, want, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => want,
        Err(cur) => cur,
    }
}

/// Forces (or stops forcing) the scalar path for every later kernel call, overriding
/// `K3_FORCE_SCALAR`. Results do not change either way; only speed does.
pub fn set_force_scalar(on: bool) {
    FORCE.store(if on { FORCE_ON } else { FORCE_OFF }, Ordering::Relaxed);
}

/// Whether the scalar path is forced (by [`set_force_scalar`] or `K3_FORCE_SCALAR=1`).
pub fn force_scalar() -> bool {
    force_state() == FORCE_ON
}

/// The level the kernels use now.
#[inline]
pub fn active_level() -> Level {
    if force_scalar() {
        Level::Scalar
    } else {
        detected_level()
    }
}

/// Name of the path in use now (`"avx512f"`, `"avx2+fma"`, `"neon"` or `"scalar"`).
pub fn simd_level() -> &'static str {
    active_level().name()
}

#[inline]
fn check(level: Level) {
    assert!(
        level.is_supported(),
        "kernel level {} is not supported on this CPU",
        level.name()
    );
}

/// [`crate::dot::dot_f32`] on a given level. Panics if the CPU lacks the level.
#[inline]
pub fn dot_f32_at(level: Level, w: &[f32], x: &[f32]) -> f64 {
    assert_eq!(w.len(), x.len(), "dot length");
    check(level);
    match level {
        Level::Scalar => crate::dot::dot_f32_scalar(w, x),
        _ => row_dots(level, Row::F32(w), [x])[0],
    }
}

/// [`crate::dot::dot_bf16`] on a given level. Panics if the CPU lacks the level.
#[inline]
pub fn dot_bf16_at(level: Level, w: &[bf16], x: &[f32]) -> f64 {
    assert_eq!(w.len(), x.len(), "dot length");
    check(level);
    match level {
        Level::Scalar => crate::dot::dot_bf16_scalar(w, x),
        _ => row_dots(level, Row::Bf16(bytemuck::cast_slice(w)), [x])[0],
    }
}

/// [`crate::dot::dot_mxfp4`] on a given level. Panics if the CPU lacks the level or the
/// lengths disagree (`packed.len() == x.len()/2`, `scales.len() == x.len()/32`).
#[inline]
pub fn dot_mxfp4_at(level: Level, packed: &[u8], scales: &[u8], x: &[f32]) -> f64 {
    check(level);
    match level {
        Level::Scalar => crate::dot::dot_mxfp4_scalar(packed, scales, x),
        _ => row_dots(level, Row::Mxfp4(packed, scales), [x])[0],
    }
}

/// One weight row in its storage (bf16 as raw bits).
#[derive(Clone, Copy)]
pub(crate) enum Row<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    Mxfp4(&'a [u8], &'a [u8]),
}

/// The dots of one weight row with `N` activation rows on a SIMD `level` (each result is the
/// same bits as the scalar dot of that activation row). Panics on length mismatch, on an
/// unsupported level and on `Level::Scalar` (callers use the scalar definitions directly).
#[inline]
pub(crate) fn row_dots<X, const N: usize>(level: Level, row: Row, xs: [&[X]; N]) -> [f64; N]
where
    X: ArchX,
{
    let len = match row {
        Row::F32(w) => w.len(),
        Row::Bf16(w) => w.len(),
        Row::Mxfp4(p, s) => {
            assert!(p.len() * 2 == s.len() * 32, "mxfp4 row lengths");
            s.len() * 32
        }
    };
    assert!(xs.iter().all(|x| x.len() == len), "dot length");
    check(level);
    match (level, row) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY (all AVX-512 arms): `check` confirmed AVX-512F, AVX2 and FMA.
        (Level::Avx512, Row::F32(w)) => unsafe { avx512::dot16(w, xs) },
        #[cfg(target_arch = "x86_64")]
        (Level::Avx512, Row::Bf16(w)) => unsafe { avx512::dot16(w, xs) },
        #[cfg(target_arch = "x86_64")]
        (Level::Avx512, Row::Mxfp4(p, s)) => unsafe { avx512::dot_mxfp4(p, s, xs) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY (all AVX2 arms): `check` confirmed AVX2 and FMA.
        (Level::Avx2, Row::F32(w)) => unsafe { avx2::dot16(w, xs) },
        #[cfg(target_arch = "x86_64")]
        (Level::Avx2, Row::Bf16(w)) => unsafe { avx2::dot16(w, xs) },
        #[cfg(target_arch = "x86_64")]
        (Level::Avx2, Row::Mxfp4(p, s)) => unsafe { avx2::dot_mxfp4(p, s, xs) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY (all NEON arms): NEON is baseline on aarch64.
        (Level::Neon, Row::F32(w)) => unsafe { neon::dot16(w, xs) },
        #[cfg(target_arch = "aarch64")]
        (Level::Neon, Row::Bf16(w)) => unsafe { neon::dot16(w, xs) },
        #[cfg(target_arch = "aarch64")]
        (Level::Neon, Row::Mxfp4(p, s)) => unsafe { neon::dot_mxfp4(p, s, xs) },
        _ => unreachable!("no SIMD kernel for level {}", level.name()),
    }
}

/// An activation vector widened to f64 (exact) once per mat-vec, in the layout the mat-vec
/// kernels of one level read for one storage kind: plain, or — AVX2 MXFP4 — every 8-element
/// block pair-swapped (`avx2_mx::PERM8`).
pub(crate) struct WideX {
    x: Vec<f64>,
    perm: bool,
}

impl WideX {
    /// `x` widened for `level`'s kernels on MXFP4 (`mxfp4`) or f32/bf16 rows.
    pub(crate) fn new(level: Level, mxfp4: bool, x: &[f32]) -> Self {
        #[cfg(target_arch = "x86_64")]
        if level == Level::Avx2 && mxfp4 && x.len().is_multiple_of(32) {
            let x = x
                .chunks_exact(8)
                .flat_map(|b| avx2_mx::PERM8.map(|k| b[k] as f64))
                .collect();
            return WideX { x, perm: true };
        }
        let _ = (level, mxfp4);
        let x = x.iter().map(|&v| v as f64).collect();
        WideX { x, perm: false }
    }
}

/// Weight rows per [`rows_dots`] call on `level` for MXFP4 (`mxfp4`) or f32/bf16 rows.
pub(crate) fn row_block(level: Level, mxfp4: bool) -> usize {
    match level {
        Level::Avx2 if mxfp4 => 4,
        Level::Avx2 => 2,
        _ => 1,
    }
}

/// The dots of `R` rows of one matrix (same storage and length) with one activation vector
/// widened by [`WideX::new`] for the same level and storage; bit-identical to the scalar dot
/// of each row. Panics on length or layout mismatch, an unsupported level and
/// `Level::Scalar`.
pub(crate) fn rows_dots<const R: usize>(level: Level, rows: [Row; R], x: &WideX) -> [f64; R] {
    check(level);
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 {
        let n = x.x.len();
        if let [Row::Mxfp4(..), ..] = rows[..] {
            assert!(x.perm && n.is_multiple_of(32), "mxfp4 activation layout");
            let mut p = [&[][..]; avx2_mx::ROWS];
            let mut s = [&[][..]; avx2_mx::ROWS];
            for k in 0..avx2_mx::ROWS {
                // Fewer than four rows: repeat the last one (its result is dropped).
                let Row::Mxfp4(pk, sk) = rows[k.min(R - 1)] else {
                    panic!("mixed row storages")
                };
                assert!(pk.len() * 2 == n && sk.len() * 32 == n, "mxfp4 row lengths");
                (p[k], s[k]) = (pk, sk);
            }
            // SAFETY: `check` confirmed AVX2 and FMA.
            let v = unsafe { avx2_mx::dot_rows(p, s, &x.x) };
            return std::array::from_fn(|k| v[k]);
        }
        assert!(!x.perm, "activation layout");
        let row_len = |r: &Row| match r {
            Row::F32(w) => w.len(),
            Row::Bf16(w) => w.len(),
            Row::Mxfp4(..) => usize::MAX,
        };
        assert!(rows.iter().all(|r| row_len(r) == n), "dot length");
        // SAFETY (both arms): `check` confirmed AVX2 and FMA.
        return match rows[0] {
            Row::F32(_) => unsafe { avx2::dot16_rows(rows.map(|r| r.f32s()), &x.x) },
            _ => unsafe { avx2::dot16_rows(rows.map(|r| r.bf16s()), &x.x) },
        };
    }
    assert!(!x.perm, "activation layout");
    rows.map(|r| row_dots(level, r, [&x.x[..]])[0])
}

#[cfg(target_arch = "x86_64")]
impl<'a> Row<'a> {
    /// The f32 row (panics for other storages).
    fn f32s(self) -> &'a [f32] {
        match self {
            Row::F32(w) => w,
            _ => panic!("mixed row storages"),
        }
    }

    /// The bf16 row bits (panics for other storages).
    fn bf16s(self) -> &'a [u16] {
        match self {
            Row::Bf16(w) => w,
            _ => panic!("mixed row storages"),
        }
    }
}

/// Activation element types every compiled SIMD module can load (`f32`, `f64`).
#[cfg(target_arch = "x86_64")]
pub(crate) trait ArchX: avx2::Ld4 + avx512::Ld8 {}
#[cfg(target_arch = "x86_64")]
impl<X: avx2::Ld4 + avx512::Ld8> ArchX for X {}
/// Activation element types every compiled SIMD module can load (`f32`, `f64`).
#[cfg(target_arch = "aarch64")]
pub(crate) trait ArchX: neon::Ld4 {}
#[cfg(target_arch = "aarch64")]
impl<X: neon::Ld4> ArchX for X {}
/// Activation element types every compiled SIMD module can load (`f32`, `f64`).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) trait ArchX: XElem {}
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
impl<X: XElem> ArchX for X {}

/// Activation rows per weight-row pass in `matmul` for a level (fits the accumulators in
/// registers: 2 per token on AVX-512, 4 on AVX2, 8 on NEON).
pub(crate) fn token_block(level: Level) -> usize {
    match level {
        Level::Avx512 => 4,
        Level::Avx2 | Level::Neon => 2,
        Level::Scalar => 1,
    }
}

/// `(t0 + t1) + (t2 + t3)`: the last two levels of both trees.
#[inline(always)]
pub(crate) fn tree4(t: [f64; 4]) -> f64 {
    (t[0] + t[1]) + (t[2] + t[3])
}

/// Sequential fused tail `acc = fma(w_j, x_j, acc)` of the 16-lane dot.
#[inline(always)]
pub(crate) fn fused_tail<X: XElem>(mut acc: f64, w: impl Iterator<Item = f32>, x: &[X]) -> f64 {
    for (wj, &xj) in w.zip(x) {
        acc = (wj as f64).mul_add(xj.wide(), acc);
    }
    acc
}

/// An activation element the kernels read: `f32`, or `f64` already widened from `f32`
/// (exact, so both give the same products). Sealed to these two types.
pub(crate) trait XElem: Copy + private::Sealed {
    /// The value as f64 (exact).
    fn wide(self) -> f64;
}

impl XElem for f32 {
    #[inline(always)]
    fn wide(self) -> f64 {
        self as f64
    }
}

impl XElem for f64 {
    #[inline(always)]
    fn wide(self) -> f64 {
        self
    }
}

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A weight element of a 16-lane row: f32, or bf16 as raw bits.
pub(crate) trait WElem: Copy {
    /// The value as f32 (bf16: bits shifted into the high half, exact).
    fn f32(self) -> f32;
}

impl WElem for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

impl WElem for u16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        f32::from_bits((self as u32) << 16)
    }
}

#[cfg(test)]
mod tests;
