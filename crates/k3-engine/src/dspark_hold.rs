//! How the DSpark draft's matrices are held in memory (docs/DSPARK.md#memory): BF16 as
//! published (mapped in place), or quantized once at open into the draft trunk's forms
//! (`q8`: per-row int8 + f32 scale; `mxfp4`: groups of 32 + E8M0 scale,
//! docs/FORMATS.md#draft-trunk) when the budget leaves no room for BF16. A matrix whose width
//! is not a multiple of 32 stays BF16 under `mxfp4`. Proposals change with the form; the
//! generated ids do not (verification is exact).

use crate::EngineError;
use k3_format::pack::DraftQuant;
use k3_kernels::Matrix;
use rayon::prelude::*;

/// The form the draft's matrices are held in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftHold {
    /// As published: BF16, read from the mapped file.
    Bf16,
    /// Quantized at open.
    Quant(DraftQuant),
}

impl DraftHold {
    /// The forms tried, largest first.
    pub const ALL: [DraftHold; 3] = [
        DraftHold::Bf16,
        DraftHold::Quant(DraftQuant::Q8),
        DraftHold::Quant(DraftQuant::Mxfp4),
    ];

    /// `bf16`, `q8` or `mxfp4`.
    pub fn name(self) -> &'static str {
        match self {
            DraftHold::Bf16 => "bf16",
            DraftHold::Quant(q) => q.name(),
        }
    }

    /// Bytes of a `[rows][cols]` BF16 matrix held in this form (the draft trunk's sizes,
    /// [`k3_format::pack::quantized_bytes`]; a matrix MXFP4 cannot hold stays BF16).
    pub fn matrix_bytes(self, rows: usize, cols: usize) -> u64 {
        let bf16 = rows as u64 * cols as u64 * 2;
        match self {
            DraftHold::Bf16 => bf16,
            DraftHold::Quant(q) => {
                k3_format::pack::quantized_bytes(q.dtype(), &[rows, cols]).unwrap_or(bf16)
            }
        }
    }
}

/// One quantized matrix, owned.
pub(crate) enum HeldMatrix {
    /// `[rows][cols]` int8, one scale per row.
    Q8 { values: Vec<i8>, scales: Vec<f32> },
    /// `[rows][cols/2]` packed nibbles, `[rows][cols/32]` E8M0 scales.
    Mxfp4 { packed: Vec<u8>, scales: Vec<u8> },
}

impl HeldMatrix {
    /// Quantizes `floats` (`[rows][cols]`) to `quant`; `None` for an MXFP4 matrix whose width
    /// is not a multiple of 32 (it stays BF16).
    pub(crate) fn quantize(
        name: &str,
        floats: &[f32],
        rows: usize,
        cols: usize,
        quant: DraftQuant,
    ) -> Result<Option<HeldMatrix>, EngineError> {
        let fail = |e: k3_kernels::quant::QuantError| {
            EngineError::Invalid(format!(
                "dspark: quantizing {name} to {}: {e}",
                quant.name()
            ))
        };
        match quant {
            DraftQuant::Q8 => {
                let mut values = vec![0i8; rows * cols];
                let scales = values
                    .par_chunks_mut(cols)
                    .zip(floats.par_chunks(cols))
                    .map(|(v, row)| k3_kernels::quant::quantize_q8_row(row, v))
                    .collect::<Result<Vec<f32>, _>>()
                    .map_err(fail)?;
                Ok(Some(HeldMatrix::Q8 { values, scales }))
            }
            DraftQuant::Mxfp4 if !cols.is_multiple_of(32) => Ok(None),
            DraftQuant::Mxfp4 => {
                let (packed, scales) = mxfp4_rows(floats, cols).map_err(|(_, e)| fail(e))?;
                Ok(Some(HeldMatrix::Mxfp4 { packed, scales }))
            }
        }
    }

    /// The matrix view (`None` only if the shape disagrees, which `quantize` rules out).
    pub(crate) fn view(&self, rows: usize, cols: usize) -> Option<Matrix<'_>> {
        match self {
            HeldMatrix::Q8 { values, scales } => Matrix::q8(rows, cols, values, scales),
            HeldMatrix::Mxfp4 { packed, scales } => Matrix::mxfp4(rows, cols, packed, scales),
        }
    }
}

