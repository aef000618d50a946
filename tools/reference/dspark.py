"""DSpark block drafter for Kimi K3 in plain float64 numpy (docs/DSPARK.md).

Written from the public description in docs/DSPARK.md; it reuses model.py for the target and
its hidden-state taps. Shapes: T context positions, B block rows, E hidden (draft == target),
H heads, n nope, r rope, v value dim, c kv_lora, R markov rank, V vocab.

    python3 tools/reference/dspark.py fixtures/tiny-k3 fixtures/tiny-k3-dspark --ids 1,2,3
"""
import json
import os

import numpy as np

import ops
from model import K3Model, decoder_layer
from safetensors_io import SafeTensorsFile


# ------------------------------------------------------------------ config, docs/DSPARK.md#configjson

class DSparkConfig:
    """The config.json fields the forward reads (docs/DSPARK.md#configjson)."""

    def __init__(self, root):
        g = root.get
        self.hidden = root["hidden_size"]
        self.inter = root["intermediate_size"]
        self.n_layers = root["num_hidden_layers"]
        self.n_heads = root["num_attention_heads"]
        self.q_lora = root["q_lora_rank"]
        self.kv_lora = root["kv_lora_rank"]
        self.nope = root["qk_nope_head_dim"]
        self.rope = root["qk_rope_head_dim"]
        self.v_head = root["v_head_dim"]
        self.vocab = root["vocab_size"]
        self.eps = root["rms_norm_eps"]
        self.theta = root["rope_theta"]
        self.target_layer_ids = list(root["target_layer_ids"])
        self.stream = g("aux_hidden_stream", "prefix")
        self.mask_id = root["mask_token_id"]
        self.block = root["block_size"]
        self.markov_rank = root["markov_rank"]
        self.confidence = g("enable_confidence_head", False)
        self.conf_markov = g("confidence_head_with_markov", False)
        self.act = g("hidden_act", "silu")
        self.situ_b1 = g("activation_situ_beta", None)
        self.situ_b2 = g("activation_situ_linear_beta", None)
        self.fc_norm = bool(g("fc_norm", False))
        self.yarn = yarn_params(root)


def yarn_params(root):
    """docs/DSPARK.md#rope: None for plain RoPE, else the DeepSeek YaRN parameters with
    vLLM's defaults (rope_scaling, else rope_parameters; rope_type or type)."""
    d = root.get("rope_scaling") or root.get("rope_parameters")
    if not d:
        return None
    kind = d.get("rope_type", d.get("type"))
    if kind == "default":
        return None
    assert kind in ("yarn", "deepseek_yarn"), kind
    ompe = d.get("original_max_position_embeddings", root.get("original_max_position_embeddings"))
    return {"factor": float(d["factor"]), "ompe": float(ompe),
            "beta_fast": float(d.get("beta_fast", 32)), "beta_slow": float(d.get("beta_slow", 1)),
            "mscale": float(d.get("mscale", 1)), "mscale_all_dim": float(d.get("mscale_all_dim", 0)),
            "extrapolation_factor": float(d.get("extrapolation_factor", 1)),
            "attn_factor": float(d.get("attn_factor", 1))}


LAYER_SHAPES = lambda c: {  # noqa: E731  (suffix under layers.{i}. -> shape)
    "input_layernorm.weight": [c.hidden],
    "post_attention_layernorm.weight": [c.hidden],
    "self_attn.q_a_proj.weight": [c.q_lora, c.hidden],
    "self_attn.q_a_layernorm.weight": [c.q_lora],
    "self_attn.q_b_proj.weight": [c.n_heads * (c.nope + c.rope), c.q_lora],
    "self_attn.kv_a_proj_with_mqa.weight": [c.kv_lora + c.rope, c.hidden],
    "self_attn.kv_a_layernorm.weight": [c.kv_lora],
    "self_attn.kv_b_proj.weight": [c.n_heads * (c.nope + c.v_head), c.kv_lora],
    "self_attn.o_proj.weight": [c.hidden, c.n_heads * c.v_head],
    "mlp.gate_proj.weight": [c.inter, c.hidden],
    "mlp.up_proj.weight": [c.inter, c.hidden],
    "mlp.down_proj.weight": [c.hidden, c.inter],
}


class DSparkModel:
    """A DSpark checkpoint directory (config.json + every *.safetensors in it), float64."""

    def __init__(self, draft_dir):
        with open(os.path.join(draft_dir, "config.json")) as f:
            self.cfg = c = DSparkConfig(json.load(f))
        shards = [SafeTensorsFile(os.path.join(draft_dir, f))
                  for f in sorted(os.listdir(draft_dir)) if f.endswith(".safetensors")]

        def get(name, shape):
            arr = next(st for st in shards if name in st.entries).get(name)
            assert list(arr.shape) == list(shape), (name, arr.shape, shape)
            return arr

        n_taps = len(c.target_layer_ids)
        self.context_proj = get("context_proj.weight", [c.hidden, n_taps * c.hidden])
        self.context_norm = get("context_norm.weight", [c.hidden])
        self.fc_norm = ([get(f"fc_norm.{i}.weight", [c.hidden]) for i in range(n_taps)]
                        if c.fc_norm else None)
        self.rope = RopeTable(c)
        self.final_norm = get("final_norm.weight", [c.hidden])
        self.markov_w1 = get("markov_head.markov_w1.weight", [c.vocab, c.markov_rank])
        self.markov_w2 = get("markov_head.markov_w2.weight", [c.vocab, c.markov_rank])
        self.conf_w = self.conf_b = None
        if c.confidence:
            width = c.hidden + (c.markov_rank if c.conf_markov else 0)
            self.conf_w = get("confidence_head.proj.weight", [1, width])[0]
            self.conf_b = get("confidence_head.proj.bias", [1])[0]
        self.layers = [{s: get(f"layers.{i}.{s}", shp) for s, shp in LAYER_SHAPES(c).items()}
                       for i in range(c.n_layers)]


