#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Renders bench_gpu.json (bench/gpu/bench_gpu.py) as the markdown table committed
under bench/results/ (date, commit, versions, per grid point: µs cold and graph
for kdispatch and each peer, GB/s, fraction of the same-bytes copy ceiling, ratio
to the best peer), plus the targets' summary."""
import argparse
import datetime
import json
import math


def f(v, fmt="{:.2f}"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args()
    r = json.load(open(a.json))
    m = r.get("meta", {})
    out = [f"# kdispatch on the H200 — {datetime.date.today().isoformat()}, commit {a.commit}", "",
           f"Device `{m.get('device')}`, driver {m.get('driver', 'unknown')}; torch {m.get('torch')} "
           f"(CUDA {m.get('torch_cuda')}), Triton {m.get('triton')}; L2 {m.get('l2_bytes')} B. Produced by "
           "`bench/gpu/run_h200.sh --sections bench` (bench/gpu/bench_gpu.py); method: bench/gpu/gpu_timing.py "
           "(cold = L2 evicted before each call, host cost hidden; graph = CUDA-graph replay per node). "
           "Every row's implementations, copy ceiling and ratios come from one run.", ""]
    if m.get("resumed_from"):
        out += [f"The grid took more than one device call: {m['resumed_from'].get('points', '?')} point(s) come from "
                f"earlier calls (resumed), {m.get('points_done', '?')} in all; {m.get('points_left', 0)} not measured.",
                ""]
    rows = r.get("norms", [])
    if rows:
        for op in sorted({x["op"] for x in rows}):
            for dt in sorted({x["dtype"] for x in rows}):
                sel = [x for x in rows if x["op"] == op and x["dtype"] == dt and "impls" in x]
                if not sel:
                    continue
                names = [n for n in sel[0]["impls"] if n != "copy_same_bytes"]
                out += [f"## {op}, {dt}", "",
                        "Cold µs per implementation; graph µs in brackets. GB/s and %copy are kdispatch's; "
                        "vs peer = best peer time / kdispatch time (>1: kdispatch faster).", "",
                        "| hidden | tokens | " + " | ".join(names) + " | copy | GB/s | %copy | vs peer cold | vs peer graph | default/tuned |",
                        "|" + "---|" * (len(names) + 8)]
                for x in sel:
                    im = x["impls"]
                    cells = []
                    for n in names:
                        v = im.get(n, {})
                        c = v.get("cold", {}).get("us")
                        g = v.get("graph", {}).get("us")
                        cells.append(("FAIL" if v and not v.get("ok", True) else f(c)) + (f" ({f(g)})" if g else ""))
                    out.append(f"| {x['hidden']} | {x['tokens']} | " + " | ".join(cells) +
                               f" | {f(im.get('copy_same_bytes', {}).get('cold', {}).get('us'))} | {f(x.get('gbps'), '{:.0f}')} | "
                               f"{f(100 * x['frac_of_copy'] if x.get('frac_of_copy') else None, '{:.0f}%')} | "
                               f"{f(x.get('ratio_cold_vs_best_peer'))} | {f(x.get('ratio_graph_vs_best_peer'))} | "
                               f"{f(x.get('default_over_tuned'))} |")
                cold = [x.get("ratio_cold_vs_best_peer") for x in sel]
                graph = [x.get("ratio_graph_vs_best_peer") for x in sel]
                small_graph = [x.get("ratio_graph_vs_best_peer") for x in sel if x["tokens"] <= 1024]
                big_copy = [x.get("frac_of_copy") for x in sel if x["tokens"] >= 8192]
                dflt = [x.get("default_over_tuned") for x in sel]
                out += ["", f"Summary {op} {dt}: min ratio cold {f(min([c for c in cold if c] or [float('nan')]))} "
                        f"(target >= 0.97), min graph {f(min([g for g in graph if g] or [float('nan')]))} (>= 0.97), "
                        f"graph geomean tokens<=1024 {f(geomean(small_graph))} (>= 1.15), "
                        f"min %copy at >= 8192 tokens {f(100 * min([b for b in big_copy if b] or [float('nan')]), '{:.0f}%')} (>= 90%), "
                        f"get_default/tuned geomean {f(geomean(dflt))} (<= 1.10).", ""]
    if r.get("errors"):
        out += ["## Errors", ""] + [f"- {e.get('where')}: {e.get('error')}" for e in r["errors"][:50]]
    print("\n".join(out))


if __name__ == "__main__":
    main()
