//! Numeric mode "fast" (docs/NUMERICS.md#numeric-mode-fast): the bf16 and MXFP4 weight
//! products on AMX tiles, with each f32 activation cut into three bf16 pieces.
//!
//! Opt-in, never the default: [`set_numerics`] switches it on for every later `matvec`,
//! `par_matvec` and `matmul` over bf16 or MXFP4 weights (f32 and Q8 weights keep contract v2),
//! and refuses where the CPU or the OS offers no AMX-BF16 tiles. Its bits are fixed by the
//! scalar definition in [`def`] — not contract v2's — and are the same for every thread
//! count, budget and chunking on any machine that runs it: every output is one tile element
//! computed by one instruction sequence in one fixed order.
//!
//! * [`def`]: the definition (pieces, the instruction's arithmetic, the order over K);
//! * `tiles`: the tile kernel, on AMX (`tdpbf16ps`) or emulated from [`def`] (tests);
//! * `gemm`: activations packed into tiles, weights as tiles, outputs scattered back.

mod decode;
pub mod def;
mod gemm;
mod tiles;

use crate::matrix::{Matrix, MatrixData};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

pub use tiles::Backend;

/// A numeric mode: which arithmetic the weight products use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// Contract v2 (docs/NUMERICS.md#row-dot-contract-v2), the default: the same bits on
    /// every machine and level.
    V2,
    /// bf16 and MXFP4 weight products on AMX tiles, each activation cut into `pieces` bf16
    /// pieces (1..=3). `pieces: 3` is the mode `fast`; 1 and 2 exist for measurements
    /// (docs/NUMERICS.md#numeric-mode-fast: their logits leave the oracle tolerance).
    Amx { pieces: u8 },
}

impl Numerics {
    /// The opt-in mode: AMX tiles, three pieces.
    pub const FAST: Numerics = Numerics::Amx { pieces: 3 };

    /// The name used by `--numerics` and in reports: `v2`, `fast`, `amx-bf16x1`, `amx-bf16x2`.
    pub fn name(self) -> &'static str {
        match self {
            Numerics::V2 => "v2",
            Numerics::Amx { pieces: 3 } => "fast",
            Numerics::Amx { pieces: 2 } => "amx-bf16x2",
            Numerics::Amx { .. } => "amx-bf16x1",
        }
    }

    /// Parses a [`Numerics::name`] (`amx-bf16x3` is `fast`); `None` for anything else.
    pub fn parse(s: &str) -> Option<Numerics> {
        match s {
            "v2" => Some(Numerics::V2),
            "fast" | "amx-bf16x3" => Some(Numerics::FAST),
            "amx-bf16x2" => Some(Numerics::Amx { pieces: 2 }),
            "amx-bf16x1" => Some(Numerics::Amx { pieces: 1 }),
            _ => None,
        }
    }

    /// The mode of a [`Numerics::code`].
    pub fn from_code(code: u8) -> Numerics {
        match code {
            0 => Numerics::V2,
            pieces => Numerics::Amx { pieces },
        }
    }

    /// A small code for fingerprints and session files (0 = v2, else the piece count).
    pub fn code(self) -> u8 {
        match self {
            Numerics::V2 => 0,
            Numerics::Amx { pieces } => pieces,
        }
    }
}

/// Why a numeric mode cannot be switched on here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NumericsError {
    /// The CPU or OS has no AMX-BF16 tiles.
    #[error("numeric mode {mode} needs AMX-BF16 tiles, and this machine has {why}; run without --numerics (contract v2)")]
    NoAmx {
        mode: &'static str,
        why: &'static str,
    },
    /// Linux refused the tile data state to this process.
    #[error("numeric mode {mode}: Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM failed, errno {errno}); run without --numerics (contract v2)")]
    Refused { mode: &'static str, errno: i32 },
    /// A piece count outside 1..=3.
    #[error("numeric mode with {0} bf16 pieces: only 1, 2 or 3 exist")]
    Pieces(u8),
}

/// The mode in use: 0 = v2, else the AMX piece count.
static MODE: AtomicU8 = AtomicU8::new(0);
/// Whether the AMX modes run on the emulated tiles (set by [`set_numerics_emulated`]).
static EMULATED: AtomicBool = AtomicBool::new(false);

