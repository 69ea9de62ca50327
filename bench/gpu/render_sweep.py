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
    pts = collections.defaultdict(list)  # (M, N, K) -> [(plan, us, rounds)] of the points timed
    tagged = collections.defaultdict(dict)  # (M, N, K) -> {"default" | "cublaslt": (plan, us, rounds)}
    for r in csv.DictReader(open(a.csv)):
        key = (int(r["M"]), int(r["N"]), int(r["K"]))
        row = (r["variant"], float(r["a_us"]), int(r["value"]))
        if r["what"] == "sweep":
            if row[2] > 0:  # 0 rounds: the point failed to launch
                pts[key].append(row)
        elif r["what"] == "sweep_default":
            tagged[key]["default"] = row
        elif r["what"] == "sweep_cublaslt":
            tagged[key]["cublaslt"] = row
    out = [f"# Decode-family sweep on the H200 — {datetime.date.today().isoformat()}, commit {a.commit}", "",
           "Produced by `KD_GEMM_SWEEP_M=1,2,4,8,16 bench/gpu/run_h200.sh --sections gemm-host` "
           "(bench/gpu/gpu_gemm_bench.cpp --sweep; rendered by bench/gpu/render_sweep.py). Every point of the "
           "skinny and skinny_mma spaces, the plan get_default picks and cuBLASLt's first pick (algo_id -1), "
           "each timed once per round (a plan equal to another is that one), with the tuner's clock (a 256 MiB "
           "L2-evicting read before each launch, CUDA events around the launch alone), a fresh random order "
           "every round; median per point. This is the data behind get_default's decode rules "
           "(kernels/gpu/gemm_variants.inc).", "",
           "| M | N | K | best point (µs) | best skinny_mma | best skinny | get_default | cuBLASLt | "
           "default / best | cuBLASLt / best |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    ratios_def, ratios_lt = collections.defaultdict(list), collections.defaultdict(list)
    reps = set()
    skipped = 0
    for (M, N, K) in sorted(pts):
        rows = pts[(M, N, K)]
        tg = tagged.get((M, N, K), {})
        if "default" not in tg or "cublaslt" not in tg or tg["default"][2] == 0 or tg["cublaslt"][2] == 0:
            skipped += 1  # an incomplete point (the run stopped inside it) or a failed pick
            continue
        reps.update(r for _, _, r in rows)
        dflt, lt = tg["default"], tg["cublaslt"]
        best = min(rows, key=lambda r: r[1])
        fam_best = {}
        for f in ("skinny_mma", "skinny"):
            c = [r for r in rows if family(r[0]) == f]
            fam_best[f] = min(c, key=lambda r: r[1]) if c else None
        cell = lambda r: f"{r[1]:.2f} `{params(r[0])}`" if r else "-"
        out.append(f"| {M} | {N} | {K} | {best[1]:.2f} {family(best[0])} | {cell(fam_best['skinny_mma'])} | "
                   f"{cell(fam_best['skinny'])} | {dflt[1]:.2f} {family(dflt[0])} `{params(dflt[0])}` | {lt[1]:.2f} | "
                   f"{dflt[1] / best[1]:.3f} | {lt[1] / best[1]:.3f} |")
        ratios_def[M].append(dflt[1] / best[1])
        ratios_lt[M].append(lt[1] / best[1])
    g = lambda v: math.exp(sum(map(math.log, v)) / len(v))
    out += ["", "| M | get_default / best, geomean (max) | cuBLASLt / best, geomean (max) |", "|---|---|---|"]
    for M in sorted(ratios_def):
        out.append(f"| {M} | {g(ratios_def[M]):.3f} ({max(ratios_def[M]):.3f}) | "
                   f"{g(ratios_lt[M]):.3f} ({max(ratios_lt[M]):.3f}) |")
    out += ["", f"Rounds per point: {', '.join(map(str, sorted(reps)))}." +
            (f" {skipped} incomplete point(s) left out." if skipped else "")]
    print("\n".join(out))


if __name__ == "__main__":
    main()
