#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Ratios of kdispatch's CUDA norms to the best peer, from one device run.

  python3 compare_peers.py --peers DIR/h200-baseline.json --ours gpu_norm_bench.csv

--peers: the JSON of ../shared/peers/h200_baseline.py --sections rmsnorm,fused
run in the same device call as kdispatch_gpu_norm_bench (--ours, its CSV).
Speed ratio = best peer time / our time (> 1: we are faster). Printed per
(op, hidden, tokens): cold and graph ratios for get_default's plan ("def")
and for the best point of the space ("tuned"), %copy bandwidth, and
default / tuned. Then the issue's targets:
  cold and graph ratio >= 0.97 at every point; >= 90% of copy bandwidth at
  >= 8192 tokens; graph geomean >= 1.15 for tokens <= 1024; default within
  10% of tuned on geomean.
"""
import argparse
import csv
import json
import math
from collections import defaultdict


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", required=True)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--copy-bw", type=float, default=None, help="GB/s (default: the peers' run, else 4234)")
    a = ap.parse_args()
    with open(a.peers) as f:
        P = json.load(f)
    ceil = P.get("ceilings") if isinstance(P.get("ceilings"), dict) else {}
    copy_bw = a.copy_bw or (ceil.get("copy_1GiB") or {}).get("GBps") or 4234.0

    peers = {}
    for op, key in (("rmsnorm", "rmsnorm"), ("fused_add_rmsnorm", "fused_add_rmsnorm")):
        for row in P.get(key, []) or []:
            best_c, best_g, names = float("inf"), float("inf"), {}
            for name, pr in row.get("peers", {}).items():
                if not pr.get("ok", True):
                    continue
                if "us" in pr and pr["us"] < best_c:
                    best_c, names["cold"] = pr["us"], name
                if "graph_us" in pr and pr["graph_us"] < best_g:
                    best_g, names["graph"] = pr["graph_us"], name
            peers[(op, row["hidden"], row["tokens"])] = (best_c, best_g, names, row["bytes"])

    ours = defaultdict(list)
    with open(a.ours) as f:
        for r in csv.DictReader(f):
            ours[(r["op"], int(r["hidden"]), int(r["tokens"]))].append(r)

    print(f"copy bandwidth {copy_bw:.0f} GB/s; ratio = best peer time / kdispatch time (>1 faster)")
    hdr = (f"{'op':18} {'hidden':>6} {'tokens':>6} | {'peer us':>8} {'def us':>8} {'tun us':>8} {'cold def':>8} "
           f"{'cold tun':>8} | {'peer g':>7} {'def g':>7} {'tun g':>7} {'grph def':>8} {'grph tun':>8} | "
           f"{'%copy':>6} {'def/tun':>7} | default plan")
    print(hdr)
    cold_def, cold_tun, g_def, g_tun, def_vs_tun, bw_fail = [], [], [], [], [], []
    small_g_def, small_g_tun = [], []
    for key in sorted(ours, key=lambda k: (k[0], k[1], k[2])):
        if key not in peers:
            continue
        pc, pg, names, nbytes = peers[key]
        rows = ours[key]
        d = next(r for r in rows if r["is_default"] == "1")
        dc, dg = float(d["cold_us"]), float(d["graph_us"])
        tc = min(float(r["cold_us"]) for r in rows)
        gs = [float(r["graph_us"]) for r in rows if float(r["graph_us"]) > 0]
        tg = min(gs) if gs else -1.0
        rc_d, rc_t = pc / dc, pc / tc
        rg_d = pg / dg if dg > 0 and math.isfinite(pg) else float("nan")
        rg_t = pg / tg if tg > 0 and math.isfinite(pg) else float("nan")
        frac = nbytes / (dc * 1e-6) / 1e9 / copy_bw
        cold_def.append((rc_d, key))
        cold_tun.append((rc_t, key))
        if math.isfinite(rg_d):
            g_def.append((rg_d, key))
            g_tun.append((rg_t, key))
            if key[2] <= 1024:
                small_g_def.append(rg_d)
                small_g_tun.append(rg_t)
        def_vs_tun.append(dc / tc)
        if key[2] >= 8192 and frac < 0.90:
            bw_fail.append((frac, key))
        print(f"{key[0]:18} {key[1]:6d} {key[2]:6d} | {pc:8.2f} {dc:8.2f} {tc:8.2f} {rc_d:8.3f} {rc_t:8.3f} | "
              f"{pg:7.2f} {dg:7.2f} {tg:7.2f} {rg_d:8.3f} {rg_t:8.3f} | {100 * frac:5.1f}% {dc / tc:7.3f} | {d['plan']}")

    def worst(xs):
        return min(xs) if xs else (float("nan"), None)

    print()
    print(f"cold  ratio: min default {worst(cold_def)[0]:.3f} at {worst(cold_def)[1]}, "
          f"min tuned {worst(cold_tun)[0]:.3f} at {worst(cold_tun)[1]}; geomean default {geomean([x for x, _ in cold_def]):.3f}")
    print(f"graph ratio: min default {worst(g_def)[0]:.3f} at {worst(g_def)[1]}, "
          f"min tuned {worst(g_tun)[0]:.3f} at {worst(g_tun)[1]}")
    print(f"graph geomean tokens<=1024: default {geomean(small_g_def):.3f}, tuned {geomean(small_g_tun):.3f} (target >= 1.15)")
    print(f"cold points below 0.97: default {sum(1 for x, _ in cold_def if x < 0.97)}, tuned {sum(1 for x, _ in cold_tun if x < 0.97)}"
          f" of {len(cold_def)}; graph below 0.97: default {sum(1 for x, _ in g_def if x < 0.97)}, tuned "
          f"{sum(1 for x, _ in g_tun if x < 0.97)} of {len(g_def)}")
    print(f">= 8192 tokens below 90% copy (default plan): {len(bw_fail)} {[(round(f, 3), k) for f, k in bw_fail]}")
    print(f"default / tuned (cold): geomean {geomean(def_vs_tun):.3f}, max {max(def_vs_tun) if def_vs_tun else float('nan'):.3f} (target geomean <= 1.10)")


if __name__ == "__main__":
    main()
