#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kdispatch on the GPU beside the peers an engine would otherwise call, one run.

Sections (--sections, comma-separated):
  norms   RMSNorm and fused add+RMSNorm, grid tokens x hidden x {bf16, fp16}:
          kdispatch (tuned table), kdispatch get_default only, torch F.rms_norm,
          a Triton RMSNorm autotuned over num_warps (the peers' kernel), the torch
          two-op fused formula; cold and CUDA-graph replay; the copy ceiling of the
          same bytes measured in the same run.
  gemm    bf16 GEMM y = x @ W^T (W [N,K] as nn.Linear stores it), grid (N,K) x M
          (--gemm-nk, --gemm-m): kdispatch (tuned table), kdispatch get_default
          only, torch F.linear (cuBLAS/cuBLASLt), the peers' Triton matmul
          (h200_kernels.mm_kernel, autotuned over the peers' 8 configs pruned by M;
          needs --peers); cold, plus CUDA-graph replay of kdispatch and torch for
          M <= --gemm-graph-max-m; the variant kdispatch served (its dispatch
          info and lookup); the read ceiling of the weight's bytes (min of a
          bf16 sum in fp32 and a plain read kernel, --read-lib) measured in the
          same run; the cuBLASLt libraries loaded in the process with their versions.
  check   the regression gate: every committed H200 row vs get_default, fails when a
          committed row is > 1.10x slower than the default (bench/gpu/check_configs.py).

Method (the same as ../shared/peers/README.md): "cold" = CUDA events around each
call, each call preceded by a 256 MiB read that evicts L2, the timed calls enqueued
in chunks behind a GPU sleep kernel so host launch cost stays out; median of many
reps. "graph" = the op captured back to back in one CUDA graph rotating over buffer
sets of >= 3x L2 where that fits, median replay time / nodes. Every implementation
is checked against a float64 reference on fresh random data with poisoned outputs
before it is timed.

Usage (on the GPU machine, after bench/gpu/run_h200.sh built the library):
  python3 bench/gpu/bench_gpu.py --lib build/gpu/libkdispatch.so --configs configs \\
      --peers <dir with h200_kernels.py> --sections norms --out OUT [--resume PREVIOUS/bench_gpu.json]
  python3 bench/gpu/bench_gpu.py --lib build/gpu/libkdispatch.so --configs configs \\
      --peers <dir> --sections gemm --json-name bench_gemm.json --out OUT [--resume PREVIOUS/bench_gemm.json]
  python3 bench/gpu/bench_gpu.py --lib ... --sections gemm --gemm-nk 4096x4096 --gemm-m 1,16 --list-points