/// Switches every later bf16/MXFP4 weight product to `mode`. `Numerics::V2` always
/// succeeds; an AMX mode asks Linux for the tile state first (once per process) and is
/// refused, leaving the mode unchanged, where there is no AMX-BF16.
pub fn set_numerics(mode: Numerics) -> Result<(), NumericsError> {
    if let Numerics::Amx { pieces } = mode {
        if !(1..=3).contains(&pieces) {
            return Err(NumericsError::Pieces(pieces));
        }
        tiles::enable_amx(mode.name())?;
    }
    EMULATED.store(false, Ordering::SeqCst);
    MODE.store(mode.code(), Ordering::SeqCst);
    Ok(())
}

/// [`set_numerics`] with the AMX modes computed on emulated tiles ([`Backend::Emu`]) on any
/// machine: the same bits as AMX (tested where AMX runs), scalar speed (hundreds of times
/// slower). For tests of the modes' engine-level properties on machines without AMX.
pub fn set_numerics_emulated(mode: Numerics) -> Result<(), NumericsError> {
    if let Numerics::Amx { pieces } = mode {
        if !(1..=3).contains(&pieces) {
            return Err(NumericsError::Pieces(pieces));
        }
    }
    EMULATED.store(true, Ordering::SeqCst);
    MODE.store(mode.code(), Ordering::SeqCst);
    Ok(())
}

/// The numeric mode in use.
pub fn numerics() -> Numerics {
    Numerics::from_code(MODE.load(Ordering::Relaxed))
}

/// Whether this machine can run the AMX modes (asks for the tile state on first call).
pub fn amx_usable() -> bool {
    tiles::enable_amx("fast").is_ok()
}

/// One `TDPBF16PS` on 16 × 16 tiles, `c += a · b` (`a`: 16 rows × 32 bf16; `b`: 16 rows of
/// 16 bf16 pairs, pair `n` of row `k` = the two elements of column `n` at `2k, 2k + 1`): what
/// the semantics probe (`examples/amx_semantics.rs`) compares with [`def::instr`]. `Err`
/// where AMX is not usable.
pub fn one_instruction(
    c: &mut [f32; 256],
    a: &[u16; 512],
    b: &[u16; 512],
) -> Result<(), NumericsError> {
    tiles::enable_amx("fast")?;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AMX is usable (just checked) and the tiles are whole arrays of the configured size.
    unsafe {
        tiles::amx::one_instruction(c, a, b)
    };
    // Without x86-64 `enable_amx` has refused already.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (c, a, b);
    Ok(())
}

/// The piece count when an AMX mode is on and `w` is a storage it takes (bf16, MXFP4).
#[inline]
pub(crate) fn takes(w: &Matrix) -> Option<usize> {
    let pieces = MODE.load(Ordering::Relaxed);
    let storage = matches!(w.data, MatrixData::Bf16(_) | MatrixData::Mxfp4 { .. });
    (pieces != 0 && storage).then_some(pieces as usize)
}

/// `Y[t] = W·X[t]` in the AMX mode with `pieces` pieces (`x` `[t][cols]`, `y` `[t][rows]`).
pub(crate) fn matmul(y: &mut [f32], w: &Matrix, x: &[f32], t: usize, pieces: usize) {
    let backend = if EMULATED.load(Ordering::Relaxed) {
        Backend::Emu
    } else {
        Backend::Amx
    };
    gemm::matmul(backend, pieces, y, w, x, t);
}

/// [`matmul`] on a chosen backend and piece count, whatever the mode in use: tests compare
/// the emulated tiles with AMX's and with [`def`]; benchmarks time the piece counts.
/// `Backend::Amx` needs [`amx_usable`] (panics otherwise). Panics on a shape mismatch, a storage other than
/// bf16/MXFP4 or a piece count outside 1..=3.
pub fn matmul_with(
    backend: Backend,
    pieces: usize,
    y: &mut [f32],
    w: &Matrix,
    x: &[f32],
    t: usize,
) {
    assert!((1..=3).contains(&pieces), "bf16 pieces {pieces}");
    if backend == Backend::Amx {
        if let Err(e) = tiles::enable_amx("fast") {
            panic!("fast::matmul_with on Backend::Amx: {e}");
        }
    }
    gemm::matmul(backend, pieces, y, w, x, t);
}

#[cfg(test)]
mod tests;