# ------------------------------------------------------- target taps, docs/DSPARK.md#taps

def target_taps(target, ids, layer_ids, stream):
    """Target forward over ids [T] (fresh state) -> {layer id: [T, E]} hidden stream after
    each tapped layer: "prefix" = the layer's output (its running block residual);
    "attn_res" = the AttnRes mixture the next consumer reads (the next layer's first
    aggregation, or the model-level aggregator after the last layer), before any norm."""
    cfg = target.cfg
    h = target.embed[np.asarray(ids, dtype=np.int64)]
    blocks, taps = [], {}
    for L in range(cfg.n_layers):
        h, _ = decoder_layer(cfg, L, target.layers[L], h, blocks)
        if L not in layer_ids:
            continue
        if stream == "prefix":
            taps[L] = h
        elif L + 1 < cfg.n_layers:
            nxt = target.layers[L + 1]
            fold = nxt["self_attention_res_norm.weight"] * nxt["self_attention_res_proj.weight"][0]
            taps[L] = ops.attn_res(blocks + [h], fold, cfg.rms_eps)
        else:
            taps[L] = ops.attn_res(blocks + [h], target.out_fold, cfg.rms_eps)
    return taps


# ------------------------------------------------------------- draft, docs/DSPARK.md#forward

def yarn_mscale(scale, m):
    """0.1*m*ln(scale) + 1 for scale > 1, else 1 (the DeepSeek YaRN magnitude)."""
    return 1.0 if scale <= 1 else 0.1 * m * np.log(scale) + 1.0


class RopeTable:
    """docs/DSPARK.md#rope: inverse frequency per pair [d/2], the magnitude the rotated pair
    is scaled by, and the factor on the softmax scale. Plain: theta^(-2i/d), 1, 1. DeepSeek
    YaRN: pairs before the correction band (fast turning) keep their frequency, pairs after
    it are divided by `factor`, a linear ramp across it (band ends from beta_fast / beta_slow
    turns over the original context);
    magnitude mscale(factor, mscale)/mscale(factor, mscale_all_dim)*attn_factor; softmax
    factor mscale(factor, mscale_all_dim)^2."""

    def __init__(self, c):
        d, base, y = c.rope, float(c.theta), c.yarn
        if y is None:
            self.inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
            self.magnitude = self.softmax_factor = 1.0
            return

        def corr(turns):
            return d * np.log(y["ompe"] / (turns * 2 * np.pi)) / (2 * np.log(base))
        low = max(np.floor(corr(y["beta_fast"])), 0.0)
        high = min(np.ceil(corr(y["beta_slow"])), d - 1.0)
        if low == high:
            high += 0.001
        pos_freq = base ** (np.arange(0, d, 2, dtype=np.float64) / d)
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        keep = (1.0 - ramp) * y["extrapolation_factor"]
        self.inv = (1.0 / (y["factor"] * pos_freq)) * (1.0 - keep) + (1.0 / pos_freq) * keep
        all_dim = yarn_mscale(y["factor"], y["mscale_all_dim"])
        self.magnitude = yarn_mscale(y["factor"], y["mscale"]) / all_dim * y["attn_factor"]
        self.softmax_factor = all_dim * all_dim


def rope(x, pos, table):
    """interleaved RoPE: pairs (x[2i], x[2i+1]) turn by pos * inv[i], scaled by the table's
    magnitude. x [T, ..., d]."""
    d = x.shape[-1]
    ang = np.asarray(pos, dtype=np.float64)[:, None] * table.inv[None, :]   # [T, d/2]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (d // 2,)
    cos = (np.cos(ang) * table.magnitude).reshape(shape)
    sin = (np.sin(ang) * table.magnitude).reshape(shape)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def context_states(draft, taps):
    """taps: list of [T, E] in target_layer_ids order -> [T, E] context rows (each tap
    RMS-normed by its fc_norm gain first when the draft has them)."""
    if draft.fc_norm is not None:
        taps = [ops.rmsnorm(t, g, draft.cfg.eps) for t, g in zip(taps, draft.fc_norm)]
    x = np.concatenate(taps, axis=-1)                                   # [T, n_taps*E]
    return ops.rmsnorm(ops.linear(x, draft.context_proj), draft.context_norm, draft.cfg.eps)


