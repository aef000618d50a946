"""Generate fixtures/tiny-k3-dspark: a tiny random DSpark draft checkpoint in the published
layout (docs/DSPARK.md), matched to fixtures/tiny-k3, plus expected.json from the float64
reference (tools/reference/dspark.py) reading back the written files. Then two variants that
reuse its weights (a test assembles the base model.safetensors with a variant's files):
fixtures/tiny-k3-dspark-yarn (config.json with DeepSeek YaRN rope_scaling) and
fixtures/tiny-k3-dspark-fcnorm (config.json with fc_norm: true, fc_norm.safetensors holding
the per-tap gains), each with the expected.json of its own stream.

    python3 tools/reference/make_dspark_fixture.py        # deterministic, byte-identical

Seeds are tried from BASE_SEED until every proposed position has a top1-top2 margin of the
Markov-corrected logits >= MIN_MARGIN (so the engine's greedy proposals are decided well
above its rounding), for both hidden streams.
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from dspark import LAYER_SHAPES, DSparkConfig, DSparkModel, draft_block  # noqa: E402
from make_fixtures import MIN_MARGIN, bf16_t, dump_json, f32_t  # noqa: E402
from model import K3Model  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402

BASE_SEED = 3000
PROMPT = [768, 17, 301, 44, 9, 512, 128, 77, 640, 3, 250, 199]

# The published field set (docs/DSPARK.md#configjson) at tiny-k3's sizes.
CONFIG = {
    "architectures": ["K3DSparkModel"],
    "model_type": "k3_dspark",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "mla_use_nope": False,
    "mla_use_output_gate": False,
    "hidden_act": "situ",
    "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0,
    "vocab_size": 1024,
    "draft_vocab_size": 1024,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 4096,
    "rope_theta": 50000.0,
    "rope_scaling": None,
    "num_target_layers": 3,
    "target_hidden_size": 64,
    "target_num_hidden_layers": 13,
    "target_layer_ids": [1, 6, 12],
    "fc_norm": False,
    "aux_hidden_stream": "attn_res",
    "mask_token_id": 1021,
    "bos_token_id": 768,
    "eos_token_id": 769,
    "block_size": 7,
    "markov_rank": 8,
    "markov_head_type": "vanilla",
    "enable_confidence_head": True,
    "confidence_head_with_markov": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def tensors(c, rng):
    """every published tensor at c's shapes: BF16, the confidence head F32."""
    def mat(shape):
        return rng.standard_normal(shape) / np.sqrt(shape[-1])

    def gain(n):
        return 1.0 + 0.1 * rng.standard_normal(n)

    n_taps = len(c.target_layer_ids)
    out = [bf16_t("context_proj.weight", mat([c.hidden, n_taps * c.hidden])),
           bf16_t("context_norm.weight", gain(c.hidden))]
    for i in range(c.n_layers):
        for suf, shp in LAYER_SHAPES(c).items():
            arr = gain(shp[0]) if len(shp) == 1 else mat(shp)
            out.append(bf16_t(f"layers.{i}.{suf}", arr))
    out += [bf16_t("final_norm.weight", gain(c.hidden)),
            bf16_t("markov_head.markov_w1.weight", 0.5 * rng.standard_normal([c.vocab, c.markov_rank])),
            bf16_t("markov_head.markov_w2.weight", mat([c.vocab, c.markov_rank])),
            f32_t("confidence_head.proj.weight", mat([1, c.hidden + c.markov_rank])),
            f32_t("confidence_head.proj.bias", np.array([0.5]))]
    return out


def margins(final):
    s = np.sort(final, axis=-1)
    return s[:, -1] - s[:, -2]


def expectation(target, draft, stream):
    base, final, ids, conf = draft_block(target, draft, PROMPT, stream)
    return {"proposed": ids, "confidence": conf,
            "min_margin": float(margins(final).min()),
            "logits": final.tolist()}, float(margins(final).min())


# docs/DSPARK.md#rope; the correction band of the 8-wide rope slot is pairs 1..3, so the
# variant has an extrapolated, a blended and an interpolated pair; mscale != mscale_all_dim
# so both the cos/sin magnitude and the softmax factor differ from 1.
YARN = {"type": "yarn", "factor": None, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0}
YARN_FACTORS = [8.0, 16.0, 4.0, 32.0, 40.0]
FC_NORM_SEED = 4000


