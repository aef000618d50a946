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
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_mx;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub(crate) mod gemm;
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
    // Advanced SIMD (with fused multiply-add) is part of the aarch64 baseline.
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

/// `fn NAME(args) -> R` that runs `BODY(args)` compiled for the vector level in use: `BODY`
/// (an `#[inline(always)]` fn) is called from a function with the level's `target_feature`,
/// so its plain loops over f32/f64 (one IEEE multiply and one add per element, never fused —
/// Rust does not contract) are vectorised as wide as the CPU allows and give the same bits at
/// every width. Used by the non-GEMM kernels' loops (`act`, `attn`, `kda`, `tmatvec`). A macro,
/// not a generic taking a closure: LLVM does not inline a closure into a `target_feature`
/// function, which left the body at the baseline width (measured: a tail jump to the closure).
macro_rules! per_level {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $body:ident;) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                match $crate::simd::active_level() {
                    // SAFETY: the level is only active where the CPU supports it.
                    $crate::simd::Level::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above (AVX2).
                    $crate::simd::Level::Avx2 => return unsafe { avx2($($arg),*) },
                    _ => {}
                }
            }
            $body($($arg),*)
        }
    };
}
pub(crate) use per_level;

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

/// The storage of a weight row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    F32,
    Bf16,
    Mxfp4,
    Q8,
}

/// One weight row in its storage (bf16 as raw bits).
#[derive(Clone, Copy)]
pub(crate) enum Row<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    Mxfp4(&'a [u8], &'a [u8]),
    /// The int8 values only: the row scale is applied after the tree by the caller.
    Q8(&'a [i8]),
}

impl<'a> Row<'a> {
    /// The f32 row (empty for other storages; callers match on the kind first).
    fn f32s(self) -> &'a [f32] {
        match self {
            Row::F32(w) => w,
            _ => &[],
        }
    }

    /// The bf16 bits (empty for other storages).
    fn bf16s(self) -> &'a [u16] {
        match self {
            Row::Bf16(w) => w,
            _ => &[],
        }
    }

    /// The int8 values (empty for other storages).
    fn q8s(self) -> &'a [i8] {
        match self {
            Row::Q8(w) => w,
            _ => &[],
        }
    }

    /// The MXFP4 codes and scales (empty for other storages).
    fn mx(self) -> (&'a [u8], &'a [u8]) {
        match self {
            Row::Mxfp4(p, s) => (p, s),
            _ => (&[], &[]),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Row::F32(_) => Kind::F32,
            Row::Bf16(_) => Kind::Bf16,
            Row::Mxfp4(..) => Kind::Mxfp4,
            Row::Q8(_) => Kind::Q8,
        }
    }

    /// Elements of the row.
    fn len(&self) -> usize {
        match self {
            Row::F32(w) => w.len(),
            Row::Bf16(w) => w.len(),
            Row::Mxfp4(_, s) => s.len() * crate::mxfp4::GROUP,
            Row::Q8(w) => w.len(),
        }
    }
}

/// How a level's kernels hold the 16 lanes of one block, and so the order they read the
/// activation in: `Natural`, or `Q16` = every 16-element block in the order
/// `[0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]` (AVX2 MXFP4, `avx2_mx::Q16`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    Natural,
    Q16,
}

/// The activation layout of `level`'s mat-vec and GEMM kernels for `kind` rows.
pub(crate) fn layout(level: Level, kind: Kind) -> Layout {
    match (level, kind) {
        (Level::Avx2, Kind::Mxfp4) => Layout::Q16,
        _ => Layout::Natural,
    }
}

/// Block element held at register position `p` of a `Q16` block.
const Q16: [usize; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// Copies `src` into `dst` (same length) in `layout` (a partial last `Q16` block is copied as
/// is; MXFP4 rows never have one).
pub(crate) fn copy_in_layout(layout: Layout, src: &[f32], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "layout copy length");
    let done = match layout {
        Layout::Natural => 0,
        Layout::Q16 => {
            let blocks = src.chunks_exact(16);
            let done = src.len() - blocks.remainder().len();
            for (b, d) in blocks.zip(dst.chunks_exact_mut(16)) {
                for (o, &k) in d.iter_mut().zip(&Q16) {
                    *o = b[k];
                }
            }
            done
        }
    };
    dst[done..].copy_from_slice(&src[done..]);
}

