//! The GEMM's per-level kernels behind one trait ([`Isa`]): panel fills (widen, MXFP4
//! decode), the microkernel sweep over a panel, the fused small-T MXFP4 tiles and the lane
//! tree. `simd::gemm` drives them (docs/NUMERICS.md#gemm).

use super::plan::{Ahead, Done, RB, XS};
use crate::dot::def::reduce16;
use crate::matrix::data::Matrix;
#[cfg(target_arch = "x86_64")]
use crate::matrix::data::MatrixData;
#[cfg(target_arch = "x86_64")]
use crate::mxfp4::GROUP;
use crate::simd::layout::{to_lanes, Kind, Layout};

/// One block × chunk of the GEMM: the operands of [`Isa::sweep`] and [`Isa::fused_mx`]
/// (`w` and the first row and column are read by the x86 fused tiles only).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct Tile<'a> {
    pub(super) w: &'a Matrix<'a>,
    /// The block's first row and row count (`1 ..= RB`).
    pub(super) rows: (usize, usize),
    /// The chunk's first column and column count (a multiple of 16; whole groups for MXFP4).
    pub(super) cols: (usize, usize),
    /// The chunk's packed activations: token `j` at `x + j·XS`.
    pub(super) x: *const f32,
    /// `x` is in halves order ([`Isa::HALVES`]; always so for the panel sweeps, which only
    /// run on calls packed that way, [`Isa::fused_only`]).
    pub(super) halves: bool,
    /// Tokens of the group.
    pub(super) tg: usize,
    /// The block's lanes (`RB · tg` slots, as [`Isa::sweep`]).
    pub(super) st: *mut f32,
    /// The first chunk: the lanes start at +0 and are only written.
    pub(super) fresh: bool,
    /// Leading tokens [`Isa::sweep`] leaves out (already added by [`Isa::sweep_bf16`]).
    pub(super) skip: usize,
    /// The rows' last chunk on a level that [reduces in the tile](Isa::REDUCES_IN_TILE):
    /// the block's outputs (row `r`, token `j` at `done.at(r, j)`), where the panel sweeps
    /// leave them instead of the state ([`Isa::fused_mx`] ignores it).
    pub(super) done: Option<Done>,
}