def write_variant(name, config, extra_shard, target, base_dir, base_logits):
    """fixtures/<name>: config.json (+ fc_norm.safetensors) and expected.json for the
    config's stream, computed on a temporary copy holding the base weights. Returns the
    smallest top1-top2 margin, or None if the variant's files were not kept."""
    out = os.path.join(REPO, "fixtures", name)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(base_dir, "model.safetensors"), tmp)
        dump_json(os.path.join(tmp, "config.json"), config)
        if extra_shard:
            write_safetensors(os.path.join(tmp, "fc_norm.safetensors"), extra_shard,
                              metadata={"format": "pt"})
        case, m = expectation(target, DSparkModel(tmp), config["aux_hidden_stream"])
        if m < MIN_MARGIN:
            return None
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.makedirs(out)
        for f in ("config.json", "fc_norm.safetensors"):
            if os.path.exists(os.path.join(tmp, f)):
                shutil.copy(os.path.join(tmp, f), out)
    shift = float(np.max(np.abs(np.asarray(case["logits"]) - base_logits)))
    dump_json(os.path.join(out, "expected.json"), {
        "base": "fixtures/tiny-k3-dspark", "target": "fixtures/tiny-k3", "prompt": PROMPT,
        "context": PROMPT[:-1], "anchor": PROMPT[-1],
        "max_shift_from_base": shift, "streams": {config["aux_hidden_stream"]: case}})
    print(f"{name}: min margin {m:.4f}, logits move up to {shift:.3f} from the base")
    return m


def variants(target, base_dir, base_logits):
    for factor in YARN_FACTORS:
        cfg = dict(CONFIG, rope_scaling=dict(YARN, factor=factor))
        if write_variant("tiny-k3-dspark-yarn", cfg, None, target, base_dir, base_logits):
            break
    else:
        sys.exit("no YaRN factor gave every margin >= MIN_MARGIN")
    c = DSparkConfig(CONFIG)
    for seed in range(FC_NORM_SEED, FC_NORM_SEED + 50):
        rng = np.random.default_rng(seed)
        gains = [bf16_t(f"fc_norm.{i}.weight", 1.0 + 0.3 * rng.standard_normal(c.hidden))
                 for i in range(len(c.target_layer_ids))]
        cfg = dict(CONFIG, fc_norm=True)
        if write_variant("tiny-k3-dspark-fcnorm", cfg, gains, target, base_dir, base_logits):
            return
    sys.exit("no fc_norm seed gave every margin >= MIN_MARGIN")


def main():
    out = os.path.join(REPO, "fixtures", "tiny-k3-dspark")
    target = K3Model(os.path.join(REPO, "fixtures", "tiny-k3"))
    c = DSparkConfig(CONFIG)
    for seed in range(BASE_SEED, BASE_SEED + 50):
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.makedirs(out)
        dump_json(os.path.join(out, "config.json"), CONFIG)
        write_safetensors(os.path.join(out, "model.safetensors"),
                          tensors(c, np.random.default_rng(seed)), metadata={"format": "pt"})
        draft = DSparkModel(out)
        cases, worst = {}, np.inf
        for stream in ("attn_res", "prefix"):
            cases[stream], m = expectation(target, draft, stream)
            worst = min(worst, m)
        if worst >= MIN_MARGIN:
            dump_json(os.path.join(out, "expected.json"), {
                "seed": seed, "target": "fixtures/tiny-k3", "prompt": PROMPT,
                "context": PROMPT[:-1], "anchor": PROMPT[-1],
                "positions": [len(PROMPT) - 1, len(PROMPT) - 1 + c.block],
                "streams": cases})
            print(f"tiny-k3-dspark: seed {seed}, min margin {worst:.4f}")
            variants(target, out, np.asarray(cases[CONFIG["aux_hidden_stream"]]["logits"]))
            return
    sys.exit("no seed gave every margin >= MIN_MARGIN")


if __name__ == "__main__":
    main()