/// Asks for `bytes` bytes at `p` to be brought into every cache level (`prefetcht0`; a hint:
/// nothing is read or written; x86-64 only, a no-op elsewhere). The GEMM's next-panel hints
/// use it: on Zen 4 `prefetcht1` left the panel fill waiting on its weight loads (14 % of
/// the 1-thread bf16 GEMM's samples in the bf16 widen, 5 % with `t0`; 64–74 → 75–85 % of the
/// FMA peak; docs/PERFORMANCE.md#prefill-against-its-compute-floor).
#[inline]
pub(crate) fn prefetch_t0(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes).step_by(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is baseline on x86-64; a prefetch never faults or dereferences.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// Runs `f` with `x` in `layout` (borrowed when that is its own order).
pub(crate) fn with_layout<R>(layout: Layout, x: &[f32], f: impl FnOnce(&[f32]) -> R) -> R {
    if layout == Layout::Natural {
        return f(x);
    }
    crate::scratch::with(&crate::scratch::X, |buf| {
        buf.clear();
        buf.resize(x.len(), 0.0);
        copy_in_layout(layout, x, buf);
        f(buf)
    })
}

/// Lanes stored in register order → lane order of the contract.
#[inline]
pub(crate) fn to_lanes(layout: Layout, reg: [f32; 16]) -> [f32; 16] {
    match layout {
        Layout::Natural => reg,
        Layout::Q16 => {
            let mut out = [0f32; 16];
            for (&v, &l) in reg.iter().zip(&Q16) {
                out[l] = v;
            }
            out
        }
    }
}

/// [`crate::dot::dot_f32`] on a given level. Panics if the CPU lacks the level or the
/// lengths differ.
#[inline]
pub fn dot_f32_at(level: Level, w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot length");
    crate::dot::reduce16(&lanes_natural(level, Row::F32(w), x))
}

/// [`crate::dot::dot_bf16`] on a given level. Panics if the CPU lacks the level or the
/// lengths differ.
#[inline]
pub fn dot_bf16_at(level: Level, w: &[bf16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len(), "dot length");
    crate::dot::reduce16(&lanes_natural(level, Row::Bf16(bytemuck::cast_slice(w)), x))
}

/// [`crate::dot::dot_mxfp4`] on a given level. Panics if the CPU lacks the level or the
/// lengths disagree (`packed.len() == x.len()/2`, `scales.len() == x.len()/32`).
#[inline]
pub fn dot_mxfp4_at(level: Level, packed: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    assert!(
        packed.len() * 2 == x.len() && scales.len() * crate::mxfp4::GROUP == x.len(),
        "mxfp4 row lengths"
    );
    crate::dot::reduce16(&lanes_natural(level, Row::Mxfp4(packed, scales), x))
}

/// [`crate::dot::dot_q8`] on a given level. Panics if the CPU lacks the level or the
/// lengths differ.
#[inline]
pub fn dot_q8_at(level: Level, values: &[i8], scale: f32, x: &[f32]) -> f32 {
    assert_eq!(values.len(), x.len(), "dot length");
    let d = crate::dot::reduce16(&lanes_natural(level, Row::Q8(values), x));
    crate::dot::q8_finish(scale, d)
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

/// Whole 32-groups every one of `R` MXFP4 rows (16 code bytes and a scale byte per group)
/// and an activation of `x_len` values have: the bound of the mat-vec kernels' loops.
#[allow(dead_code)] // unused on targets with no MXFP4 SIMD kernel
pub(super) fn mx_groups<const R: usize>(
    packed: &[&[u8]; R],
    scales: &[&[u8]; R],
    x_len: usize,
) -> usize {
    (0..R).fold(x_len / crate::mxfp4::GROUP, |m, r| {
        m.min(scales[r].len()).min(packed[r].len() / 16)
    })
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
    use crate::dot::{lanes_f32_scalar, lanes_mxfp4_scalar};
    let kind = rows[0].kind();
    match level {
        Level::Scalar => rows.map(|r| match r {
            Row::F32(w) => lanes_f32_scalar(w, x),
            Row::Bf16(w) => crate::dot::lanes_bf16_scalar(bytemuck::cast_slice(w), x),
            Row::Mxfp4(p, s) => lanes_mxfp4_scalar(p, s, x),
            Row::Q8(w) => crate::dot::lanes_q8_scalar(w, x),
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
