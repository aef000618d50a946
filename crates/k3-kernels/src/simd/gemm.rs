//! `matmul` (T tokens) on the SIMD levels: register-blocked microkernels over f32 weight
//! panels (docs/NUMERICS.md#gemm).
//!
//! The activations are packed once per call, chunk-major (`[chunk][token][XS]`, in the
//! level's layout and chunk order — AVX2 stores each chunk's 8-lane halves apart, see
//! [`Isa::HALVES`] — `+0`-padded). One rayon task owns up to [`SB`] blocks of [`RB`] weight rows
//! and every token. Per group of ≤ [`TG`] tokens it walks the columns in chunks of [`KC`]; on
//! each chunk its blocks take turns: the activation chunk (≤ 135 KB) is read from L3 once per
//! task and then served from L2 to every block (2-thread bf16 GEMM 46–52 → 52–58 % of the FMA
//! peak, docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why). Each row's chunk becomes an
//! f32 panel row (f32 copied, bf16 and int8 widened, MXFP4 decoded — once, shared by all the
//! tokens; `−0`-padded), and the level's microkernel adds the chunk to the 16 lanes of `MR`
//! rows × `TB` tokens at a time, the lanes living in registers within a chunk and in a
//! per-block state between chunks; meanwhile the next panel's weights are prefetched, spread
//! over the microkernel calls. MXFP4 at T ≤ 8 on AVX2, and T ≤ 24 on AVX-512 with VBMI,
//! skips the panel: its tile decodes the rows in registers for ≤ 4 (AVX2) or ≤ 8 tokens at a
//! time (the level kernels are in [`isa`]). The lanes are reduced by the
//! level's form of the scalar tree (AVX2: the same additions, 8 / 4 / 2 / 1 at a time;
//! AVX-512: 16 lane sets at once), in registers by the panel sweep's tile that adds the last
//! chunk, so those lanes are never stored, or after the last chunk for the fused MXFP4 tiles
//! (and NEON), and each token's outputs of a task are stored as one run.
//!
//! Every (row, token) lane therefore sees exactly the elements, order and fused operations of
//! the mat-vec — columns ascending, element `i` → lane `i % 16` — and the scalar tree finishes
//! it (a Q8 row then takes its scale, as in the mat-vec), so every output equals that token's
//! `matvec` bit for bit, for any `RB`, `SB`, `KC`, `TG`, `MR`, `TB` and thread count.

mod isa;
mod pack;
pub(crate) mod plan;

use super::layout::{layout, Kind, Layout};
use super::level::Level;
use crate::matrix::data::{Matrix, MatrixData};
use crate::mxfp4::GROUP;
use crate::scratch;
#[cfg(target_arch = "aarch64")]
use isa::Neon;
#[cfg(target_arch = "x86_64")]
use isa::{Avx2, Avx512};
use isa::{Isa, Tile};
use pack::{pack_x, to_halves};
use plan::{Ahead, Done, KC, RB, XS};
use rayon::prelude::*;

/// Tokens per lane-state group (bounds the state at `RB · TG · 64` bytes).
const TG: usize = 64;