def latent_kv(c, table, lw, x, pos):
    """a layer's latent KV rows of inputs x [T, E] at positions pos: ([T, c], [T, r])."""
    a = ops.linear(x, lw["self_attn.kv_a_proj_with_mqa.weight"])        # [T, c+r]
    latent = ops.rmsnorm(a[:, :c.kv_lora], lw["self_attn.kv_a_layernorm.weight"], c.eps)
    return latent, rope(a[:, c.kv_lora:], pos, table)


def block_attention(c, table, lw, x, pos, ctx_kv):
    """non-causal MLA of the block x [B, E] over context rows + the block's own rows."""
    B, H, n = x.shape[0], c.n_heads, c.nope
    cq = ops.rmsnorm(ops.linear(x, lw["self_attn.q_a_proj.weight"]),
                     lw["self_attn.q_a_layernorm.weight"], c.eps)
    q = ops.linear(cq, lw["self_attn.q_b_proj.weight"]).reshape(B, H, n + c.rope)
    q_rope = rope(q[:, :, n:], pos, table)                              # [B, H, r]
    lat_b, kr_b = latent_kv(c, table, lw, x, pos)
    latent = np.concatenate([ctx_kv[0], lat_b])                         # [S, c]
    k_rope = np.concatenate([ctx_kv[1], kr_b])                          # [S, r]
    kv = ops.linear(latent, lw["self_attn.kv_b_proj.weight"]).reshape(-1, H, n + c.v_head)
    k_nope, v = kv[:, :, :n], kv[:, :, n:]
    sc = (np.einsum("bhi,shi->hbs", q[:, :, :n], k_nope)
          + np.einsum("bhi,si->hbs", q_rope, k_rope)) / np.sqrt(n + c.rope) \
        * table.softmax_factor                                          # [H, B, S]
    p = ops.softmax(sc, axis=-1)                                        # no mask
    o = np.einsum("hbs,shj->bhj", p, v).reshape(B, H * c.v_head)
    return ops.linear(o, lw["self_attn.o_proj.weight"])


def mlp(c, lw, x):
    g, u = ops.linear(x, lw["mlp.gate_proj.weight"]), ops.linear(x, lw["mlp.up_proj.weight"])
    a = ops.silu(g) * u if c.act == "silu" else ops.situ_glu(g, u, c.situ_b1, c.situ_b2)
    return ops.linear(a, lw["mlp.down_proj.weight"])


def draft_hidden(draft, embed, anchor, ctx_rows):
    """the block [anchor, mask x (B-1)] at positions T..T+B-1 over ctx_rows [T, E]
    -> final-normed hidden [B, E]."""
    c = draft.cfg
    T = ctx_rows.shape[0]
    pos = np.arange(T, T + c.block)
    ctx_pos = np.arange(T)
    r = embed[np.asarray([anchor] + [c.mask_id] * (c.block - 1), dtype=np.int64)]   # [B, E]
    for lw in draft.layers:
        ctx_kv = latent_kv(c, draft.rope, lw, ctx_rows, ctx_pos)
        r = r + block_attention(c, draft.rope, lw,
                                ops.rmsnorm(r, lw["input_layernorm.weight"], c.eps), pos, ctx_kv)
        r = r + mlp(c, lw, ops.rmsnorm(r, lw["post_attention_layernorm.weight"], c.eps))
    return ops.rmsnorm(r, draft.final_norm, c.eps)


def propose(draft, lm_head, hidden, anchor):
    """Markov head left to right, greedy: row i's logits = lm_head·hidden_i + w2·w1[prev_i],
    prev_0 = anchor, prev_{i+1} = draft_i. Returns (base logits [B, V], final logits [B, V],
    ids [B], confidences [B] or None)."""
    base = ops.linear(hidden, lm_head)                                  # [B, V]
    final, ids, conf = np.empty_like(base), [], []
    prev = anchor
    for i in range(base.shape[0]):
        m = draft.markov_w1[prev]                                       # [R]
        final[i] = base[i] + draft.markov_w2 @ m
        if draft.conf_w is not None:
            feat = np.concatenate([hidden[i], m]) if draft.cfg.conf_markov else hidden[i]
            conf.append(float(ops.sigmoid(feat @ draft.conf_w + draft.conf_b)))
        prev = int(np.argmax(final[i]))
        ids.append(prev)
    return base, final, ids, (conf if draft.conf_w is not None else None)


def draft_block(target, draft, ids, stream=None):
    """Everything for context ids[:-1] (target taps) and anchor ids[-1]."""
    c = draft.cfg
    taps = target_taps(target, ids[:-1], c.target_layer_ids, stream or c.stream)
    rows = context_states(draft, [taps[L] for L in c.target_layer_ids])
    hidden = draft_hidden(draft, target.embed, ids[-1], rows)
    return propose(draft, target.lm_head, hidden, ids[-1])


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("draft_dir")
    ap.add_argument("--ids", required=True)
    args = ap.parse_args()
    _, _, proposed, conf = draft_block(K3Model(args.model_dir), DSparkModel(args.draft_dir),
                                       [int(s) for s in args.ids.split(",")])
    print("proposed", proposed)
    print("confidence", conf)
