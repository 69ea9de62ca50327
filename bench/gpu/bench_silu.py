#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kdispatch's silu_and_mul on the GPU beside what an engine runs without it, one run.

  out[t, i] = silu(x[t, i]) * x[t, d + i],  x [tokens, 2d], out [tokens, d]

Per point (dtype x d x tokens; defaults bf16,fp16 x 4864,14336,18944 x
1,8,64,512,4096,16384):
  ours      kdispatch's silu_and_mul (get_default or the tuned table of --configs)
            through its torch op, torch.ops.kdispatch.silu_and_mul(x) (kdispatch.torch_ops,
            on torch's current stream), as the other sections time ops; the variant
            it served is recorded (kdispatch.torch_ops.call_info);
  eager     F.silu(x[:, :d]) * x[:, d:] (two kernels and a temporary);
  compiled  the same expression under torch.compile (Inductor fuses it into one
            Triton kernel; compiled once per point, dynamic=False);
each checked against a float64 reference on fresh data (outputs NaN-poisoned)
before it is timed, then timed
  cold      CUDA events around each call, a 256 MiB read evicting L2 before each,
            calls enqueued behind a GPU sleep so host cost stays out, the three in
            turns (bench/gpu/gpu_timing.py: cold_interleaved); median;
  graph     calls captured back to back in one CUDA graph over rotating input sets
            (>= 3x L2 where it fits, at most 64 sets), median replay time / calls.
The copy rate B_copy (bytes moved per second: read + write) of a device-to-device
copy of max(4x L2, 200 MB) is measured in the same run, cold, at the start and at
the end (the larger rate counts); at tokens >= 4096 a row reports
ours_cold / ((3 * tokens * d * elem_bytes) / B_copy): 1.00 = a copy's speed for the
op's bytes (2d read + d written per token).

  python3 bench/gpu/bench_silu.py --lib build/gpu/libkdispatch.so --configs configs --out OUT \\
      [--resume PREVIOUS/bench_silu.json] [--budget-s 520]
  python3 bench/gpu/bench_silu.py --render OUT/bench_silu.json --commit abc1234 > h200_silu.md

Exit status: 0 when every point is in the JSON (bench_silu.json in --out), 3 when the
time budget left points out (run again with --resume), 1 on an error.
"""
import argparse
import datetime
import json
import math
import os
import sys
import tempfile
import time

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def point_key(row):
    return (row["dtype"], int(row["d"]), int(row["tokens"]))


# ---------------------------------------------------------------- rendering

def _f(v, fmt="{:.2f}"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def render(res, commit):
    m = res.get("meta", {})
    rows = sorted((r for r in res.get("silu", []) if "impls" in r), key=point_key)
    out = [f"## silu_and_mul on {m.get('device', '?')}", "",
           f"{datetime.date.today().isoformat()}, commit {commit}; torch {m.get('torch', '?')} (CUDA "
           f"{m.get('torch_cuda', '?')}), Triton {m.get('triton', '?')}, driver {m.get('driver', '?')}; "
           f"kdispatch through {m.get('ours_path', '?')}; configs: {m.get('configs', '?')}.", "",
           "Method: bench/gpu/bench_silu.py (cold: L2 evicted before each call, the three in turns, median; "
           "graph: CUDA-graph replay over rotating input sets, median per call). "
           f"B_copy = {_f(m.get('b_copy_gbps'), '{:.0f}')} GB/s moved (read + write) by a device-to-device copy of "
           f"{_f((m.get('copy_bytes') or 0) / 1e6, '{:.0f}')} MB, cold, this run "
           f"(start {_f(m.get('b_copy_start_gbps'), '{:.0f}')}, end {_f(m.get('b_copy_end_gbps'), '{:.0f}')} GB/s). "
           "x = their time / ours (> 1: ours faster). vs copy = ours cold / (3 * tokens * d * bytes / B_copy), "
           "tokens >= 4096.", ""]
    hdr = ("| dtype | d | tokens | ours cold | eager cold | compiled cold | ours graph | eager graph | "
           "compiled graph | vs eager cold | vs compiled cold | vs eager graph | vs compiled graph | vs copy | "
           "served |")
    out += [hdr, "|" + "---|" * 15]
    for r in rows:
        im = r["impls"]

        def us(name, kind):
            return (im.get(name, {}).get(kind) or {}).get("us")
        fails = ", ".join(r.get("failed", []))
        out.append("| " + " | ".join([
            r["dtype"], str(r["d"]), str(r["tokens"]),
            _f(us("ours", "cold")), _f(us("eager", "cold")), _f(us("compiled", "cold")),
            _f(us("ours", "graph")), _f(us("eager", "graph")), _f(us("compiled", "graph")),
            _f(r.get("x_eager_cold"), "{:.2f}x"), _f(r.get("x_compiled_cold"), "{:.2f}x"),
            _f(r.get("x_eager_graph"), "{:.2f}x"), _f(r.get("x_compiled_graph"), "{:.2f}x"),
            _f(r.get("vs_copy"), "{:.2f}"),
            (r.get("served") or "-") + (f" (FAILED: {fails})" if fails else "")]) + " |")
    out.append("")
    for kind in ("cold", "graph"):
        for peer in ("eager", "compiled"):
            g = _geomean([r.get(f"x_{peer}_{kind}") for r in rows])
            out.append(f"- ours vs {peer}, {kind}: geomean {_f(g, '{:.2f}x')} over "
                       f"{sum(1 for r in rows if r.get(f'x_{peer}_{kind}'))} point(s)")
    vc = [r["vs_copy"] for r in rows if r.get("vs_copy")]
    if vc:
        out.append(f"- tokens >= 4096: ours at {_f(_geomean(vc))}x the copy-rate time (geomean; "
                   f"worst {_f(max(vc))}x)")
    errs = res.get("errors", [])
    if errs:
        out += ["", "Errors:"] + [f"- {e.get('where')}: {e.get('error')}" for e in errs]
    if m.get("points_left"):
        out += ["", f"INCOMPLETE: {m['points_left']} point(s) not measured (time budget)."]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- measuring

def make_ours(torch):
    """(call(x, out) -> result, description): kdispatch's silu_and_mul through its torch
    op (kdispatch.torch_ops registers one per op of the library's op list: functional,
    out = silu_and_mul(x), on torch's current stream), as the other sections time ops."""
    ns = getattr(torch.ops, "kdispatch", None)
    try:
        op = getattr(ns, "silu_and_mul")
    except (AttributeError, RuntimeError) as e:
        raise RuntimeError("torch.ops.kdispatch.silu_and_mul is not registered (kdispatch.torch_ops of this "
                           f"checkout has no such op): {e!r}") from e
    try:
        nargs = len(op.default._schema.arguments)
    except Exception:  # noqa: BLE001
        nargs = 1
    if nargs >= 2:  # an in-place form silu_and_mul(out, x), as vLLM's
        fn = lambda x, out: (op(out, x), out)[1]  # noqa: E731
        fn.needs_out = True
        return fn, "torch.ops.kdispatch.silu_and_mul(out, x)"
    return (lambda x, out: op(x)), "torch.ops.kdispatch.silu_and_mul(x)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path of libkdispatch.so (with the CUDA backend)")
    ap.add_argument("--configs", default="configs", help="configs dir (the tuned table); missing: get_default only")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--ds", default="4864,14336,18944")
    ap.add_argument("--tokens", default="1,8,64,512,4096,16384")
    ap.add_argument("--rep-ms", type=float, default=20.0, help="cold timing budget per implementation and point")
    ap.add_argument("--budget-s", type=float, default=520.0, help="stop starting new points after this")
    ap.add_argument("--resume", default=None, help="bench_silu.json of an earlier run: keep its points")
    ap.add_argument("--out", default=".")
    ap.add_argument("--tol", type=float, default=1e-2, help="relative L2 error vs float64 that fails a point")
    ap.add_argument("--render", default=None, metavar="JSON", help="print the markdown of a bench_silu.json and exit")
    ap.add_argument("--commit", default="unknown", help="--render: the commit the run measured")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            sys.stdout.write(render(json.load(f), args.commit))
        return 0
    if not args.lib:
        ap.error("--lib is required (or --render)")
    os.makedirs(args.out, exist_ok=True)
    os.environ["KDISPATCH_LIBRARY"] = os.path.abspath(args.lib)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "integrations", "python"))
    sys.path.insert(0, here)
    import torch
    import torch.nn.functional as F
    import kdispatch
    import kdispatch.torch_ops as kops
    from gpu_timing import Timer

    dev = "cuda"
    torch.manual_seed(4321)
    props = torch.cuda.get_device_properties(0)
    L2 = int(getattr(props, "L2_cache_size", 50 * 2**20) or 50 * 2**20)
    res = {"meta": {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "torch_cuda": torch.version.cuda, "l2_bytes": L2,
                    "kdispatch": getattr(kdispatch, "__version__", "?")},
           "errors": [], "silu": []}
    try:
        import triton
        res["meta"]["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        res["meta"]["triton"] = f"unavailable: {e!r}"
    try:
        import subprocess
        res["meta"]["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True,
            timeout=20).stdout.strip().splitlines()[0]
    except Exception as e:  # noqa: BLE001
        res["meta"]["driver"] = f"unknown ({e!r})"
    prev = {}
    if args.resume and os.path.isfile(args.resume):
        try:
            with open(args.resume) as f:
                old = json.load(f)
            prev = {point_key(r): r for r in old.get("silu", []) if "impls" in r}
            res["meta"]["resumed_from"] = {"points": len(prev), "meta": old.get("meta", {})}
            log(f"resume: {len(prev)} point(s) from {args.resume}")
        except Exception as e:  # noqa: BLE001
            res["errors"].append({"where": "resume", "error": repr(e)})
    deadline = T0 + args.budget_s

    def save():
        res["meta"]["elapsed_s"] = round(time.time() - T0, 1)
        tmp = os.path.join(args.out, ".bench_silu.json.tmp")
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1, default=str)
        os.replace(tmp, os.path.join(args.out, "bench_silu.json"))

    timer = Timer(torch, dev)

    # ---------------- kdispatch: the runtime of --configs (tuned rows where it has them) ----------------
    nocache = tempfile.mkdtemp(prefix="kd-bench-silu-no-cache-")
    have_configs = os.path.isdir(args.configs)
    rt = kdispatch.Runtime(config_dirs=[args.configs] if have_configs else [], shipped_configs=False,
                           cache_dir=nocache)
    kops.set_runtime(rt)
    res["meta"]["configs"] = args.configs if have_configs else "none (get_default)"
    ours, how = make_ours(torch)
    res["meta"]["ours_path"] = how
    log(f"ours: {how}")

    # ---------------- torch.compile: one compiled function per point ----------------
    try:
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 1024)
    except Exception as e:  # noqa: BLE001
        res["errors"].append({"where": "dynamo config", "error": repr(e)})

    def make_eager(d):
        return lambda x, out: F.silu(x[:, :d]) * x[:, d:]

    def make_compiled(d):
        def silu_mul(x):
            return F.silu(x[:, :d]) * x[:, d:]
        c = torch.compile(silu_mul, dynamic=False, fullgraph=True)
        return lambda x, out: c(x)

    # ---------------- the copy rate, same run ----------------
    copy_bytes = max(4 * L2, 200 * 10**6)
    csrc = torch.empty(copy_bytes, dtype=torch.uint8, device=dev)
    cdst = torch.empty_like(csrc)

    def copy_rate():
        t = timer.cold(lambda: cdst.copy_(csrc), rep_ms=100.0, min_iters=10)["us"]
        return 2.0 * copy_bytes / (t * 1e-6) / 1e9  # GB/s, read + write

    b0 = copy_rate()
    res["meta"].update({"copy_bytes": copy_bytes, "b_copy_start_gbps": b0, "b_copy_gbps": b0})
    log(f"B_copy: {b0:.0f} GB/s moved (copy of {copy_bytes / 1e6:.0f} MB, cold)")

    DT = {"bf16": torch.bfloat16, "fp16": torch.float16}
    dtypes = [s.strip() for s in args.dtypes.split(",") if s.strip()]
    ds = [int(s) for s in args.ds.split(",") if s.strip()]
    tokens = [int(s) for s in args.tokens.split(",") if s.strip()]
    incomplete = 0
    for dname in dtypes:
        dt = DT[dname]
        es = torch.empty(0, dtype=dt).element_size()
        for d in ds:
            for T in tokens:
                key = (dname, d, T)
                if key in prev:
                    res["silu"].append(prev[key])
                    continue
                if time.time() > deadline:
                    incomplete += 1
                    continue
                row = {"dtype": dname, "d": d, "tokens": T, "bytes": 3 * T * d * es}
                try:
                    measure_point(torch, kops, timer, row, dt, d, T, L2, ours, make_eager(d), make_compiled(d),
                                  args, dev)
                except Exception as ex:  # noqa: BLE001
                    res["errors"].append({"where": f"silu {dname} d{d} T{T}", "error": repr(ex)})
                    log(f"ERROR silu {dname} d{d} T{T}: {ex!r}")
                res["silu"].append(row)
                save()
                torch.cuda.empty_cache()
    b1 = copy_rate()
    b = max(b0, b1)
    res["meta"].update({"b_copy_end_gbps": b1, "b_copy_gbps": b})
    log(f"B_copy at the end: {b1:.0f} GB/s; using {b:.0f} GB/s")
    for row in res["silu"]:
        kd = ((row.get("impls") or {}).get("ours") or {}).get("cold", {}).get("us")
        if kd and row["tokens"] >= 4096:
            row["vs_copy"] = kd / (row["bytes"] / (b * 1e9) * 1e6)
    res["meta"]["points_done"] = sum(1 for r in res["silu"] if "impls" in r)
    res["meta"]["points_left"] = incomplete
    save()
    log(f"silu: {res['meta']['points_done']} point(s) measured (this run and resumed), {incomplete} left")
    return 3 if incomplete else 0


