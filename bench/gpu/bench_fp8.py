# SPDX-License-Identifier: Apache-2.0
"""fp8 GEMMs (w8a8 e4m3fn, issue 21) on the GPU: kdispatch's table (the torch ops
torch.ops.kdispatch.gemm_fp8_<layout>_out on the shipped + tuned configs) beside
torch's scaled matmul in the same layout, bf16 F.linear on the same (N, K), and
the fp8 weight's read ceiling, per scale layout:

  tensor   torch._scaled_mm(a8, b8.t(), sa, sb) with 0-d fp32 scales
  rowwise  torch._scaled_mm with sa [M, 1], sb [1, N]
  block    torch._scaled_mm with 1x128 activation scales ([M, K/128], outer-dim
           major: kdispatch's M-major [K/128, M] transposed, no copy) and
           128x128 weight scales ([K/128, N/128] view of kdispatch's
           [N/128, K/128]); where torch refuses (M % 4 != 0 on sm_90, or a
           version without block scaling) the point has no peer and says why;
           and triton_sglang: bench/gpu/triton_fp8_block.py, a Triton peer of
           SGLang's w8a8 block-fp8 GEMM run with SGLang's committed H200 config
           for (N, K) at the nearest batch size (--sglang-configs; its default
           config where no file exists), where Triton is missing or refuses
           the point records triton_refused; "kd / peer" is against the
           fastest correct peer of the layout

Correctness first, against float64 of the dequantised inputs on a sample of
rows (relative L2 error; bar --tol), then the times: gpu_timing's cold,
interleaved method (L2 evicted before each call, medians, p20-p80), all
implementations of a point in the same rounds. The read ceiling is the fastest
of bench/gpu/gpu_read_kernels.cu's plain read of the N*K fp8 bytes at 4 and 8
blocks per SM, this run.

  python3 bench/gpu/bench_fp8.py --lib build/gpu/libkdispatch.so \
      --read-lib build/gpu/bench/gpu/libkdispatch_bench_read.so --out out
writes out/bench_fp8.json and prints a markdown table (render it with --render).
"""
import argparse
import ctypes
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SGLANG_CONFIGS = os.path.join(HERE, "..", "..", "..", "shared", "data", "sglang-configs", "quantization")
from gpu_timing import Timer  # noqa: E402

LLAMA = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
# Llama-3-70B at TP 8 (the bf16 grid's other four pairs)
LLAMA70 = [(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584)]
DEEPGEMM = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
# DeepGEMM's published H800 TFLOPS (its README), the M >= 1024 anchors: (N, K, M) -> TFLOPS
DEEPGEMM_TFLOPS = {(4096, 7168, 4096): 1410, (7168, 16384, 4096): 1520, (2112, 7168, 64): 206}
# SGLang's 15 committed H200 block-fp8 tables (DeepSeek-V3's linear layers)
SGLANG15 = [(1536, 7168), (2048, 512), (2304, 7168), (24576, 7168), (3072, 1536), (32768, 512), (4096, 512),
            (512, 7168), (576, 7168), (7168, 1024), (7168, 1152), (7168, 16384), (7168, 18432), (7168, 2304),
            (7168, 256)]


def full_grid():
    """The issue's grid: (layout, N, K, Ms) in run order. tensor and rowwise:
    the 8 Llama pairs and DeepGEMM's 6 shapes; block: SGLang's 15 H200 shapes,
    DeepGEMM's 6 and the 8 Llama pairs. M 1, 16, 64, 1024 everywhere, and
    M = 4096 on DeepGEMM's shapes (its M >= 1024 anchors)."""
    out, seen = [], set()
    for layout, shapes in (("tensor", LLAMA + LLAMA70 + DEEPGEMM), ("rowwise", LLAMA + LLAMA70 + DEEPGEMM),
                           ("block", SGLANG15 + DEEPGEMM + LLAMA + LLAMA70)):
        for nk in shapes:
            if (layout,) + nk in seen:
                continue
            seen.add((layout,) + nk)
            out.append((layout, nk[0], nk[1], [1, 16, 64, 1024] + ([4096] if nk in DEEPGEMM else [])))
    return out


def parse_nk(text):
    return [tuple(int(v) for v in p.split("x")) for p in text.split(",") if p]


