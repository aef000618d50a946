//! Opening a [`StreamingStore`](super::StreamingStore): where the trunk runs lie, the trunk
//! store (whole layers or pieces), the expert cache and the head.

use super::{cfg_experts, embed_mode, read_aligned, Files, Head, PackSource, TrunkRuns};
use crate::gather::{Gather, RunMap};
use crate::layer_view::{prepare_mat, widen};
use crate::pieces::{LayerPieces, PIECES};
use crate::EngineError;
use k3_format::ModelBinding;
use k3_plan::{KeySpace, MemoryPlan, PolicyKind};
use k3_store::expert_store::{ExpertLoc, ExpertStore};
use k3_store::io::ReadAt;
use k3_store::trunk_store::{RunLoc, TrunkStore};
use std::sync::Arc;

/// Where every layer's trunk run lies: in the pack when one is given, else in its shard; a
/// layer that is not one run is gathered into a virtual file appended to `files`.
pub(super) fn trunk_runs(
    binding: &ModelBinding,
    files: &mut Files,
    pack: Option<&k3_format::TrunkPack>,
) -> TrunkRuns {
    let mut runs = Vec::with_capacity(binding.layers.len());
    let mut run_maps = Vec::with_capacity(binding.layers.len());
    let mut gather = Gather::new(files.clone());
    let gather_file = files.len();
    for lt in &binding.layers {
        match (lt.trunk_run(), pack) {
            (Ok(r), Some(p)) => {
                let (file_off, len) = p.layer(lt.layer);
                runs.push(RunLoc {
                    file: files.len() - 1,
                    offset: file_off,
                    len,
                });
                run_maps.push(RunMap::Contiguous { start: r.start });
            }
            (Ok(r), None) => {
                runs.push(RunLoc {
                    file: r.shard,
                    offset: r.start,
                    len: r.len(),
                });
                run_maps.push(RunMap::Contiguous { start: r.start });
            }
            // Not one run (gaps, or split across shards): read tensor by tensor.
            (Err(_), _) => {
                let ((offset, len), map) = gather.add_layer(lt);
                runs.push(RunLoc {
                    file: gather_file,
                    offset,
                    len,
                });
                run_maps.push(map);
            }
        }
    }
    if gather.len() > 0 {
        files.push(Arc::new(gather));
    }
    TrunkRuns { runs, run_maps }
}

/// The trunk store for `plan`: a ring of pieces when the plan asks for one and every layer
/// splits (else whole layers), pinned layers read (and decoded) now.
pub(super) fn open_trunk(
    binding: &ModelBinding,
    files: &Files,
    trunk_runs: &TrunkRuns,
    plan: &MemoryPlan,
    pack: Option<&PackSource<'_>>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(TrunkStore, Option<Vec<LayerPieces>>), EngineError> {
    let runs = &trunk_runs.runs;
    let mut pinned = vec![false; runs.len()];
    for &l in &plan.trunk.pinned {
        pinned[l] = true;
    }
    let compressed = pack.filter(|(p, _)| p.is_compressed());
    if !plan.trunk.piece_slot_bytes.is_empty() {
        if let Some(split) = crate::pieces::piece_runs(binding, trunk_runs, compressed) {
            let decoder = compressed.map(|(p, pool)| {
                Arc::new(crate::decode::PackDecoder::for_pieces(
                    (*p).clone(),
                    Arc::clone(pool),
                    split.spans,
                )) as Arc<dyn k3_store::RunDecoder>
            });
            let trunk = TrunkStore::new_pieces(
                files.clone(),
                split.runs,
                PIECES,
                &pinned,
                decoder,
                progress,
            )?;
            return Ok((trunk, Some(split.pieces)));
        }
    }
    let decoder = compressed.map(|(p, pool)| {
        Arc::new(crate::decode::PackDecoder::new(
            (*p).clone(),
            Arc::clone(pool),
        )) as Arc<dyn k3_store::RunDecoder>
    });
    let ring = if plan.trunk.pinned.len() == runs.len() {
        0
    } else {
        plan.trunk.ring_slots.max(1)
    };
    let trunk = TrunkStore::new_decoding(
        files.clone(),
        runs.clone(),
        &pinned,
        ring,
        decoder,
        progress,
    )?;
    Ok((trunk, None))
}

/// The expert cache the plan sized.
pub(super) fn open_experts(
    binding: &ModelBinding,
    files: &Files,
    plan: &MemoryPlan,
    io_threads: usize,
) -> Result<ExpertStore, EngineError> {
    let locator = binding.experts.clone();
    let locate = Box::new(move |layer: usize, e: u32| {
        locator
            .locate(layer, e as usize)
            .map(|l| ExpertLoc {
                file: l.shard,
                reads: l.reads.clone(),
                total: l.total_bytes,
            })
            .map_err(|err| err.to_string())
    });
    let space = KeySpace {
        n_layers: binding.layers.len() as u32,
        n_experts: cfg_experts(binding),
    };
    Ok(ExpertStore::new_in(
        space,
        files.clone(),
        locate,
        plan.expert_slots as usize,
        plan.expert_slot_bytes,
        PolicyKind::DEFAULT,
        io_threads,
    )?)
}

/// Reads the head (final norms, lm_head) into memory; the embedding stays on disk.
pub(super) fn read_head(binding: &ModelBinding, files: &Files) -> Result<Head, EngineError> {
    let g = &binding.globals;
    let mut vecs = Vec::new();
    for t in [&g.norm, &g.output_attn_res_norm, &g.output_attn_res_proj] {
        let (buf, skew) = read_aligned(files, t)?;
        vecs.push(widen(t, &buf[skew..skew + t.nbytes as usize])?);
    }
    let (lm_head_bytes, lm_head_skew) = read_aligned(files, &g.lm_head)?;
    let lm_head = prepare_mat(
        &g.lm_head,
        &lm_head_bytes[lm_head_skew..lm_head_skew + g.lm_head.nbytes as usize],
    )?;
    // The embedding is never read whole: rows come on demand. Its access mode is decided
    // from the file offset's alignment, exactly as for a mapped view.
    let embed = embed_mode(&g.embed_tokens)?;
    Ok(Head {
        vecs,
        lm_head,
        lm_head_bytes,
        lm_head_skew,
        lm_head_len: g.lm_head.nbytes as usize,
        embed,
    })
}
