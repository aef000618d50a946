//! A layer streamed in two pieces (docs/STREAMING.md#trunk-pieces): the token mixer's tensors,
//! bound first, then the channel mixer's. Each piece is one contiguous byte range of the
//! layer's run, cut on a tensor boundary, so it is one read (and, in a compressed pack, one
//! stored range decoded chunk by chunk); the trunk store keeps one ring slot per piece and
//! reads the next piece while the current one computes.

use crate::decode::{stored_range, PieceSpan};
use crate::gather::RunMap;
use crate::layer_view::{layer_tensors, prepare_piece, unprepared, view_layer, PreparedLayer};
use crate::streaming::{PackSource, StreamingStore, TrunkRuns};
use k3_format::bind::{FfnTensors, LayerTensors};
use k3_format::{ModelBinding, TensorRef};
use k3_model::weights::{ChannelWeights, LayerHold, MixerWeights, SourceError};
use k3_store::trunk_store::LayerBytes;
use k3_store::trunk_store::RunLoc;
use std::ops::Range;

/// Pieces per layer when a layer streams in pieces.
pub(crate) const PIECES: usize = 2;

/// Where a layer's two pieces lie in its run: byte ranges that tile it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LayerPieces {
    /// `[token mixer, channel mixer]`, in the order the pass binds them.
    pub(crate) ranges: [Range<usize>; PIECES],
    /// The token mixer's layer norms that lie in the channel mixer's piece (the checkpoint's
    /// name order puts `input_layernorm` before a dense layer's `mlp.*`): read on their own
    /// from the checkpoint when the first piece is bound, a few KB each.
    pub(crate) outside: Vec<TensorRef>,
}

impl LayerPieces {
    /// Bytes of each piece, `[token mixer, channel mixer]`.
    pub(crate) fn bytes(&self) -> [u64; PIECES] {
        self.ranges.clone().map(|r| r.len() as u64)
    }

    /// The pieces in byte order (for the run's checksum).
    pub(crate) fn byte_order(&self) -> [usize; PIECES] {
        if self.ranges[0].start < self.ranges[1].start {
            [0, 1]
        } else {
            [1, 0]
        }
    }
}

/// The token mixer's own tensors (weights and vectors of `self_attn`), its layer norms, and
/// the channel mixer's matrices. The channel mixer's vectors may lie in either piece: vectors
/// are widened when their piece is bound and kept for the layer.
fn mixer_and_channel(lt: &LayerTensors) -> [Vec<&TensorRef>; 3] {
    let (vecs, mats) = layer_tensors(lt);
    let (ffn_mats, ffn_vecs) = match &lt.ffn {
        FfnTensors::Dense(_) => (3, 0),
        FfnTensors::Moe(_) => (6, 2),
    };
    // vecs: input norm, post-attention norm, attn-res norm/proj, mlp-res norm/proj, the
    // mixer's own vectors, then the channel mixer's.
    let mut attn: Vec<&TensorRef> = vecs[6..vecs.len() - ffn_vecs].to_vec();
    attn.extend(&mats[..mats.len() - ffn_mats]);
    let norms = vec![vecs[0], vecs[2], vecs[3]];
    [attn, norms, mats[mats.len() - ffn_mats..].to_vec()]
}

/// Splits layer `lt`'s contiguous run of `run_len` bytes into its two pieces, cut where the
/// channel mixer's matrices end or begin, or `None` when the token mixer's own tensors and
/// the channel mixer's matrices interleave in the run (or the layer is gathered tensor by
/// tensor): such a layer streams whole.
pub(crate) fn split_layer(lt: &LayerTensors, map: &RunMap, run_len: usize) -> Option<LayerPieces> {
    if !matches!(map, RunMap::Contiguous { .. }) {
        return None;
    }
    let span = |ts: &[&TensorRef]| -> Option<Range<usize>> {
        let mut r: Option<Range<usize>> = None;
        for t in ts {
            let o = map.offset_of(t)?;
            let e = o + t.nbytes as usize;
            r = Some(match r {
                None => o..e,
                Some(r) => r.start.min(o)..r.end.max(e),
            });
        }
        r
    };
    let [attn, norms, channel] = mixer_and_channel(lt);
    let (m, c) = (span(&attn)?, span(&channel)?);
    let ranges = if m.end <= c.start {
        [0..c.start, c.start..run_len]
    } else if c.end <= m.start {
        [c.end..run_len, 0..c.end]
    } else {
        return None;
    };
    let outside = norms
        .into_iter()
        .filter(|t| {
            let o = map.offset_of(t).unwrap_or(usize::MAX);
            !(ranges[0].start <= o && o + t.nbytes as usize <= ranges[0].end)
        })
        .cloned()
        .collect();
    Some(LayerPieces { ranges, outside })
}

/// One layer of a [`StreamingStore`] whose trunk streams in pieces: the bound piece's bytes
/// and what was prepared from the pieces bound so far.
pub(crate) struct PieceHold<'s> {
    pub(crate) store: &'s StreamingStore,
    pub(crate) l: usize,
    pub(crate) lt: &'s LayerTensors,
    pub(crate) pieces: &'s LayerPieces,
    /// Which piece `bytes` holds.
    pub(crate) piece: usize,
    pub(crate) bytes: Option<LayerBytes<'s>>,
    pub(crate) prepared: PreparedLayer,
}