def measure_point(torch, kops, timer, row, dt, d, T, L2, ours, eager, compiled, args, dev):
    x = (torch.randn(T, 2 * d, device=dev) * 2.0).to(dt)
    xd = x.double()
    g, u = xd[:, :d], xd[:, d:]
    ref = g / (1.0 + torch.exp(-g)) * u
    impls = {"ours": ours, "eager": eager, "compiled": compiled}
    out = {}
    # correctness first: fresh data, outputs NaN-poisoned (the ops allocate their output:
    # hand the caching allocator a NaN-filled block of that size first, freed at once,
    # which it gives to the next same-size request on this stream; an in-place form
    # gets it as its out)
    for name, fn in impls.items():
        e = out[name] = {}
        try:
            if getattr(fn, "needs_out", False):
                got = fn(x, torch.full((T, d), float("nan"), dtype=dt, device=dev))
            else:
                torch.full((T, d), float("nan"), dtype=dt, device=dev)
                got = fn(x, None)
            torch.cuda.synchronize()
            finite = bool(torch.isfinite(got).all())
            err = float((got.double() - ref).norm() / max(float(ref.norm()), 1e-30)) if finite else float("inf")
            e.update({"rel_err": err, "ok": finite and err < args.tol})
        except Exception as ex:  # noqa: BLE001
            e.update({"ok": False, "error": repr(ex)})
    # what kdispatch served (the table row or get_default): the op's own path, with its info
    try:
        _, served = kops.call_info("silu_and_mul", x)
        row["served"] = served.get("variant")
        row["served_source"] = served.get("source")
    except Exception as ex:  # noqa: BLE001
        row["served_error"] = repr(ex)
    # cold, in turns
    passed = {}
    for name, fn in impls.items():
        if out[name].get("ok"):
            o = torch.empty(T, d, dtype=dt, device=dev)
            passed[name] = (lambda fn=fn, o=o: fn(x, o))
    if passed:
        try:
            for name, r in timer.cold_interleaved(passed, rep_ms=args.rep_ms).items():
                out[name]["cold"] = r
        except Exception as ex:  # noqa: BLE001
            for name, fn in passed.items():
                try:
                    out[name]["cold"] = timer.cold(fn, rep_ms=args.rep_ms)
                except Exception as ex2:  # noqa: BLE001
                    out[name]["cold_error"] = repr(ex2)
            row["cold_interleaved_error"] = repr(ex)
    # graph replay over rotating input sets (>= 3x L2 where it fits)
    per_set = 3 * T * d * x.element_size()
    nsets = int(min(64, max(1, math.ceil(3 * L2 / per_set))))
    if nsets * per_set > 2 * 2**30:
        nsets = max(1, int(2 * 2**30 // per_set))
    sets = [(x if i == 0 else (torch.randn(T, 2 * d, device=dev) * 2.0).to(dt),
             torch.empty(T, d, dtype=dt, device=dev)) for i in range(nsets)]
    for name, fn in impls.items():
        e = out[name]
        if "cold" not in e:
            continue
        nodes = int(min(200, max(nsets, math.ceil(2000.0 / max(e["cold"]["us"], 0.5)))))
        calls = [(lambda a=sets[i % nsets][0], o=sets[i % nsets][1], fn=fn: fn(a, o)) for i in range(nodes)]
        try:
            e["graph"] = timer.graph(calls)
            e["graph"]["input_sets"] = nsets
        except Exception as ex:  # noqa: BLE001
            e["graph_error"] = repr(ex)
    del sets
    row["impls"] = out
    row["failed"] = [n for n, e in out.items() if not e.get("ok")]
    for kind in ("cold", "graph"):
        kd = out["ours"].get(kind, {}).get("us")
        for peer in ("eager", "compiled"):
            t = out[peer].get(kind, {}).get("us")
            if kd and t:
                row[f"x_{peer}_{kind}"] = t / kd
    log(f"silu {row['dtype']} d{d} T{T}: " + ", ".join(
        f"{n} {e['cold']['us']:.2f}" + (f" (graph {e['graph']['us']:.2f})" if "graph" in e else "")
        for n, e in out.items() if "cold" in e) +
        (f" | served {row.get('served')}" if row.get("served") else "") +
        (f" | FAILED {row['failed']}" if row["failed"] else ""))


if __name__ == "__main__":
    sys.exit(main())
