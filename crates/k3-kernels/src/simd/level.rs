//! The kernel levels (scalar, AVX2, AVX-512, NEON): which the CPU has, which is in use
//! (`K3_FORCE_SCALAR`, [`set_force_scalar`]), and [`per_level`], which compiles a loop for the
//! level in use. A leaf: it imports nothing of the crate.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

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
pub(super) fn check(level: Level) {
    assert!(
        level.is_supported(),
        "kernel level {} is not supported on this CPU",
        level.name()
    );
}