/// A level's GEMM kernels.
pub(super) trait Isa {
    /// The sweeps' microkernels reduce the lanes in registers after a row's last chunk and
    /// write the outputs to [`Tile::done`] (AVX2, AVX-512); otherwise, and in [`Isa::fused_mx`]
    /// always, they leave the lanes in the state and [`Isa::reduce16x16`] / [`Isa::reduce`]
    /// finish them.
    const REDUCES_IN_TILE: bool = false;
    /// The panel rows and packed activations hold each chunk of `kc` columns in **halves**
    /// order (AVX2): register positions 0..8 of the chunk's 16-element steps first, then
    /// positions 8..16 from `kc / 2` on, so each of the microkernel's two 8-lane passes reads
    /// one contiguous half (docs/NUMERICS.md#gemm). Otherwise the steps follow each other.
    const HALVES: bool = false;
    /// Every tile of a call with `t` tokens of `kind` rows goes through [`Isa::fused_mx`]:
    /// its activations are then packed in step order, even on a level with
    /// [`Isa::HALVES`] (the order the AVX2 fused tiles read; they decline other calls).
    fn fused_only(_kind: Kind, _t: usize) -> bool {
        false
    }
    /// Copies one chunk of an f32 row (`src.len() == dst.len()`, a multiple of 16) into `dst`
    /// in the level's chunk order ([`Isa::HALVES`]).
    ///
    /// # Safety
    /// The CPU supports the level.
    unsafe fn copy_f32(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    /// Widens one chunk of bf16 bits (`src.len() == dst.len()`, a multiple of 16) into `dst`
    /// in the level's chunk order; [`Isa::widen_q8`] and [`Isa::panel_mx`] (whole groups) the
    /// same.
    ///
    /// # Safety
    /// The CPU supports the level.
    unsafe fn widen(src: &[u16], dst: &mut [f32]);
    /// Widens one chunk of int8 values into `dst` (as [`Isa::widen`]).
    ///
    /// # Safety
    /// The CPU supports the level.
    unsafe fn widen_q8(src: &[i8], dst: &mut [f32]);
    /// Decodes one chunk of whole MXFP4 groups into `dst` in the level's MXFP4 layout and
    /// chunk order.
    ///
    /// # Safety
    /// The CPU supports the level.
    unsafe fn panel_mx(packed: &[u8], scales: &[u8], dst: &mut [f32]);
    /// Adds the tile's column chunk (`kc = tile.cols.1`) of the panel rows `w[0 .. nr]`
    /// (`nr = tile.rows.1`; rows `nr .. RB` may repeat the last) to the lanes of those rows ×
    /// `tg` tokens: token `j` is read at `x + j·XS`, the lanes of (row `r`, token `j`) live at
    /// `st + (r·tg + j)·16`; a `fresh` tile (the first chunk) starts its lanes at +0 and only
    /// writes the state.
    ///
    /// # Safety
    /// The CPU supports the level; `1 <= nr <= RB`; `kc` f32 readable at every `w[r]` and at
    /// every `x + j·XS` (`j < tg`); `RB · tg · 16` f32 readable and writable at `st`,
    /// overlapping no input.
    unsafe fn sweep(w: &[*const f32; RB], tile: &Tile, ahead: &mut Ahead);
    /// Fills the panel rows `w[r]` from the bf16 rows `src[r]` (`kc` elements each, inside
    /// the row) while adding the first token block, then sweeps the rest (as [`Isa::sweep`]),
    /// when the level has such a tile; `false` (nothing done) otherwise.
    ///
    /// # Safety
    /// As [`Isa::sweep`]; `kc` bf16 readable at every `src[r]`, `kc` f32 writable at every
    /// `w[r]` (rows past `nr` may repeat the last row's pointers).
    unsafe fn sweep_bf16(
        _src: &[*const u16; RB],
        _w: &[*mut f32; RB],
        _tile: &Tile,
        _ahead: &mut Ahead,
    ) -> bool {
        false
    }
    /// Adds the tile's columns of its MXFP4 rows to their lanes (as [`Isa::sweep`]) straight
    /// from the packed bytes, without a panel, when the level has a fused tile and `tg` is
    /// small enough for it to win; `false` (nothing done) otherwise.
    ///
    /// # Safety
    /// As [`Isa::sweep`] (`cols.1` f32 at every `x + j·XS`, the block's `RB · tg` lanes at
    /// `st`); the tile's columns lie inside the rows.
    unsafe fn fused_mx(_tile: &Tile, _ahead: &mut Ahead) -> bool {
        false
    }
    /// `reduce16(to_lanes(lay, lanes))` of the 16 register-order lanes at `p`.
    ///
    /// # Safety
    /// The CPU supports the level; 16 f32 readable at `p`.
    unsafe fn reduce(lay: Layout, p: *const f32) -> f32 {
        // SAFETY: 16 readable f32 at `p` (caller).
        let lanes: [f32; 16] = std::array::from_fn(|l| unsafe { *p.add(l) });
        reduce16(&to_lanes(lay, lanes))
    }
    /// [`Isa::reduce`] of the 16 consecutive lane sets at `p` into `out`.
    ///
    /// # Safety
    /// The CPU supports the level; `16 · 16` f32 readable at `p`.
    unsafe fn reduce16x16(lay: Layout, p: *const f32, out: &mut [f32; 16]) {
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: set `i < 16` is inside the caller's `16 · 16` f32.
            *o = unsafe { Self::reduce(lay, p.wrapping_add(16 * i)) };
        }
    }
}

