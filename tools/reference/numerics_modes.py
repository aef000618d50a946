"""Logit deviation of bf16-activation numeric modes (AMX `TDPBF16PS`, AVX512_BF16
`VDPBF16PS`) on k3's tiny checkpoints, against the float64 reference and the fixtures'
own tolerance (docs/NUMERICS.md#avx512_bf16-and-amx).

    python3 tools/reference/numerics_modes.py [--fixtures DIR] [--scope trunk|all]

Both instructions multiply bf16 by bf16. k3's activations are f32, so a product `W x` on them
must first cut every activation `x` (as f32) into `P` bf16 pieces: `x1 = bf16(x)`,
`x2 = bf16(x - x1)`, `x3 = bf16(x - x1 - x2)` (round to nearest even; subnormal inputs and
pieces flushed to zero, as the instructions' DAZ does). `P = 3` is exact for every normal f32;
`P = 1` keeps 8 of x's 24 significand bits. Each product `w · x_p` of two bf16 values is exact
in f32, so the mode's deviation from contract v2 is the pieces' truncation plus the f32
accumulation order — this model computes the first exactly (products and sums in float64) and
leaves out the second, which contract v2 pays as well (its engine ratio is printed by
`cargo xtask conformance`).

`--scope trunk` cuts the activations of the bf16 trunk's products only (what an AMX tile GEMM
of the trunk changes); `all` also those of the MXFP4 experts (decoded to bf16 first: every
E2M1 value times its E8M0 scale is a bf16 within bf16's range). The router and every other op
stay float64.

For every case of each fixture's expected.json: the last prompt position's logits against
`last_logits` as `max |got - want| / (abs + rel * max |want|)` (the conformance ratio: <= 1
passes), the teacher-forced argmax over the prompt and 16 greedy ids by full recompute against
the recorded ones.
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
from model import LM, LM_HEAD, K3Model, argmax_lowest  # noqa: E402
from safetensors_io import ShardedCheckpoint  # noqa: E402

MODELS = ["tiny-k3", "tiny-k3-wide"]
F32_MIN_NORMAL = np.float32(2.0**-126)


def bf16_rne_daz(x32):
    """float32 array -> nearest bf16 (ties to even) as float32, subnormals (in and out) -> 0."""
    x32 = np.where(np.abs(x32) < F32_MIN_NORMAL, np.float32(0), x32).astype(np.float32)
    u = x32.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
    return np.where(np.abs(r) < F32_MIN_NORMAL, np.float32(0), r).astype(np.float32)


def bf16_pieces(x, pieces):
    """x (any float) as f32, cut into `pieces` bf16 parts; returns their float64 sum."""
    rest = np.asarray(x, dtype=np.float32)
    total = np.zeros(rest.shape, dtype=np.float64)
    for _ in range(pieces):
        p = bf16_rne_daz(rest)
        total += p.astype(np.float64)
        rest = (rest - p).astype(np.float32)   # exact: p is rest's leading bits
    return total


def bf16_weight_ids(model, model_dir, scope):
    """ids of the float64 weight arrays whose products the mode would run in bf16."""
    ck = ShardedCheckpoint(model_dir)
    ids = set()
    if ck.raw(LM_HEAD)[0] == "BF16":
        ids.add(id(model.lm_head))
    for L, lw in enumerate(model.layers):
        for suf, arr in lw.items():
            if suf == "experts":
                if scope == "all":
                    ids.update(id(w) for ex in arr for w in ex)
                continue
            if arr.ndim == 2 and ck.raw(f"{LM}layers.{L}.{suf}")[0] == "BF16":
                ids.add(id(arr))
    return ids


def with_mode(pieces, ids):
    """an `ops.linear` that cuts x into bf16 pieces when W is one of `ids`."""
    exact = ops.linear

    def linear(x, W):
        if pieces and id(W) in ids:
            return bf16_pieces(x, pieces) @ W.T
        return exact(x, W)
    return linear


def run_case(model, case, vocab):
    prompt, greedy_want = case["prompt_ids"], case["greedy_ids"]
    logits = model.forward(prompt)                              # [T, V]
    tf = [argmax_lowest(r) for r in logits]
    want = np.asarray(case["last_logits"], dtype=np.float64)
    seq, got = list(prompt), []
    for _ in range(len(greedy_want)):
        tok = argmax_lowest(model.forward(seq)[-1])
        got.append(tok)
        seq.append(tok)
    return logits[-1], want, tf == case["tf_argmax"], got == greedy_want


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixtures", default=os.path.join(REPO, "fixtures"))
    ap.add_argument("--scope", choices=["trunk", "all"], default="trunk")
    args = ap.parse_args()
    exact = ops.linear
    print(f"scope: {args.scope}; ratio = max |logit - f64 reference| / fixture tolerance")
    for name in MODELS:
        d = os.path.join(args.fixtures, name)
        doc = json.load(open(os.path.join(d, "expected.json")))
        rel, ab = doc["tolerance"]["logits_rel_to_max"], doc["tolerance"]["logits_abs"]
        model = K3Model(d)
        ids = bf16_weight_ids(model, d, args.scope)
        for pieces, label in [(0, "float64 (reference)"), (1, "bf16 x1"), (2, "bf16 x2"),
                              (3, "bf16 x3")]:
            ops.linear = with_mode(pieces, ids)
            worst, rel_err, tf_ok, greedy_ok = 0.0, 0.0, 0, 0
            for case in doc["cases"]:
                got, want, tf, gr = run_case(model, case, model.cfg.vocab)
                tol = ab + rel * np.max(np.abs(want))
                worst = max(worst, float(np.max(np.abs(got - want)) / tol))
                rel_err = max(rel_err, float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
                tf_ok += tf
                greedy_ok += gr
            n = len(doc["cases"])
            print(f"{name:13} {label:20} ratio {worst:10.4f}  max|dlogit|/max|logit| "
                  f"{rel_err:.3e}  tf argmax {tf_ok}/{n}  greedy 16 ids {greedy_ok}/{n}")
            sys.stdout.flush()
        ops.linear = exact


if __name__ == "__main__":
    main()
