"""Check the float64 reference against upstream's op fixtures (fixtures/upstream).

    python3 tools/reference/test_upstream.py [--upstream DIR]

One line per check, then `N passed, M failed`; exit status 1 on any failure.
Tolerance (ops/MANIFEST.json): per element |got - want| <= fp32_abs + fp32_rel * |want|.
The one documented exception (README "Known numerical note"): a moe.json element in heavy
cancellation gets the float32 summation error bound of its own terms added; the strict ratio
is printed as information.
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import ops  # noqa: E402
from config import parse_config  # noqa: E402
from model import decoder_layer, sub  # noqa: E402
from mxfp4 import dequantize  # noqa: E402

U32 = 2.0 ** -24  # unit roundoff of float32


class Checker:
    def __init__(self, atol, rtol):
        self.atol, self.rtol = atol, rtol
        self.passed = self.failed = 0

    def report(self, name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name:34s} {detail}")
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def close(self, name, got, want, extra_bound=None):
        """allclose-style check; `extra_bound` (same shape as want, default 0) is added to
        the tolerance of individual elements (used only for the documented moe element)."""
        got = np.asarray(got, np.float64)
        want = np.asarray(want, np.float64)
        if got.shape != want.shape:
            self.report(name, False, f"shape {got.shape} != {want.shape}")
            return
        err = np.abs(got - want)
        tol = self.atol + self.rtol * np.abs(want)
        strict = float(np.max(err / tol))
        detail = f"n={want.size} max|err|={err.max():.3e} worst err/tol={strict:.3f}"
        if extra_bound is not None:
            relaxed = tol + extra_bound
            ok = bool(np.all(err <= relaxed))
            bumped = np.argwhere(extra_bound > 0)
            for i in bumped:
                i = tuple(int(j) for j in i)
                print(f"INFO {name}{list(i)}: err={err[i]:.3e} strict ratio={err[i] / tol[i]:.3f} "
                      f"(f32 summation bound {extra_bound[i]:.3e} added; "
                      f"ratio to relaxed tolerance {err[i] / relaxed[i]:.3f})")
            others = np.ones(want.shape, bool)
            others[tuple(bumped.T)] = False
            rest = float(np.max((err / tol)[others])) if others.any() else 0.0
            detail += f" (all other elements: worst err/tol={rest:.3f})"
        else:
            ok = bool(np.all(err <= tol))
        self.report(name, ok, detail)

    def exact(self, name, got, want):
        got, want = np.asarray(got), np.asarray(want)
        ok = got.shape == want.shape and bool(np.array_equal(got, want))
        n_bad = int(np.sum(got != want)) if got.shape == want.shape else -1
        self.report(name, ok, f"n={want.size} exact, mismatches={n_bad}")

    def truth(self, name, ok, detail):
        self.report(name, bool(ok), detail)


def T(obj):
    """a fixture tensor {shape, data} -> float64 array."""
    return np.asarray(obj["data"], dtype=np.float64).reshape(obj["shape"])


def load(d, name):
    with open(os.path.join(d, name)) as f:
        return json.load(f)


# --------------------------------------------------------------------------- per-op checks

def check_rmsnorm(c, d):
    c.close("rmsnorm.out", ops.rmsnorm(T(d["in"]), T(d["weight"]), d["eps"]), T(d["out"]))


def check_situ_glu(c, d):
    x = T(d["in"])                                   # [rows, 2n] = [gate | up]
    n = x.shape[1] // 2
    got = ops.situ_glu(x[:, :n], x[:, n:], d["beta"], d["linear_beta"])
    c.close("situ_glu.out", got, T(d["out"]))
    c.close("situ_glu.max_abs", np.max(np.abs(got)), d["max_abs"])


def check_shortconv(c, d):
    C, K = d["channels"], d["kernel"]
    w = T(d["weight"]).reshape(C, K)
    out, hist = ops.short_conv(T(d["in"])[0], w, np.zeros((C, K - 1)))
    c.close("shortconv.out", out, T(d["out"])[0])
    c.close("shortconv.state_after", hist, T(d["state_after"])[0])
    out2, _ = ops.short_conv(T(d["in_next"])[0], w, hist)
    c.close("shortconv.out_next", out2, T(d["out_next"])[0])


def check_kda_decay(c, d):
    z = T(d["z"])[0]                                 # [T, P]
    H = T(d["A_log"]).shape[0]
    _, _, Hg, D = d["g"]["shape"]
    assert Hg == H
    g, alpha = ops.kda_decay(z, T(d["A_log"]), T(d["dt_bias"]), d["lower_bound"], H, D)
    c.close("kda_decay.g", g, T(d["g"])[0])
    c.close("kda_decay.alpha", alpha, T(d["alpha"])[0])


def check_kda_recur(c, d, tag):
    S0 = np.zeros((d["H"], d["d_k"], d["d_v"]))
    o, S = ops.kda_recurrence(T(d["q"]), T(d["k"]), T(d["v"]), T(d["alpha"]), T(d["beta"]),
                              d["q_scale"], S0)
    c.close(f"{tag}.out", o, T(d["out"]))
    c.close(f"{tag}.state_out", S, T(d["state_out"]))


KDA_FIXTURE_NAMES = {  # kda_layer{1,8}.json key -> released suffix (docs/MODEL.md#kda-layer-tensors)
    "q_proj": "q_proj.weight", "k_proj": "k_proj.weight", "v_proj": "v_proj.weight",
    "g_proj": "g_proj.weight", "o_proj": "o_proj.weight", "f_a": "f_a_proj.weight",
    "f_b": "f_b_proj.weight", "b_proj": "b_proj.weight", "q_conv": "q_conv1d.weight",
    "k_conv": "k_conv1d.weight", "v_conv": "v_conv1d.weight", "A_log": "A_log",
    "dt_bias": "dt_bias", "o_norm": "o_norm.weight"}


def check_kda_layer(c, d, tag):
    w = {suf: T(d[k]) for k, suf in KDA_FIXTURE_NAMES.items()}
    out, st = ops.kda_layer(T(d["in"])[0], w, d["H"], d["d_k"], d["lower_bound"], d["rms_eps"])
    c.close(f"{tag}.out", out, T(d["out"])[0])
    c.close(f"{tag}.state_out", st["S"], T(d["state_out"])[0])


def check_router(c, d):
    idx, wts = ops.route(T(d["in"]), T(d["gate_weight"]), T(d["bias"]), d["top_k"])
    c.exact("router.topk_idx", idx, T(d["topk_idx"]).astype(np.int64))
    c.close("router.topk_weight", wts, T(d["topk_weight"]))
    idx_nobias, _ = ops.route(T(d["in"]), T(d["gate_weight"]), np.zeros(d["n_experts"]), d["top_k"])
    changed = int(np.sum(np.any(idx_nobias != idx, axis=1)))
    c.truth("router.bias_changes_selection", changed == d["rows_where_bias_changed_selection"],
            f"rows where the bias changed the top-k: {changed} "
            f"(fixture says {d['rows_where_bias_changed_selection']})")


def check_attnres(c, d):
    fold = T(d["norm_weight"]) * T(d["proj_weight"])                 # [E]
    c.close("attnres.fold_hint", fold, T(d["fold_hint"]))
    blocks = T(d["block_residual"])                                  # [T, nb, E]
    sources = [blocks[:, i] for i in range(blocks.shape[1])] + [T(d["prefix_sum"])]
    assert len(sources) == d["n_sources"]
    c.close("attnres.out", ops.attn_res(sources, fold, d["eps"]), T(d["out"]))


def check_mla(c, d):
    w = {k[:-len("_weight")] + ".weight": T(v) for k, v in d.items() if k.endswith("_weight")}
    nope, rope = d["qk_nope"], d["qk_rope"]
    c.close("mla.scale", 1.0 / np.sqrt(nope + rope), d["scale"])
    trace = {}
    out = ops.mla_layer(T(d["in"])[0], w, d["n_heads"], nope, rope, d["v_head"], d["kv_lora"],
                        d["rms_eps"], True, trace)
    c.close("mla.kv_latent", trace["kv_latent"], T(d["kv_latent"])[0])
    c.close("mla.k_rope", trace["k_rope"], T(d["k_rope"])[0])
    c.close("mla.out", out, T(d["out"])[0])


MOE_FIXTURE_NAMES = {  # moe.json / layer_*.json "mlp_" keys -> released block_sparse_moe. suffix
    "gate_weight": "gate.weight", "e_score_correction_bias": "gate.e_score_correction_bias",
    "down_weight": "routed_expert_down_proj.weight", "up_weight": "routed_expert_up_proj.weight",
    "norm_weight": "routed_expert_norm.weight",
    "shared_w1_weight": "shared_experts.gate_proj.weight",
    "shared_w3_weight": "shared_experts.up_proj.weight",
    "shared_w2_weight": "shared_experts.down_proj.weight"}


def moe_weights(d, prefix, n_experts):
    w = {suf: T(d[prefix + k]) for k, suf in MOE_FIXTURE_NAMES.items()}
    experts = [tuple(T(d[f"{prefix}experts_{e}_{m}_weight"]) for m in ("w1", "w2", "w3"))
               for e in range(n_experts)]
    return w, experts


def f32_sum_bound(terms, partials):
    """float32 rounding bound for an output element formed as in the upstream engine (docs/NUMERICS.md#numerics):
    each dot product accumulates exactly-rounded f64 products of f32 operands and is rounded to
    f32 once, then the partial results are added in f32. First order in u = 2^-24:
      u * sum|t_i|        (the f32 rounding of the operands of every product term t_i)
    + u * sum|partial_p|  (rounding each dot result to f32)
    + u * |sum partial_p| (the final f32 addition).
    The f64 accumulation itself contributes O(2^-53 * n * sum|t_i|), negligible."""
    return U32 * (np.sum(np.abs(terms)) + np.sum(np.abs(partials)) + abs(np.sum(partials)))


def check_moe(c, d):
    w, experts = moe_weights(d, "", d["n_experts"])
    x = T(d["in"])[0]
    parts = {}
    got = ops.latent_moe(x, w, experts, d["top_k"], d["situ_b1"], d["situ_b2"], d["rms_eps"],
                         bool(d["renorm"]), d["routed_scale"], bool(d["latent_norm"]), parts)
    want = T(d["out"])[0]
    tol = c.atol + c.rtol * np.abs(want)
    extra = np.zeros_like(want)
    bad = np.argwhere(np.abs(got - want) > tol)
    for t, i in bad:  # README: heavy-cancellation element(s) -> add the f32 summation bound
        # the element is sum_k Wup[i,k]*acc[t,k] + sum_j Wsh_down[i,j]*sa[t,j]; its f32 value
        # was formed from these products (f64 dot accumulations rounded to f32, then added)
        sa = ops.situ_glu(x[t] @ w["shared_experts.gate_proj.weight"].T,
                          x[t] @ w["shared_experts.up_proj.weight"].T, d["situ_b1"], d["situ_b2"])
        terms = np.concatenate([w["routed_expert_up_proj.weight"][i] * parts["acc"][t],
                                w["shared_experts.down_proj.weight"][i] * sa])
        extra[t, i] = f32_sum_bound(terms, np.array([parts["routed"][t, i], parts["shared"][t, i]]))
        print(f"INFO moe.out[{t},{i}]: want={want[t, i]:.6g} routed={parts['routed'][t, i]:.6g} "
              f"shared={parts['shared'][t, i]:.6g} n_terms={terms.size} "
              f"sum|terms|={np.sum(np.abs(terms)):.4g}")
    c.close("moe.out", got, want, extra if len(bad) else None)


def layer_weights(d):
    """layer_kda.json / layer_mla.json flattened names -> released per-layer suffixes."""
    lw = {}
    for k, v in d.items():
        if not isinstance(v, dict) or k in ("in", "out") or k.startswith("block_residual") \
                or (k.startswith("mlp_") and not k.startswith("mlp_res_")):
            continue
        if k.startswith("self_attn_"):
            rest = k[len("self_attn_"):]
            name = "self_attn." + (rest[:-len("_weight")] + ".weight" if rest.endswith("_weight") else rest)
        else:
            assert k.endswith("_weight"), k
            name = k[:-len("_weight")] + ".weight"
        lw[name] = T(v)
    moe, experts = moe_weights(d, "mlp_", 8)
    lw.update({"block_sparse_moe." + s: v for s, v in moe.items()})
    lw["experts"] = experts
    return lw


def check_layer(c, d, tag, cfg):
    L = d["layer_idx"]
    assert cfg.is_mla(L) == d["is_mla"] and cfg.attn_res_block == d["attn_res_block_size"]
    lw = layer_weights(d)
    h = T(d["in"])[0]                                                # [T, E]
    bri = T(d["block_residual_in"])                                  # [T, nb, E]
    blocks = [bri[:, i] for i in range(bri.shape[1])]
    out, _ = decoder_layer(cfg, L, lw, h, blocks)
    bro = T(d["block_residual_out"])
    c.close(f"{tag}.out", out, T(d["out"])[0])
    c.truth(f"{tag}.n_blocks", len(blocks) == bro.shape[1],
            f"blocks {bri.shape[1]} -> {len(blocks)} (fixture: {bro.shape[1]})")
    if len(blocks) == bro.shape[1]:
        c.close(f"{tag}.block_residual_out", np.stack(blocks, axis=1), bro)


def check_mxfp4(c, d):
    packed = T(d["packed"]).astype(np.uint8)
    scales = T(d["scales"]).astype(np.uint8)
    c.exact("mxfp4.e2m1_lut", __import__("mxfp4").E2M1, np.asarray(d["e2m1_lut"]))
    got = dequantize(packed, scales)
    c.truth("mxfp4.shape", got.shape[1] == d["logical_width"] and
            packed.shape[1] * 2 == scales.shape[1] * d["group_size"],
            f"decoded {got.shape}, group size {d['group_size']}")
    c.exact("mxfp4.expected", got, T(d["expected"]))
    sw = dequantize(packed, scales, swap_nibbles=True)
    first = np.asarray(d["expected_swapped_nibbles"]["first64"])
    c.exact("mxfp4.swapped_nibbles.first64", sw.reshape(-1)[:first.size], first)
    c.truth("mxfp4.swapped_differs", not np.array_equal(sw.reshape(-1)[:first.size],
                                                       got.reshape(-1)[:first.size]),
            "swapped-nibble decode differs from expected (right values, wrong places)")
    c.truth("mxfp4.swapped_same_multiset", np.array_equal(np.sort(sw, axis=1), np.sort(got, axis=1)),
            "per-row value multisets identical")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", default=os.path.join(REPO, "fixtures", "upstream"))
    args = ap.parse_args()
    ops_dir = os.path.join(args.upstream, "ops")
    man = load(ops_dir, "MANIFEST.json")
    cfg = parse_config(man["config"], "MANIFEST.json config")
    c = Checker(man["tolerance"]["fp32_abs"], man["tolerance"]["fp32_rel"])
    run = {
        "rmsnorm": lambda: check_rmsnorm(c, load(ops_dir, "rmsnorm.json")),
        "situ_glu": lambda: check_situ_glu(c, load(ops_dir, "situ_glu.json")),
        "shortconv": lambda: check_shortconv(c, load(ops_dir, "shortconv.json")),
        "kda_decay": lambda: check_kda_decay(c, load(ops_dir, "kda_decay.json")),
        "kda_step": lambda: [check_kda_recur(c, load(ops_dir, f"kda_recur{n}.json"), f"kda_recur{n}")
                             for n in (1, 8)],
        "kda_seq": lambda: [check_kda_layer(c, load(ops_dir, f"kda_layer{n}.json"), f"kda_layer{n}")
                            for n in (1, 8)],
        "router": lambda: check_router(c, load(ops_dir, "router.json")),
        "attnres": lambda: check_attnres(c, load(ops_dir, "attnres.json")),
        "mla": lambda: check_mla(c, load(ops_dir, "mla.json")),
        "layer_kda": lambda: check_layer(c, load(ops_dir, "layer_kda.json"), "layer_kda", cfg),
        "layer_mla": lambda: check_layer(c, load(ops_dir, "layer_mla.json"), "layer_mla", cfg),
    }
    for name in man["order"]:
        run[name]()
    check_moe(c, load(ops_dir, "moe.json"))
    check_mxfp4(c, load(args.upstream, "mxfp4.json"))
    print(f"{c.passed} passed, {c.failed} failed")
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
