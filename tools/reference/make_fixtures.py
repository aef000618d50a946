"""Generate k3's own tiny Kimi K3 checkpoints in the RELEASED on-disk format, plus expectations.

    python3 tools/reference/make_fixtures.py            # writes fixtures/tiny-k3, fixtures/tiny-k3-wide,
                                                        # fixtures/config-shapes/*.flat.json
    python3 tools/reference/make_fixtures.py --only tiny-k3

Deterministic: seeds are tried in order from each geometry's base seed until every prompt and
generated position has a top1-top2 logit margin >= MIN_MARGIN; the seed used is recorded in
expected.json. Expectations are computed by the float64 reference READING BACK the written
files (bf16-rounded weights, real MXFP4 bytes). Running twice gives byte-identical files.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bpe_corpus import CORPUS  # noqa: E402
from bpe_train import (load_tiktoken_model, make_encoding, special_names,  # noqa: E402
                       tiktoken_model_text, tokenizer_config, train_bpe)
from config import load_config  # noqa: E402
from model import LM, LM_HEAD, K3Model, argmax_lowest, expected_shapes  # noqa: E402
from mxfp4 import quantize  # noqa: E402
from safetensors_io import f32_to_bf16_bits, write_safetensors  # noqa: E402

MIN_MARGIN = 2e-3
N_GEN = 16
MAX_FILE = 4 * 1024 * 1024

# ----------------------------------------------------------------------------- geometries
GEOMETRIES = {
    "tiny-k3": dict(
        base_seed=1000, n_ranks=768, hidden=64, n_layers=13, attn_res_block=3,
        full_attn=[4, 8, 12, 13], first_dense=1, rms_eps=1e-5,
        kda_heads=4, kda_head_dim=16, conv_k=4, gate_lb=-5.0,
        n_heads=4, q_lora=32, kv_lora=32, qk_nope=16, qk_rope=8, v_head=16,
        n_experts=8, topk=2, n_shared=2, latent=64, moe_inter=32, routed_scale=1.0,
        dense_inter=96, situ_b1=4.0, situ_b2=25.0, model_max_length=4096,
        # shard boundaries: after these units ("L{n}.trunk" / "L{n}.experts")
        splits=["L6.trunk"],
        # (layer, expert, matrix, row, group) whose E8M0 scale byte is set to 255
        nan_scales=[(1, 3, "w2", 0, 0), (5, 0, "w1", 7, 1), (12, 6, "w3", 2, 1)],
        text="The train left at 7:30 😀 火车开了。Привет, мир! fn main() { x += 42; }"),
    "tiny-k3-wide": dict(
        base_seed=2000, n_ranks=1000, hidden=80, n_layers=26, attn_res_block=12,
        full_attn=[3, 9, 14, 20, 25, 26], first_dense=1, rms_eps=1e-5,
        kda_heads=3, kda_head_dim=24, conv_k=4, gate_lb=-5.0,
        n_heads=5, q_lora=48, kv_lora=40, qk_nope=20, qk_rope=12, v_head=24,
        n_experts=16, topk=4, n_shared=2, latent=96, moe_inter=64, routed_scale=2.5,
        dense_inter=160, situ_b1=4.0, situ_b2=25.0, model_max_length=8192,
        splits=["L8.trunk", "L17.experts"],
        nan_scales=[(1, 0, "w1", 0, 0), (13, 9, "w2", 5, 1), (25, 15, "w3", 63, 2)],
        text="Über den Bergen 🚀 今日はとても良い天気です。 SELECT name FROM users; 3.14159"),
}

ENGINE_KEYS = ["hidden", "n_layers", "rms_eps", "kda_heads", "kda_head_dim", "conv_k", "gate_lb",
               "n_heads", "q_lora", "kv_lora", "qk_nope", "qk_rope", "v_head", "n_experts",
               "topk", "n_shared", "latent", "moe_inter", "routed_scale", "first_dense",
               "dense_inter", "attn_res_block", "situ_b1", "situ_b2", "full_attn"]


def vocab(g):
    return g["n_ranks"] + len(special_names())


# ----------------------------------------------------------------------------- configs (docs/MODEL.md#configuration)

def text_keys(g):
    """text_config members (engine keys + the ones the engine does not read)."""
    return {
        "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
        "hidden_size": g["hidden"], "num_hidden_layers": g["n_layers"], "vocab_size": vocab(g),
        "rms_norm_eps": g["rms_eps"], "num_attention_heads": g["n_heads"],
        "num_key_value_heads": g["n_heads"], "q_lora_rank": g["q_lora"],
        "kv_lora_rank": g["kv_lora"], "qk_nope_head_dim": g["qk_nope"],
        "qk_rope_head_dim": g["qk_rope"], "v_head_dim": g["v_head"],
        "mla_use_output_gate": True, "mla_use_nope": True,
        "num_experts": g["n_experts"], "num_experts_per_token": g["topk"],
        "num_shared_experts": g["n_shared"], "routed_expert_hidden_size": g["latent"],
        "moe_intermediate_size": g["moe_inter"], "routed_scaling_factor": g["routed_scale"],
        "moe_renormalize": True, "latent_moe_use_norm": True,
        "first_k_dense_replace": g["first_dense"], "intermediate_size": g["dense_inter"],
        "attn_res_block_size": g["attn_res_block"],
        "activation_situ_beta": g["situ_b1"], "activation_situ_linear_beta": g["situ_b2"],
        "hidden_act": "situ", "moe_router_activation_func": "sigmoid", "num_expert_group": 1,
        "topk_group": 1, "topk_method": "noaux_tc", "moe_layer_freq": 1,
        "use_full_rank_gate": True, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": g["n_ranks"], "eos_token_id": g["n_ranks"] + 1,
    }


def nested_config(g):
    txt = text_keys(g)
    kda = [L + 1 for L in range(g["n_layers"]) if (L + 1) not in g["full_attn"]]
    txt["linear_attn_config"] = {
        "num_heads": g["kda_heads"], "head_dim": g["kda_head_dim"],
        "short_conv_kernel_size": g["conv_k"], "gate_lower_bound": g["gate_lb"],
        "full_attn_layers": g["full_attn"], "kda_layers": kda}
    return {
        "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
        "vocab_size": vocab(g), "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "mxfp4", "format": "mxfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"group_size": 32, "num_bits": 4,
                                                      "type": "float"}}},
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"]},
        "text_config": txt,
        "vision_config": {"model_type": "kimi_k3_vision", "note": "not part of this fixture"},
    }


def flat_config(g):
    """docs/MODEL.md#config-shapes: flat shape: one level, kda_num_heads / kda_head_dim / situ_beta /
    situ_linear_beta aliases, full_attn_layers at top level."""
    t = text_keys(g)
    flat = {k: t[k] for k in [
        "hidden_size", "num_hidden_layers", "vocab_size", "rms_norm_eps", "tie_word_embeddings"]}
    flat.update({"kda_num_heads": g["kda_heads"], "kda_head_dim": g["kda_head_dim"],
                 "short_conv_kernel_size": g["conv_k"], "gate_lower_bound": g["gate_lb"]})
    flat.update({k: t[k] for k in [
        "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
        "qk_rope_head_dim", "v_head_dim", "mla_use_output_gate", "num_experts",
        "num_experts_per_token", "num_shared_experts", "routed_expert_hidden_size",
        "moe_intermediate_size", "routed_scaling_factor", "moe_renormalize",
        "latent_moe_use_norm", "first_k_dense_replace", "intermediate_size",
        "attn_res_block_size"]})
    flat.update({"situ_beta": g["situ_b1"], "situ_linear_beta": g["situ_b2"],
                 "full_attn_layers": g["full_attn"]})
    return flat


# ----------------------------------------------------------------------------- weights (docs/MODEL.md#checkpoint-tensor-inventory)

def bf16_t(name, arr):
    return (name, "BF16", list(arr.shape), f32_to_bf16_bits(arr).tobytes())


def f32_t(name, arr):
    return (name, "F32", list(arr.shape), np.ascontiguousarray(arr, dtype="<f4").tobytes())


def u8_t(name, arr):
    return (name, "U8", list(arr.shape), np.ascontiguousarray(arr, dtype=np.uint8).tobytes())


F32_SUFFIXES = ("conv1d.weight", "A_log", "dt_bias", "o_norm.weight", "e_score_correction_bias")


def layer_trunk(g, cfg, L, rng):
    """layer L's non-expert tensors, name-sorted (one contiguous run in the shard)."""
    E, H, D = g["hidden"], g["kda_heads"], g["kda_head_dim"]
    out = {}
    for suf, shape in expected_shapes(cfg, L).items():
        fan_in = shape[-1]
        if suf.endswith(("layernorm.weight", "_res_norm.weight", "routed_expert_norm.weight",
                         "o_norm.weight")):
            w = 1.0 + 0.1 * rng.standard_normal(shape)                 # norm gains ~1
        elif suf.endswith("_res_proj.weight"):
            w = rng.standard_normal(shape) / np.sqrt(E)               # AttnRes scores ~N(0,1)
        elif suf.endswith("conv1d.weight"):
            w = 0.5 * rng.standard_normal(shape)
        elif suf.endswith("A_log"):                                   # per HEAD, tail = padding
            w = np.zeros(shape)
            w[:H] = rng.uniform(-1.5, 1.5, H)
        elif suf.endswith("dt_bias"):
            w = 0.5 * rng.standard_normal(shape)
        elif suf.endswith("e_score_correction_bias"):
            w = 0.05 * rng.standard_normal(shape)                     # steers selection
        elif suf.endswith("gate.weight"):
            w = 2.0 * rng.standard_normal(shape) / np.sqrt(fan_in)    # router logits ~N(0,4)
        elif suf.endswith("gate_proj.weight"):
            w = 1.5 * rng.standard_normal(shape) / np.sqrt(fan_in)    # SiTU gates, some capping
        else:
            w = rng.standard_normal(shape) / np.sqrt(fan_in)
        name = f"{LM}layers.{L}.{suf}"
        out[name] = f32_t(name, w) if suf.endswith(F32_SUFFIXES) else bf16_t(name, w)
    return [out[k] for k in sorted(out)]