/// Defines `$name`, the [`Isa::sweep`] of level module `$m` (its `MR × N` microkernels, `N`
/// up to its `TB`), compiled with the level's features so the microkernels inline.
macro_rules! sweep_fn {
    ($name:ident, $feat:literal, $m:ident, [$($n:literal),+]) => {
        /// See [`Isa::sweep`].
        ///
        /// # Safety
        /// See [`Isa::sweep`].
        #[target_feature(enable = $feat)]
        unsafe fn $name(w: &[*const f32; RB], tile: &Tile, ahead: &mut Ahead) {
            let Tile { rows: (_, nr), cols: (_, kc), x, tg, st, fresh, .. } = *tile;
            const MR: usize = crate::simd::$m::MR;
            // The prefetches are spread over every microkernel call of the sweep.
            let calls = (tg - tile.skip).div_ceil(crate::simd::$m::TB) * nr.div_ceil(MR);
            let per = ahead.lines_left().div_ceil(calls.max(1)).max(1);
            let mut tb0 = tile.skip;
            while tb0 < tg {
                let nt = (tg - tb0).min(crate::simd::$m::TB);
                let xp = x.wrapping_add(tb0 * XS);
                let mut rb = 0;
                while rb < nr {
                    // Spread over `kc / 16` ticks. The AVX2 kernel ticks every 8 columns
                    // (`kc / 8` ticks), so there the hints go out in the first half of the
                    // call: spreading them over all of it measured 1–3 points slower (bf16
                    // T 32/64), over the first quarter level (measured 2026-12-06;
                    // docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why).
                    let pf = ahead.take(per, kc / 16);
                    let mut wr = [w[0]; MR];
                    wr.copy_from_slice(&w[rb..rb + MR]);
                    let sp = st.wrapping_add((rb * tg + tb0) * 16);
                    let done = tile.done.map(|d| d.from(rb, tb0));
                    match nt {
                        $($n => {
                            // SAFETY: rows `rb .. rb + MR <= RB` (RB is a multiple of MR) and
                            // tokens `tb0 .. tb0 + nt <= tg` are inside the caller's
                            // guarantees; the state slots (or outputs) of distinct (row,
                            // token) differ.
                            unsafe { crate::simd::$m::micro::<MR, $n>(wr, xp, XS, kc, sp, tg * 16, fresh, pf, done) }
                        })+
                        _ => {}
                    }
                    rb += MR;
                }
                tb0 += nt;
            }
            // Lines the calls' shares did not cover (a share stops at a region's end).
            ahead.step(usize::MAX);
        }
    };
}

#[cfg(target_arch = "x86_64")]
sweep_fn!(sweep_avx2, "avx2,fma", avx2, [1, 2, 3]);
#[cfg(target_arch = "x86_64")]
sweep_fn!(sweep_avx512, "avx512f,avx2,fma", avx512, [1, 2, 3, 4]);
#[cfg(target_arch = "aarch64")]
sweep_fn!(sweep_neon, "neon", neon, [1, 2]);

/// Implements [`Isa`] for `$isa` from level module `$m`'s kernels and `$sweep`.
macro_rules! isa_impl {
    ($isa:ident, $m:ident, $widen:ident, $panel:path, $sweep:ident $(, $reduce:ident, $fused:ident)? $(; { $($extra:tt)* })?) => {
        pub(super) struct $isa;
        impl Isa for $isa {
            unsafe fn widen(src: &[u16], dst: &mut [f32]) {
                // SAFETY: the caller guarantees the level's features.
                unsafe { crate::simd::$m::$widen(src, dst) }
            }
            unsafe fn widen_q8(src: &[i8], dst: &mut [f32]) {
                // SAFETY: the caller guarantees the level's features.
                unsafe { crate::simd::$m::widen_q8(src, dst) }
            }
            unsafe fn panel_mx(packed: &[u8], scales: &[u8], dst: &mut [f32]) {
                // SAFETY: the caller guarantees the level's features.
                unsafe { $panel(packed, scales, dst) }
            }
            unsafe fn sweep(w: &[*const f32; RB], tile: &Tile, ahead: &mut Ahead) {
                // SAFETY: forwarded from the caller.
                unsafe { $sweep(w, tile, ahead) }
            }
            $(unsafe fn reduce(lay: Layout, p: *const f32) -> f32 {
                // SAFETY: forwarded from the caller.
                unsafe { crate::simd::$m::$reduce(lay, p) }
            }
            unsafe fn fused_mx(tile: &Tile, ahead: &mut Ahead) -> bool {
                // SAFETY: forwarded from the caller.
                unsafe { $fused(tile, ahead) }
            })?
            $($($extra)*)?
        }
    };
}

#[cfg(target_arch = "x86_64")]
isa_impl!(
    Avx2,
    avx2,
    widen_bf16,
    crate::simd::avx2_mx::panel,
    sweep_avx2,
    reduce16_at,
    fused_avx2;
    {
        const HALVES: bool = true;
        const REDUCES_IN_TILE: bool = true;
        fn fused_only(kind: Kind, t: usize) -> bool {
            kind == Kind::Mxfp4 && t <= FUSED_MAX_T_AVX2
        }
        unsafe fn copy_f32(src: &[f32], dst: &mut [f32]) {
            // SAFETY: the caller guarantees the level's features.
            unsafe { crate::simd::avx2::copy_f32(src, dst) }
        }
    }
);

