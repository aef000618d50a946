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
mod mode;
mod tiles;

use crate::matrix::data::{Matrix, MatrixData};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

pub use mode::{Numerics, NumericsError};
pub use tiles::Backend;

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
