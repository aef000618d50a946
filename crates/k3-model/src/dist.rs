//! The distribution seam (docs/DISTRIBUTED.md#the-seam): which rank computes which rows.
//!
//! One model runs over `N` ranks (threads of one process with [`crate::local::LocalComm`],
//! or processes with an MPI transport in the `k3` binary). Every rank holds the same residual
//! stream; three kinds of work are dealt out, all keeping every dot product and every
//! per-head sum whole on one rank, so ids and logits are bit-identical to one process at any
//! `N`:
//!
//! * **Trunk rows**: every trunk mat-vec / mat-mat that is not per head goes through
//!   [`Dist::matmul`], which computes rows `[r0, r1)` of this rank ([`row_share`]) and
//!   all-gathers the slices in rank order. A row's output is one row dot of the kernel
//!   contract, whichever rows run beside it (docs/NUMERICS.md#matvec-and-matmul), so the
//!   gathered result equals the whole product.
//! * **Heads**: KDA and MLA heads are dealt contiguously ([`Dist::heads`]); a rank computes
//!   its heads' projection rows locally ([`Dist::local_matmuls`]), runs their recurrence or
//!   attention and gathers their outputs in head order ([`Dist::allgather_cols`]).
//! * **Routed experts**: expert `e` of every layer is owned by rank `e % N`
//!   ([`Dist::owns_expert`]); each rank fetches and runs only its own experts of the tokens'
//!   top-k, the per-slot outputs are all-gathered, and every rank sums them in top-k order
//!   exactly as one process does (crate::moe).
//!
//! Everything else (norms, routing, the MLA latent cache, the residual mix) is replicated:
//! every rank computes it on identical inputs, with identical results. Which rows of each
//! tensor a rank reads is stated once, in [`crate::share`]; every dealt tensor may be handed
//! over whole or as exactly this rank's rows ([`Dist::share_of`]).

pub use crate::error::CommError;
use crate::error::ModelError;
pub use crate::share::row_share;
use crate::share::Split;
use k3_kernels::{matmul, Matrix, MatrixData};
use std::fmt;
use std::ops::Range;

/// The collectives one model needs across ranks. Every rank calls the same collectives in the
/// same order (the model's control flow is identical on every rank); a rank that fails calls
/// [`Comm::abort`] so that the others' pending and later collectives fail instead of waiting.
pub trait Comm: Send + Sync + fmt::Debug {
    /// This rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Ranks in the group (≥ 1).
    fn size(&self) -> usize;
    /// All-gather with fixed per-rank counts: rank `q` contributes `counts[q]` values
    /// (`mine.len() == counts[rank]`), and `out` (`Σ counts` long) receives every rank's values
    /// concatenated in rank order. Every rank passes the same `counts`.
    fn allgather_f32(
        &self,
        mine: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError>;
    /// Replaces `ids` on every rank by rank `root`'s `ids` (any length).
    fn broadcast_u32(&self, root: usize, ids: &mut Vec<u32>) -> Result<(), CommError>;
    /// Replaces `bytes` on every rank by rank `root`'s (any length): events of a replicated
    /// loop (a server's admitted requests, a chat's input lines). The default packs them into
    /// `u32` words (length first) over [`Comm::broadcast_u32`].
    fn broadcast_bytes(&self, root: usize, bytes: &mut Vec<u8>) -> Result<(), CommError> {
        let len = bytes.len() as u64;
        let mut words = vec![len as u32, (len >> 32) as u32];
        words.extend(
            bytes
                .chunks(4)
                .map(|c| c.iter().rev().fold(0u32, |w, &b| (w << 8) | b as u32)),
        );
        self.broadcast_u32(root, &mut words)?;
        let got = match words.get(..2) {
            Some(&[lo, hi]) => (lo as u64 | (hi as u64) << 32) as usize,
            _ => {
                return Err(CommError::Mismatch(
                    "byte broadcast without a length".into(),
                ))
            }
        };
        let body: Vec<u8> = words[2..].iter().flat_map(|w| w.to_le_bytes()).collect();
        if body.len() < got || body.len() > got + 3 {
            return Err(CommError::Mismatch(format!(
                "byte broadcast: length {got}, {} bytes received",
                body.len()
            )));
        }
        *bytes = body[..got].to_vec();
        Ok(())
    }
    /// One `u64` from every rank, in rank order (fingerprints, flags).
    fn allgather_u64(&self, mine: u64) -> Result<Vec<u64>, CommError>;
    /// Waits until every rank has arrived.
    fn barrier(&self) -> Result<(), CommError>;
    /// This rank failed with `reason`: ends the group (the others' collectives return
    /// [`CommError::Aborted`] naming this rank; an MPI transport may end the processes).
    fn abort(&self, reason: &str);
}

/// The group of one: every collective is the identity.
#[derive(Debug, Default, Clone, Copy)]
pub struct Solo;

impl Comm for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn allgather_f32(
        &self,
        mine: &[f32],
        counts: &[usize],
        out: &mut [f32],
    ) -> Result<(), CommError> {
        check_counts(0, mine.len(), counts, out.len())?;
        out.copy_from_slice(mine);
        Ok(())
    }
    fn broadcast_u32(&self, _root: usize, _ids: &mut Vec<u32>) -> Result<(), CommError> {
        Ok(())
    }
    fn allgather_u64(&self, mine: u64) -> Result<Vec<u64>, CommError> {
        Ok(vec![mine])
    }
    fn barrier(&self) -> Result<(), CommError> {
        Ok(())
    }
    fn abort(&self, _reason: &str) {}
}