/// Most tokens for which the AVX2 MXFP4 GEMM decodes in registers ([`fused_avx2`]) rather
/// than into a panel: the tile decodes each row once per 4 tokens but saves the panel's
/// stores and reloads. Measured (`gemm_cpu_time mxs`/`mx`, 3072 × 3584, alternate runs):
/// AVX2 (Zen 3) T 3–4 +15–60 % (1 and 2 threads), T 8 +10–60 % (1 thread; level on 2),
/// T 16 7–15 % slower. At released scale a prompt's expert groups average ~5 tokens (16 of
/// 896 experts).
#[cfg(target_arch = "x86_64")]
const FUSED_MAX_T_AVX2: usize = 8;

/// [`FUSED_MAX_T_AVX2`] for AVX-512 VBMI ([`fused_avx512`]), which decodes each row once per
/// ≤ 8 tokens. Zen 5 (`vpmultishiftqb` decoder): T 4 +30 %, T 8 +20–25 %, T 16
/// level. Zen 4 with the `vpermb` decoder (`gemm_cpu_time mx` with `TS`, 1
/// thread, alternate runs; docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why): fused ahead of the panel
/// path by 5–17 points of the FMA peak at T 9–24, behind by 3 at T 32 and 48.
/// On Intel, where the decode's permutes share port 5 with the FMAs, a port model predicts
/// the panel path ahead from T ≈ 12 (not yet measured there;
/// docs/PERFORMANCE.md#intel-amx-mode-fast-and-the-port-model).
#[cfg(target_arch = "x86_64")]
const FUSED_MAX_T_AVX512: usize = 24;

#[cfg(target_arch = "x86_64")]
impl Tile<'_> {
    /// The packed codes and scales when the tile is MXFP4 of at most `max_t` tokens.
    fn small_mxfp4(&self, max_t: usize) -> Option<(&[u8], &[u8])> {
        match self.w.data {
            MatrixData::Mxfp4 { packed, scales } if self.tg <= max_t => Some((packed, scales)),
            _ => None,
        }
    }

    /// Row `r`'s codes and scales over the tile's columns.
    fn row_mx<'p>(&self, packed: &'p [u8], scales: &'p [u8], r: usize) -> (&'p [u8], &'p [u8]) {
        let (a, b) = (
            r * self.w.cols + self.cols.0,
            r * self.w.cols + self.cols.0 + self.cols.1,
        );
        (&packed[a / 2..b / 2], &scales[a / GROUP..b / GROUP])
    }
}

/// [`Isa::fused_mx`] on AVX2: every row of the block through `avx2_mx::fused`, ≤ 4 tokens at a
/// time, when `tg <= FUSED_MAX_T_AVX2`.
///
/// # Safety
/// See [`Isa::fused_mx`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fused_avx2(tile: &Tile, ahead: &mut Ahead) -> bool {
    use crate::simd::avx2_mx::{fused, FUSED_TB};
    // Activations in halves order (a call of more than `FUSED_MAX_T_AVX2` tokens, whose
    // last token group may still be small) go to the panel sweep: one instantiation of the
    // fused tile, reading the steps in order, measured 1–2 points ahead at T 4 / 8 of one
    // that also read halves.
    let small = tile.small_mxfp4(FUSED_MAX_T_AVX2);
    let Some((packed, scales)) = small.filter(|_| !tile.halves) else {
        return false;
    };
    let Tile {
        rows: (rb, nr),
        x,
        tg,
        st,
        fresh,
        ..
    } = *tile;
    let per = ahead.lines_left().div_ceil(nr).max(1);
    for r in rb..rb + nr {
        ahead.step(per);
        let (p, s) = tile.row_mx(packed, scales, r);
        let mut t0 = 0;
        while t0 < tg {
            let n = (tg - t0).min(FUSED_TB);
            let (xp, sp) = (
                x.wrapping_add(t0 * XS),
                st.wrapping_add(((r - rb) * tg + t0) * 16),
            );
            // SAFETY: tokens `t0 .. t0 + n <= tg` and row `r - rb < nr` are inside the
            // caller's guarantees (`kc` f32 at every `x + j·XS`, the block's state slots).
            unsafe {
                match n {
                    1 => fused::<1>(p, s, xp, XS, sp, fresh),
                    2 => fused::<2>(p, s, xp, XS, sp, fresh),
                    3 => fused::<3>(p, s, xp, XS, sp, fresh),
                    _ => fused::<4>(p, s, xp, XS, sp, fresh),
                }
            }
            t0 += n;
        }
    }
    true
}

