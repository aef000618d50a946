#!/usr/bin/env python3
"""Where one more prompt token's time goes: a `perf record -k realtime` profile of
`cargo xtask bench-compute --model DIR`, split into the windows its stderr names
("phase prefill N tokens: A .. B unix s"), each sample's symbol put in a category, and the
marginal per token = (long window - short window) / (long - short tokens); with
`--repeats N` (default 3) the first short and long windows are the ones used.

    perf record -e cpu-clock -F 499 -k realtime -o prefill.perf \
        target/release/xtask bench-compute --model /work/bench/k3 2> phases.txt
    python3 tools/perf/prefill_profile.py prefill.perf phases.txt 499

Prints a markdown table (docs/PERFORMANCE.md "Prefill against its compute floor"). The
first window (cold) is reported apart: its excess is first-touch cost (page faults). Also
prints each compute thread's on-CPU time per marginal token and, per window, the idle
thread time `wall × threads − on-CPU` (serial sections, joins, other tenants' slices).
Needs only `perf` and Python 3 (no packages).
"""
import re
import subprocess
import sys
from collections import Counter

# (category, symbol or DSO substrings); the first match wins, in this order.
CATEGORIES = [
    ("GEMM microkernel (sweep, fused MXFP4 tile)", ["sweep_avx", "sweep_bf16", "sweep_neon", "micro_mx", "fused_avx", "avx2_mx::fused"]),
    ("GEMM panel fill (bf16 widen, MXFP4 decode)", ["widen_bf16", "widen_q8", "panel_mx", "Job::fill"]),
    ("GEMM emit, packing, task loop", ["reduce16", "gemm::Job", "Job::rows", "gemm::pack_x", "gemm::matmul", "next_chunk", "Ahead"]),
    ("mat-vec (T = 1)", ["rows16", "rows_mx", "par_matvec", "matvec_rows"]),
    # rayon's `bridge_producer_consumer::helper` is where the MLA heads' closures are inlined:
    # `perf annotate -l` put its samples on mla.rs (scores and context loops).
    ("MLA attention (absorbed query, scores, context)", ["matvec_t_f64", "latent_scores", "scores_lanes", "matvec_t_lanes", "attend_latent", "add_scaled", "k3_model::mla", "bridge_producer_consumer::helper"]),
    ("KDA recurrence, conv, decay", ["kda_step_head", "kda::step_", "kda_recurrence", "shortconv", "kda_decay", "k3_model::kda"]),
    ("activations (exp, tanh: SiTU-GLU, sigmoid)", ["expm1f", "tanhf", "expf", "act::", "situ", "sigmoid", "silu"]),
    ("norms, residual mixes", ["rmsnorm", "l2norm", "norm::", "attn_res", "residual::", "softmax"]),
    ("router", ["router", "row_dots"]),
    ("expert gather/scatter (MoE bookkeeping, copies)", ["moe::", "memmove", "memcpy", "memset"]),
    ("page faults, kernel memory", ["clear_page", "folio", "page_range", "do_fault", "handle_mm", "filemap", "exc_page_fault", "do_anonymous", "lru_", "zap_", "memcg"]),
    ("thread joins, scheduling (rayon, futex)", ["rayon", "crossbeam", "futex", "spin_unlock", "task_switch", "schedule", "sched_", "irqentry", "syscall", "__x64_sys"]),
]


def category(sym, dso):
    for name, keys in CATEGORIES:
        if any(k in sym for k in keys):
            return name
    if "kernel" in dso:
        return "other kernel"
    return "other"