/// The one group of one, for passes that run on a single rank.
pub static SOLO: Solo = Solo;

/// Refuses an all-gather whose lengths disagree with its counts.
pub fn check_counts(
    rank: usize,
    mine: usize,
    counts: &[usize],
    out: usize,
) -> Result<(), CommError> {
    let total: usize = counts.iter().sum();
    if counts.get(rank) != Some(&mine) || total != out {
        return Err(CommError::Mismatch(format!(
            "rank {rank}: contributes {mine} values, counts {counts:?}, output {out}"
        )));
    }
    Ok(())
}

/// Rows `[r0, r1)` of `w` as a matrix of their own (the same bytes, borrowed).
pub fn row_slice<'a>(w: &Matrix<'a>, r0: usize, r1: usize) -> Matrix<'a> {
    let c = w.cols;
    let data = match w.data {
        MatrixData::Bf16(d) => MatrixData::Bf16(&d[r0 * c..r1 * c]),
        MatrixData::F32(d) => MatrixData::F32(&d[r0 * c..r1 * c]),
        MatrixData::Mxfp4 { packed, scales } => MatrixData::Mxfp4 {
            packed: &packed[r0 * c / 2..r1 * c / 2],
            scales: &scales[r0 * c / 32..r1 * c / 32],
        },
        MatrixData::Q8 { values, scales } => MatrixData::Q8 {
            values: &values[r0 * c..r1 * c],
            scales: &scales[r0..r1],
        },
    };
    Matrix {
        rows: r1 - r0,
        cols: c,
        data,
    }
}

/// This rank's view of the group, carried by every pass (crate::pass::Pass).
#[derive(Clone, Copy)]
pub struct Dist<'a> {
    /// The transport.
    pub comm: &'a dyn Comm,
}