def layer_experts(g, L, rng):
    """the routed experts of layer L: per expert six U8 tensors in the canonical order
    w1.weight_packed, w1.weight_scale, w2..., w3... (docs/MODEL.md#routed-experts), experts in index order."""
    I, LT = g["moe_inter"], g["latent"]
    tensors = []
    for e in range(g["n_experts"]):
        mats = {"w1": 1.5 * rng.standard_normal((I, LT)) / np.sqrt(LT),   # gate
                "w2": rng.standard_normal((LT, I)) / np.sqrt(I),            # down
                "w3": rng.standard_normal((I, LT)) / np.sqrt(LT)}           # up
        for m in ("w1", "w2", "w3"):
            packed, scales = quantize(mats[m])
            for (nl, ne, nm, row, grp) in g["nan_scales"]:
                if (nl, ne, nm) == (L, e, m):
                    scales[row, grp] = 255                  # legal: this group contributes 0
            pre = f"{LM}layers.{L}.block_sparse_moe.experts.{e}.{m}."
            tensors += [u8_t(pre + "weight_packed", packed), u8_t(pre + "weight_scale", scales)]
    return tensors


def make_units(g, cfg, rng):
    """ordered atomic byte runs: embed, per layer trunk then experts, model-level tail."""
    E, V = g["hidden"], vocab(g)
    units = [("embed", [bf16_t(LM + "embed_tokens.weight", rng.standard_normal((V, E)))])]
    for L in range(g["n_layers"]):
        units.append((f"L{L}.trunk", layer_trunk(g, cfg, L, rng)))
        if not cfg.is_dense(L):
            units.append((f"L{L}.experts", layer_experts(g, L, rng)))
    tail = [bf16_t(LM + "norm.weight", 1.0 + 0.1 * rng.standard_normal(E)),
            bf16_t(LM + "output_attn_res_norm.weight", 1.0 + 0.1 * rng.standard_normal(E)),
            bf16_t(LM + "output_attn_res_proj.weight", rng.standard_normal((1, E)) / np.sqrt(E)),
            bf16_t(LM_HEAD, 2.0 * rng.standard_normal((V, E)) / np.sqrt(E))]   # logits ~N(0,4)
    units.append(("tail", tail))
    return units