/// [`Isa::fused_mx`] on AVX-512 with VBMI, when `tg <= FUSED_MAX_T_AVX512`: the block's rows
/// through `avx512::micro_mx`, 4 rows × ≤ 4 tokens per call for `tg <= 4`, else 2 rows × ≤ 8
/// tokens (each row's groups decoded once per 8 tokens instead of per 4).
///
/// # Safety
/// See [`Isa::fused_mx`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn fused_avx512(tile: &Tile, ahead: &mut Ahead) -> bool {
    use crate::simd::avx512_mx::has_vbmi;
    let Some((packed, scales)) = tile.small_mxfp4(FUSED_MAX_T_AVX512).filter(|_| has_vbmi()) else {
        return false;
    };
    // SAFETY: VBMI detected; the caller's guarantees are forwarded.
    unsafe {
        if tile.tg <= 4 {
            fused_rows_avx512::<4, 4>(tile, packed, scales, ahead);
        } else {
            fused_rows_avx512::<2, 8>(tile, packed, scales, ahead);
        }
    }
    true
}

/// [`fused_avx512`] with `R` rows × ≤ `TB` tokens per `micro_mx` call. The tokens are split
/// into `⌈tg / TB⌉` near-equal blocks (T 9 is 5 + 4, not 8 + 1: a 1-token call waits on its
/// FMA chains), the outer loop: a block's activations (≤ 16 KB) stay in L1 while every row
/// pair of the block's rows passes over them.
///
/// # Safety
/// See [`Isa::fused_mx`]; the CPU has VBMI; `packed` and `scales` are the tile's matrix's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn fused_rows_avx512<const R: usize, const TB: usize>(
    tile: &Tile,
    packed: &[u8],
    scales: &[u8],
    ahead: &mut Ahead,
) {
    use crate::simd::avx512::micro_mx;
    let Tile {
        rows: (rb, nr),
        x,
        tg,
        st,
        fresh,
        ..
    } = *tile;
    let groups = tile.cols.1 / GROUP;
    // The block's rows at the tile's columns, checked once here (their pointers are then
    // stepped per row pair: slicing each row per call cost ~3 % of the T 8 GEMM, `perf`).
    let (cols, k0) = (tile.w.cols, tile.cols.0);
    let (last_p, last_s) = tile.row_mx(packed, scales, rb + nr - 1);
    assert!(
        last_p.len() == 16 * groups && last_s.len() == groups,
        "MXFP4 tile"
    );
    let (code0, scale0) = (packed[k0 / 2..].as_ptr(), scales[k0 / GROUP..].as_ptr());
    let blocks = tg.div_ceil(TB);
    let per = ahead.lines_left().div_ceil(blocks * nr.div_ceil(R)).max(1);
    let mut t0 = 0;
    for b in 0..blocks {
        let n = tg / blocks + usize::from(b < tg % blocks);
        for rg in (0..nr).step_by(R) {
            // Rows past `nr` repeat the last (their lanes land in unused slots of the block).
            let rows: [usize; R] = std::array::from_fn(|i| rb + (rg + i).min(nr - 1));
            let p = rows.map(|r| code0.wrapping_add(r * cols / 2));
            let s = rows.map(|r| scale0.wrapping_add(r * cols / GROUP));
            let (xp, sp) = (
                x.wrapping_add(t0 * XS),
                st.wrapping_add((rg * tg + t0) * 16),
            );
            let ss = tg * 16;
            // The hints spread over the call's groups (a burst before each call stalled,
            // ~10 % of the T 8 GEMM's samples; docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why).
            let pf = ahead.take(per, groups);
            // SAFETY: VBMI (caller); rows `rb ..= rb + nr - 1` hold `groups` groups from
            // column `k0` (the last row's slice, asserted, ends past the others);
            // tokens `t0 .. t0 + n <= tg` (the blocks' sizes sum to `tg`, each ≤ `TB`) and
            // rows `rg .. rg + R <= RB` are inside the caller's guarantees (`kc` f32 at
            // every `x + j·XS`, the block's state slots).
            unsafe {
                match n {
                    1 => micro_mx::<R, 1>(p, s, groups, xp, XS, sp, ss, fresh, pf),
                    2 => micro_mx::<R, 2>(p, s, groups, xp, XS, sp, ss, fresh, pf),
                    3 => micro_mx::<R, 3>(p, s, groups, xp, XS, sp, ss, fresh, pf),
                    4 => micro_mx::<R, 4>(p, s, groups, xp, XS, sp, ss, fresh, pf),
                    5 => micro_mx::<R, 5>(p, s, groups, xp, XS, sp, ss, fresh, pf),
                    6 => micro_mx::<R, 6>(p, s, groups, xp, XS, sp, ss, fresh, pf),
                    7 => micro_mx::<R, 7>(p, s, groups, xp, XS, sp, ss, fresh, pf),
                    _ => micro_mx::<R, 8>(p, s, groups, xp, XS, sp, ss, fresh, pf),
                }
            }
        }
        t0 += n;
    }
    // Lines the calls' shares did not cover.
    ahead.step(usize::MAX);
}

