"""Kimi K3 model: weights from a released-format model directory and the full forward
(docs/MODEL.md#configuration, docs/MODEL.md#checkpoint-tensor-inventory,
docs/MODEL.md#top-level-forward, docs/MODEL.md#decoder-layer). Everything float64.

    python3 tools/reference/model.py fixtures/tiny-k3 --ids 1,2,3     # prints argmax per position
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops  # noqa: E402
from config import load_config  # noqa: E402
from mxfp4 import dequantize  # noqa: E402
from safetensors_io import ShardedCheckpoint  # noqa: E402

LM = "language_model.model."          # docs/MODEL.md#checkpoint-tensor-inventory: prefix of all language-model tensors
LM_HEAD = "language_model.lm_head.weight"


def expected_shapes(cfg, L):
    """docs/MODEL.md#per-layer-trunk-tensors: {suffix: shape} of layer L's trunk tensors (released names, no prefix)."""
    E, H, D = cfg.hidden, cfg.kda_heads, cfg.kda_head_dim
    P, K = H * D, cfg.conv_k
    s = {"input_layernorm.weight": [E], "post_attention_layernorm.weight": [E],
         "self_attention_res_norm.weight": [E], "self_attention_res_proj.weight": [1, E],
         "mlp_res_norm.weight": [E], "mlp_res_proj.weight": [1, E]}
    a = "self_attn."
    if cfg.is_mla(L):
        NH, QH = cfg.n_heads, cfg.qk_nope + cfg.qk_rope
        s.update({a + "q_a_proj.weight": [cfg.q_lora, E], a + "q_a_layernorm.weight": [cfg.q_lora],
                  a + "q_b_proj.weight": [NH * QH, cfg.q_lora],
                  a + "kv_a_proj_with_mqa.weight": [cfg.kv_lora + cfg.qk_rope, E],
                  a + "kv_a_layernorm.weight": [cfg.kv_lora],
                  a + "kv_b_proj.weight": [NH * (cfg.qk_nope + cfg.v_head), cfg.kv_lora],
                  a + "o_proj.weight": [E, NH * cfg.v_head]})
        if cfg.mla_out_gate:
            s[a + "g_proj.weight"] = [NH * cfg.v_head, E]
    else:
        s.update({a + "q_proj.weight": [P, E], a + "k_proj.weight": [P, E],
                  a + "v_proj.weight": [P, E], a + "g_proj.weight": [P, E],
                  a + "o_proj.weight": [E, P], a + "q_conv1d.weight": [P, 1, K],
                  a + "k_conv1d.weight": [P, 1, K], a + "v_conv1d.weight": [P, 1, K],
                  a + "f_a_proj.weight": [D, E], a + "f_b_proj.weight": [P, D],
                  a + "b_proj.weight": [H, E], a + "A_log": [D], a + "dt_bias": [P],
                  a + "o_norm.weight": [D]})
    if cfg.is_dense(L):
        s.update({"mlp.gate_proj.weight": [cfg.dense_inter, E],
                  "mlp.up_proj.weight": [cfg.dense_inter, E],
                  "mlp.down_proj.weight": [E, cfg.dense_inter]})
    else:
        m, NE, LT, SI = "block_sparse_moe.", cfg.n_experts, cfg.latent, cfg.moe_inter * cfg.n_shared
        s.update({m + "gate.weight": [NE, E], m + "gate.e_score_correction_bias": [NE],
                  m + "routed_expert_down_proj.weight": [LT, E],
                  m + "routed_expert_norm.weight": [LT],
                  m + "routed_expert_up_proj.weight": [E, LT],
                  m + "shared_experts.gate_proj.weight": [SI, E],
                  m + "shared_experts.up_proj.weight": [SI, E],
                  m + "shared_experts.down_proj.weight": [E, SI]})
    return s