impl<'a> Dist<'a> {
    /// The group of one.
    pub fn solo() -> Dist<'static> {
        Dist { comm: &SOLO }
    }
    /// More than one rank.
    pub fn is_split(&self) -> bool {
        self.comm.size() > 1
    }
    /// Whether this rank runs routed expert `expert` (owner `expert % N`).
    pub fn owns_expert(&self, expert: u32) -> bool {
        crate::share::owns_expert(expert, self.comm.rank(), self.comm.size())
    }
    /// Owner rank of routed expert `expert`.
    pub fn expert_owner(&self, expert: u32) -> usize {
        expert as usize % self.comm.size()
    }

    /// The rows `split` deals this rank of a `total`-row tensor (crate::share).
    pub fn rows(&self, total: usize, split: Split) -> Range<usize> {
        split.rows(total, self.comm.rank(), self.comm.size())
    }

    /// This rank's rows of `w`, a tensor of `total` rows dealt by `split`, which a store may
    /// hand over EITHER whole OR as exactly this rank's share of rows (crate::share); `None`
    /// when it is neither.
    pub fn share_of<'w>(&self, w: &Matrix<'w>, total: usize, split: Split) -> Option<Matrix<'w>> {
        let r = self.rows(total, split);
        if w.rows == total {
            Some(row_slice(w, r.start, r.end))
        } else if w.rows == r.len() {
            Some(*w)
        } else {
            None
        }
    }

    /// This rank's part of `v`, `total` rows of `width` values each dealt by `split`, handed
    /// over whole or as this rank's share (as [`Dist::share_of`]).
    pub fn share_of_slice<'v>(
        &self,
        v: &'v [f32],
        total: usize,
        width: usize,
        split: Split,
    ) -> Option<&'v [f32]> {
        let r = self.rows(total, split);
        if v.len() == total * width {
            Some(&v[r.start * width..r.end * width])
        } else if v.len() == r.len() * width {
            Some(v)
        } else {
            None
        }
    }

    /// Refuses a tensor that is neither whole (`want`) nor this rank's share of `want`'s rows
    /// under `split`, naming both shapes it would accept.
    pub fn check_dealt(
        &self,
        layer: Option<usize>,
        what: &'static str,
        w: &Matrix,
        want: (usize, usize),
        split: Split,
    ) -> Result<(), ModelError> {
        let r = self.rows(want.0, split);
        let rows_ok = w.rows == want.0 || w.rows == r.len();
        if rows_ok && w.cols == want.1 {
            return Ok(());
        }
        let share = r.len();
        Err(self.shape_error(layer, what, (w.rows, w.cols), want, (r, share)))
    }

    /// [`Dist::check_dealt`] for a tensor of `total` rows of `width` values held as a flat
    /// slice of `len` values.
    pub fn check_dealt_len(
        &self,
        layer: Option<usize>,
        what: &'static str,
        len: usize,
        (total, width): (usize, usize),
        split: Split,
    ) -> Result<(), ModelError> {
        let r = self.rows(total, split);
        if len == total * width || len == r.len() * width {
            return Ok(());
        }
        let share = r.len() * width;
        Err(self.shape_error(layer, what, (len, 1), (total * width, 1), (r, share)))
    }

    fn shape_error(
        &self,
        layer: Option<usize>,
        what: &'static str,
        got: (usize, usize),
        want: (usize, usize),
        (r, share): (Range<usize>, usize),
    ) -> ModelError {
        let (rank, n) = (self.comm.rank(), self.comm.size());
        let want = if n == 1 {
            format!("[{}, {}]", want.0, want.1)
        } else {
            format!(
                "[{}, {}] (whole) or [{}, {}] (rank {rank} of {n}'s share, rows {}..{})",
                want.0, want.1, share, want.1, r.start, r.end
            )
        };
        ModelError::Shape {
            layer,
            what,
            got: format!("[{}, {}]", got.0, got.1),
            want,
        }
    }

    /// `Y[t] = W·X[t]` for `t` tokens (`x` `[t][cols]`, `y` `[t][rows]`), bit-identical to
    /// [`k3_kernels::matmul`]: this rank computes its rows, the slices are all-gathered in
    /// rank order and scattered back into `[t][rows]`. `w` is whole or this rank's rows.
    pub fn matmul(&self, y: &mut [f32], w: &Matrix, x: &[f32], t: usize) -> Result<(), ModelError> {
        self.matmuls(&mut [(y, w)], x, t)
    }
}

