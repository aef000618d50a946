//! How the kernels see a weight row ([`Row`], [`Kind`]) and hold the 16 lanes of a block
//! ([`Layout`]): the types every level's kernels and the dispatch above them share.

use super::level::Level;

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
    pub(super) fn f32s(self) -> &'a [f32] {
        match self {
            Row::F32(w) => w,
            _ => &[],
        }
    }

    /// The bf16 bits (empty for other storages).
    pub(super) fn bf16s(self) -> &'a [u16] {
        match self {
            Row::Bf16(w) => w,
            _ => &[],
        }
    }

    /// The int8 values (empty for other storages).
    pub(super) fn q8s(self) -> &'a [i8] {
        match self {
            Row::Q8(w) => w,
            _ => &[],
        }
    }

    /// The MXFP4 codes and scales (empty for other storages).
    pub(super) fn mx(self) -> (&'a [u8], &'a [u8]) {
        match self {
            Row::Mxfp4(p, s) => (p, s),
            _ => (&[], &[]),
        }
    }

    pub(super) fn kind(&self) -> Kind {
        match self {
            Row::F32(_) => Kind::F32,
            Row::Bf16(_) => Kind::Bf16,
            Row::Mxfp4(..) => Kind::Mxfp4,
            Row::Q8(_) => Kind::Q8,
        }
    }

    /// Elements of the row.
    pub(super) fn len(&self) -> usize {
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
pub(super) const Q16: [usize; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

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