def expert_shapes(cfg):
    """docs/MODEL.md#routed-experts: {suffix: shape} of one routed expert (U8 packed + E8M0 scales)."""
    I, LT = cfg.moe_inter, cfg.latent
    return {"w1.weight_packed": [I, LT // 2], "w1.weight_scale": [I, LT // 32],
            "w2.weight_packed": [LT, I // 2], "w2.weight_scale": [LT, I // 32],
            "w3.weight_packed": [I, LT // 2], "w3.weight_scale": [I, LT // 32]}


def sub(d, prefix):
    """the entries of d under `prefix`, with the prefix stripped."""
    return {k[len(prefix):]: v for k, v in d.items() if k.startswith(prefix)}


class K3Model:
    """All weights of a model directory, dequantised to float64."""

    def __init__(self, model_dir, config_path=None):
        self.cfg = cfg = load_config(config_path or os.path.join(model_dir, "config.json"))
        ck = ShardedCheckpoint(model_dir)

        def get(name, shape):
            arr = ck.get(name)
            assert list(arr.shape) == list(shape), f"{name}: shape {list(arr.shape)}, expected {shape}"
            return arr

        E, V = cfg.hidden, cfg.vocab
        self.embed = get(LM + "embed_tokens.weight", [V, E])               # [V, E]
        self.norm = get(LM + "norm.weight", [E])                           # [E]
        self.out_fold = (get(LM + "output_attn_res_norm.weight", [E])
                         * get(LM + "output_attn_res_proj.weight", [1, E])[0])   # [E]
        self.lm_head = get(LM_HEAD, [V, E])                                # [V, E]
        self.layers = []
        for L in range(cfg.n_layers):
            pre = f"{LM}layers.{L}."
            lw = {suf: get(pre + suf, shp) for suf, shp in expected_shapes(cfg, L).items()}
            if not cfg.is_dense(L):
                lw["experts"] = [self._expert(ck, f"{pre}block_sparse_moe.experts.{e}.")
                                 for e in range(cfg.n_experts)]
            self.layers.append(lw)

    def _expert(self, ck, pre):
        cfg = self.cfg
        t = {}
        for suf, shp in expert_shapes(cfg).items():
            dtype, arr = ck.raw(pre + suf)
            assert dtype == "U8" and list(arr.shape) == shp, (pre + suf, dtype, arr.shape, shp)
            t[suf] = arr
        w = {n: dequantize(t[n + ".weight_packed"], t[n + ".weight_scale"]) for n in ("w1", "w2", "w3")}
        return w["w1"], w["w2"], w["w3"]      # [I, L], [L, I], [I, L]

    def forward(self, ids):
        return forward(self.cfg, self, ids)


# --------------------------------------------------- layer, docs/MODEL.md#decoder-layer

def attention(cfg, L, lw, x, state=None):
    """the attention block of layer L on normed input x [T, E] -> ([T, E], new KDA state)."""
    a = sub(lw, "self_attn.")
    if cfg.is_mla(L):
        return ops.mla_layer(x, a, cfg.n_heads, cfg.qk_nope, cfg.qk_rope, cfg.v_head,
                             cfg.kv_lora, cfg.rms_eps, cfg.mla_out_gate), state
    return ops.kda_layer(x, a, cfg.kda_heads, cfg.kda_head_dim, cfg.gate_lb, cfg.rms_eps, state)


def ffn(cfg, L, lw, x):
    """dense MLP (L < first_k_dense_replace, docs/MODEL.md#dense-mlp) or Stable LatentMoE
    (docs/MODEL.md#stable-latentmoe). x [T, E]."""
    if cfg.is_dense(L):
        return ops.dense_mlp(x, lw["mlp.gate_proj.weight"], lw["mlp.up_proj.weight"],
                             lw["mlp.down_proj.weight"], cfg.situ_b1, cfg.situ_b2)
    return ops.latent_moe(x, sub(lw, "block_sparse_moe."), lw["experts"], cfg.topk,
                          cfg.situ_b1, cfg.situ_b2, cfg.rms_eps, cfg.moe_renorm,
                          cfg.routed_scale, cfg.latent_norm)


def decoder_layer(cfg, L, lw, h, blocks, state=None):
    """docs/MODEL.md#decoder-layer: decoder layer with Block Attention Residuals.
    h [T, E] = previous layer output (the running prefix), blocks = list of [T, E] snapshots
    (mutated: a boundary layer appends). Returns (layer output [T, E], new KDA state)."""
    eps = cfg.rms_eps
    fold_attn = lw["self_attention_res_norm.weight"] * lw["self_attention_res_proj.weight"][0]  # [E]
    fold_mlp = lw["mlp_res_norm.weight"] * lw["mlp_res_proj.weight"][0]                          # [E]
    prefix = h
    if len(blocks) > 0:                                   # guard only on the first aggregation
        h = ops.attn_res(blocks + [prefix], fold_attn, eps)   # REPLACES h
    if L % cfg.attn_res_block == 0:                       # block boundary: snapshot, then clear
        blocks.append(prefix)
        prefix = None
    a, state = attention(cfg, L, lw, ops.rmsnorm(h, lw["input_layernorm.weight"], eps), state)
    prefix = a if prefix is None else prefix + a
    h = ops.attn_res(blocks + [prefix], fold_mlp, eps)    # no emptiness guard
    m = ffn(cfg, L, lw, ops.rmsnorm(h, lw["post_attention_layernorm.weight"], eps))
    return prefix + m, state                              # the output is prefix, never h


# ----------------------------------------------- top level, docs/MODEL.md#top-level-forward

def forward(cfg, model, ids):
    """full K3 forward over a whole sequence (fresh state). ids [T] -> logits [T, V] at EVERY
    position (docs/MODEL.md#top-level-forward computes only the last; every row here is what that would give for
    the corresponding prefix, since everything is causal)."""
    h = model.embed[np.asarray(ids, dtype=np.int64)]      # [T, E]
    blocks = []
    for L in range(cfg.n_layers):
        h, _ = decoder_layer(cfg, L, model.layers[L], h, blocks)
    h = ops.attn_res(blocks + [h], model.out_fold, cfg.rms_eps)   # model-level aggregator
    x = ops.rmsnorm(h, model.norm, cfg.rms_eps)           # [T, E]
    return ops.linear(x, model.lm_head)                   # [T, V]


def argmax_lowest(v):
    """greedy pick: argmax with the lowest index winning ties (np.argmax does exactly that)."""
    return int(np.argmax(v))


def greedy(model, prompt_ids, n):
    """n greedy tokens by FULL RECOMPUTE over the growing sequence. Returns (ids, logits of
    every step's last position)."""
    seq = list(prompt_ids)
    out, steps = [], []
    for _ in range(n):
        logits = model.forward(seq)[-1]
        tok = argmax_lowest(logits)
        out.append(tok)
        steps.append(logits)
        seq.append(tok)
    return out, steps


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--ids", required=True)
    ap.add_argument("--gen", type=int, default=0)
    args = ap.parse_args()
    m = K3Model(args.model_dir)
    ids = [int(s) for s in args.ids.split(",")]
    lg = m.forward(ids)
    print("tf_argmax", [argmax_lowest(r) for r in lg])
    if args.gen:
        print("greedy", greedy(m, ids, args.gen)[0])
