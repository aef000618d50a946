"""Re-run the float64 reference on the committed fixture model directories and check that
expected.json (and the on-disk layout promised by docs/REFERENCE.md) still hold.

    python3 tools/reference/test_fixtures.py [--fixtures DIR] [--quick]

Per model: config shapes (nested == flat), tokenizer files, shard layout (trunk runs and
expert runs contiguous, docs/MODEL.md#routed-experts / docs/FORMATS.md#packed-trunk), then for every case: teacher-forced argmax, last-prompt
logits within tolerance, greedy ids (full recompute) and the recorded margin.
Prints one line per check and finally `N passed, M failed`; exit 1 on failure.
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bpe_train import load_tiktoken_model, special_names  # noqa: E402
from config import load_config  # noqa: E402
from kimi_pat import PAT_STR  # noqa: E402
from model import LM, K3Model, argmax_lowest, expected_shapes  # noqa: E402
from safetensors_io import ShardedCheckpoint  # noqa: E402

MODELS = ["tiny-k3", "tiny-k3-wide"]


class Counter:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, name, ok, detail=""):
        print(f"{'PASS' if ok else 'FAIL'} {name:44s} {detail}")
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def check_layout(c, mdir, name, cfg):
    ck = ShardedCheckpoint(mdir)
    trunk_ok, expert_ok, split = True, True, []
    for L in range(cfg.n_layers):
        names = [f"{LM}layers.{L}.{s}" for s in expected_shapes(cfg, L)]
        shards = {ck.where[n] for n in names}
        ranges = sorted(ck.shards[ck.where[n]].abs_range(n) for n in names)
        lo, hi = ranges[0][0], ranges[-1][1]
        own = sum(e - s for s, e in ranges)
        trunk_ok &= len(shards) == 1 and hi - lo == own            # tiles one byte run
        if cfg.is_dense(L):
            continue
        for e in range(cfg.n_experts):
            pre = f"{LM}layers.{L}.block_sparse_moe.experts.{e}."
            six = [pre + m + s for m in ("w1.", "w2.", "w3.") for s in ("weight_packed", "weight_scale")]
            eshards = {ck.where[n] for n in six}
            rr = [ck.shards[ck.where[n]].abs_range(n) for n in six]
            contiguous = all(rr[i][1] == rr[i + 1][0] for i in range(5))   # canonical order
            expert_ok &= len(eshards) == 1 and contiguous
            if e == 0 and eshards != shards:
                split.append(L)
    c.check(f"{name}.layout.trunk_runs_contiguous", trunk_ok)
    c.check(f"{name}.layout.experts_contiguous_w1p_w1s_w2p_w2s_w3p_w3s", expert_ok)
    c.check(f"{name}.layout.experts_in_other_shard_than_trunk", len(split) > 0, f"layers {split}")
    sizes = {f: os.path.getsize(os.path.join(mdir, f)) for f in os.listdir(mdir)}
    c.check(f"{name}.layout.files_under_4MiB", max(sizes.values()) < 4 << 20,
            f"largest {max(sizes.values())} B")


def check_tokenizer(c, mdir, name, cfg):
    import tiktoken
    ranks = load_tiktoken_model(os.path.join(mdir, "tiktoken.model"))
    with open(os.path.join(mdir, "tokenizer_config.json")) as f:
        tc = json.load(f)
    specials = {v["content"]: int(k) for k, v in tc["added_tokens_decoder"].items()}
    n = len(ranks)
    c.check(f"{name}.tokenizer.specials_follow_ranks",
            [specials[s] for s in special_names()] == list(range(n, n + 256)) and n + 256 == cfg.vocab,
            f"{n} ranks + 256 specials = {cfg.vocab}")
    enc = tiktoken.Encoding(name, pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)
    return enc


def check_model(c, fixtures, name, quick):
    mdir = os.path.join(fixtures, name)
    cfg = load_config(os.path.join(mdir, "config.json"))
    flat_path = os.path.join(fixtures, "config-shapes", f"{name}.flat.json")
    if os.path.exists(flat_path):
        flat = load_config(flat_path)
        same = {k: v for k, v in flat.__dict__.items() if k != "shape"} == \
               {k: v for k, v in cfg.__dict__.items() if k != "shape"}
        c.check(f"{name}.config.nested_equals_flat", same and cfg.shape == "nested" and flat.shape == "flat")
    check_layout(c, mdir, name, cfg)
    enc = check_tokenizer(c, mdir, name, cfg)
    with open(os.path.join(mdir, "expected.json")) as f:
        exp = json.load(f)
    tol = exp["tolerance"]
    model = K3Model(mdir)
    for case in exp["cases"]:
        tag = f"{name}.{case['name']}"
        prompt = case["prompt_ids"]
        if case["prompt_text"] is not None:
            c.check(f"{tag}.tiktoken_encode", enc.encode_ordinary(case["prompt_text"]) == prompt)
        logits = model.forward(prompt)                                     # [T, V]
        c.check(f"{tag}.tf_argmax", [argmax_lowest(r) for r in logits] == case["tf_argmax"],
                f"{len(prompt)} positions")
        want = np.asarray(case["last_logits"])
        err = np.max(np.abs(logits[-1] - want))
        bound = tol["logits_rel_to_max"] * np.max(np.abs(want)) + tol["logits_abs"]
        c.check(f"{tag}.last_logits", err <= bound, f"max|err|={err:.2e} bound={bound:.2e}")
        seq, margins = list(prompt), [float(np.min(np.diff(np.sort(logits, axis=-1)[:, -2:])))]
        greedy = []
        n_gen = len(case["greedy_ids"]) if not quick else 0
        for step in range(n_gen):
            lg = logits if step == 0 else model.forward(seq)               # full recompute
            s = np.sort(lg[-1])
            margins.append(s[-1] - s[-2])
            greedy.append(argmax_lowest(lg[-1]))
            seq.append(greedy[-1])
        if not quick:
            c.check(f"{tag}.greedy_ids", greedy == case["greedy_ids"], f"{len(greedy)} tokens")
            m = min(margins)
            c.check(f"{tag}.min_top2_margin", abs(m - case["min_top2_margin"]) < 1e-6 and m >= 2e-3,
                    f"{m:.4g}")


def check_dspark(c, fixtures):
    """fixtures/tiny-k3-dspark and its variants (-yarn, -fcnorm: the base weights with the
    variant's files): the reference re-run reproduces expected.json (proposals exactly,
    logits and confidences to 1e-9)."""
    import shutil
    import tempfile
    from dspark import DSparkModel, draft_block
    base = os.path.join(fixtures, "tiny-k3-dspark")
    target = K3Model(os.path.join(fixtures, "tiny-k3"))
    for name in ("tiny-k3-dspark", "tiny-k3-dspark-yarn", "tiny-k3-dspark-fcnorm"):
        ddir = os.path.join(fixtures, name)
        with open(os.path.join(ddir, "expected.json")) as f:
            exp = json.load(f)
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(base, "model.safetensors"), tmp)
            for f in os.listdir(ddir):
                if f != "expected.json" and f != "model.safetensors":
                    shutil.copy(os.path.join(ddir, f), tmp)
            draft = DSparkModel(tmp)
        for stream, case in exp["streams"].items():
            _, final, ids, conf = draft_block(target, draft, exp["prompt"], stream)
            err = float(np.max(np.abs(final - np.asarray(case["logits"]))))
            cerr = float(np.max(np.abs(np.asarray(conf) - np.asarray(case["confidence"]))))
            c.check(f"{name} {stream} proposals", ids == case["proposed"], str(ids))
            c.check(f"{name} {stream} logits", err <= 1e-9, f"max err {err:.1e}")
            c.check(f"{name} {stream} confidence", cerr <= 1e-9, f"max err {cerr:.1e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=os.path.join(REPO, "fixtures"))
    ap.add_argument("--quick", action="store_true", help="skip the greedy decode")
    ap.add_argument("--only", choices=MODELS)
    args = ap.parse_args()
    c = Counter()
    for name in MODELS:
        if args.only and name != args.only:
            continue
        check_model(c, args.fixtures, name, args.quick)
    if not args.only:
        check_dspark(c, args.fixtures)
    print(f"{c.passed} passed, {c.failed} failed")
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
