//! Binding tensors by their released names: a well-formed container whose tensors do not match
//! the config is refused naming the tensor, its shape or dtype, and what was expected.

use crate::common::*;
use crate::safetensors::{KPROJ, NORM, QPROJ};
use k3_format::Dtype;
use std::path::Path;

const F_A: &str = "language_model.model.layers.2.self_attn.f_a_proj.weight"; // BF16 [16, 64]
const EXPERT_SCALE: &str =
    "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight_scale"; // U8 [64,1]
const EXPERT_PACKED: &str =
    "language_model.model.layers.1.block_sparse_moe.experts.5.w1.weight_packed"; // U8 [32,32]
const LM_HEAD: &str = "language_model.lm_head.weight";
const CONV: &str = "language_model.model.layers.1.self_attn.q_conv1d.weight"; // F32 [64,1,4]

/// Rewrites the shards with `edit` applied to the tensor `name`'s spec.
fn respec(
    name: &'static str,
    edit: impl Fn(&mut k3_format::writer::TensorSpec) + 'static,
) -> impl Fn(&Path) {
    move |d: &Path| rewrite(d, true, |docs| edit(&mut find(docs, name).spec))
}

fn drop_tensor(name: &'static str) -> impl Fn(&Path) {
    move |d: &Path| {
        rewrite(d, true, |docs| {
            docs.iter_mut()
                .for_each(|s| s.tensors.retain(|t| t.spec.name != name))
        })
    }
}

fn cases() -> Vec<Case> {
    let r = run_args;
    vec![
        case(
            "missing-trunk-tensor",
            "layer 2 f_a_proj absent (shard and index)",
            drop_tensor(F_A),
            r(),
            2,
            &[F_A, "is missing from the checkpoint"],
        ),
        case(
            "missing-lm-head",
            "lm_head absent",
            drop_tensor(LM_HEAD),
            r(),
            2,
            &[LM_HEAD, "is missing"],
        ),
        case(
            "missing-expert-tensor",
            "layer 1 expert 3 w2.weight_scale absent",
            drop_tensor(EXPERT_SCALE),
            r(),
            2,
            &[EXPERT_SCALE, "missing"],
        ),
        case(
            "renamed-trunk-tensor",
            "f_a_proj renamed with a suffix",
            respec(F_A, |s| s.name.push_str(".old")),
            r(),
            2,
            &[F_A, "is missing"],
        ),
        case(
            "transposed-matrix",
            "f_a_proj [16,64] stored as [64,16] (same element count)",
            respec(F_A, |s| s.shape.reverse()),
            r(),
            2,
            &[F_A, "has shape [64, 16]", "expected"],
        ),
        case(
            "reshaped-matrix",
            "k_proj [64,64] stored as [32,128]",
            respec(KPROJ, |s| s.shape = vec![32, 128]),
            r(),
            2,
            &[KPROJ, "has shape [32, 128]"],
        ),
        case(
            "norm-as-matrix",
            "input_layernorm [64] stored as [8,8]",
            respec(NORM, |s| s.shape = vec![8, 8]),
            r(),
            2,
            &[NORM, "has shape [8, 8]"],
        ),
        case(
            "conv-taps-reshaped",
            "q_conv1d [64,1,4] stored as [4,1,64]",
            respec(CONV, |s| s.shape = vec![4, 1, 64]),
            r(),
            2,
            &[CONV, "has shape [4, 1, 64]"],
        ),
        case(
            "expert-wrong-shape",
            "expert w1.weight_packed [32,32] stored as [16,64]",
            respec(EXPERT_PACKED, |s| s.shape = vec![16, 64]),
            r(),
            2,
            &[EXPERT_PACKED, "16"],
        ),
        case(
            "i32-matrix",
            "q_proj BF16 [64,64] stored as I32 [64,64]",
            respec(QPROJ, |s| s.dtype = Dtype::I32),
            r(),
            2,
            &[QPROJ, "is I32", "expected"],
        ),
        case(
            "f16-matrix",
            "q_proj stored as F16 (matrices are BF16 or F32)",
            respec(QPROJ, |s| s.dtype = Dtype::F16),
            r(),
            2,
            &[QPROJ, "is F16"],
        ),
        case(
            "u8-norm",
            "input_layernorm BF16 [64] stored as U8 [64]",
            respec(NORM, |s| s.dtype = Dtype::U8),
            r(),
            2,
            &[NORM, "is U8", "expected"],
        ),
        case(
            "bf16-expert",
            "expert w1.weight_packed U8 stored as BF16",
            respec(EXPERT_PACKED, |s| s.dtype = Dtype::BF16),
            r(),
            2,
            &[EXPERT_PACKED, "BF16"],
        ),
        case(
            "embed-wrong-vocab",
            "embed_tokens [1024,64] stored as [512,64]",
            respec("language_model.model.embed_tokens.weight", |s| {
                s.shape = vec![512, 64]
            }),
            r(),
            2,
            &[
                "language_model.model.embed_tokens.weight",
                "has shape [512, 64]",
            ],
        ),
    ]
}

#[test]
fn mismatched_tensors_are_refused_by_name() {
    check_all("binding", cases());
}

/// MXFP4 scale byte 255 (E8M0 NaN) decodes as 0 by the documented rule: the tiny model already
/// has three, and one more must still run.
#[test]
fn mxfp4_nan_scales_still_run() {
    let run = args(&["run", "{dir}", "--ids", PROMPT, "-n", "4", "--print-ids"]);
    check_all(
        "binding-valid",
        vec![
            case(
                "mxfp4-scale-255-as-shipped",
                "the tiny model as shipped (3 scale bytes are 255)",
                |_| {},
                run.clone(),
                0,
                &[CLEAN_IDS],
            ),
            case(
                "mxfp4-scale-255-verify",
                "k3 verify --deep counts the 255 scale bytes",
                |_| {},
                args(&["verify", "{dir}", "--deep"]),
                0,
                &["WARN  mxfp4 scales", "are 255 (NaN)"],
            ),
            case(
                "mxfp4-scale-255-added",
                "every scale byte of layer 1 expert 3 w2 set to 255",
                |d| rewrite(d, true, |docs| find(docs, EXPERT_SCALE).data.fill(255)),
                run,
                0,
                &["generated ids:"],
            ),
        ],
    );
}
