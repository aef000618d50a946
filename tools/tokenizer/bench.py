#!/usr/bin/env python3
"""Benchmark: k3-tokenizer (Rust, release) vs Python tiktoken, same file, same run.

Tokenizer: o200k_base ranks + Kimi pat_str + Kimi special layout (200,254 ids), from
crates/k3-tokenizer/tests/data/o200k_kimi. Input: a deterministic mixed-script file of >= 1 MB
built from the parity cases. Both sides encode ordinary text on one thread; ids must agree.

Usage (repo root):  python3 tools/tokenizer/bench.py [--mb 1.5] [--runs 7]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import tiktoken  # noqa: E402
from gen_parity import corpus, fnv1a_ids, kimi_encoding  # noqa: E402
from parity_cases import TEXT_CASES  # noqa: E402

DATA = os.path.join(ROOT, "crates", "k3-tokenizer", "tests", "data", "o200k_kimi")
MODEL = os.path.join(DATA, "o200k_base.tiktoken")
CONFIG = os.path.join(DATA, "tokenizer_config.json")


def bench_tiktoken(path, runs):
    loads = []
    for _ in range(3):
        t = time.perf_counter()
        enc, _ = kimi_encoding(MODEL, CONFIG)
        loads.append((time.perf_counter() - t) * 1e3)
    with open(path, encoding="utf-8", newline="") as f:  # keep \r\n and \r as they are
        text = f.read()
    mb = len(text.encode()) / 1e6
    result = {"load_ms": statistics.median(loads)}
    modes = [("file", lambda t: len(enc.encode_ordinary(t))),
             ("lines", lambda t: sum(len(enc.encode_ordinary(line))
                                     for line in re.findall(r"[^\n]*\n|[^\n]+$", t)))]
    for name, f in modes:
        speeds, n_ids = [], 0
        for _ in range(runs):
            t = time.perf_counter()
            n_ids = f(text)
            speeds.append(mb / (time.perf_counter() - t))
        result.update({f"{name}_mb_s_best": max(speeds),
                       f"{name}_mb_s_median": statistics.median(speeds), f"{name}_n_ids": n_ids})
    return result


def bench_rust(path, runs):
    env = dict(os.environ, CARGO_TARGET_DIR=os.environ.get(
        "CARGO_TARGET_DIR", os.path.join(ROOT, "target")))
    cmd = ["cargo", "run", "--quiet", "--release", "-p", "k3-tokenizer", "--example",
           "tokenizer_bench", "--", MODEL, CONFIG, path, str(runs)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=1.5, help="input size in MB (>= 1)")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    text = corpus([t for _, t in TEXT_CASES], int(args.mb * 1e6))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8",
                                     newline="") as f:
        f.write(text)
        path = f.name
    try:
        rust = bench_rust(path, args.runs)
        py = bench_tiktoken(path, args.runs)
    finally:
        os.unlink(path)
    for mode in ["file", "lines"]:
        key = f"{mode}_n_ids"
        assert rust[key] == py[key], (mode, rust[key], py[key])
    size = len(text.encode())
    print(f"input: {size / 1e6:.2f} MB mixed-script, {py['file_n_ids']} ids (both sides agree), "
          f"{args.runs} runs, tiktoken {tiktoken.__version__}, one thread each")
    print(f"{'':34} {'k3-tokenizer':>14} {'tiktoken':>14} {'ratio':>8}")
    for key, label in [("file_mb_s_best", "encode whole file MB/s (best)"),
                       ("file_mb_s_median", "encode whole file MB/s (median)"),
                       ("lines_mb_s_best", "encode per line MB/s (best)"),
                       ("lines_mb_s_median", "encode per line MB/s (median)")]:
        print(f"{label:34} {rust[key]:14.2f} {py[key]:14.2f} {rust[key] / py[key]:7.2f}x")
    print(f"{'load 200k-rank tokenizer (ms)':34} {rust['load_ms']:14.1f} {py['load_ms']:14.1f} "
          f"{py['load_ms'] / rust['load_ms']:7.2f}x")


if __name__ == "__main__":
    main()
