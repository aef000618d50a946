"""Kimi K3 config.json reader (docs/MODEL.md#configuration).

Accepts both shapes (docs/MODEL.md#config-shapes):
  * released / nested: root {model_type: "kimi_k3", text_config: {..., linear_attn_config: {...}}}
  * flat: every key at one level (kda_num_heads / kda_head_dim / situ_beta / situ_linear_beta
    aliases); a root with an object member "config" is unwrapped first (ref_k3.json style).

Lookup (docs/MODEL.md#config-key-lookup): candidate objects are searched in the order text_config, linear_attn_config,
root; inside each object the primary name before the alias; first hit wins. Numbers must be JSON
numbers (bools are rejected). Missing required keys are collected and reported together; there
are never defaults for required keys.
"""
import json
from dataclasses import dataclass, field

# (engine field, primary key, alias or None, kind) -- docs/MODEL.md#config-keys table, in table order.
REQUIRED_FIELDS = [
    ("hidden", "hidden_size", None, "int"),
    ("n_layers", "num_hidden_layers", None, "int"),
    ("vocab", "vocab_size", None, "int"),
    ("rms_eps", "rms_norm_eps", None, "float"),
    ("kda_heads", "num_heads", "kda_num_heads", "int"),
    ("kda_head_dim", "head_dim", "kda_head_dim", "int"),
    ("conv_k", "short_conv_kernel_size", None, "int"),
    ("gate_lb", "gate_lower_bound", None, "float"),
    ("n_heads", "num_attention_heads", None, "int"),
    ("q_lora", "q_lora_rank", None, "int"),
    ("kv_lora", "kv_lora_rank", None, "int"),
    ("qk_nope", "qk_nope_head_dim", None, "int"),
    ("qk_rope", "qk_rope_head_dim", None, "int"),
    ("v_head", "v_head_dim", None, "int"),
    ("n_experts", "num_experts", None, "int"),
    ("topk", "num_experts_per_token", None, "int"),
    ("n_shared", "num_shared_experts", None, "int"),
    ("latent", "routed_expert_hidden_size", None, "int"),
    ("moe_inter", "moe_intermediate_size", None, "int"),
    ("routed_scale", "routed_scaling_factor", None, "float"),
    ("first_dense", "first_k_dense_replace", None, "int"),
    ("dense_inter", "intermediate_size", None, "int"),
    ("attn_res_block", "attn_res_block_size", None, "int"),
    ("situ_b1", "activation_situ_beta", "situ_beta", "float"),
    ("situ_b2", "activation_situ_linear_beta", "situ_linear_beta", "float"),
]
# optional booleans, default 1 (docs/MODEL.md#config-keys)
BOOL_FIELDS = [
    ("mla_out_gate", "mla_use_output_gate"),
    ("moe_renorm", "moe_renormalize"),
    ("latent_norm", "latent_moe_use_norm"),
]
MAX_TOPK = 64  # K3_MAX_TOPK (docs/MODEL.md#config-validation)


@dataclass
class K3Config:
    hidden: int
    n_layers: int
    vocab: int
    rms_eps: float
    kda_heads: int
    kda_head_dim: int
    conv_k: int
    gate_lb: float
    n_heads: int
    q_lora: int
    kv_lora: int
    qk_nope: int
    qk_rope: int
    v_head: int
    n_experts: int
    topk: int
    n_shared: int
    latent: int
    moe_inter: int
    routed_scale: float
    first_dense: int
    dense_inter: int
    attn_res_block: int
    situ_b1: float
    situ_b2: float
    full_attn: list = field(default_factory=list)  # ONE-based (docs/MODEL.md#layer-map)
    mla_out_gate: bool = True
    moe_renorm: bool = True
    latent_norm: bool = True
    shape: str = "flat"

    # docs/MODEL.md#layer-map (L zero-based; full_attn one-based)
    def is_mla(self, L):
        return (L + 1) in self.full_attn

    def is_dense(self, L):
        return L < self.first_dense


class ConfigError(Exception):
    pass


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_config(root, path="<config>"):
    """docs/MODEL.md#config-key-lookup + docs/MODEL.md#config-validation. `root` is the decoded JSON object."""
    if isinstance(root.get("config"), dict):  # ref_k3.json style wrapper
        root = root["config"]
    txt = root.get("text_config") if isinstance(root.get("text_config"), dict) else None
    base = txt if txt is not None else root
    lin = base.get("linear_attn_config") if isinstance(base.get("linear_attn_config"), dict) else None
    cands = [o for o in (txt, lin, root) if o is not None]

    def find(primary, alias):
        for obj in cands:
            for key in (primary, alias):
                if key is not None and key in obj:
                    return True, obj[key]
        return False, None

    vals, missing = {}, []
    for fname, primary, alias, kind in REQUIRED_FIELDS:
        ok, v = find(primary, alias)
        if not ok or not _is_number(v):
            missing.append(primary)
            continue
        vals[fname] = int(v) if kind == "int" else float(v)
    ok, fa = find("full_attn_layers", None)
    if not ok or not isinstance(fa, list) or len(fa) == 0:
        missing.append("full_attn_layers")
    if missing:
        raise ConfigError(
            f"k3_cfg: {path} is missing {len(missing)} required field(s):\n"
            + "".join(f"  {m}\n" for m in missing[:32])
            + "refusing to substitute defaults: a config this reader cannot fully understand "
            "would silently produce a DIFFERENT model.")
    for fname, key in BOOL_FIELDS:
        ok, v = find(key, None)
        if ok and isinstance(v, bool):
            vals[fname] = v
        elif ok and _is_number(v):
            vals[fname] = v != 0
        else:
            vals[fname] = True
    full = []
    for i, v in enumerate(fa):
        if not _is_number(v):
            raise ConfigError(f"full_attn_layers[{i}] is not a number")
        full.append(int(v))
    cfg = K3Config(full_attn=full, shape="nested" if txt is not None else "flat", **vals)

    # docs/MODEL.md#config-validation
    n = cfg.n_layers
    if n <= 0 or cfg.hidden <= 0 or cfg.vocab <= 0:
        raise ConfigError("non-positive layers/hidden/vocab")
    if len(full) >= n:
        raise ConfigError(f"marks {len(full)} of {n} layers as full attention, leaving no KDA layers")
    for i, v in enumerate(full):
        if v < 1 or v > n:
            raise ConfigError(f"full_attn_layers[{i}] = {v} is outside 1..{n} (the list is ONE-based)")
    if cfg.topk > MAX_TOPK:
        raise ConfigError(f"selects top-{cfg.topk}, but this build supports at most {MAX_TOPK}")
    if cfg.topk > cfg.n_experts:
        raise ConfigError(f"selects {cfg.topk} of {cfg.n_experts} experts")
    if cfg.attn_res_block <= 0:
        raise ConfigError("layer_idx % 0 would divide by zero")
    if cfg.conv_k < 1:
        raise ConfigError(f"has short_conv_kernel_size {cfg.conv_k}")
    return cfg


def load_config(path):
    with open(path) as f:
        return parse_config(json.load(f), path)
