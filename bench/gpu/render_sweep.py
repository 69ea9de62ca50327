#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Renders the decode-family sweep (kdispatch_gpu_gemm_bench --sweep, the CSV
that `run_h200.sh --sections gemm-host` writes when KD_GEMM_SWEEP_M is set) as
a markdown table: per (M, N, K), the fastest point of each family, the point
get_default picked, and cuBLASLt's first pick, all from one run.

  render_sweep.py gemm_sweep.csv --commit SHA > bench/results/h200_gemm_sweep.md
"""
import argparse
import collections
import csv
import datetime
import math
import re


def family(plan):
    m = re.match(r"gemm_\w+?__(\w+?)\{", plan)
    return m.group(1) if m else plan


def params(plan):
    return plan[plan.index("{") + 1:-1] if "{" in plan else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    pts = collections.defaultdict(list)  # (M, N, K) -> [(plan, us, reps)]
    for r in csv.DictReader(open(a.csv)):
        if r["what"] != "sweep":
            continue
        pts[(int(r["M"]), int(r["N"]), int(r["K"]))].append((r["variant"], float(r["a_us"]), int(r["value"])))
    out = [f"# Decode-family sweep on the H200 — {datetime.date.today().isoformat()}, commit {a.commit}", "",
           "Produced by `KD_GEMM_SWEEP_M=1,2,4,8,16 bench/gpu/run_h200.sh --sections gemm-host` "
           "(tests/gpu/gpu_gemm_bench.cpp --sweep; rendered by bench/gpu/render_sweep.py). Every point of the "
           "skinny and skinny_mma spaces, the plan get_default picks and cuBLASLt's first pick (algo_id -1), "
           "timed with the tuner's clock (a 256 MiB L2-evicting read before each launch, CUDA events around the "
           "launch alone), in turns over the rounds, the order rotated per round; median per point. "
           "This is the data behind get_default's decode rules (kernels/gpu/gemm_variants.inc).", "",
           "| M | N | K | best point (µs) | best skinny_mma | best skinny | get_default | cuBLASLt | "
           "default / best | cuBLASLt / best |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    ratios_def, ratios_lt = collections.defaultdict(list), collections.defaultdict(list)
    reps = set()
    for (M, N, K) in sorted(pts):
        rows = pts[(M, N, K)]
        reps.update(r for _, _, r in rows)
        lt = [r for r in rows if family(r[0]) == "cublaslt"]
        # the last two rows of a point are get_default's plan and cuBLASLt's pick
        dflt = rows[-2]
        best = min(rows, key=lambda r: r[1])
        fam_best = {}
        for f in ("skinny_mma", "skinny"):
            c = [r for r in rows[:-2] if family(r[0]) == f]
            fam_best[f] = min(c, key=lambda r: r[1]) if c else None
        ltu = lt[-1][1] if lt else float("nan")
        cell = lambda r: f"{r[1]:.2f} `{params(r[0])}`" if r else "-"
        out.append(f"| {M} | {N} | {K} | {best[1]:.2f} {family(best[0])} | {cell(fam_best['skinny_mma'])} | "
                   f"{cell(fam_best['skinny'])} | {dflt[1]:.2f} {family(dflt[0])} `{params(dflt[0])}` | {ltu:.2f} | "
                   f"{dflt[1] / best[1]:.3f} | {ltu / best[1]:.3f} |")
        ratios_def[M].append(dflt[1] / best[1])
        ratios_lt[M].append(ltu / best[1])
    g = lambda v: math.exp(sum(map(math.log, v)) / len(v))
    out += ["", "| M | get_default / best, geomean (max) | cuBLASLt / best, geomean (max) |", "|---|---|---|"]
    for M in sorted(ratios_def):
        out.append(f"| {M} | {g(ratios_def[M]):.3f} ({max(ratios_def[M]):.3f}) | "
                   f"{g(ratios_lt[M]):.3f} ({max(ratios_lt[M]):.3f}) |")
    out += ["", f"Rounds per point: {', '.join(map(str, sorted(reps)))}."]
    print("\n".join(out))


if __name__ == "__main__":
    main()