--resume takes the JSON of an earlier (partial) run (norms points and gemm points
alike): its measured points are kept as they are and not measured again. Exit
status: 0 when every point of the grid is in the JSON (--json-name, default
bench_gpu.json, in --out), 3 when the time budget (--budget-s) left points out (run
again with --resume), 1 on an error. bench/gpu/render.py renders that JSON.
"""
import argparse
import ctypes
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


# ---------------------------------------------------------------- gemm section
# The grid of the issue: the projections of Llama-3-8B (qkv 6144x4096, o 4096x4096,
# gate_up 28672x4096, down 4096x14336) and of other common decoders, x M.
GEMM_NK_DEFAULT = "6144x4096,4096x4096,28672x4096,4096x14336,1280x8192,8192x1024,7168x8192,8192x3584"
GEMM_M_DEFAULT = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192"
GEMM_DTYPE = "bf16"
# The peers' Triton matmul configs and their pruning by M (../shared/peers/h200_baseline.py).
TRITON_MM_CONFIGS = [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (64, 256, 64, 4, 4), (128, 64, 64, 4, 4),
                     (64, 128, 64, 4, 4), (64, 64, 128, 4, 4), (16, 64, 128, 4, 4), (16, 32, 256, 3, 4)]


def parse_nk(text):
    """ "6144x4096,4096x4096" -> [(6144, 4096), (4096, 4096)]."""
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        n, sep, k = item.partition("x")
        if not sep:
            raise ValueError(f"'{item}' is not NxK (e.g. 6144x4096)")
        N, K = int(n), int(k)
        if N < 1 or K < 1:
            raise ValueError(f"'{item}': N and K must be >= 1")
        out.append((N, K))
    if not out:
        raise ValueError("no NxK given")
    return out


def gemm_key(row):
    return (row.get("dtype", GEMM_DTYPE), int(row["N"]), int(row["K"]), int(row["M"]))


def list_points(args, sections, nks, ms):
    """--list-points: the grid and what --resume already holds; no torch, no GPU."""
    have_n, have_g = set(), set()
    if args.resume and os.path.isfile(args.resume):
        with open(args.resume) as f:
            old = json.load(f)
        have_n = {(r["op"], r["dtype"], r["hidden"], r["tokens"]) for r in old.get("norms", []) if "impls" in r}
        have_g = {gemm_key(r) for r in old.get("gemm", []) if "impls" in r}
    total = todo = 0
    if "norms" in sections:
        for op in args.ops.split(","):
            for dname in args.dtypes.split(","):
                for H in [int(h) for h in args.hiddens.split(",")]:
                    ts = [int(t) for t in args.tokens.split(",")]
                    left = [T for T in ts if (op, dname, H, T) not in have_n]
                    total += len(ts)
                    todo += len(left)
                    print(f"norms {op} {dname} hidden={H}: {len(ts)} point(s), {len(ts) - len(left)} resumed")
    if "gemm" in sections:
        for (N, K) in nks:
            left = [M for M in ms if (GEMM_DTYPE, N, K, M) not in have_g]
            total += len(ms)
            todo += len(left)
            print(f"gemm {GEMM_DTYPE} N={N} K={K} (weights {N * K * 2 / 2**20:.0f} MiB): M " +
                  ",".join(str(M) + ("" if M in left else "(resumed)") for M in ms) +
                  f"; graph timing at M <= {args.gemm_graph_max_m}")
    print(f"{total} point(s), {total - todo} in {args.resume or 'no --resume'}, {todo} to measure")
    return 0


def loaded_paths(fragment):
    """Files mapped into this process whose name contains `fragment` (/proc/self/maps)."""
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    if fragment in os.path.basename(path) and os.path.isfile(path) and path not in paths:
                        paths.append(path)
    except OSError:
        pass
    return paths


def cublaslt_versions():
    """Every libcublasLt mapped into this process with its cublasLtGetVersion
    (MAJOR*10000 + MINOR*100 + PATCH) and cublasLtGetCudartVersion."""
    out = []
    for path in loaded_paths("libcublasLt"):
        e = {"path": path}
        try:
            lib = ctypes.CDLL(path)  # already mapped: dlopen returns that library, loads nothing new
            for name in ("cublasLtGetVersion", "cublasLtGetCudartVersion"):
                fn = getattr(lib, name)
                fn.restype = ctypes.c_size_t
                fn.argtypes = []
                e[name] = int(fn())
            v = e["cublasLtGetVersion"]
            e["version"] = f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
        except Exception as ex:  # noqa: BLE001
            e["error"] = repr(ex)
        out.append(e)
    return out


def blas_info(c):
    """Which cuBLASLt torch and kdispatch run on (both load into this process)."""
    torch = c.torch
    info = {}
    try:  # cuBLAS(Lt) loads lazily: make both sides call a GEMM first
        a = torch.randn(2, 64, dtype=torch.bfloat16, device=c.dev)
        b = torch.randn(64, 64, dtype=torch.bfloat16, device=c.dev)
        c.F.linear(a, b)
        c.kops.set_runtime(c.rt_tuned)
        torch.ops.kdispatch.gemm(a, b)
        torch.cuda.synchronize()
    except Exception as ex:  # noqa: BLE001
        info["warmup_error"] = repr(ex)
    mapped = cublaslt_versions()
    info["mapped"] = mapped
    site = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))  # torch's site-packages
    t = {"torch_cuda": torch.version.cuda}
    for k, fn in (("compiled_cuda", lambda: torch._C._cuda_getCompiledVersion()),
                  ("preferred_blas_library", lambda: str(torch.backends.cuda.preferred_blas_library())),
                  ("allow_bf16_reduced_precision_reduction",
                   lambda: bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction))):
        try:
            t[k] = fn()
        except Exception as ex:  # noqa: BLE001
            t[k] = f"unavailable: {ex!r}"
    t["cublaslt"] = [e for e in mapped if e["path"].startswith(site + os.sep)] or mapped
    info["torch"] = t
    kd = {"todo": "kdispatch does not report its cuBLASLt through the Python API yet (the C++ backend's "
                  "library_versions line): read from /proc/self/maps; replace with the library's own report once "
                  "exposed"}
    try:  # a future device_info may carry the library line ("cuBLASLt 130100 (...)")
        di = c.rt_tuned.device_info("cuda")
        rep = {k: v for k, v in di.items() if any(w in k.lower() for w in ("cublas", "librar", "vendor", "blas"))}
        if rep:
            kd["reported"] = rep
    except Exception as ex:  # noqa: BLE001
        kd["device_info_error"] = repr(ex)
    try:
        import kdispatch
        libpath = kdispatch.library_path()
        ldd = subprocess.run(["ldd", libpath], capture_output=True, text=True, timeout=20).stdout
        kd["ldd"] = [ln.strip() for ln in ldd.splitlines() if "cublas" in ln.lower()] or [
            "(no libcublas* linked: kdispatch dlopens libcublasLt.so.<major> at run time, which resolves to an "
            "already loaded library of that SONAME)"]
    except Exception as ex:  # noqa: BLE001
        kd["ldd"] = [f"unavailable: {ex!r}"]
    own = [e for e in mapped if not e["path"].startswith(site + os.sep)]
    kd["cublaslt"] = own or t["cublaslt"]
    if not mapped:
        kd["note"] = "no libcublasLt is mapped in this process"
    elif not own:
        kd["note"] = ("no libcublasLt outside torch's is mapped: kdispatch's dlopen of libcublasLt resolved to the "
                      "one torch loaded (same SONAME), or kdispatch loads none")
    info["kd_cublaslt"] = kd
    return info


def make_triton_mm(c):
    """The peers' Triton matmul (h200_kernels.mm_kernel), autotuned over their 8 configs pruned by M,
    timed by this script's cold method. Returns ((call, autotuner), None) or (None, why not)."""
    if not c.args.peers:
        return None, "no --peers: the peers' Triton matmul was not run"
    try:
        sys.path.insert(0, os.path.abspath(c.args.peers))
        import triton
        import h200_kernels as KK  # the peers' kernels, read in place (not part of kdispatch)

        def tuner_bench(fn, quantiles=None, **_kw):
            r = c.cold(fn, rep_ms=5.0)
            return [r["us"] / 1e3, r["p20"] / 1e3, r["p80"] / 1e3]

        def prune(configs, named_args, **kwargs):
            M = int(named_args["M"])
            if M <= 64:
                keep = [x for x in configs if x.kwargs["BM"] <= 64]
            elif M >= 1024:
                keep = [x for x in configs if x.kwargs["BM"] >= 64]
            else:
                keep = configs
            return keep or configs

        configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GM": 8}, num_stages=st, num_warps=nw)
                   for bm, bn, bk, st, nw in TRITON_MM_CONFIGS]
        kw = dict(configs=configs, key=["M", "N", "K"], prune_configs_by={"early_config_prune": prune})
        try:
            mm_t = triton.autotune(do_bench=tuner_bench, **kw)(KK.mm_kernel)
        except TypeError:
            mm_t = triton.autotune(warmup=3, rep=15, **kw)(KK.mm_kernel)

        def triton_mm(x, W, out):
            M, K = x.shape
            N = W.shape[0]
            grid = lambda META: (triton.cdiv(M, META["BM"]) * triton.cdiv(N, META["BN"]),)  # noqa: E731
            mm_t[grid](x, W, out, M, N, K, x.stride(0), x.stride(1), W.stride(1), W.stride(0),
                       out.stride(0), out.stride(1))
            return out

        return (triton_mm, mm_t), None
    except Exception as e:  # noqa: BLE001
        return None, f"the peers' Triton matmul is unavailable: {e!r}"