/// `floats` (`[rows][cols]`, `cols` a multiple of 32) as MXFP4: `[rows][cols/2]` packed
/// nibbles and `[rows][cols/32]` E8M0 scales. Rows are independent and each is quantized by
/// the same pure function, so splitting them across threads changes no byte. `Err` names the
/// first row that failed.
pub(crate) fn mxfp4_rows(
    floats: &[f32],
    cols: usize,
) -> Result<(Vec<u8>, Vec<u8>), (usize, k3_kernels::quant::QuantError)> {
    let rows = floats.len() / cols;
    let mut packed = vec![0u8; rows * cols / 2];
    let mut scales = vec![0u8; rows * cols / 32];
    let results: Vec<_> = packed
        .par_chunks_mut(cols / 2)
        .zip(scales.par_chunks_mut(cols / 32))
        .zip(floats.par_chunks(cols))
        .map(|((p, s), row)| k3_kernels::quant::quantize_mxfp4_row(row, p, s))
        .collect();
    match results.into_iter().enumerate().find(|(_, r)| r.is_err()) {
        Some((r, Err(e))) => Err((r, e)),
        _ => Ok((packed, scales)),
    }
}

/// The memory plan with the DSpark draft `draft` held beside the model
/// (docs/DSPARK.md#memory): its weights in the first form of [`DraftHold::ALL`] whose plan
/// fits, plus `sessions` × `ctx` positions of context KV. Refuses (exit 2) with every form's
/// bytes and what to change when none fits.
pub(crate) fn plan_block_draft(
    sizes: &k3_plan::ModelSizes,
    budget: k3_plan::plan::Budget,
    options: &crate::EngineOptions,
    draft: &crate::dspark::DsparkDraft,
) -> Result<(k3_plan::plan::MemoryPlan, DraftHold), EngineError> {
    let (ctx, sessions) = (options.ctx, options.sessions);
    let kv = draft.context_kv_bytes(ctx, sessions);
    let mut last = None;
    for hold in DraftHold::ALL {
        let bytes = draft.held_weight_bytes(hold) + kv;
        let req = k3_plan::plan::PlanRequest::new(budget, ctx as u64)
            .with_sessions(sessions as u64)
            .with_block_draft_as(bytes, hold.name());
        let req = crate::planning::with_planned_drafts(req, options);
        let planned = k3_plan::plan::plan(sizes, &req)
            .and_then(|p| p.check(sizes, &k3_store::available_memory()).map(|()| p));
        match planned {
            Ok(p) => return Ok((p, hold)),
            Err(e) => last = Some(e),
        }
    }
    let fmt = k3_plan::plan::fmt_bytes;
    let forms: Vec<String> = DraftHold::ALL
        .iter()
        .map(|h| format!("{} {}", h.name(), fmt(draft.held_weight_bytes(*h) + kv)))
        .collect();
    Err(EngineError::Invalid(format!(
        "the DSpark draft {} does not fit beside the model: with {} of context KV ({} session(s) × {ctx} positions) it needs {}; with mxfp4: {}; raise --mem-gb (or the budget), lower --ctx, or drop --draft-model",
        draft.dir().display(),
        fmt(kv),
        sessions.max(1),
        forms.join(", "),
        last.map_or_else(String::new, |e| e.to_string()),
    )))
}

/// What `k3 plan --draft-model` prints: the plan with the DSpark draft `draft` in the first
/// form that fits this machine (as the engine would hold it), else in the smallest form, with
/// whether it fits (`Err` carries the refusal).
#[allow(clippy::type_complexity)]
pub fn forecast(
    dir: &std::path::Path,
    budget: k3_plan::plan::Budget,
    ctx: usize,
    sessions: usize,
    draft: &crate::dspark::DsparkDraft,
) -> Result<
    (
        k3_plan::plan::MemoryPlan,
        k3_plan::Available,
        Result<(), EngineError>,
        DraftHold,
    ),
    EngineError,
> {
    let kv = draft.context_kv_bytes(ctx, sessions);
    let mut last = None;
    for hold in DraftHold::ALL {
        let bytes = draft.held_weight_bytes(hold) + kv;
        match crate::planning::forecast_block_draft_as(
            dir,
            budget,
            ctx,
            sessions,
            bytes,
            hold.name(),
        ) {
            Ok((plan, available, Ok(()))) => return Ok((plan, available, Ok(()), hold)),
            Ok((plan, available, Err(e))) => last = Some(Ok((plan, available, Err(e), hold))),
            Err(e) => last = Some(Err(e)),
        }
    }
    last.unwrap_or_else(|| Err(EngineError::Invalid("no draft form to plan".into())))
}