/// [`Isa::sweep_bf16`] on AVX-512: the first ≤ `TB` tokens through `avx512::micro_widen`
/// (which stores the widened panel rows), the others through [`sweep_avx512`].
///
/// # Safety
/// See [`Isa::sweep_bf16`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn sweep_bf16_avx512(
    src: &[*const u16; RB],
    w: &[*mut f32; RB],
    tile: &Tile,
    ahead: &mut Ahead,
) -> bool {
    use crate::simd::avx512::{micro_widen, MR, TB};
    let Tile {
        rows: (_, nr),
        cols: (_, kc),
        x,
        tg,
        st,
        fresh,
        ..
    } = *tile;
    let nt = tg.min(TB);
    let calls = tg.div_ceil(TB) * nr.div_ceil(MR);
    let per = ahead.lines_left().div_ceil(calls).max(1);
    for rb in (0..nr).step_by(MR) {
        let pf = ahead.take(per, kc / 16);
        let s: [*const u16; MR] = std::array::from_fn(|i| src[rb + i]);
        let d: [*mut f32; MR] = std::array::from_fn(|i| w[rb + i]);
        let (sp, ss) = (st.wrapping_add(rb * tg * 16), tg * 16);
        let done = tile.done.map(|o| o.from(rb, 0));
        // SAFETY: rows `rb .. rb + MR <= RB` and tokens `0 .. nt <= tg` are inside the
        // caller's guarantees; the panel rows written here are read by no one until after.
        unsafe {
            match nt {
                1 => micro_widen::<MR, 1>(s, d, x, XS, kc, sp, ss, fresh, pf, done),
                2 => micro_widen::<MR, 2>(s, d, x, XS, kc, sp, ss, fresh, pf, done),
                3 => micro_widen::<MR, 3>(s, d, x, XS, kc, sp, ss, fresh, pf, done),
                _ => micro_widen::<MR, 4>(s, d, x, XS, kc, sp, ss, fresh, pf, done),
            }
        }
    }
    let wp: [*const f32; RB] = w.map(|p| p.cast_const());
    let rest = Tile { skip: nt, ..*tile };
    // SAFETY: the panel rows are filled (above); the rest is the caller's guarantees.
    unsafe { sweep_avx512(&wp, &rest, ahead) };
    true
}

#[cfg(target_arch = "x86_64")]
isa_impl!(Avx512, avx512, widen_bf16, crate::simd::avx512::panel_mx, sweep_avx512; {
    const REDUCES_IN_TILE: bool = true;
    unsafe fn sweep_bf16(
        src: &[*const u16; RB],
        w: &[*mut f32; RB],
        tile: &Tile,
        ahead: &mut Ahead,
    ) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { sweep_bf16_avx512(src, w, tile, ahead) }
    }
    unsafe fn fused_mx(tile: &Tile, ahead: &mut Ahead) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe { fused_avx512(tile, ahead) }
    }
    unsafe fn reduce(lay: Layout, p: *const f32) -> f32 {
        // SAFETY: AVX-512F implies the AVX2 this needs; 16 f32 at `p` (caller).
        unsafe { crate::simd::avx2::reduce16_at(lay, p) }
    }
    unsafe fn reduce16x16(lay: Layout, p: *const f32, out: &mut [f32; 16]) {
        debug_assert!(matches!(lay, Layout::Natural), "AVX-512 lanes are natural");
        // SAFETY: forwarded from the caller.
        unsafe { crate::simd::avx512::reduce16x16(p, out) }
    }
});
#[cfg(target_arch = "aarch64")]
isa_impl!(
    Neon,
    neon,
    widen_bf16,
    crate::simd::neon::panel_mx,
    sweep_neon
);