def write_model(out_dir, g, units):
    """shards split after g["splits"]; returns list of shard file names."""
    groups, cur = [], []
    for name, tensors in units:
        cur += tensors
        if name in g["splits"]:
            groups.append(cur)
            cur = []
    groups.append(cur)
    n = len(groups)
    weight_map, total, files = {}, 0, []
    for i, tensors in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        ranges = write_safetensors(os.path.join(out_dir, fname), tensors, {"format": "pt"})
        for tname, _, _, data in tensors:
            assert ranges[tname][0] % 8 == 0, f"{tname} not 8-byte aligned"
            weight_map[tname] = fname
            total += len(data)
        files.append(fname)
    index = {"metadata": {"total_size": total},
             "weight_map": {k: weight_map[k] for k in sorted(weight_map)}}
    dump_json(os.path.join(out_dir, "model.safetensors.index.json"), index)
    return files


def dump_json(path, obj, indent=2):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False)
        f.write("\n")


# ----------------------------------------------------------------------------- expectations

def top2_margin(logits):
    """top1 - top2 of each row. logits [T, V] -> [T]."""
    s = np.sort(logits, axis=-1)
    return s[:, -1] - s[:, -2]


def run_case(model, name, prompt, text):
    """greedy by FULL RECOMPUTE over the growing sequence; teacher-forced argmax over the
    prompt; margins over every prompt and generated position."""
    seq = list(prompt)
    tf_logits = model.forward(seq)                              # [T, V]
    margins = list(top2_margin(tf_logits))
    greedy, last = [], tf_logits[-1]
    logits = tf_logits
    for step in range(N_GEN):
        if step > 0:
            logits = model.forward(seq)                         # fresh recompute
            margins.append(top2_margin(logits[-1:])[0])
        tok = argmax_lowest(logits[-1])
        greedy.append(tok)
        seq.append(tok)
    return {"name": name, "prompt_ids": [int(i) for i in prompt], "prompt_text": text,
            "greedy_ids": greedy, "tf_argmax": [argmax_lowest(r) for r in tf_logits],
            "last_logits": [float(f"{x:.9g}") for x in last],
            "min_top2_margin": float(f"{min(margins):.9g}")}, tf_logits


