#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 22's serving check: a bf16 GEMM grid served from the configs of one
tuning process and from the merge of shards tuned apart, in one process, on
one GPU.

Three runtimes, each loading one dir and nothing else (no shipped configs,
an empty cache): `single` (one process's emit dir), `single_again` (the same
dir loaded a second time: the noise pair), `merged` (kdispatch merge of the
shards). Per point (M, N, K) of --grid: every runtime's output checked
against float64 first, what each serves recorded (variant, table or
default), then the three timed interleaved (bench/gpu/gpu_timing.py's
cold_interleaved: L2 evicted before each call, CUDA events, medians).

Targets (the issue): geomean(merged / single) - 1 within |geomean(single_again
/ single) - 1| + 1 %; no point's merged / single above 1 + the pair's largest
per-point |single_again / single - 1| + 2 %.

    PYTHONPATH=build/gpu/python python3 bench/gpu/shard_serving.py --single A --merged B --grid grid.csv --out x.json
"""
import argparse
import csv
import json
import math
import os
import sys
import tempfile

import torch


def row_of(root, m, n, k):
    """The row of M in the dir's cuda/gemm table of (N, K) (None when absent)."""
    d = os.path.join(root, "cuda", "gemm")
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if f.startswith(f"N={n},K={k},") and f.endswith(".json"):
            with open(os.path.join(d, f)) as fh:
                return json.load(fh).get(str(m))
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--single", required=True, help="emit dir of the one-process run")
    ap.add_argument("--merged", required=True, help="the merged shards' dir")
    ap.add_argument("--grid", required=True, help="CSV M,N,K (the tuned shapes)")
    ap.add_argument("--rep-ms", type=float, default=20.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import kdispatch
    import kdispatch.torch_ops as kops
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_timing import Timer

    nocache = tempfile.mkdtemp(prefix="kd-shard-serving-")
    rts = {
        "single": kdispatch.Runtime(config_dirs=[a.single], shipped_configs=False, cache_dir=nocache),
        "single_again": kdispatch.Runtime(config_dirs=[a.single], shipped_configs=False, cache_dir=nocache),
        "merged": kdispatch.Runtime(config_dirs=[a.merged], shipped_configs=False, cache_dir=nocache),
    }
    timer = Timer(torch, "cuda")
    points = []
    with open(a.grid) as f:
        for r in csv.DictReader(f):
            points.append((int(r["M"]), int(r["N"]), int(r["K"])))
    g = torch.Generator("cuda").manual_seed(22)
    rows, bad = [], []
    for m, n, k in points:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda", generator=g)
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda", generator=g) / math.sqrt(k)
        ref = x.double() @ w.double().t()
        row = {"M": m, "N": n, "K": k, "served": {}, "rel_err": {}}
        fns = {}
        for name, rt in rts.items():
            kops.set_runtime(rt)
            y, info = kops.gemm_info(x, w)
            row["served"][name] = {kk: info.get(kk) for kk in ("variant", "source", "M")}
            e = float((y.double() - ref).norm() / ref.norm())
            row["rel_err"][name] = e
            if not e < 1e-2:
                bad.append(f"{name} {m}x{n}x{k}: rel. error {e:.3g}")

            def call(rt=rt):
                kops.set_runtime(rt)
                return torch.ops.kdispatch.gemm(x, w)
            fns[name] = call
        t = timer.cold_interleaved(fns, rep_ms=a.rep_ms)
        row["us"] = {nm: t[nm]["us"] for nm in fns}
        row["merged_over_single"] = t["merged"]["us"] / t["single"]["us"]
        row["again_over_single"] = t["single_again"]["us"] / t["single"]["us"]
        row["config"] = {"single": row_of(a.single, m, n, k), "merged": row_of(a.merged, m, n, k)}
        # A point without a row in either dir (skipped by --max-flops, a failed unit) is not "the same config".
        row["same_config"] = row["config"]["single"] is not None and row["config"]["single"] == row["config"]["merged"]
        rows.append(row)
        print(f"{m}x{n}x{k}: single {t['single']['us']:.2f} us, again {t['single_again']['us']:.2f}, merged "
              f"{t['merged']['us']:.2f} (same config: {row['same_config']})", flush=True)
    if not rows:
        print("no grid points", file=sys.stderr)
        return 1
    gm = lambda v: math.exp(sum(math.log(x) for x in v) / len(v))  # noqa: E731
    g_merged = gm([r["merged_over_single"] for r in rows])
    g_again = gm([r["again_over_single"] for r in rows])
    worst_pair = max(abs(r["again_over_single"] - 1) for r in rows)
    worst_merged = max(r["merged_over_single"] for r in rows)
    out = {
        "points": len(rows), "same_config": sum(r["same_config"] for r in rows),
        "geomean_merged_over_single": g_merged, "geomean_again_over_single": g_again,
        "pair_largest_point_diff": worst_pair, "merged_largest_point_ratio": worst_merged,
        "geomean_target": "met" if abs(g_merged - 1) <= abs(g_again - 1) + 0.01 else "missed",
        "point_target": "met" if worst_merged <= 1 + worst_pair + 0.02 else "missed",
        "correctness_failures": bad, "rows": rows,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