/// The output, written by many tasks at disjoint indices.
struct Out {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: `Out` is only used through `write_run`, whose callers write disjoint indices (every
// output element belongs to exactly one row, and every row to exactly one task).
unsafe impl Sync for Out {}

impl Out {
    /// Stores `run` at `i ..` (bounds-checked).
    ///
    /// # Safety
    /// No other thread accesses indices `i .. i + run.len()` during the `matmul` call.
    /// Runs are ≤ `SB · RB` values, so they go out 8 at a time as fixed-size copies, not
    /// through a `memcpy` call per run (the call was ~0.6 % of a prefill's samples, `perf`).
    unsafe fn write_run(&self, i: usize, run: &[f32]) {
        assert!(i + run.len() <= self.len, "matmul output run");
        let mut eights = run.chunks_exact(8);
        let mut at = i;
        for e in &mut eights {
            let e: [f32; 8] = e.try_into().unwrap_or_default();
            // SAFETY: in bounds (checked) and owned by the caller; an unaligned store.
            unsafe { self.ptr.add(at).cast::<[f32; 8]>().write_unaligned(e) };
            at += 8;
        }
        for &v in eights.remainder() {
            // SAFETY: as above.
            unsafe { self.ptr.add(at).write(v) };
            at += 1;
        }
    }
}

/// The storage kind of `w`.
pub(crate) fn kind_of(w: &Matrix) -> Kind {
    match w.data {
        MatrixData::F32(_) => Kind::F32,
        MatrixData::Bf16(_) => Kind::Bf16,
        MatrixData::Mxfp4 { .. } => Kind::Mxfp4,
        MatrixData::Q8 { .. } => Kind::Q8,
    }
}

/// Most row blocks one task runs over each activation chunk.
const SB: usize = 4;

/// Row blocks per task: [`SB`], fewer when that would leave under 4 tasks per thread.
/// (Results do not depend on it: every output is computed the same way in any task.)
fn blocks_per_task(blocks: usize, threads: usize) -> usize {
    (blocks / (4 * threads.max(1))).clamp(1, SB)
}

/// `Y[t] = W·X[t]` for `t ≥ 1` tokens on a SIMD `level` (shapes checked by the caller,
/// `w.cols > 0`).
pub(crate) fn matmul(level: Level, y: &mut [f32], w: &Matrix, x: &[f32], t: usize) {
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => matmul_on::<Avx2>(level, y, w, x, t),
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => matmul_on::<Avx512>(level, y, w, x, t),
        #[cfg(target_arch = "aarch64")]
        Level::Neon => matmul_on::<Neon>(level, y, w, x, t),
        _ => unreachable!("no GEMM kernels for level {}", level.name()),
    }
}

/// [`matmul`] with `level`'s kernels `I`.
fn matmul_on<I: Isa>(level: Level, y: &mut [f32], w: &Matrix, x: &[f32], t: usize) {
    let lay = layout(level, kind_of(w));
    // The panel sweeps read halves order on a level with it; a call whose tiles are all fused
    // reads the steps in order (no reordering to pay for, and two streams fewer per token).
    let halves = I::HALVES && !I::fused_only(kind_of(w), t);
    scratch::with(&scratch::X, |buf| {
        let xs = pack_x(lay, halves, x, t, w.cols, buf);
        let out = Out {
            ptr: y.as_mut_ptr(),
            len: y.len(),
        };
        let job = Job {
            w,
            xs,
            t,
            k16: w.cols.next_multiple_of(16),
            lay,
            halves,
            out: &out,
        };
        let sb = blocks_per_task(w.rows.div_ceil(RB), rayon::current_num_threads());
        // Split down to single tasks: rayon's default stops splitting a range after a few
        // halvings unless a part is stolen, and a thread that runs out of tasks cannot steal
        // from inside the other's unsplit run, so the call's tail waited on up to a quarter
        // of the tasks (docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why). Tasks keep their order on each
        // thread (the next-task prefetch in `next_chunk` still points at the right rows).
        (0..w.rows.div_ceil(RB * sb))
            .into_par_iter()
            .with_max_len(1)
            .for_each(|b| job.rows::<I>(b * RB * sb, sb));
    });
}

/// Everything a task needs.
struct Job<'a> {
    w: &'a Matrix<'a>,
    /// Packed activations ([`pack_x`]).
    xs: &'a [f32],
    t: usize,
    k16: usize,
    lay: Layout,
    /// `xs` holds each chunk in halves order ([`Isa::HALVES`]).
    halves: bool,
    out: &'a Out,
}

