//! The GEMM's blocking constants and the handles its microkernels receive: where a tile
//! leaves its reduced outputs ([`Done`]) and the next panel's prefetch, spread over the
//! k-loop ([`Ahead`], [`Spread`]). A leaf below the level kernels and the GEMM driver.

use crate::simd::layout::{prefetch_t0, Layout};

/// Weight rows per rayon task (a multiple of every level's `MR`).
pub(crate) const RB: usize = 8;
/// Columns per panel chunk (a multiple of 32: whole MXFP4 groups).
pub(crate) const KC: usize = 512;
/// Stride (f32) between panel rows and between packed activation rows: a chunk plus one
/// cache line, so the rows a microkernel reads never alias in the L1 sets.
pub(crate) const XS: usize = KC + 16;

/// Where a tile's microkernels leave a row's reduced outputs after its last chunk, on a level
/// that reduces in registers (`Isa::REDUCES_IN_TILE`): (row `r`, token `t`) of the
/// call at `at + t·ts + r` (the task's token-major staging, `Job::emit`).
#[derive(Clone, Copy)]
pub(crate) struct Done {
    pub(super) at: *mut f32,
    pub(super) ts: usize,
    /// The lane layout of the tile's sets (the tree pairs register positions by it).
    pub(crate) lay: Layout,
}

impl Done {
    /// The output slot of (row `r`, token `t`). An address only: the microkernels write it.
    #[inline(always)]
    pub(crate) fn at(self, r: usize, t: usize) -> *mut f32 {
        self.at.wrapping_add(t * self.ts + r)
    }

    /// The slots of a call whose first row and token are this one's `r` and `t`.
    #[inline(always)]
    pub(crate) fn from(self, r: usize, t: usize) -> Done {
        Done {
            at: self.at(r, t),
            ts: self.ts,
            lay: self.lay,
        }
    }
}

/// Byte ranges to prefetch (into L1, `prefetch_t0`) a few cache lines at a time (a burst of a hundred
/// prefetches overflows the miss buffers and most are dropped). Addresses are hints only:
/// never dereferenced.
#[derive(Default)]
pub(crate) struct Ahead {
    regions: [(usize, usize); 2 * RB],
    n: usize,
    /// Next region and byte offset in it.
    at: (usize, usize),
    /// Cache lines not yet prefetched.
    left: usize,
}

impl Ahead {
    pub(super) fn push(&mut self, p: *const u8, bytes: usize) {
        if self.n < self.regions.len() && bytes > 0 {
            self.regions[self.n] = (p as usize, bytes);
            self.left += bytes.div_ceil(64);
            self.n += 1;
        }
    }

    /// The next `lines` cache lines (across regions), to be prefetched by a microkernel
    /// over its k-loop of `steps` steps ([`Spread`]).
    pub(super) fn take(&mut self, lines: usize, steps: usize) -> Spread<'_> {
        let lines = lines.min(self.lines_left());
        Spread {
            gap: (steps / lines.max(1)).max(1),
            ahead: Some(self),
            lines,
            wait: 1,
        }
    }

    /// Cache lines not yet prefetched.
    pub(super) fn lines_left(&self) -> usize {
        self.left
    }

    /// Prefetches up to `lines` more cache lines.
    pub(super) fn step(&mut self, mut lines: usize) {
        while lines > 0 && self.at.0 < self.n {
            let (base, len) = self.regions[self.at.0];
            prefetch_t0((base + self.at.1) as *const u8, 1);
            self.at.1 += 64;
            if self.at.1 >= len {
                self.at = (self.at.0 + 1, 0);
            }
            lines -= 1;
            self.left -= 1;
        }
    }
}

/// Cache lines a microkernel prefetches (`prefetch_t0`), one every `gap` steps of its k-loop
/// instead of a burst at the call's start: on Zen 4 the bursts of next-panel hints from
/// DRAM stalled the sweep (~7 % of its samples on the prefetch loop, `perf`,
/// docs/PERFORMANCE.md#gemm-design-what-is-kept-and-why). Hints only: never dereferenced.
pub(crate) struct Spread<'a> {
    ahead: Option<&'a mut Ahead>,
    lines: usize,
    gap: usize,
    wait: usize,
}

impl Spread<'_> {
    /// One k-step: prefetches the next line when its turn has come.
    #[inline(always)]
    pub(crate) fn tick(&mut self) {
        if self.lines > 0 {
            self.wait -= 1;
            if self.wait == 0 {
                if let Some(a) = self.ahead.as_mut() {
                    a.step(1);
                }
                self.lines -= 1;
                self.wait = self.gap;
            }
        }
    }

    /// Prefetches the lines the k-loop did not reach.
    #[inline(always)]
    pub(crate) fn finish(self) {
        if let Some(a) = self.ahead {
            a.step(self.lines);
        }
    }
}