def gemm_ceiling(c, w):
    """The same-size read ceiling of W's bytes, cold, this run: the faster of two
    reads of all N*K*2 bytes, a bf16 sum in fp32 (torch) and the plain read kernel
    of bench/gpu/gpu_read_kernels.cu (--read-lib, 4 and 8 blocks per SM).

    A copy moving as many bytes (N*K read + N*K written) is measured too but is
    not a read ceiling: its writes land in L2 (60 MiB) and reach DRAM after the
    interval, so below ~100 MiB it reads half the bytes from DRAM in the timed
    window (on the H200 a 16 MiB weight's copy took 8.4 us, a read of the 16 MiB
    10.1 us: bench/results/h200_gemm_fixed.md). The ceiling before 4bdee27 was
    min(sum, copy), i.e. the copy at every shape."""
    torch = c.torch
    nbytes = w.numel() * w.element_size()
    rd = c.cold(lambda: torch.sum(w, dtype=torch.float32))
    out = {"bytes": nbytes, "sum_us": rd["us"]}
    best, kind = rd["us"], "sum"
    if c.read_lib is not None:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        sink = torch.empty(8 * sms, dtype=torch.float32, device=c.dev)
        for per_sm in (4, 8):
            def fn(per_sm=per_sm):
                e = c.read_lib.kd_bench_read(ctypes.c_void_p(w.data_ptr()), ctypes.c_int64(nbytes // 16 * 16),
                                             per_sm * sms, ctypes.c_void_p(sink.data_ptr()),
                                             ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
                if e != 0:
                    raise RuntimeError(f"kd_bench_read: cudaError {e}")
            t = c.cold(fn)["us"]
            out[f"read{per_sm}_us"] = t
            if t < best:
                best, kind = t, f"read kernel, {per_sm} blocks/SM"
    src = torch.empty(max(nbytes // 2, 2), dtype=torch.uint8, device=c.dev)
    dst = torch.empty_like(src)
    out["copy_us"] = c.cold(lambda: dst.copy_(src))["us"]  # reference only (see above)
    out.update({"us": best, "kind": kind})
    return out


def gemm_point(c, row, N, K, M, w, wd, wsets, ceil, tri, devname):
    torch, F = c.torch, c.F
    dt = torch.bfloat16
    nan = float("nan")
    tol = c.args.gemm_tol
    x = torch.randn(M, K, dtype=dt, device=c.dev)
    # float64 reference on a sample of rows (the first 128, the last 64, 64 random), as the peers
    idx = sorted(set(range(min(M, 128))) | set(range(max(0, M - 64), M)) | set(torch.randint(0, M, (64,)).tolist()))
    idx_t = torch.tensor(idx, device=c.dev)
    ref = x[idx_t].double() @ wd.t()
    row["check_rows"] = len(idx)
    impls = {"kdispatch": c.with_rt(c.rt_tuned, lambda xx, ww: torch.ops.kdispatch.gemm(xx, ww)),
             "kdispatch_default": c.with_rt(c.rt_default, lambda xx, ww: torch.ops.kdispatch.gemm(xx, ww)),
             "torch": lambda xx, ww: F.linear(xx, ww)}
    if tri:
        tout = torch.empty(M, N, dtype=dt, device=c.dev)
        impls["triton"] = lambda xx, ww: tri[0](xx, ww, tout)
    out = {}
    # correctness first, fresh data, outputs poisoned
    for name, fn in impls.items():
        e = out[name] = {}
        try:
            if name == "triton":
                fn(x, w)  # the autotuner runs on the first call of each (M, N, K)
                torch.cuda.synchronize()
                e["config"] = str(getattr(tri[1], "best_config", "?"))
                tout.fill_(nan)
                got = fn(x, w)
            else:
                # The op allocates its output: hand the caching allocator a NaN-filled
                # block of that size first (freed at once), which it gives to the next
                # same-size request on this stream.
                torch.full((M, N), nan, dtype=dt, device=c.dev)
                got = fn(x, w)
            torch.cuda.synchronize()
            e["all_finite"] = bool(torch.isfinite(got).all())
            e["rel_err"] = c.rel_err(got[idx_t], ref)
            e["ok"] = e["all_finite"] and e["rel_err"] < tol
        except Exception as ex:  # noqa: BLE001
            e["ok"] = False
            e["error"] = repr(ex)
    # what kdispatch served: the same C ABI call through the runtime, with its dispatch
    # info and an output buffer passed in NaN-filled
    for name, rt in (("kdispatch", c.rt_tuned), ("kdispatch_default", c.rt_default)):
        e = out[name]
        try:
            # torch_ops.gemm_info: the op's own path (its stream workspace), with the info
            c.kops.set_runtime(rt)
            d, e["served"] = c.kops.gemm_info(x, w)
            torch.cuda.synchronize()
            e["rel_err_out_param"] = c.rel_err(d[idx_t], ref)
            if not (bool(torch.isfinite(d).all()) and e["rel_err_out_param"] < tol):
                e["ok"] = False
                e["note"] = "the call through torch_ops.gemm_info (the op's own path) failed the check"
            del d
        except Exception as ex:  # noqa: BLE001
            e["served_error"] = repr(ex)
    try:
        lk = c.rt_tuned.lookup(op="gemm", key=f"N={N},K={K},dtype={GEMM_DTYPE}", device=devname, M=M,
                               backend="cuda")
        row["kd_lookup"] = {k: lk.get(k) for k in ("match", "variant", "M", "source", "why")}
    except Exception as ex:  # noqa: BLE001
        row["kd_lookup"] = {"error": repr(ex)}
    # cold timing of what passed, the implementations in turns (one drift for all)
    passed = {name: (lambda fn=fn: fn(x, w)) for name, fn in impls.items() if out[name].get("ok")}
    try:
        colds = c.cold_many(passed)
    except Exception:  # noqa: BLE001
        # one implementation failed inside the turns: time each on its own,
        # so the others keep their numbers
        colds = {}
        for name, fn in passed.items():
            try:
                colds[name] = c.cold(fn)
            except Exception as ex:  # noqa: BLE001
                out[name]["cold_error"] = repr(ex)
    for name, r in colds.items():
        e = out[name]
        e["cold"] = r
        us = r["us"]
        e["tflops"] = 2.0 * M * N * K / us / 1e6
        e["w_gbps"] = N * K * 2 / us / 1e3
    if M <= c.args.gemm_graph_max_m and wsets:  # graph replay over rotating weight copies (>= 3x L2)
        xs = [torch.randn(M, K, dtype=dt, device=c.dev) for _ in wsets]
        n = len(wsets)
        for name in ("kdispatch", "torch"):
            e = out[name]
            if "cold" not in e:
                continue
            fn = impls[name]
            if name == "kdispatch":
                c.kops.set_runtime(c.rt_tuned)
            nodes = int(min(200, max(n, math.ceil(2000.0 / max(e["cold"]["us"], 0.5)))))
            calls = [(lambda a=xs[i % n], b=wsets[i % n]: fn(a, b)) for i in range(nodes)]
            try:
                e["graph"] = c.graph(calls)
                e["graph"]["weight_sets"] = n
            except Exception as ex:  # noqa: BLE001
                e["graph_error"] = repr(ex)
        del xs
    row["impls"] = out
    row["failed"] = [name for name, e in out.items() if not e.get("ok")]
    srv = out["kdispatch"].get("served") or {}
    row["kd_variant"], row["kd_source"], row["kd_table_m"] = srv.get("variant"), srv.get("source"), srv.get("M")
    row["default_variant"] = (out["kdispatch_default"].get("served") or {}).get("variant")
    kd = out["kdispatch"].get("cold", {}).get("us")
    if kd:
        row["kd_us"] = kd
        row["tflops"] = out["kdispatch"]["tflops"]
        row["w_gbps"] = out["kdispatch"]["w_gbps"]
        row["frac_ceiling"] = ceil["us"] / kd
        for name, key in (("torch", "speedup_vs_torch"), ("triton", "speedup_vs_triton"),
                          ("kdispatch_default", "default_over_tuned")):
            t = out.get(name, {}).get("cold", {}).get("us")
            if t:
                row[key] = t / kd
        kg, tg = out["kdispatch"].get("graph", {}).get("us"), out["torch"].get("graph", {}).get("us")
        if kg and tg:
            row["graph_speedup_vs_torch"] = tg / kg
    log(f"gemm N{N} K{K} M{M}: " + ", ".join(
        f"{nm} {e['cold']['us']:.2f}" + (f" (graph {e['graph']['us']:.2f})" if "graph" in e else "")
        for nm, e in out.items() if "cold" in e) +
        (f" | kd {row.get('kd_variant')} [{row.get('kd_source')}], vs torch {row['speedup_vs_torch']:.2f}x"
         if "speedup_vs_torch" in row else "") +
        (f", {100 * row['frac_ceiling']:.0f}% of the read ceiling" if "frac_ceiling" in row else "") +
        (f" | FAILED {row['failed']}" if row["failed"] else ""))


def gemm_section(c):
    torch = c.torch
    rows = []
    c.res["gemm"] = rows
    gm = c.res["meta"].setdefault("gemm", {})
    gm.update({"dtype": GEMM_DTYPE, "nk": [list(x) for x in c.nks], "m": list(c.ms), "tol": c.args.gemm_tol,
               "graph_max_m": c.args.gemm_graph_max_m, "weight_init": "randn * 0.05 (bf16)",
               "ceiling": "min(cold bf16 sum in fp32 of N*K elements, cold plain read kernel of the N*K*2 bytes"
                          + ("" if c.read_lib is not None else " [not loaded: sum alone]") +
                          "), per (N,K), this run; a copy of N*K bytes is listed but is no read ceiling "
                          "(its writes stay in L2)"})
    tri, note = make_triton_mm(c)
    if note:
        gm["triton_note"] = note
        log(note)
    else:
        gm["triton_configs"] = [f"BM{a} BN{b} BK{k} s{st} w{w}" for a, b, k, st, w in TRITON_MM_CONFIGS]
    devname = torch.cuda.get_device_name(0)
    for (N, K) in c.nks:
        keys = [(GEMM_DTYPE, N, K, M) for M in c.ms]
        if all(k in c.prev for k in keys) or time.time() > c.deadline:
            for k in keys:
                if k in c.prev:
                    rows.append(c.prev[k])
                else:
                    c.incomplete[0] += 1  # left for a resumed run
            continue
        try:
            w = torch.randn(N, K, dtype=torch.bfloat16, device=c.dev) * 0.05
            wd = w.double()
            ceil = gemm_ceiling(c, w)
            wsets = []
            if any(M <= c.args.gemm_graph_max_m and k not in c.prev for M, k in zip(c.ms, keys)):
                nsets = int(min(16, max(1, math.ceil(3 * c.L2 / (N * K * 2)))))
                wsets = [w] + [torch.randn(N, K, dtype=torch.bfloat16, device=c.dev) * 0.05
                               for _ in range(nsets - 1)]
        except Exception as ex:  # noqa: BLE001
            c.res["errors"].append({"where": f"gemm N{N} K{K} setup", "error": repr(ex)})
            log(f"ERROR gemm N{N} K{K} setup: {ex!r}")
            for M, k in zip(c.ms, keys):
                rows.append(c.prev[k] if k in c.prev else {"dtype": GEMM_DTYPE, "N": N, "K": K, "M": M,
                                                            "error": repr(ex)})
            continue
        log(f"gemm N{N} K{K}: ceiling {ceil['us']:.2f} us ({ceil['kind']}; "
            f"{ceil['bytes'] / ceil['us'] / 1e3:.0f} GB/s), {len(wsets)} weight set(s) for graphs")
        for M, k in zip(c.ms, keys):
            if k in c.prev:
                rows.append(c.prev[k])
                continue
            if time.time() > c.deadline:
                c.incomplete[0] += 1
                continue
            row = {"dtype": GEMM_DTYPE, "N": N, "K": K, "M": M, "flop": 2 * M * N * K, "weight_bytes": N * K * 2,
                   "ceiling": ceil}
            try:
                gemm_point(c, row, N, K, M, w, wd, wsets, ceil, tri, devname)
            except Exception as ex:  # noqa: BLE001
                c.res["errors"].append({"where": f"gemm N{N} K{K} M{M}", "error": repr(ex)})
                log(f"ERROR gemm N{N} K{K} M{M}: {ex!r}")
            rows.append(row)
            c.save()
        del w, wd, wsets
        torch.cuda.empty_cache()
    c.res["meta"]["cublaslt"] = blas_info(c)
    c.save()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="path of libkdispatch.so (with the CUDA backend)")
    ap.add_argument("--configs", default="configs", help="committed configs dir (the tuned table)")
    ap.add_argument("--read-lib", default=None,
                    help="libkdispatch_bench_read.so (build/gpu/bench/gpu): the plain read kernel of the GEMM "
                         "table's read ceiling; without it the ceiling is the bf16 sum alone")
    ap.add_argument("--peers", default=None, help="dir holding the peers' h200_kernels.py (Triton kernels)")
    ap.add_argument("--sections", default="norms", help="comma-separated: norms, gemm (default norms)")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--ops", default="rmsnorm,fused_add_rmsnorm")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384,32768")
    ap.add_argument("--hiddens", default="1024,2048,2560,3584,4096,5120,7168,8192,12288,16384")
    ap.add_argument("--rep-ms", type=float, default=20.0, help="cold timing budget per implementation and point")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting new points after this")
    ap.add_argument("--resume", default=None, help="bench_gpu.json of an earlier run: keep its points")
    ap.add_argument("--out", default=".")
    ap.add_argument("--json-name", default="bench_gpu.json",
                    help="the results file written in --out (run_h200.sh's gemm-bench: bench_gemm.json)")
    ap.add_argument("--gemm-nk", default=GEMM_NK_DEFAULT,
                    help="gemm: the weight shapes, NxK comma-separated (default: the Llama-3-8B/70B and "
                         "Mixtral-style projections %(default)s)")
    ap.add_argument("--gemm-m", default=GEMM_M_DEFAULT, help="gemm: the M (tokens) values (default %(default)s)")
    ap.add_argument("--gemm-graph-max-m", type=int, default=16,
                    help="gemm: CUDA-graph replay times of kdispatch and torch for M <= this (default 16)")
    ap.add_argument("--gemm-tol", type=float, default=1e-2,
                    help="gemm: relative L2 error vs float64 above which a point's implementation fails (1e-2)")
    ap.add_argument("--list-points", action="store_true",
                    help="print the grid points of --sections (and which --resume already holds), measure nothing")
    args = ap.parse_args()
    sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = [x for x in sections if x not in ("norms", "gemm")]
    if unknown:
        ap.error(f"--sections: unknown section(s) {unknown} (norms, gemm; check is bench/gpu/check_configs.py)")
    try:
        gemm_nk = parse_nk(args.gemm_nk)
        gemm_ms = [int(m) for m in args.gemm_m.split(",") if m.strip()]
        if not gemm_ms or min(gemm_ms) < 1:
            raise ValueError("M values must be >= 1")
    except ValueError as e:
        ap.error(f"--gemm-nk/--gemm-m: {e}")
    if args.list_points:
        return list_points(args, sections, gemm_nk, gemm_ms)
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
                    "kdispatch": getattr(kdispatch, "__version__", "?")},
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
    prev_gemm = {}
    if args.resume and os.path.isfile(args.resume):
        try:
            with open(args.resume) as f:
                old = json.load(f)
            for row in old.get("norms", []):
                if "impls" in row:
                    prev[(row["op"], row["dtype"], row["hidden"], row["tokens"])] = row
            for row in old.get("gemm", []):
                if "impls" in row:
                    prev_gemm[gemm_key(row)] = row
            res["meta"]["resumed_from"] = {"points": len(prev) + len(prev_gemm), "meta": old.get("meta", {})}
            log(f"resume: {len(prev) + len(prev_gemm)} point(s) from {args.resume}")
        except Exception as e:  # noqa: BLE001
            res["errors"].append({"where": "resume", "error": repr(e)})
    deadline = T0 + args.budget_s

    def save():
        res["meta"]["elapsed_s"] = round(time.time() - T0, 1)
        tmp = os.path.join(args.out, "." + args.json_name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1, default=str)
        os.replace(tmp, os.path.join(args.out, args.json_name))

    # ---------------- timing (the peers' method, bench/gpu/gpu_timing.py) ----------------
    sys.path.insert(0, here)
    from gpu_timing import Timer
    timer = Timer(torch, dev)
    def cold(fn, rep_ms=args.rep_ms):
        return timer.cold(fn, rep_ms=rep_ms)

    def cold_many(fns, rep_ms=args.rep_ms):
        return timer.cold_interleaved(fns, rep_ms=rep_ms)

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
    if "norms" in sections:
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

    # ---------------- gemm ----------------
    if "gemm" in sections:
        import types
        read_lib = None
        if args.read_lib:
            try:
                read_lib = ctypes.CDLL(args.read_lib)
                read_lib.kd_bench_read.restype = ctypes.c_int
                read_lib.kd_bench_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p,
                                                   ctypes.c_void_p]
            except OSError as e:
                log(f"--read-lib {args.read_lib}: {e} (the read ceiling is the bf16 sum alone)")
                read_lib = None
        gemm_section(types.SimpleNamespace(read_lib=read_lib,
            torch=torch, F=F, kdispatch=kdispatch, kops=kops, res=res, args=args, nks=gemm_nk, ms=gemm_ms,
            prev=prev_gemm, deadline=deadline, incomplete=incomplete, save=save, cold=cold, cold_many=cold_many, graph=graph,
            rel_err=rel_err, with_rt=with_rt, rt_tuned=rt_tuned, rt_default=rt_default, L2=L2, dev=dev))

    done = sum(1 for r in res.get("norms", []) if "impls" in r)
    gdone = sum(1 for r in res.get("gemm", []) if "impls" in r)
    res["meta"]["points_done"] = done + gdone
    res["meta"]["points_left"] = incomplete[0]
    save()
    if "norms" in sections:
        log(f"norms: {done} point(s) measured (this run and resumed), {incomplete[0]} left for another run")
    if "gemm" in sections:
        log(f"gemm: {gdone} point(s) measured (this run and resumed), {incomplete[0]} left for another run")
    return 3 if incomplete[0] else 0


if __name__ == "__main__":
    sys.exit(main())