impl Job<'_> {
    /// Rows `r0 .. r0 + sb·RB` (fewer at the end) for every token, as `sb` blocks of
    /// [`RB`] rows that take turns on each activation chunk (so the chunk, read from L3 once,
    /// serves all of them from L2).
    fn rows<I: Isa>(&self, r0: usize, sb: usize) {
        let blocks = sb.min((self.w.rows - r0).div_ceil(RB));
        scratch::with(&scratch::PANEL, |pbuf| {
            scratch::with(&scratch::STATE, |sbuf| {
                scratch::with(&scratch::EMIT, |ebuf| {
                    // Every panel row is filled before it is read; the state's first chunk
                    // writes it fresh (`Isa::sweep`), and every staged output is written
                    // before `emit` reads it, so none is cleared (a zeroed 8 KB staging per
                    // call was ~1 % of the T 8 MXFP4 GEMM, `perf`).
                    let panel = scratch::aligned_any(pbuf, RB * XS);
                    let staged = scratch::aligned_any(ebuf, SB * RB * TG);
                    for tok0 in (0..self.t).step_by(TG) {
                        let tg = TG.min(self.t - tok0);
                        let per = RB * tg * 16;
                        let states = scratch::aligned_any(sbuf, blocks * per);
                        let reduced =
                            self.chunks::<I>(r0, blocks, (tok0, tg), panel, states, staged);
                        self.emit::<I>(r0, tok0, tg, states.chunks(per), reduced, staged);
                    }
                })
            })
        })
    }

    /// Adds every column chunk of the task's `blocks` row blocks (from row `r0`) for tokens
    /// `tok0 .. tok0 + tg` to their lanes (`states`, `RB · tg` slots per block); on a level
    /// that [reduces in the tile](Isa::REDUCES_IN_TILE) the last chunk of a sweep leaves the
    /// outputs in `staged` (token `j`, task row `r` at `j · SB · RB + r`) instead. Returns,
    /// per block, whether it did (the fused MXFP4 tiles never do: reducing in them cost the
    /// T 8 / 16 GEMM ~2 points of the FMA peak;
    /// docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why).
    fn chunks<I: Isa>(
        &self,
        r0: usize,
        blocks: usize,
        (tok0, tg): (usize, usize),
        panel: &mut [f32],
        states: &mut [f32],
        staged: &mut [f32],
    ) -> [bool; SB] {
        let per = RB * tg * 16;
        assert!(blocks <= SB && states.len() >= blocks * per && staged.len() >= SB * RB * TG);
        let mut reduced = [false; SB];
        let last = (self.k16 - 1) / KC * KC;
        for (c, k0) in (0..self.k16).step_by(KC).enumerate() {
            let kc = KC.min(self.k16 - k0);
            let xoff = (c * self.t + tok0) * XS;
            assert!(xoff + tg * XS <= self.xs.len());
            let x = self.xs[xoff..].as_ptr();
            for (b, state) in states.chunks_mut(per).take(blocks).enumerate() {
                let rb = r0 + b * RB;
                let nr = RB.min(self.w.rows - rb);
                let mut ahead = self.next_chunk(r0, b, blocks, k0);
                let done = (I::REDUCES_IN_TILE && k0 == last).then(|| Done {
                    at: staged[b * RB..].as_mut_ptr(),
                    ts: SB * RB,
                    lay: self.lay,
                });
                let tile = Tile {
                    w: self.w,
                    rows: (rb, nr),
                    cols: (k0, kc),
                    x,
                    halves: self.halves,
                    tg,
                    st: state.as_mut_ptr(),
                    fresh: c == 0,
                    skip: 0,
                    done,
                };
                // SAFETY: as below; `k0 + kc <= cols` for MXFP4 (whole groups); the outputs
                // of (row `r < RB`, token `j < tg`) lie in `staged` (asserted length).
                if unsafe { I::fused_mx(&tile, &mut ahead) } {
                    continue;
                }
                reduced[b] = tile.done.is_some();
                if self.widen_in_sweep::<I>(&tile, panel, &mut ahead) {
                    continue;
                }
                for (rl, dst) in panel.chunks_mut(XS).take(nr).enumerate() {
                    self.fill::<I>(rb + rl, k0, &mut dst[..kc]);
                }
                let base = panel.as_ptr();
                let wp: [*const f32; RB] =
                    std::array::from_fn(|rl| base.wrapping_add(rl.min(nr - 1) * XS));
                // SAFETY: the level is supported (`matmul_at` checked it); `kc` is a multiple
                // of 16 (`k16` and `KC` are) and `kc <= KC < XS`, so `kc` f32 are readable at
                // every panel row (`RB · XS` long) and at every `x + j·XS`, `j < tg`
                // (asserted); `state` holds `RB · tg` lanes.
                unsafe { I::sweep(&wp, &tile, &mut ahead) };
            }
        }
        reduced
    }

    /// [`Isa::sweep_bf16`] of a bf16 tile whose columns lie inside the rows: the level's
    /// first token block widens the rows into `panel` as it adds them; `false` (nothing
    /// done) for other storages, a chunk past the row's end, or a level without it.
    fn widen_in_sweep<I: Isa>(&self, tile: &Tile, panel: &mut [f32], ahead: &mut Ahead) -> bool {
        let MatrixData::Bf16(d) = self.w.data else {
            return false;
        };
        let (c, (rb, nr), (k0, kc)) = (self.w.cols, tile.rows, tile.cols);
        if k0 + kc > c {
            return false;
        }
        assert!(panel.len() >= RB * XS && nr >= 1, "GEMM panel");
        // Rows past `nr` repeat the last row (source and panel row alike).
        let src: [*const u16; RB] =
            std::array::from_fn(|rl| d[(rb + rl.min(nr - 1)) * c + k0..].as_ptr().cast());
        let pp = panel.as_mut_ptr();
        let dst: [*mut f32; RB] = std::array::from_fn(|rl| pp.wrapping_add(rl.min(nr - 1) * XS));
        // SAFETY: the level is supported (`matmul_at` checked it); `k0 + kc <= cols`, so `kc`
        // bf16 are readable at every `src[r]`; the panel rows are `XS > kc` f32 apart inside
        // `panel` (asserted) and overlap neither the activations nor the state; the tile's
        // activations and lanes are as for `Isa::sweep` (the caller's).
        unsafe { I::sweep_bf16(&src, &dst, tile, ahead) }
    }

    /// The weights the next panel fill reads, to prefetch while the microkernels of block
    /// `b` (of `blocks`, the task's first at row `r0`) run on chunk `k0`: the same columns of
    /// the next block, else the next chunk of the first block, else — past the last chunk —
    /// the first chunk of the rows after this task (usually this thread's next task).
    fn next_chunk(&self, r0: usize, b: usize, blocks: usize, k0: usize) -> Ahead {
        let (r0, k0) = if b + 1 < blocks {
            (r0 + (b + 1) * RB, k0)
        } else if k0 + KC < self.w.cols {
            (r0, k0 + KC)
        } else {
            (r0 + blocks * RB, 0)
        };
        let c = self.w.cols;
        let (end, rows) = (c.min(k0 + KC), r0..self.w.rows.min(r0 + RB));
        let mut a = Ahead::default();
        // Hint addresses only (never dereferenced), stepped per row without slicing: this
        // runs once per block and chunk (3–4 % of the T 8 MXFP4 GEMM with a bounds-checked
        // slice and a storage match per row, `perf`).
        // (base, bytes per row, offset in the row, bytes) of each region of a row.
        let regions: [(*const u8, usize, usize, usize); 2] = match self.w.data {
            MatrixData::F32(d) => [(d.as_ptr().cast(), c * 4, k0 * 4, (end - k0) * 4); 2],
            MatrixData::Bf16(d) => [(d.as_ptr().cast(), c * 2, k0 * 2, (end - k0) * 2); 2],
            MatrixData::Q8 { values, .. } => [(values.as_ptr().cast(), c, k0, end - k0); 2],
            MatrixData::Mxfp4 { packed, scales } => [
                (packed.as_ptr(), c / 2, k0 / 2, (end - k0) / 2),
                (scales.as_ptr(), c / GROUP, k0 / GROUP, (end - k0) / GROUP),
            ],
        };
        let n = if matches!(self.w.data, MatrixData::Mxfp4 { .. }) {
            2
        } else {
            1
        };
        for r in rows {
            for &(base, row_bytes, at, bytes) in &regions[..n] {
                a.push(base.wrapping_add(r * row_bytes + at), bytes);
            }
        }
        a
    }

    /// Columns `k0 .. k0 + dst.len()` (one chunk) of row `r` as f32 into `dst` in the
    /// level's chunk order, `−0` past the row.
    fn fill<I: Isa>(&self, r: usize, k0: usize, dst: &mut [f32]) {
        let c = self.w.cols;
        let end = c.min(k0 + dst.len());
        if end - k0 < dst.len() {
            return self.fill_partial::<I>(r, k0, dst);
        }
        // The task runs on a level the CPU supports (checked by `matmul_at`), the only
        // requirement of the calls below; the source is `dst.len()` elements, a multiple of
        // 16 (a chunk) and whole MXFP4 groups (MXFP4 rows hold whole groups, `KC` is a
        // multiple of 32).
        let row = r * c + k0..r * c + end;
        match self.w.data {
            // SAFETY: see above.
            MatrixData::F32(d) => unsafe { I::copy_f32(&d[row], dst) },
            // SAFETY: see above.
            MatrixData::Bf16(d) => unsafe { I::widen(bytemuck::cast_slice(&d[row]), dst) },
            // SAFETY: see above.
            MatrixData::Q8 { values, .. } => unsafe { I::widen_q8(&values[row], dst) },
            MatrixData::Mxfp4 { packed, scales } => {
                let p = &packed[row.start / 2..row.end / 2];
                let s = &scales[row.start / GROUP..row.end / GROUP];
                // SAFETY: see above.
                unsafe { I::panel_mx(p, s, dst) };
            }
        }
    }

    /// [`Job::fill`] of a chunk that the row ends inside (its last, when `cols` is not a
    /// multiple of 16): widened element by element (exact), `−0`-padded, then put in the
    /// level's chunk order. MXFP4 rows hold whole groups, so never end inside a chunk.
    fn fill_partial<I: Isa>(&self, r: usize, k0: usize, dst: &mut [f32]) {
        let c = self.w.cols;
        let n = c - k0;
        let mut block = [-0f32; KC];
        let src = &mut block[..n];
        match self.w.data {
            MatrixData::F32(d) => src.copy_from_slice(&d[r * c + k0..r * c + c]),
            MatrixData::Bf16(d) => {
                for (o, b) in src.iter_mut().zip(&d[r * c + k0..r * c + c]) {
                    *o = f32::from_bits((b.to_bits() as u32) << 16);
                }
            }
            MatrixData::Q8 { values, .. } => {
                for (o, &v) in src.iter_mut().zip(&values[r * c + k0..r * c + c]) {
                    *o = v as f32;
                }
            }
            MatrixData::Mxfp4 { .. } => unreachable!("MXFP4 rows hold whole 32-groups"),
        }
        if I::HALVES {
            to_halves(&block[..dst.len()], dst);
        } else {
            dst.copy_from_slice(&block[..dst.len()]);
        }
    }

    /// Writes the outputs of the task's blocks (`states[b]`: rows `r0 + b·RB ..`) for tokens
    /// `tok0 .. tok0 + tg`: reduces their lanes, unless the tiles already did (`reduced[b]`,
    /// [`Isa::REDUCES_IN_TILE`]), finishes them (a Q8 row's scale) and stores each token's
    /// outputs as one run of ≤ `SB · RB`. On AVX-512, 7168 × 1536 at T 32 spent ~13 % of its
    /// time on single stores 28 KB apart and ~10 % in the scalar tree (`perf`); with runs and
    /// 16 sets per reduction, 1 thread 47 → 63 % of the FMA peak
    /// (docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why).
    fn emit<'s, I: Isa>(
        &self,
        r0: usize,
        tok0: usize,
        tg: usize,
        states: impl Iterator<Item = &'s [f32]>,
        reduced: [bool; SB],
        staged: &mut [f32],
    ) {
        let mut nrows = 0;
        for ((b, state), reduced) in states.enumerate().zip(reduced) {
            let nr = RB.min(self.w.rows - (r0 + b * RB));
            nrows = b * RB + nr;
            if !reduced {
                self.reduce_block::<I>(b, nr, tg, state, staged);
            }
        }
        for j in 0..tg {
            let run = &mut staged[j * SB * RB..j * SB * RB + nrows];
            for (r, v) in run.iter_mut().enumerate() {
                *v = self.w.finish(r0 + r, *v);
            }
            // SAFETY: rows `r0 .. r0 + nrows` belong to this task only.
            unsafe { self.out.write_run((tok0 + j) * self.w.rows + r0, run) };
        }
    }

    /// Reduces block `b`'s lanes (`nr` rows × `tg` tokens, `state`) into `staged` (token `j`,
    /// task row `r` at `j · SB · RB + r`), 16 lane sets at a time where they can.
    fn reduce_block<I: Isa>(
        &self,
        b: usize,
        nr: usize,
        tg: usize,
        state: &[f32],
        staged: &mut [f32],
    ) {
        // Lane set `i` is (row `i / tg`, token `i % tg`).
        let sets = nr * tg;
        assert!(state.len() >= sets * 16, "GEMM state length");
        let mut d = [0f32; 16];
        let mut i0 = 0;
        while i0 < sets {
            let n = if sets - i0 >= 16 { 16 } else { 1 };
            let p = state[i0 * 16..].as_ptr();
            // SAFETY: `(i0 + n)·16 <= sets·16 <= state.len()` (asserted); the task runs on a
            // level the CPU supports.
            unsafe {
                if n == 16 {
                    I::reduce16x16(self.lay, p, &mut d);
                } else {
                    d[0] = I::reduce(self.lay, p);
                }
            }
            // Set `i0 + k` is (row `rl`, token `j`), stepped without a division per output.
            let (mut rl, mut j) = (i0 / tg, i0 % tg);
            for &dk in &d[..n] {
                staged[j * SB * RB + b * RB + rl] = dk;
                j += 1;
                if j == tg {
                    (rl, j) = (rl + 1, 0);
                }
            }
            i0 += n;
        }
    }
}
