#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Renders bench_gpu.json / bench_gemm.json (bench/gpu/bench_gpu.py) as the markdown
committed under bench/results/ (date, commit, versions, per grid point: µs cold and
graph for kdispatch and each peer, GB/s, fraction of the same-bytes ceiling, ratio
to the peers), plus the targets' summary. The norms part renders when the JSON has
"norms" rows, the GEMM part when it has "gemm" rows; either may be absent.

  python3 bench/gpu/render.py OUT/bench_gemm.json --commit abc1234 > bench/results/h200_gemm.md"""
import argparse
import datetime
import json
import math


def f(v, fmt="{:.2f}"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def pct(v):
    return f(100 * v if v else None, "{:.0f}%")


def mark(v, target, above=True):
    """'met' or 'MISSED' (the value against its target), '- (no data)' without a value."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "- (no data)"
    ok = v >= target if above else v <= target
    return "met" if ok else "MISSED"


def cublaslt_line(m):
    cb = m.get("cublaslt")
    if not cb:
        return "cuBLASLt versions: not recorded."

    def one(e):
        return f"{e.get('version', '?')} (`{e.get('path', '?')}`)" + (f" [{e['error']}]" if e.get("error") else "")
    t = cb.get("torch", {})
    kd = cb.get("kd_cublaslt", {})
    parts = ["libcublasLt mapped in the process: " + ("; ".join(one(e) for e in cb.get("mapped", [])) or "none")]
    parts.append("torch: " + (", ".join(one(e) for e in t.get("cublaslt", [])) or "-") +
                 f" (preferred BLAS {t.get('preferred_blas_library', '?')}, "
                 f"bf16 reduced-precision reduction {t.get('allow_bf16_reduced_precision_reduction', '?')})")
    kdl = "kdispatch: " + (", ".join(one(e) for e in kd.get("cublaslt", [])) or "-")
    if kd.get("reported"):
        kdl += f"; reports {kd['reported']}"
    if kd.get("note"):
        kdl += f" ({kd['note']})"
    parts.append(kdl)
    return ". ".join(parts) + "."


