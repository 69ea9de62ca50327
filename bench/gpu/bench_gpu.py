#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kdispatch on the GPU beside the peers an engine would otherwise call, one run.

Sections (--sections, comma-separated):
  norms   RMSNorm and fused add+RMSNorm, grid tokens x hidden x {bf16, fp16}:
          kdispatch (tuned table), kdispatch get_default only, torch F.rms_norm,
          a Triton RMSNorm autotuned over num_warps (the peers' kernel), the torch
          two-op fused formula; cold and CUDA-graph replay; the copy ceiling of the
          same bytes measured in the same run.
  check   the regression gate: every committed H200 row vs get_default, fails when a
          committed row is > 1.10x slower than the default.

Method (the same as ../shared/peers/README.md): "cold" = CUDA events around each
call, each call preceded by a 256 MiB read that evicts L2, the timed calls enqueued
in chunks behind a GPU sleep kernel so host launch cost stays out; median of many
reps. "graph" = the op captured back to back in one CUDA graph rotating over buffer
sets of >= 3x L2 where that fits, median replay time / nodes. Every implementation
is checked against a float64 reference on fresh random data with poisoned outputs
before it is timed.

Usage (on the GPU machine, after bench/gpu/run_h200.sh built the library):
  python3 bench/gpu/bench_gpu.py --lib build/gpu/libkdispatch.so --configs configs \
      --peers <dir with h200_kernels.py> --sections norms --out OUT [--resume PREVIOUS/bench_gpu.json]

--resume takes the bench_gpu.json of an earlier (partial) run: its measured points
are kept as they are and not measured again. Exit status: 0 when every point of the
grid is in bench_gpu.json, 3 when the time budget (--budget-s) left points out (run
again with --resume), 1 on an error.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path of libkdispatch.so (with the CUDA backend)")
    ap.add_argument("--configs", default="configs", help="committed configs dir (the tuned table)")
    ap.add_argument("--peers", default=None, help="dir holding the peers' h200_kernels.py (Triton kernels)")
    ap.add_argument("--sections", default="norms")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--ops", default="rmsnorm,fused_add_rmsnorm")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384,32768")
    ap.add_argument("--hiddens", default="1024,2048,2560,3584,4096,5120,7168,8192,12288,16384")
    ap.add_argument("--rep-ms", type=float, default=20.0, help="cold timing budget per implementation and point")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting new points after this")
    ap.add_argument("--resume", default=None, help="bench_gpu.json of an earlier run: keep its points")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    os.environ["KDISPATCH_LIBRARY"] = os.path.abspath(args.lib)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "integrations", "python"))
    import torch
    import torch.nn.functional as F
    import kdispatch
    import kdispatch.torch_ops as kops

    dev = "cuda"
    torch.manual_seed(1234)
    props = torch.cuda.get_device_properties(0)
    L2 = int(getattr(props, "L2_cache_size", 60 * 2**20) or 60 * 2**20)
    res = {"meta": {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "torch_cuda": torch.version.cuda, "l2_bytes": L2, "sections": args.sections,
                    "kdispatch": kdispatch.version() if hasattr(kdispatch, "version") else "?"},
           "errors": []}
    try:
        import triton
        res["meta"]["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        res["meta"]["triton"] = f"unavailable: {e!r}"
    try:
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
            for row in old.get("norms", []):
                if "impls" in row:
                    prev[(row["op"], row["dtype"], row["hidden"], row["tokens"])] = row
            res["meta"]["resumed_from"] = {"points": len(prev), "meta": old.get("meta", {})}
            log(f"resume: {len(prev)} point(s) from {args.resume}")
        except Exception as e:  # noqa: BLE001
            res["errors"].append({"where": "resume", "error": repr(e)})
    deadline = T0 + args.budget_s

    def save():
        res["meta"]["elapsed_s"] = round(time.time() - T0, 1)
        with open(os.path.join(args.out, "bench_gpu.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)

    # ---------------- timing (the peers' method, bench/gpu/gpu_timing.py) ----------------
    sys.path.insert(0, here)
    from gpu_timing import Timer
    timer = Timer(torch, dev)
    def cold(fn, rep_ms=args.rep_ms):
        return timer.cold(fn, rep_ms=rep_ms)

    graph = timer.graph

    def rel_err(out, ref):
        o = out.double()
        if not bool(torch.isfinite(o).all()):
            return float("inf")
        return float((o - ref).norm() / max(float(ref.norm()), 1e-30))

    # ---------------- kdispatch runtimes: tuned table vs get_default ----------------
    nocache = tempfile.mkdtemp(prefix="kd-bench-no-cache-")  # outside --out: only results go there
    rt_tuned = kdispatch.Runtime(config_dirs=[args.configs] if os.path.isdir(args.configs) else [],
                                 shipped_configs=False, cache_dir=nocache)
    rt_default = kdispatch.Runtime(shipped_configs=False, cache_dir=nocache)
    res["meta"]["load_report"] = {k: v for k, v in rt_tuned.load_report().items() if k != "files"}

    def with_rt(rt, fn):
        def call(*a):
            kops.set_runtime(rt)
            return fn(*a)
        return call

    # ---------------- peers ----------------
    peers_triton = None
    if args.peers:
        try:
            sys.path.insert(0, os.path.abspath(args.peers))
            import triton
            import h200_kernels as KK  # the peers' Triton kernels, read in place (not part of kdispatch)

            def tuner_bench(fn, quantiles=None, **_kw):
                r = cold(fn, rep_ms=5.0)
                return [r["us"] / 1e3, r["p20"] / 1e3, r["p80"] / 1e3]

            def prune(configs, named_args, **kwargs):
                blk = triton.next_power_of_2(int(named_args["N"]))
                keep = [c for c in configs if blk // (32 * c.num_warps) <= 128]
                return keep or configs[-1:]

            def autotuned(fn, restore=None):
                # The fused kernel is in place: without restore_value Triton's
                # autotuner applies it once per config and rep (case C01), and
                # the first call returns garbage.
                kw = dict(configs=[triton.Config({}, num_warps=w) for w in (1, 2, 4, 8, 16)], key=["M", "N"],
                          prune_configs_by={"early_config_prune": prune})
                if restore:
                    kw["restore_value"] = restore
                try:
                    return triton.autotune(do_bench=tuner_bench, **kw)(fn)
                except TypeError:
                    return triton.autotune(warmup=3, rep=15, **kw)(fn)

            rms_t = autotuned(KK.rmsnorm_kernel)
            fused_t = autotuned(KK.fused_add_rmsnorm_kernel, restore=["X", "Res"])

            def triton_rms(x, w, y, eps):
                M, N = x.shape
                rms_t[(M,)](x, w, y, x.stride(0), y.stride(0), M, N, eps, BLOCK=triton.next_power_of_2(N))

            def triton_fused(x, r, w, eps):
                M, N = x.shape
                fused_t[(M,)](x, r, w, x.stride(0), r.stride(0), M, N, eps, BLOCK=triton.next_power_of_2(N))

            peers_triton = (triton_rms, triton_fused)
        except Exception as e:  # noqa: BLE001
            res["errors"].append({"where": "peers import", "error": repr(e)})
            log(f"peers unavailable: {e!r}")

    EPS = 1e-6
    DT = {"bf16": torch.bfloat16, "fp16": torch.float16}

    def point_norm_impl(row, op, dt, T, H, nbytes):
        x = torch.randn(T, H, dtype=dt, device=dev)
        w = (1 + 0.1 * torch.randn(H, device=dev)).to(dt)
        r0 = torch.randn(T, H, dtype=dt, device=dev)
        # float64 reference
        if op == "rmsnorm":
            xd = x.double()
            ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
        else:
            z = (x.float() + r0.float()).to(dt).double()
            ref = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
        impls = {}
        if op == "rmsnorm":
            impls["kdispatch"] = with_rt(rt_tuned, lambda xx, yy: torch.ops.kdispatch.rmsnorm(xx, w, EPS))
            impls["kdispatch_default"] = with_rt(rt_default, lambda xx, yy: torch.ops.kdispatch.rmsnorm(xx, w, EPS))
            impls["torch_F_rms_norm"] = lambda xx, yy: F.rms_norm(xx, (H,), w, EPS)
            if peers_triton:
                impls["triton_autotuned"] = lambda xx, yy: (peers_triton[0](xx, w, yy, EPS), yy)[1]
        else:
            impls["kdispatch"] = with_rt(rt_tuned, lambda xx, rr: torch.ops.kdispatch.fused_add_rmsnorm_(xx, rr, w, EPS))
            impls["kdispatch_default"] = with_rt(rt_default,
                                                 lambda xx, rr: torch.ops.kdispatch.fused_add_rmsnorm_(xx, rr, w, EPS))
            impls["torch_2op"] = lambda xx, rr: (rr.add_(xx), F.rms_norm(rr, (H,), w, EPS))[1]
            if peers_triton:
                impls["triton_autotuned"] = lambda xx, rr: peers_triton[1](xx, rr, w, EPS)
        out = {}
        # correctness first (fresh copies; outputs poisoned)
        for name, fn in impls.items():
            xx = x.clone()
            if op == "rmsnorm":
                yy = torch.full_like(x, float("nan"))
                got = fn(xx, yy)
                got = got if isinstance(got, torch.Tensor) else yy
            else:
                rr = r0.clone()
                got = fn(xx, rr)
                got = got if (name == "torch_2op") else xx
            torch.cuda.synchronize()
            err = rel_err(got, ref)
            out[name] = {"rel_err": err, "ok": err < 1e-2}
        # cold timing (rotating inputs are not needed: L2 is flushed before each call)
        for name, fn in impls.items():
            if not out[name]["ok"]:
                continue
            xx = x.clone()
            if op == "rmsnorm":
                yy = torch.empty_like(x)
                out[name]["cold"] = cold(lambda: fn(xx, yy))
            else:
                rr = r0.clone()
                out[name]["cold"] = cold(lambda: fn(xx, rr))
        # graph replay over rotating buffer sets
        per_set = max(nbytes - H * 2, 1)
        nsets = int(min(64, max(1, math.ceil(3 * L2 / per_set))))
        if nsets * per_set > 2 * 2**30:
            nsets = max(1, int(2 * 2**30 // per_set))
        sets = [(torch.randn(T, H, dtype=dt, device=dev), torch.randn(T, H, dtype=dt, device=dev)) for _ in range(nsets)]
        for name, fn in impls.items():
            if not out[name]["ok"]:
                continue
            if name.startswith("kdispatch"):
                kops.set_runtime(rt_tuned if name == "kdispatch" else rt_default)
            est = out[name]["cold"]["us"]
            nodes = int(min(200, max(nsets, math.ceil(2000.0 / max(est, 0.5)))))
            calls = [(lambda a=sets[i % nsets][0], b=sets[i % nsets][1]: fn(a, b)) for i in range(nodes)]
            try:
                out[name]["graph"] = graph(calls)
            except Exception as ex:  # noqa: BLE001
                out[name]["graph_error"] = repr(ex)
        # the copy ceiling of the same bytes, same run
        half = max(nbytes // 2, 2)
        src = torch.empty(half, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        out["copy_same_bytes"] = {"cold": cold(lambda: dst.copy_(src))}
        row["impls"] = out
        peers = [n for n in out if not n.startswith("kdispatch") and n != "copy_same_bytes" and "cold" in out[n]]
        if "cold" in out.get("kdispatch", {}) and peers:
            best_cold = min(out[n]["cold"]["us"] for n in peers)
            row["ratio_cold_vs_best_peer"] = best_cold / out["kdispatch"]["cold"]["us"]
            gp = [out[n]["graph"]["us"] for n in peers if "graph" in out[n]]
            if gp and "graph" in out["kdispatch"]:
                row["ratio_graph_vs_best_peer"] = min(gp) / out["kdispatch"]["graph"]["us"]
            row["gbps"] = nbytes / (out["kdispatch"]["cold"]["us"] * 1e-6) / 1e9
            row["frac_of_copy"] = out["copy_same_bytes"]["cold"]["us"] / out["kdispatch"]["cold"]["us"]
            if "cold" in out.get("kdispatch_default", {}):
                row["default_over_tuned"] = out["kdispatch_default"]["cold"]["us"] / out["kdispatch"]["cold"]["us"]
        log(f"{op} {row['dtype']} H{H} T{T}: " + ", ".join(
            f"{n} {v['cold']['us']:.2f}" for n, v in out.items() if "cold" in v) +
            (f" | vs best peer {row.get('ratio_cold_vs_best_peer', float('nan')):.2f}x cold, "
             f"{row.get('ratio_graph_vs_best_peer', float('nan')):.2f}x graph" if "ratio_cold_vs_best_peer" in row else ""))

    # ---------------- norms ----------------
    incomplete = [0]  # points left out by the time budget
    if "norms" in args.sections.split(","):
        rows = []
        res["norms"] = rows
        tokens = [int(t) for t in args.tokens.split(",")]
        hiddens = [int(h) for h in args.hiddens.split(",")]
        for op in args.ops.split(","):
            for dname in args.dtypes.split(","):
                dt = DT[dname]
                for H in hiddens:
                    for T in tokens:
                        if (op, dname, H, T) in prev:
                            rows.append(prev[(op, dname, H, T)])
                            continue
                        if time.time() > deadline:
                            incomplete[0] += 1  # left for a resumed run
                            continue
                        row = {"op": op, "dtype": dname, "hidden": H, "tokens": T}
                        nbytes = (2 * T * H * 2 + H * 2) if op == "rmsnorm" else (4 * T * H * 2 + H * 2)
                        row["bytes"] = nbytes
                        try:
                            point_norm_impl(row, op, dt, T, H, nbytes)
                        except Exception as ex:  # noqa: BLE001
                            res["errors"].append({"where": f"{op} {dname} H{H} T{T}", "error": repr(ex)})
                            log(f"ERROR {op} {dname} H{H} T{T}: {ex!r}")
                        rows.append(row)
                    save()
                    torch.cuda.empty_cache()
        save()

    done = sum(1 for r in res.get("norms", []) if "impls" in r)
    res["meta"]["points_done"] = done
    res["meta"]["points_left"] = incomplete[0]
    save()
    log(f"norms: {done} point(s) measured (this run and resumed), {incomplete[0]} left for another run")
    return 3 if incomplete[0] else 0


if __name__ == "__main__":
    sys.exit(main())