def quantise(torch, x, layout, group=128):
    """bf16 x [R, K] -> (q e4m3fn, scales): tensor 0-d, rowwise [R], block per
    1 x 128 group [R, K/128] (row-major here; callers lay it out)."""
    f = x.float()
    if layout == "tensor":
        s = f.abs().amax().clamp(min=1e-10) / 448.0
        q = (f / s).clamp(-448, 448).to(torch.float8_e4m3fn)
        return q, s.reshape(())
    if layout == "rowwise":
        s = f.abs().amax(dim=1).clamp(min=1e-10) / 448.0
        q = (f / s[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        return q, s
    R, K = f.shape
    kb = (K + group - 1) // group
    pad = torch.zeros(R, kb * group, device=x.device)
    pad[:, :K] = f
    g = pad.view(R, kb, group)
    s = g.abs().amax(dim=2).clamp(min=1e-10) / 448.0
    q = (g / s[:, :, None]).clamp(-448, 448).view(R, kb * group)[:, :K].to(torch.float8_e4m3fn)
    return q.contiguous(), s


def weight_block_quant(torch, w, block=128):
    """bf16 W [N, K] -> (q, sb [N/128, K/128]): one scale per 128 x 128 block."""
    N, K = w.shape
    nb, kb = (N + block - 1) // block, (K + block - 1) // block
    pad = torch.zeros(nb * block, kb * block, device=w.device)
    pad[:N, :K] = w.float()
    g = pad.view(nb, block, kb, block)
    s = g.abs().amax(dim=(1, 3)).clamp(min=1e-10) / 448.0
    q = (g / s[:, None, :, None]).clamp(-448, 448).view(nb * block, kb * block)[:N, :K].to(torch.float8_e4m3fn)
    return q.contiguous(), s.contiguous()


def dequant(torch, q, s, layout, rows_are_weight=False, block=128):
    f = q.double()
    if layout == "tensor":
        return f * s.double()
    if layout == "rowwise":
        return f * s.double()[:, None]
    R, K = f.shape
    if rows_are_weight:  # s [N/128, K/128]
        full = s.double().repeat_interleave(block, 0)[:R].repeat_interleave(block, 1)[:, :K]
    else:  # s [R, K/128]
        full = s.double().repeat_interleave(block, 1)[:, :K]
    return f * full


def read_ceiling(torch, timer, lib, w8):
    nbytes = w8.numel()
    if lib is None:
        return {"us": timer.cold(lambda: torch.sum(w8.view(torch.uint8), dtype=torch.int32))["us"], "kind": "torch sum"}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.empty(8 * sms, dtype=torch.float32, device="cuda")
    best = None
    for per_sm in (4, 8):
        def fn(per_sm=per_sm):
            e = lib.kd_bench_read(ctypes.c_void_p(w8.data_ptr()), ctypes.c_int64(nbytes // 16 * 16), per_sm * sms,
                                  ctypes.c_void_p(sink.data_ptr()), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            if e != 0:
                raise RuntimeError(f"kd_bench_read: cudaError {e}")
        t = timer.cold(fn)["us"]
        if best is None or t < best["us"]:
            best = {"us": t, "kind": f"read kernel, {per_sm} blocks/SM"}
    return best


def point(torch, F, timer, layout, N, K, M, w, wq, ceil, tol, sglang_configs=SGLANG_CONFIGS):
    row = {"layout": layout, "N": N, "K": K, "M": M}
    x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    a8, sa = quantise(torch, x, layout)
    w8, sb = wq
    # kdispatch's layouts: block sa M-major [K/128, M]
    sa_kd = sa.t().contiguous() if layout == "block" else sa.reshape(-1) if layout == "rowwise" else sa.reshape(1)
    sb_kd = sb if layout == "block" else sb.reshape(-1) if layout == "rowwise" else sb.reshape(1)
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    kd_op = getattr(torch.ops.kdispatch, f"gemm_fp8_{layout}_out")
    impls = {"kdispatch": lambda: kd_op(out, a8, w8, sa_kd, sb_kd)}
    if layout == "block":
        # SGLang's per_token_group_quant_fp8 layout, K-major [M, K/128], given
        # as its transpose (a column-major view, no copy): the op converts it
        sa_km = sa.contiguous().t()
        impls["kdispatch_kmajor"] = lambda: kd_op(out, a8, w8, sa_km, sb_kd)
    # torch's scaled matmul in the same layout
    b8t = w8.t()
    if layout == "tensor":
        args = (sa.reshape(()), sb.reshape(()))
    elif layout == "rowwise":
        args = (sa.reshape(M, 1), sb.reshape(1, N))
    else:
        args = (sa_kd.t(), sb.t())  # [M, K/128] outer-dim major; [K/128, N/128]
    peer_err = None
    try:
        torch._scaled_mm(a8, b8t, *args, out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        impls["torch_scaled_mm"] = lambda: torch._scaled_mm(a8, b8t, *args, out_dtype=torch.bfloat16)
    except Exception as e:  # noqa: BLE001
        peer_err = str(e).splitlines()[0][:160]
        row["peer_refused"] = peer_err
    if layout == "block":
        # the Triton peer of SGLang's block GEMM; triton is imported here only,
        # and any failure (no triton, a refused config, a compile error) is recorded
        try:
            from triton_fp8_block import make_block_fp8_peer
            tri_fn, tri_desc = make_block_fp8_peer(sglang_configs, N, K, M, out)
            row["triton_config"] = tri_desc
            sa_mk = sa_kd.t()  # [M, K/128] view of the M-major scales, strides (1, M)
            tri_fn(a8, w8, sa_mk, sb)  # compiles; raises here rather than in the rounds
            torch.cuda.synchronize()
            impls["triton_sglang"] = lambda: tri_fn(a8, w8, sa_mk, sb)
        except Exception as e:  # noqa: BLE001
            lines = str(e).strip().splitlines() or [""]
            row["triton_refused"] = f"{type(e).__name__}: {lines[0][:200]}"
    wb = w
    impls["bf16_linear"] = lambda: F.linear(x, wb)
    if M <= 16 and layout == "tensor":
        # our own bf16 table on the same (N, K): the fp8 speedup's bound is
        # its time over the fp8 read ceiling
        out16 = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        impls["kd_bf16"] = lambda: torch.ops.kdispatch.gemm_out(out16, x, wb)
    # correctness: float64 of the dequantised inputs on a sample of rows
    idx = sorted(set(range(min(M, 64))) | set(range(max(0, M - 32), M)))
    it = torch.tensor(idx, device="cuda")
    if layout == "block":
        da = dequant(torch, a8[it], sa[it], layout)
        dw = dequant(torch, w8, sb, layout, rows_are_weight=True)
    else:
        da = dequant(torch, a8[it], sa if layout == "tensor" else sa[it], layout)
        dw = dequant(torch, w8, sb, layout)
    ref = da @ dw.t()
    for name, fn in impls.items():
        if name in ("bf16_linear", "kd_bf16"):
            continue
        out.fill_(float("nan"))
        got = fn()
        got = out if got is None else got
        torch.cuda.synchronize()
        err = float((got[it].double() - ref).norm() / ref.norm().clamp(min=1e-30))
        row[f"{name}_err"] = err
        if not err < tol:
            row[f"{name}_bad"] = True
    t = timer.cold_interleaved(impls)
    for name, r in t.items():
        row[f"{name}_us"] = r["us"]
        row[f"{name}_p20"] = r["p20"]
        row[f"{name}_p80"] = r["p80"]
    row["ceiling_us"] = ceil["us"]
    row["ceiling_kind"] = ceil["kind"]
    try:
        impls["kdispatch"]()  # the info of this call, not of the last impl of the rounds
        torch.cuda.synchronize()
        src, variant, m, source_id, tuned = torch.ops.kdispatch._last_info()
        row["kd_source"], row["kd_variant"] = str(src), str(variant)
    except Exception:  # noqa: BLE001
        pass
    return row


# the peers a point may have, fastest correct one first in "kd / peer": (row key, short name)
PEERS = (("torch_scaled_mm", "torch"), ("triton_sglang", "triton"))


def best_peer(r):
    """(row key, short name, µs) of the row's fastest peer among those within the
    error bar (the fastest of all where none is), or (None, None, None)."""
    timed = [(r[k + "_us"], k, nm) for k, nm in PEERS if r.get(k + "_us")]
    good = [t for t in timed if not r.get(t[1] + "_bad")]
    pick = min(good or timed, default=None)
    return (pick[1], pick[2], pick[0]) if pick else (None, None, None)


def kmajor(r):
    """The K-major scale_a call (block): its time and the conversion's cost over the M-major call."""
    if not r.get("kdispatch_kmajor_us") or not r.get("kdispatch_us"):
        return "-"
    bad = ", over the error bar" if r.get("kdispatch_kmajor_bad") else ""
    return f"{r['kdispatch_kmajor_us']:.1f} (+{r['kdispatch_kmajor_us'] - r['kdispatch_us']:.1f}){bad}"


def tflops(r):
    """TFLOPS of the table's choice at M >= 1024 (and DeepGEMM's anchors), with DeepGEMM's H800 figure."""
    anchor = DEEPGEMM_TFLOPS.get((r["N"], r["K"], r["M"]))
    if not r.get("kdispatch_us") or (r["M"] < 1024 and anchor is None):
        return "-"
    t = 2.0 * r["M"] * r["N"] * r["K"] / (r["kdispatch_us"] * 1e-6) / 1e12
    return f"{t:.0f}" + (f" (DeepGEMM H800: {anchor})" if anchor else "")


def render(rows, commit):
    lines = [f"fp8 GEMM on the H200, commit {commit}, {time.strftime('%Y-%m-%d')}; µs median (p20-p80) of the cold, "
             "interleaved rounds; ratios within the run; kd / peer against the fastest peer of the point "
             "(torch._scaled_mm or, block only, the Triton peer of SGLang's kernel on SGLang's config), named.", "",
             "| layout | N x K | M | kdispatch | torch._scaled_mm | triton (SGLang cfg) | kd / peer | bf16 F.linear | "
             "read ceiling | kd % of ceiling | kd rel. err | peer rel. err | kd variant | kd, K-major scale_a | TFLOPS |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kd = r.get("kdispatch_us")
        pk, pname, peer = best_peer(r)
        fmt = lambda k: f"{r[k + '_us']:.1f} ({r[k + '_p20']:.1f}-{r[k + '_p80']:.1f})" if k + "_us" in r else "-"
        if kd and peer:
            ratio = f"{peer / kd:.2f}x ({pname}{', over the error bar' if r.get(pk + '_bad') else ''})"
        elif kd:
            why = [r[k][:60] for k in ("peer_refused", "triton_refused") if r.get(k)]
            ratio = "no peer: " + ("; ".join(why) if why else "?")
        else:
            ratio = "-"
        frac = f"{100 * r['ceiling_us'] / kd:.0f}%" if kd else "-"
        lines.append(f"| {r['layout']} | {r['N']}x{r['K']} | {r['M']} | {fmt('kdispatch')} | {fmt('torch_scaled_mm')} | "
                     f"{fmt('triton_sglang')}{', over the error bar' if r.get('triton_sglang_bad') else ''} | {ratio} | {fmt('bf16_linear')} | {r['ceiling_us']:.1f} | {frac} | "
                     f"{r.get('kdispatch_err', float('nan')):.1e} | "
                     f"{r.get(pk + '_err', float('nan')) if pk else float('nan'):.1e} | "
                     f"{r.get('kd_variant', '?')} | {kmajor(r)} | {tflops(r)} |")
    # geomeans per layout, against each point's fastest peer; M <= 16
    lines.append("")
    for lay in ("tensor", "rowwise", "block"):
        sel = [r for r in rows if r["layout"] == lay and r.get("kdispatch_us")]
        if not sel:
            continue
        dec = [r for r in sel if r["M"] <= 16]
        g = lambda v: math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")
        vs_peer = [best_peer(r)[2] / r["kdispatch_us"] for r in sel if best_peer(r)[2]]
        vs_peer_dec = [best_peer(r)[2] / r["kdispatch_us"] for r in dec if best_peer(r)[2]]
        ceil = [r["ceiling_us"] / r["kdispatch_us"] for r in dec]
        tally = ""
        if any(r.get("triton_sglang_us") for r in sel):
            names = [best_peer(r)[1] for r in sel if best_peer(r)[2]]
            tally = " (fastest peer: " + ", ".join(f"{nm} {names.count(nm)}" for _, nm in PEERS) + ")"
        lines.append(f"- {lay}: kd / peer geomean {g(vs_peer):.2f}x over {len(vs_peer)} points{tally} "
                     f"(M <= 16: {g(vs_peer_dec):.2f}x over {len(vs_peer_dec)}); M <= 16 fraction of the read "
                     f"ceiling geomean {100 * g(ceil):.0f}% over {len(ceil)} points")
    bf = [r for r in rows if r.get("kd_bf16_us") and r.get("kdispatch_us")]
    if bf:
        lines += ["", "Against our own bf16 table (tensor layout, M <= 16): the fp8 speedup beside its bound, "
                  "bf16 table time / fp8 read ceiling (both this run); the target is >= 0.85x the bound.", "",
                  "| N x K | M | kd bf16 | kd fp8 (tensor) | speedup | bound | speedup / bound |", "|---|---|---|---|---|---|---|"]
        for r in bf:
            sp, bound = r["kd_bf16_us"] / r["kdispatch_us"], r["kd_bf16_us"] / r["ceiling_us"]
            lines.append(f"| {r['N']}x{r['K']} | {r['M']} | {r['kd_bf16_us']:.1f} | {r['kdispatch_us']:.1f} | "
                         f"{sp:.2f}x | {bound:.2f}x | {sp / bound:.2f} |")
    km = [r for r in rows if r.get("kdispatch_kmajor_us") and r.get("kdispatch_us")]
    if km:
        d = sorted(r["kdispatch_kmajor_us"] - r["kdispatch_us"] for r in km)
        lines += ["", f"- K-major scale_a (block): the conversion costs {d[len(d) // 2]:+.1f} µs median over "
                  f"{len(km)} points (range {d[0]:+.1f} to {d[-1]:+.1f})"]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="libkdispatch.so (KDISPATCH_LIBRARY for the torch ops)")
    ap.add_argument("--read-lib", help="libkdispatch_bench_read.so (the read ceiling)")
    ap.add_argument("--layouts", default="tensor,rowwise,block")
    ap.add_argument("--nk", default=",".join(f"{n}x{k}" for n, k in LLAMA + DEEPGEMM[:1]))
    ap.add_argument("--m", default="1,16,64,1024")
    ap.add_argument("--grid", choices=("nk", "full"), default="nk",
                    help="nk: --nk x --m in every layout; full: the issue's grid (full_grid(): the 8 Llama pairs and "
                         "DeepGEMM's 6 shapes per tensor/rowwise, SGLang's 15 H200 shapes + those per block)")
    ap.add_argument("--tol", type=float, default=2e-2, help="relative L2 error bar against float64 (default 0.02)")
    ap.add_argument("--out", default="out")
    ap.add_argument("--commit", default=os.environ.get("KD_COMMIT", "unknown"))
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--render", help="render a bench_fp8.json and exit")
    ap.add_argument("--sglang-configs", default=SGLANG_CONFIGS,
                    help="SGLang's quantization config folder (the block layout's Triton peer reads "
                         "N=..,K=..,device_name=..,dtype=fp8_w8a8,block_shape=[128, 128].json there; "
                         "default ../shared/data/sglang-configs/quantization beside the repo)")
    args = ap.parse_args()
    if args.render:
        print(render(json.load(open(args.render))["rows"], args.commit))
        return 0
    if args.lib:
        os.environ.setdefault("KDISPATCH_LIBRARY", args.lib)
    import torch
    import torch.nn.functional as F
    import kdispatch.torch_ops  # noqa: F401  registers torch.ops.kdispatch
    t_end = time.time() + args.budget_s
    timer = Timer(torch)
    if "block" in args.layouts.split(",") and not os.path.isdir(args.sglang_configs):
        print(f"note: no SGLang config folder {args.sglang_configs}: the Triton peer runs SGLang's default config",
              flush=True)
    lib = ctypes.CDLL(args.read_lib) if args.read_lib else None
    rows = []
    os.makedirs(args.out, exist_ok=True)
    ms = [int(v) for v in args.m.split(",")]
    if args.grid == "full":
        plan = [(lay, N, K, m) for lay, N, K, m in full_grid() if lay in args.layouts.split(",")]
    else:
        plan = [(lay, N, K, ms) for N, K in parse_nk(args.nk) for lay in args.layouts.split(",")]
    # by (N, K): one weight, its quantisations and its read ceiling per shape
    by_nk = {}
    for lay, N, K, m in plan:
        by_nk.setdefault((N, K), []).append((lay, m))
    spent = False
    for (N, K), work in by_nk.items():
        if spent:
            break
        w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda") * 0.02
        quants = {"tensor": quantise(torch, w, "tensor"), "rowwise": quantise(torch, w, "rowwise"),
                  "block": weight_block_quant(torch, w)}
        ceil = read_ceiling(torch, timer, lib, quants["tensor"][0])
        for layout, mlist in work:
            for M in mlist:
                if time.time() > t_end:
                    print("budget spent", flush=True)
                    spent = True
                    break
                r = point(torch, F, timer, layout, N, K, M, w, quants[layout], ceil, args.tol,
                          sglang_configs=args.sglang_configs)
                rows.append(r)
                print(json.dumps(r), flush=True)
        json.dump({"rows": rows, "device": torch.cuda.get_device_name(0), "torch": torch.__version__},
                  open(os.path.join(args.out, "bench_fp8.json"), "w"), indent=1)
    md = render(rows, args.commit)
    open(os.path.join(args.out, "h200_fp8.md"), "w").write(md + "\n")
    print(md)
    bad = [r for r in rows if r.get("kdispatch_bad")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