def render_gemm(r):
    """The GEMM part: a table per (N,K), then the targets over the whole grid."""
    m = r.get("meta", {})
    gm = m.get("gemm", {})
    rows = [x for x in r.get("gemm", []) if "N" in x]
    out = ["## GEMM bf16, y = x @ W^T (x: MxK, W: NxK)", "",
           "Cold µs (L2 evicted before each call); for M <= " + str(gm.get("graph_max_m", 16)) +
           ", CUDA-graph replay µs per call in brackets (rotating weight copies of >= 3x L2). "
           "variant: what kdispatch's tuned table served (its source: table, default or forced). "
           "speedup = torch µs / kdispatch µs; vs triton = Triton µs / kdispatch µs (> 1: kdispatch faster). "
           "TFLOP/s and W GB/s (weight bytes N*K*2 / time) are kdispatch's; %ceiling = the same-size read "
           "ceiling's µs / kdispatch µs (" + gm.get("ceiling", "read ceiling of the weight's bytes") + "). "
           "default = kdispatch on get_default alone. FAIL: the float64 check (rel. L2 error < " +
           str(gm.get("tol", 0.01)) + ", outputs NaN-poisoned) failed, not timed.", ""]
    if gm.get("triton_note"):
        out += [f"Triton: {gm['triton_note']}.", ""]
    out += [cublaslt_line(m), ""]

    def cell(x, name, graph=True):
        e = x.get("impls", {}).get(name)
        if e is None:
            return "-"
        if not e.get("ok", True):
            return "FAIL"
        c = e.get("cold", {}).get("us")
        g = e.get("graph", {}).get("us") if graph else None
        return f(c) + (f" ({f(g)})" if g else "")

    order = []  # (N, K) in the grid's order
    for x in rows:
        if (x["N"], x["K"]) not in order:
            order.append((x["N"], x["K"]))
    for (N, K) in order:
        sel = [x for x in rows if x["N"] == N and x["K"] == K]
        ceil = next((x["ceiling"] for x in sel if x.get("ceiling")), None)
        out += [f"### N={N}, K={K} (weights {N * K * 2 / 2**20:.0f} MiB" +
                (f"; read ceiling {f(ceil['us'])} µs = {ceil['bytes'] / ceil['us'] / 1e3:.0f} GB/s, {ceil['kind']}" +
                 "".join(f"; {lbl} {f(ceil[k])} µs" for k, lbl in
                         (("sum_us", "sum"), ("read4_us", "read kernel 4/SM"), ("read8_us", "8/SM"),
                          ("copy_us", "copy of N*K bytes (not a read ceiling: its writes stay in L2)"))
                         if ceil.get(k)) + ")"
                 if ceil and ceil.get("us") else ")"), "",
                "| M | kdispatch µs | variant | torch µs | speedup | triton µs | vs triton | TFLOP/s | "
                "W GB/s (%ceiling) | default µs |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for x in sel:
            if "impls" not in x:
                out.append(f"| {x['M']} | ERROR: {x.get('error', 'not measured')} |" + " |" * 8)
                continue
            var = x.get("kd_variant") or "-"
            if x.get("kd_source") and x.get("kd_source") != "table":
                var += f" ({x['kd_source']})"
            sp = f(x.get("speedup_vs_torch"))
            if x.get("graph_speedup_vs_torch"):
                sp += f" ({f(x['graph_speedup_vs_torch'])})"
            out.append(f"| {x['M']} | {cell(x, 'kdispatch')} | {var} | {cell(x, 'torch')} | {sp} | "
                       f"{cell(x, 'triton', False)} | {f(x.get('speedup_vs_triton'))} | "
                       f"{f(x.get('tflops'), '{:.1f}')} | {f(x.get('w_gbps'), '{:.0f}')} ({pct(x.get('frac_ceiling'))}) | "
                       f"{cell(x, 'kdispatch_default', False)} |")
        out.append("")

    meas = [x for x in rows if "impls" in x]
    sp_all = [x.get("speedup_vs_torch") for x in meas]
    small = [x for x in meas if x["M"] <= 16]
    sp_small = [x.get("speedup_vs_torch") for x in small]
    ceil_small = [x.get("frac_ceiling") for x in small if x.get("frac_ceiling")]
    g_small = [x.get("graph_speedup_vs_torch") for x in small]
    fails = [f"N{x['N']} K{x['K']} M{x['M']}: {','.join(x['failed'])}" for x in meas if x.get("failed")]
    kd_missing = [x for x in meas if not x.get("speedup_vs_torch")]
    kd_fail = [x for x in meas if "kdispatch" in (x.get("failed") or [])]
    real = [v for v in sp_all if v]
    mn = min(real) if real else None
    worst = min((x for x in meas if x.get("speedup_vs_torch")), key=lambda x: x["speedup_vs_torch"], default=None)
    cmin = min(ceil_small) if ceil_small else None
    cworst = min((x for x in small if x.get("frac_ceiling")), key=lambda x: x["frac_ceiling"], default=None)
    gs, ga = geomean(sp_small), geomean(sp_all)
    out += ["### GEMM summary (the issue's targets, cold, over the grid above)", "",
            "| target | value | |", "|---|---|---|",
            f"| min speedup vs torch, all points (>= 0.97) | {f(mn)}" +
            (f" at N={worst['N']} K={worst['K']} M={worst['M']}" if worst else "") + f" | {mark(mn, 0.97)} |",
            f"| %ceiling at M <= 16, every point (>= 90%) | min {pct(cmin)}" +
            (f" at N={cworst['N']} K={cworst['K']} M={cworst['M']}" if cworst else "") +
            f" | {mark(cmin, 0.90)} |",
            f"| geomean speedup vs torch, M <= 16 (>= 1.10) | {f(gs)} | {mark(gs, 1.10)} |",
            f"| geomean speedup vs torch, all points (>= 1.03) | {f(ga)} | {mark(ga, 1.03)} |",
            "| tiled family alone at M >= 1024 | not in this JSON (a forced-variant run) | - |",
            f"| kdispatch passes the float64 check at every point | {len(meas) - len(kd_fail)}/{len(meas)} | "
            f"{'met' if meas and not kd_fail else 'MISSED'} |",
            "",
            f"Graph replay at M <= 16: geomean speedup vs torch {f(geomean(g_small))}; "
            f"geomean get_default/tuned {f(geomean([x.get('default_over_tuned') for x in meas]))}; "
            f"geomean speedup vs Triton {f(geomean([x.get('speedup_vs_triton') for x in meas]))}. "
            f"{len(meas)} point(s) measured" +
            (f", {len(kd_missing)} without a kdispatch time (counted out of the geomeans)" if kd_missing else "") +
            ".", ""]
    if fails:
        out += ["Points with a failed implementation: " + "; ".join(fails[:40]) +
                (f" (+{len(fails) - 40} more)" if len(fails) > 40 else ""), ""]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="bench_gpu.json or bench_gemm.json written by bench/gpu/bench_gpu.py")
    ap.add_argument("--commit", default="unknown", help="the commit the numbers were measured at (KD_COMMIT)")
    a = ap.parse_args()
    r = json.load(open(a.json))
    m = r.get("meta", {})
    gemm_only = bool(r.get("gemm")) and not r.get("norms")
    out = [f"# kdispatch on the H200 — {datetime.date.today().isoformat()}, commit {a.commit}", "",
           f"Device `{m.get('device')}`, driver {m.get('driver', 'unknown')}; torch {m.get('torch')} "
           f"(CUDA {m.get('torch_cuda')}), Triton {m.get('triton')}; L2 {m.get('l2_bytes')} B. Produced by "
           + ("`bench/gpu/run_h200.sh --sections gemm-bench` (bench/gpu/bench_gpu.py --sections gemm)"
              if gemm_only else "`bench/gpu/run_h200.sh --sections bench` (bench/gpu/bench_gpu.py)") +
           "; method: bench/gpu/gpu_timing.py "
           "(cold = L2 evicted before each call, host cost hidden" +
           ("; a GEMM point's implementations timed in turns, 5 calls each, the order rotated per round"
            if gemm_only else "") + "; graph = CUDA-graph replay per node). "
           "Every row's implementations, " + ("read" if gemm_only else "copy") +
           " ceiling and ratios come from one run.", ""]
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
    if r.get("gemm"):
        out += render_gemm(r)
    if r.get("errors"):
        out += ["## Errors", ""] + [f"- {e.get('where')}: {e.get('error')}" for e in r["errors"][:50]]
    print("\n".join(out))


if __name__ == "__main__":
    main()