def build(name, g, out_root, max_tries=50):
    out_dir = os.path.join(out_root, name)
    flat_path = os.path.join(out_root, "config-shapes", f"{name}.flat.json")
    os.makedirs(os.path.dirname(flat_path), exist_ok=True)
    dump_json(flat_path, flat_config(g))
    ranks = train_bpe(CORPUS, g["n_ranks"])
    enc = make_encoding(name, ranks)
    text_ids = enc.encode_ordinary(g["text"])
    assert enc.decode(text_ids) == g["text"]
    for seed in range(g["base_seed"], g["base_seed"] + max_tries):
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.makedirs(out_dir)
        dump_json(os.path.join(out_dir, "config.json"), nested_config(g))
        with open(os.path.join(out_dir, "tiktoken.model"), "w") as f:
            f.write(tiktoken_model_text(ranks))
        dump_json(os.path.join(out_dir, "tokenizer_config.json"),
                  tokenizer_config(g["n_ranks"], g["model_max_length"]))
        cfg = load_config(os.path.join(out_dir, "config.json"))
        assert cfg.vocab == vocab(g) and all(getattr(cfg, k) == g[k] for k in ENGINE_KEYS)
        assert load_config(flat_path).__dict__ | {"shape": ""} == cfg.__dict__ | {"shape": ""}
        rng = np.random.default_rng(seed)
        files = write_model(out_dir, g, make_units(g, cfg, rng))
        # read everything back: the expectations see bf16 weights and real MXFP4 bytes
        model = K3Model(out_dir)
        check_tokenizer_files(out_dir, g, name)
        V = vocab(g)
        prompts = [("one_id", [int(rng.integers(0, g["n_ranks"]))], None),
                   ("seven_ids", [int(i) for i in rng.integers(0, g["n_ranks"], 7)], None),
                   ("long_24_ids", [int(i) for i in rng.integers(0, V, 24)], None),
                   ("tiktoken_text", text_ids, g["text"])]
        cases, ok, stds = [], True, []
        for cname, prompt, text in prompts:
            case, tf_logits = run_case(model, cname, prompt, text)
            stds.append(float(np.std(tf_logits)))
            cases.append(case)
            if case["min_top2_margin"] < MIN_MARGIN:
                print(f"  {name} seed {seed}: case {cname} margin {case['min_top2_margin']:.2e} "
                      f"< {MIN_MARGIN}, next seed")
                ok = False
                break
        if not ok:
            continue
        assert all(0.5 < s < 5.0 for s in stds), f"logit std out of range: {stds}"
        exp = {"model": name, "generator": f"tools/reference/make_fixtures.py (seed {seed})",
               "vocab_size": V, "tolerance": {"logits_rel_to_max": 1e-4, "logits_abs": 1e-5},
               "cases": cases}
        with open(os.path.join(out_dir, "expected.json"), "w") as f:
            json.dump(exp, f, separators=(",", ":"))
            f.write("\n")
        for fn in os.listdir(out_dir):
            sz = os.path.getsize(os.path.join(out_dir, fn))
            assert sz < MAX_FILE, f"{fn} is {sz} bytes (limit {MAX_FILE})"
        print(f"{name}: seed {seed}, {len(files)} shards, logits std "
              f"{', '.join(f'{s:.2f}' for s in stds)}, min margins "
              + ", ".join(f"{c['min_top2_margin']:.3g}" for c in cases))
        return seed
    raise RuntimeError(f"{name}: no seed in {max_tries} tries met the margin")


def check_tokenizer_files(out_dir, g, name):
    """the written tokenizer files load into tiktoken and round-trip the corpus."""
    ranks = load_tiktoken_model(os.path.join(out_dir, "tiktoken.model"))
    assert sorted(ranks.values()) == list(range(g["n_ranks"]))
    with open(os.path.join(out_dir, "tokenizer_config.json")) as f:
        tc = json.load(f)
    specials = {v["content"]: int(k) for k, v in tc["added_tokens_decoder"].items()}
    import tiktoken
    from kimi_pat import PAT_STR
    enc = tiktoken.Encoding(name, pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)
    assert enc.decode(enc.encode_ordinary(CORPUS)) == CORPUS
    assert enc.encode("[BOS]<|end_of_msg|>", allowed_special="all") == [g["n_ranks"], g["n_ranks"] + 2]
    assert enc.n_vocab == vocab(g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "fixtures"))
    ap.add_argument("--only", choices=list(GEOMETRIES))
    args = ap.parse_args()
    for name, g in GEOMETRIES.items():
        if args.only and name != args.only:
            continue
        build(name, g, args.out)


if __name__ == "__main__":
    main()