def windows(phase_file):
    pat = re.compile(r"phase prefill (\d+) tokens: ([\d.]+) \.\. ([\d.]+) unix s")
    out = []
    for line in open(phase_file, encoding="utf-8"):
        m = pat.search(line)
        if m:
            out.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
    if len(out) < 3:
        sys.exit(f"{phase_file}: expected 3 'phase prefill' lines (cold, short, long), found {len(out)}")
    return out[:3]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    data, phase_file, hz = sys.argv[1], sys.argv[2], float(sys.argv[3])
    (n_cold, c0, c1), (n_short, s0, s1), (n_long, l0, l1) = windows(phase_file)
    script = subprocess.run(
        ["perf", "script", "-i", data, "-F", "comm,tid,time,ip,sym,dso"],
        capture_output=True, text=True, check=True).stdout
    # "k3-compute-0  2679 1796288924.766492:   55d27aa7d574 sym (dso)"
    line_pat = re.compile(r"^\s*(\S+)\s+(\d+)\s+([\d.]+):\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")
    counts = {w: Counter() for w in ("cold", "short", "long")}
    threads = {w: Counter() for w in ("cold", "short", "long")}
    for line in script.splitlines():
        m = line_pat.match(line)
        if not m:
            continue
        thread, t, sym, dso = f"{m.group(1)}/{m.group(2)}", float(m.group(3)), m.group(4), m.group(5)
        for w, (a, b) in (("cold", (c0, c1)), ("short", (s0, s1)), ("long", (l0, l1))):
            if a <= t <= b:
                counts[w][category(sym, dso)] += 1
                threads[w][thread] += 1
    per = 1e3 / hz  # ms of CPU per sample
    tokens = n_long - n_short
    wall = (l1 - l0 - (s1 - s0)) / tokens * 1e3
    cats = sorted(set(counts["long"]) | set(counts["short"]),
                  key=lambda c: -(counts["long"][c] - counts["short"][c]))
    total = sum(counts["long"].values()) - sum(counts["short"].values())
    print(f"marginal wall time {wall:.1f} ms/token; on-CPU samples {total * per / tokens:.1f} ms/token "
          f"over all threads ({per:.2f} ms per sample)\n")
    print("| where | on-CPU ms per marginal token | share |\n|---|---:|---:|")
    for c in cats:
        d = counts["long"][c] - counts["short"][c]
        print(f"| {c} | {d * per / tokens:.1f} | {100 * d / max(total, 1):.1f} % |")
    print("\n| thread | on-CPU ms per marginal token |\n|---|---:|")
    for th in sorted(set(threads["long"]) | set(threads["short"])):
        d = threads["long"][th] - threads["short"][th]
        if abs(d * per / tokens) >= 0.05:
            print(f"| {th} | {d * per / tokens:.1f} |")
    n_thr = sum(1 for th in threads["long"] if th.startswith("k3-compute")) or 1
    print(f"\nidle thread time = wall x {n_thr} compute threads - on-CPU of all threads:")
    for w, (a, b), n in (("cold", (c0, c1), n_cold), ("short", (s0, s1), n_short), ("long", (l0, l1), n_long)):
        on = sum(threads[w].values()) * per / 1e3
        idle = (b - a) * n_thr - on
        print(f"  {w} ({n} tokens): wall {b - a:.2f} s, on-CPU {on:.2f} s, idle {idle:.2f} s "
              f"({100 * idle / max((b - a) * n_thr, 1e-9):.0f} %)")
    idle_marg = wall * n_thr - total * per / tokens
    print(f"  marginal: {idle_marg:.1f} ms/token idle of {wall * n_thr:.1f}")
    extra = sum(counts["cold"].values()) - sum(counts["long"].values())
    print(f"\ncold prefill ({n_cold} tokens): {c1 - c0:.2f} s wall vs {l1 - l0:.2f} s warm; "
          f"{extra * per / 1e3:+.2f} s more on-CPU, of which by category:")
    for c in sorted(counts["cold"], key=lambda c: -(counts["cold"][c] - counts["long"][c]))[:6]:
        print(f"  {c}: {(counts['cold'][c] - counts['long'][c]) * per / 1e3:+.2f} s")


if __name__ == "__main__":
    main()