impl<'s> PieceHold<'s> {
    /// Binds piece 0 (the token mixer's) of layer `l` and prepares its tensors.
    pub(crate) fn bind(
        store: &'s StreamingStore,
        l: usize,
        lt: &'s LayerTensors,
        pieces: &'s LayerPieces,
        bytes: LayerBytes<'s>,
    ) -> Result<Self, SourceError> {
        let mut hold = PieceHold {
            store,
            l,
            lt,
            pieces,
            piece: 0,
            bytes: Some(bytes),
            prepared: unprepared(),
        };
        hold.prepare()?;
        Ok(hold)
    }

    /// Tensor `t`'s bytes when it lies in the bound piece.
    fn tensor_bytes(&self, t: &TensorRef) -> Option<&[u8]> {
        let bytes = self.bytes.as_ref()?;
        in_piece(
            self.store.run_map(self.l)?,
            &self.pieces.ranges[self.piece],
            t,
            bytes,
        )
    }

    fn prepare(&mut self) -> Result<(), SourceError> {
        let outside = match self.piece {
            0 => self.store.read_outside(&self.pieces.outside)?,
            _ => Vec::new(),
        };
        let side = |t: &TensorRef| {
            let i = self.pieces.outside.iter().position(|o| o.name == t.name)?;
            let (buf, skew) = outside.get(i)?;
            Some(&buf[*skew..*skew + t.nbytes as usize])
        };
        let mut prepared = std::mem::replace(&mut self.prepared, unprepared());
        prepare_piece(self.lt, &mut prepared, |t| {
            self.tensor_bytes(t).or_else(|| side(t))
        })?;
        self.prepared = prepared;
        Ok(())
    }

    fn view(&self) -> k3_model::weights::LayerWeights<'_> {
        view_layer(self.lt, &self.prepared, |t| {
            self.tensor_bytes(t).unwrap_or(&[])
        })
    }
}

/// `t`'s bytes within `bytes`, the bound piece covering `range` of the run, if it lies there.
pub(crate) fn in_piece<'b>(
    map: &RunMap,
    range: &Range<usize>,
    t: &TensorRef,
    bytes: &'b [u8],
) -> Option<&'b [u8]> {
    let o = map.offset_of(t)?;
    let e = o + t.nbytes as usize;
    (range.start <= o && e <= range.end).then(|| &bytes[o - range.start..e - range.start])
}

impl LayerHold for PieceHold<'_> {
    fn mixer(&self) -> MixerWeights<'_> {
        self.view().halves().0
    }

    /// Releases the token mixer's piece, then binds the channel mixer's: its slot is of the
    /// other class, so this never waits on the piece just released.
    fn channel(&mut self) -> Result<ChannelWeights<'_>, SourceError> {
        if self.piece == 0 {
            self.bytes = None;
            self.bytes = Some(self.store.trunk_piece(self.l, 1)?);
            self.piece = 1;
            self.prepare()?;
        }
        Ok(self.view().halves().1)
    }
}

/// The trunk store's units for a ring of pieces: `runs[l · 2 + p]` is piece `p` of layer `l`.
pub(crate) struct PieceRuns {
    pub(crate) runs: Vec<RunLoc>,
    pub(crate) pieces: Vec<LayerPieces>,
    /// For a compressed pack: each unit's decoded and stored ranges.
    pub(crate) spans: Vec<PieceSpan>,
}

/// Splits every layer's run into its pieces, or `None` when some layer cannot be split (it
/// then streams whole, and so do the others). In a compressed pack a piece's stored bytes are
/// the stored range of the chunks decoding into it.
pub(crate) fn piece_runs(
    binding: &ModelBinding,
    trunk: &TrunkRuns,
    compressed: Option<&PackSource<'_>>,
) -> Option<PieceRuns> {
    let mut out = PieceRuns {
        runs: Vec::new(),
        pieces: Vec::new(),
        spans: Vec::new(),
    };
    for (l, lt) in binding.layers.iter().enumerate() {
        let run = trunk.runs[l];
        let decoded_len = match compressed {
            Some((p, _)) => p.decoded_bytes(lt.layer) as usize,
            None => run.len as usize,
        };
        let pieces = split_layer(lt, &trunk.run_maps[l], decoded_len)?;
        for range in &pieces.ranges {
            let stored = match compressed {
                Some((p, _)) => stored_range(p, lt.layer, range)?,
                None => range.clone(),
            };
            out.runs.push(RunLoc {
                file: run.file,
                offset: run.offset + stored.start as u64,
                len: stored.len() as u64,
            });
            out.spans.push(PieceSpan {
                layer: lt.layer,
                decoded: range.clone(),
                stored,
            });
        }
        out.pieces.push(pieces);
    }
    Some(out)
}

/// Each layer's `[token mixer, channel mixer]` piece bytes for the planner, or an empty list
/// when some layer cannot stream in pieces.
pub(crate) fn piece_bytes(binding: &ModelBinding) -> Vec<[u64; PIECES]> {
    let split = |lt: &LayerTensors| {
        let run = lt.trunk_run().ok()?;
        split_layer(
            lt,
            &RunMap::Contiguous { start: run.start },
            run.len() as usize,
        )
    };
    binding
        .layers
        .iter()
        .map(|lt| split(lt).map(|p| p.bytes()))
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default()
}