/// One product of [`Dist::matmuls`]: its output `[t][w.rows]` and its weight.
pub type Product<'o, 'w> = (&'o mut [f32], &'w Matrix<'w>);

impl Dist<'_> {
    /// Several products of the SAME input `x` (`[t][cols]`) in one all-gather: each rank
    /// computes its rows of every product, sends them as one message, and every output is
    /// bit-identical to [`k3_kernels::matmul`] (one collective instead of one per product).
    pub fn matmuls(
        &self,
        jobs: &mut [Product<'_, '_>],
        x: &[f32],
        t: usize,
    ) -> Result<(), ModelError> {
        if t == 0 {
            return Ok(());
        }
        let n = self.comm.size();
        // each output is `[t][rows]` of the WHOLE product; the weight is whole or this
        // rank's share of its rows (docs/DISTRIBUTED.md#the-seam)
        let mut mats = Vec::with_capacity(jobs.len());
        for (y, w) in jobs.iter() {
            let total = y.len() / t;
            let mine = self.share_of(w, total, Split::Rows).ok_or_else(|| {
                let r = self.rows(total, Split::Rows);
                let share = r.len();
                self.shape_error(
                    None,
                    "dealt product",
                    (w.rows, w.cols),
                    (total, w.cols),
                    (r, share),
                )
            })?;
            mats.push((total, mine));
        }
        if n == 1 {
            for ((y, _), (_, w)) in jobs.iter_mut().zip(&mats) {
                matmul(y, w, x, t);
            }
            return Ok(());
        }
        let me = self.comm.rank();
        let share = |rows: usize, q: usize| {
            let (a, b) = row_share(rows, q, n);
            t * (b - a)
        };
        let counts: Vec<usize> = (0..n)
            .map(|q| mats.iter().map(|&(total, _)| share(total, q)).sum())
            .collect();
        let mut mine = vec![0f32; counts[me]];
        let mut off = 0;
        for (_, w) in &mats {
            let len = t * w.rows;
            matmul(&mut mine[off..off + len], w, x, t);
            off += len;
        }
        let mut all = vec![0f32; counts.iter().sum()];
        self.comm.allgather_f32(&mine, &counts, &mut all)?;
        let mut off = 0;
        for q in 0..n {
            for ((y, _), &(total, _)) in jobs.iter_mut().zip(&mats) {
                let (a, b) = row_share(total, q, n);
                let width = b - a;
                for tok in 0..t {
                    let src = &all[off + tok * width..off + (tok + 1) * width];
                    y[tok * total + a..tok * total + b].copy_from_slice(src);
                }
                off += t * width;
            }
        }
        Ok(())
    }
}

/// One product of [`Dist::local_matmuls`]: its output `[t][share rows]`, its weight (whole or
/// this rank's share), the weight's whole row count and how its rows are dealt.
pub type LocalProduct<'o, 'w> = (&'o mut [f32], &'w Matrix<'w>, usize, Split);

impl Dist<'_> {
    /// This rank's heads of `heads` (`row_share(heads)`, docs/DISTRIBUTED.md#the-seam).
    pub fn heads(&self, heads: usize) -> Range<usize> {
        self.rows(heads, Split::Heads(heads))
    }

    /// This rank's rows of several products of the same input `x` (`[t][cols]`), kept on
    /// this rank (no collective): output `j` is `[t][rows of its share]`, each row the same
    /// row dot as in the whole product.
    pub fn local_matmuls(
        &self,
        jobs: &mut [LocalProduct<'_, '_>],
        x: &[f32],
        t: usize,
    ) -> Result<(), ModelError> {
        for (y, w, total, split) in jobs.iter_mut() {
            let r = self.rows(*total, *split);
            let mine = self.share_of(w, *total, *split).ok_or_else(|| {
                let share = r.len();
                let want = (*total, w.cols);
                self.shape_error(
                    None,
                    "head-split product",
                    (w.rows, w.cols),
                    want,
                    (r, share),
                )
            })?;
            matmul(&mut y[..t * mine.rows], &mine, x, t);
        }
        Ok(())
    }

    /// All-gathers per-token slices dealt by `split`: this rank holds `mine`,
    /// `[t][its rows of total]`; `out` (`[t][total]`) receives every rank's columns in rank
    /// order (= head order for [`Split::Heads`]). One collective.
    pub fn allgather_cols(
        &self,
        mine: &[f32],
        total: usize,
        split: Split,
        out: &mut [f32],
        t: usize,
    ) -> Result<(), ModelError> {
        let n = self.comm.size();
        let widths: Vec<Range<usize>> = (0..n).map(|q| split.rows(total, q, n)).collect();
        let me = self.comm.rank();
        let mine = &mine[..t * widths[me].len()];
        if n == 1 {
            out[..t * total].copy_from_slice(mine);
            return Ok(());
        }
        let counts: Vec<usize> = widths.iter().map(|r| t * r.len()).collect();
        let mut all = vec![0f32; t * total];
        self.comm.allgather_f32(mine, &counts, &mut all)?;
        let mut off = 0;
        for r in &widths {
            let w = r.len();
            for tok in 0..t {
                let src = &all[off + tok * w..off + (tok + 1) * w];
                out[tok * total + r.start..tok * total + r.end].copy_from_slice(src);
            }
            off += t * w;
        }
        Ok(())
    }
}
