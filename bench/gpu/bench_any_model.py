# SPDX-License-Identifier: Apache-2.0
"""The "any model" benchmark (issue 32): kdispatch's GEMMs on projections of
models the project has no rows for, against the torch call they replace, as
served, plus the floor's check.

Per point (N, K, M) and kind:
  bf16     torch = F.linear(x, w[, b]) (b: the projections in BIASED, as their
           model has it); kd = torch.ops.kdispatch.gemm_out on the
           default runtime (shipped configs: no row for these shapes, so
           get_default serves); floor = the same op on a runtime forced to
           gemm_bf16__cublas (cuBLAS as F.linear calls it)
  tensor / rowwise / block
           torch = torch._scaled_mm in the same layout (bench_fp8.py's
           inputs); kd = torch.ops.kdispatch.gemm_fp8_<layout>_out; floor =
           the same op forced to gemm_fp8_<layout>_e4m3fn__cublaslt with
           algo_id -2 (cuBLASLt asked as torch._scaled_mm asks it)
and an A/A control per side: torch_aa (the same torch call again) and
kd_aa (the same kd call again), timed in the same rounds.

Timing (gpu_timing.py), R rounds (default 5), every implementation in every
round, order rotated per round; the point's number is the median over rounds:
  cold   one call, L2 evicted before it, a GPU sleep ahead so the host's
         launch cost stays out (Timer.cold_interleaved);
  graph  20 calls back to back in one CUDA graph, the weight rotated over
         copies totalling > 2x L2 (Timer.graph), time per call.
The A/A spread of a point is max(|torch_aa/torch - 1|, |kd_aa/kd - 1|) in
that mode.

Floor check (per point, before timing): the floor's output is bitwise equal
to torch's, and the GEMM kernels torch.profiler records for one floor call
are the ones it records for one torch call (names; the bias/copy kernels
left out).

  python3 bench/gpu/bench_any_model.py --out DIR [--kinds bf16,tensor,rowwise,block]
         [--grid bench|fit|committed|large] [--kd-force SPEC] [--rounds 5] [--budget-s 500] [--resume FILE]
writes DIR/any_model.json (resumable: points already there are skipped) and
prints one line per point; --render FILE prints the markdown summary.
--grid committed: the shapes configs/cuda has rows for (COMMITTED: the 8 bf16
Llama pairs x the 14 Ms; COMMITTED_FP8 x M 1, 16, 64, 1024 per fp8 layout),
kd served from those rows: committed.json.
--grid large: the dense 8192^3 GEMM and the committed bf16 shapes at M 1024..8192
(issue 36's milestone); with --kd-force gemm=gemm_bf16__wgmma, kd is that family
at its default point. --grid fit: the synthetic (N, K) grid get_default's decode tiers are fitted on
(bench/gpu/fit_grid.csv; fp8: the pairs with N*K <= 2^27), M 1..16, cold and
graph (--fit-modes; graph alone up to 2026-12-03), 3 rounds, kd (get_default's
rule) vs the floor vs torch.
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# (model, projection, N, K): five families with no committed rows (configs/cuda
# holds Llama-3-8B, Llama-3-70B TP8 and SGLang's DeepSeek-V3 block shapes).
PROJECTIONS = [
    ("Qwen2.5-7B", "qkv", 4608, 3584), ("Qwen2.5-7B", "o", 3584, 3584),
    ("Qwen2.5-7B", "gate_up", 37888, 3584), ("Qwen2.5-7B", "down", 3584, 18944),
    ("Mistral-Nemo-12B", "qkv", 6144, 5120), ("Mistral-Nemo-12B", "o", 5120, 4096),
    ("Mistral-Nemo-12B", "gate_up", 28672, 5120),
    ("Phi-3-mini", "qkv", 9216, 3072), ("Phi-3-mini", "gate_up", 16384, 3072), ("Phi-3-mini", "down", 3072, 8192),
    # (Gemma-2-9B's qkv, 8192x3584, is Llama-3-70B TP8's down projection, a
    # committed shape: its gate_up instead since 2026-12-03's second run.)
    ("Gemma-2-9B", "gate_up", 28672, 3584), ("Gemma-2-9B", "down", 3584, 14336),
    ("Qwen3-8B", "gate_up", 24576, 4096), ("Qwen3-8B", "down", 4096, 12288),
]
# Projections that carry a bias in their model (Qwen2's q/k/v): bf16 runs them
# with it (F.linear's bias; kdispatch's gemm with a bias is another key, the
# one `tune --model` tunes), since 2026-12-04 (run 4 timed them without).
BIASED = {("Qwen2.5-7B", "qkv")}
# --grid committed: the shapes configs/cuda holds rows for (bench_gpu.py's and
# run_h200.sh's fp8 grids), served from those rows: "committed shapes" of
# issue 32's targets.
COMMITTED = [
    ("Llama-3-8B", "qkv", 6144, 4096), ("Llama-3-8B", "o", 4096, 4096), ("Llama-3-8B", "gate_up", 28672, 4096),
    ("Llama-3-8B", "down", 4096, 14336), ("Llama-3-70B-TP8", "qkv", 1280, 8192), ("Llama-3-70B-TP8", "o", 8192, 1024),
    ("Llama-3-70B-TP8", "gate_up", 7168, 8192), ("Llama-3-70B-TP8", "down", 8192, 3584),
]
# --grid large (issue 36's milestone): the dense 8192^3 GEMM and the committed
# bf16 shapes at prefill M, for a family forced with --kd-force.
LARGE = [("square", "8192", 8192, 8192)] + COMMITTED
LARGE_MS = [1024, 2048, 4096, 8192]
COMMITTED_FP8 = [("Llama-3-8B", "qkv", 6144, 4096), ("Llama-3-8B", "o", 4096, 4096),
                 ("Llama-3-8B", "gate_up", 28672, 4096), ("Llama-3-8B", "down", 4096, 14336),
                 ("DeepSeek-V3", "q_a/kv_a", 2112, 7168), ("DeepSeek-V3", "o", 7168, 16384)]
COMMITTED_FP8_MS = [1, 16, 64, 1024]
FP8_PROJECTIONS = [(4608, 3584), (5120, 4096), (28672, 5120), (9216, 3072), (3584, 14336), (24576, 4096)]
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
FP8_MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]
GEMM_KERNEL_HINTS = ("gemm", "nvjet", "xmma", "cutlass", "sm90", "splitk", "splitK", "reduce")


def fit_grid():
    rows = []
    with open(os.path.join(HERE, "fit_grid.csv")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and not line.startswith("N"):
                n, k = line.split(",")[:2]
                rows.append(("fit", "grid", int(n), int(k)))
    return rows


def median(xs):
    xs = sorted(x for x in xs if x == x)
    return xs[len(xs) // 2] if xs else float("nan")


def gemm_kernels(torch, fn):
    """Names of the GEMM kernels one call of fn launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = []
    for e in prof.events():
        dev = str(getattr(e, "device_type", "")).lower()
        if "cuda" not in dev:
            continue
        if any(h in e.name for h in GEMM_KERNEL_HINTS) and "elementwise" not in e.name:
            names.append(e.name)
    return names


class Point:
    def __init__(self, torch, F, kd, kind, N, K, M, rt_floor, rt_default, bias=False):
        self.torch, self.kind, self.N, self.K, self.M = torch, kind, N, K, M
        self.rt_floor, self.rt_default = rt_floor, rt_default
        # torch._scaled_mm's block mode (torch 2.11, cuBLASLt 13) reads scale_b with a row stride of
        # ceil(K/128) rounded up to 4 and is handed the unpadded [N/128, K/128] scales: at ceil(K/128) % 4 != 0
        # it reads past them (an illegal address at N=3200, K=6528 in the second fit). Not called there.
        self.torch_ok = not (kind == "block" and ((K + 127) // 128) % 4)
        dev = "cuda"
        # weights: enough copies to rotate past 2x L2 (H200: 50 MiB L2) in graphs
        wbytes = N * K * (2 if kind == "bf16" else 1)
        self.copies = max(1, min(20, math.ceil(2.2 * 50 * 2**20 / wbytes)))
        x = torch.randn(M, K, dtype=torch.bfloat16, device=dev)
        self.out = [torch.empty(M, N, dtype=torch.bfloat16, device=dev) for _ in range(2)]
        if kind == "bf16":
            ws = [torch.randn(N, K, dtype=torch.bfloat16, device=dev) / math.sqrt(K) for _ in range(self.copies)]
            b = torch.randn(N, dtype=torch.bfloat16, device=dev) if bias else None
            self.x, self.ws = x, ws
            self.call = {
                "torch": lambda i=0: F.linear(x, ws[i], b),
                "kd": lambda i=0: kd.gemm_out(self.out[0], x, ws[i], b),
            }
            self.ref = lambda: (x[: min(M, 64)].double() @ ws[0].double().t() + (0 if b is None else b.double()))
        else:
            import bench_fp8 as b8
            a8, sa = b8.quantise(torch, x, kind)
            wq = []
            for _ in range(self.copies):
                w = torch.randn(N, K, dtype=torch.bfloat16, device=dev) / math.sqrt(K)
                if kind == "block":
                    wq.append(b8.weight_block_quant(torch, w))
                else:
                    wq.append(b8.quantise(torch, w, kind))
            sa_kd = sa.t().contiguous() if kind == "block" else sa.reshape(-1) if kind == "rowwise" else sa.reshape(1)
            sbs = [(w8, sb if kind == "block" else sb.reshape(-1) if kind == "rowwise" else sb.reshape(1)) for w8, sb in wq]
            if kind == "tensor":
                targs = [(sa.reshape(()), sb.reshape(())) for _, sb in wq]
            elif kind == "rowwise":
                targs = [(sa.reshape(M, 1), sb.reshape(1, N)) for _, sb in wq]
            else:
                targs = [(sa_kd.t(), sb.t()) for _, sb in wq]
            op = getattr(kd, f"gemm_fp8_{kind}_out")
            self.call = {
                "torch": lambda i=0: torch._scaled_mm(a8, wq[i][0].t(), *targs[i], out_dtype=torch.bfloat16),
                "kd": lambda i=0: op(self.out[0], a8, sbs[i][0], sa_kd, sbs[i][1]),
            }
            idx = list(range(min(M, 64)))
            da = b8.dequant(torch, a8[idx], sa[idx] if kind != "tensor" else sa, kind)
            dw = b8.dequant(torch, wq[0][0], wq[0][1], kind, rows_are_weight=True)
            self.ref = lambda: da @ dw.t()

    def with_rt(self, rt, fn):
        def go(i=0):
            self.kd_mod.set_runtime(rt)
            return fn(i)
        return go

    def impls(self, kd_mod, fit=False):
        self.kd_mod = kd_mod
        c = self.call
        if fit:
            return {**({"torch": c["torch"]} if self.torch_ok else {}), "kd": self.with_rt(self.rt_default, c["kd"]),
                    "floor": self.with_rt(self.rt_floor, c["kd"])}
        if not self.torch_ok:
            raise RuntimeError("torch._scaled_mm's block mode reads past unpadded scales at ceil(K/128) % 4 != 0")
        return {
            "torch": c["torch"], "torch_aa": lambda i=0: c["torch"](i),
            "kd": self.with_rt(self.rt_default, c["kd"]), "kd_aa": self.with_rt(self.rt_default, c["kd"]),
            "floor": self.with_rt(self.rt_floor, c["kd"]),
        }


def run_point(torch, timer, kd_mod, pt, rounds, modes, row, fit=False):
    impls = pt.impls(kd_mod, fit)
    # correctness and the floor check
    ref = pt.ref()
    rows = ref.shape[0]
    tout = None
    if "torch" in impls:
        tout = impls["torch"]()
        torch.cuda.synchronize()
        tout = tout.clone()
    else:
        row["torch_skipped"] = "scale_b rows not padded to 4 blocks (see Point)"
    for name in ("kd", "floor"):
        pt.out[0].fill_(float("nan"))
        impls[name]()
        torch.cuda.synchronize()
        got = pt.out[0].clone()
        err = float((got[:rows].double() - ref).norm() / ref.norm().clamp(min=1e-30))
        row[f"{name}_err"] = err
        if name == "floor" and tout is not None:
            row["floor_bitwise"] = bool(torch.equal(got.view(torch.int16), tout.view(torch.int16)))
    try:
        kd_mod.set_runtime(pt.rt_default)
        impls["kd"]()
        torch.cuda.synchronize()
        src, variant, m, sid, tuned = torch.ops.kdispatch._last_info()
        row["kd_source"], row["kd_variant"] = str(src), str(variant)
        kd_mod.set_runtime(pt.rt_floor)
        impls["floor"]()
        torch.cuda.synchronize()
        src, variant, m, sid, tuned = torch.ops.kdispatch._last_info()
        row["floor_variant"] = str(variant)
    except Exception as e:  # noqa: BLE001
        row["info_error"] = str(e)[:200]
    try:
        if fit:
            raise StopIteration
        row["torch_kernels"] = gemm_kernels(torch, impls["torch"])
        row["floor_kernels"] = gemm_kernels(torch, impls["floor"])
        row["kd_kernels"] = gemm_kernels(torch, impls["kd"])
        row["floor_same_kernels"] = row["torch_kernels"] == row["floor_kernels"]
    except StopIteration:
        pass
    except Exception as e:  # noqa: BLE001
        row["profile_error"] = str(e)[:200]
    names = list(impls)
    res = {m: {n: [] for n in names} for m in modes}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        if "cold" in modes:
            t = timer.cold_interleaved({n: impls[n] for n in order}, rep_ms=8.0, min_iters=10, chunk=5)
            for n in names:
                res["cold"][n].append(t[n]["us"])
        if "graph" in modes:
            for n in order:
                fn = impls[n]
                calls = [(lambda i=i, fn=fn: fn(i % pt.copies)) for i in range(20)]
                res["graph"][n].append(timer.graph(calls)["us"])
    kd_mod.set_runtime(None)
    for m in modes:
        for n in names:
            row[f"{m}_{n}_us"] = median(res[m][n])
        if "torch" not in names:
            continue
        t, k = row[f"{m}_torch_us"], row[f"{m}_kd_us"]
        row[f"{m}_ratio"] = t / k  # > 1: kdispatch faster
        row[f"{m}_floor_ratio"] = t / row[f"{m}_floor_us"]
        if not fit:
            row[f"{m}_aa"] = max(abs(row[f"{m}_torch_aa_us"] / t - 1), abs(row[f"{m}_kd_aa_us"] / k - 1))
    return row


def no_nan(x):
    """x with every NaN / inf float as None: strict JSON (NaN is not JSON; kdispatch report and
    other readers refuse it), a point not measured reads as null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: no_nan(v) for k, v in x.items()}
    if isinstance(x, list):
        return [no_nan(v) for v in x]
    return x


def save(done, path):
    with open(path, "w") as f:
        json.dump(no_nan(done), f, allow_nan=False)


def geomean(xs):
    xs = [x for x in xs if x and x == x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def render(rows, commit=""):
    out = [f"# The any-model benchmark (issue 32), {time.strftime('%Y-%m-%d')}{' at ' + commit if commit else ''}", ""]
    for kind in ("bf16", "tensor", "rowwise", "block"):
        rs = [r for r in rows if r["kind"] == kind and r.get("cold_ratio") is not None and r.get("graph_ratio") is not None]
        if not rs:
            continue
        out += [f"## {kind}", ""]
        for mode in ("cold", "graph"):
            ratios = [r[f"{mode}_ratio"] for r in rs]
            below = [r for r in rs if r[f"{mode}_ratio"] < 0.97 - r[f"{mode}_aa"]]
            below_raw = [r for r in rs if r[f"{mode}_ratio"] < 0.97]
            small = [r[f"{mode}_ratio"] for r in rs if r["M"] <= 16]
            worst = min(rs, key=lambda r: r[f"{mode}_ratio"])
            out.append(f"- {mode}: geomean {geomean(ratios):.3f}x over {len(rs)} points (M <= 16: {geomean(small):.3f}x); "
                       f"{len(below_raw)} below 0.97x ({len(below)} beyond their A/A spread); worst "
                       f"{worst[f'{mode}_ratio']:.2f}x at N={worst['N']} K={worst['K']} M={worst['M']} "
                       f"({worst.get('kd_variant', '?')}); floor geomean {geomean([r[f'{mode}_floor_ratio'] for r in rs]):.3f}x")
        same = sum(1 for r in rs if r.get("floor_same_kernels"))
        bit = sum(1 for r in rs if r.get("floor_bitwise"))
        out.append(f"- floor check: same GEMM kernels as torch at {same}/{len(rs)} points, bitwise equal at {bit}/{len(rs)}")
        out += ["", "| model | N x K | M | torch cold us | kd cold us | cold x | A/A | torch graph us | kd graph us | graph x | A/A | floor graph x | kd variant | floor = torch |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            out.append(f"| {r.get('model', '')} {r.get('proj', '')} | {r['N']}x{r['K']} | {r['M']} | {r['cold_torch_us']:.1f} | "
                       f"{r['cold_kd_us']:.1f} | {r['cold_ratio']:.2f} | {r['cold_aa']:.2f} | {r['graph_torch_us']:.1f} | "
                       f"{r['graph_kd_us']:.1f} | {r['graph_ratio']:.2f} | {r['graph_aa']:.2f} | {r['graph_floor_ratio']:.2f} | "
                       f"{r.get('kd_variant', '?').split('__')[-1]} | {'yes' if r.get('floor_same_kernels') else 'NO'}"
                       f"{'' if r.get('floor_bitwise') else ' (not bitwise)'} |")
        out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--kinds", default="bf16,tensor,rowwise,block")
    ap.add_argument("--grid", default="bench", choices=("bench", "fit", "committed", "large"))
    ap.add_argument("--kd-force", default=None,
                    help="kd on a runtime forced to this spec (e.g. gemm=gemm_bf16__wgmma), no shipped configs")
    ap.add_argument("--rounds", type=int, default=None, help="5 (bench), 3 (fit)")
    ap.add_argument("--budget-s", type=float, default=500)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--ms", default=None)
    ap.add_argument("--fit-modes", default="cold,graph",
                    help="--grid fit: the timing modes (a cell must win in each; 'graph' alone: the fits up to 2026-12-03)")
    ap.add_argument("--models", default=None, help="only these model names (comma-separated; bench grid)")
    ap.add_argument("--json-name", default=None, help="the results file's name in --out")
    ap.add_argument("--render", default=None)
    ap.add_argument("--commit", default=os.environ.get("KD_COMMIT", ""))
    a = ap.parse_args()
    if a.render:
        print(render(json.load(open(a.render))["rows"], a.commit))
        return 0
    import torch
    import torch.nn.functional as F

    import kdispatch
    from kdispatch import torch_ops as kd
    from gpu_timing import Timer

    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, a.json_name or {"bench": "any_model.json", "fit": "fit.json",
                                                "committed": "committed.json", "large": "large.json"}[a.grid])
    done = {"rows": []}
    if a.resume and os.path.exists(a.resume):
        done = json.load(open(a.resume))
    have = {(r["kind"], r["N"], r["K"], r["M"]) for r in done["rows"]}
    timer = Timer(torch)
    rt_default = kdispatch.Runtime.from_env() if not a.kd_force else \
        kdispatch.Runtime(force=a.kd_force, shipped_configs=False)
    floors = {"bf16": "gemm=gemm_bf16__cublas"}
    for L in ("tensor", "rowwise", "block"):
        floors[L] = f"gemm_fp8_{L}=gemm_fp8_{L}_e4m3fn__cublaslt:algo_id=-2"
    rts = {k: kdispatch.Runtime(force=v, shipped_configs=False) for k, v in floors.items()}
    kinds = a.kinds.split(",")
    modes = tuple(a.fit_modes.split(",")) if a.grid == "fit" else ("cold", "graph")
    complete = True
    for kind in kinds:
        if a.grid == "fit":
            projs = [(m, p, n, k) for (m, p, n, k) in fit_grid() if kind == "bf16" or n * k <= 2**27]
        elif a.grid == "committed":
            projs = COMMITTED if kind == "bf16" else COMMITTED_FP8
        elif a.grid == "large":
            projs = LARGE
        else:
            projs = PROJECTIONS if kind == "bf16" else \
                [(m, p, n, k) for (m, p, n, k) in PROJECTIONS if (n, k) in FP8_PROJECTIONS]
        if a.models:
            projs = [p for p in projs if p[0] in a.models.split(",")]
        if a.ms:
            ms = [int(x) for x in a.ms.split(",")]
        elif a.grid == "fit":
            ms = [1, 2, 4, 8, 16] if kind == "bf16" else [1, 8, 16]
        elif a.grid == "large":
            ms = LARGE_MS
        else:
            ms = MS if kind == "bf16" else COMMITTED_FP8_MS if a.grid == "committed" else FP8_MS
        for model, proj, N, K in projs:
            for M in ms:
                if (kind, N, K, M) in have:
                    continue
                if time.time() - t0 > a.budget_s:
                    complete = False
                    break
                bias = kind == "bf16" and (model, proj) in BIASED
                row = {"kind": kind, "model": model, "proj": proj, "N": N, "K": K, "M": M, "bias": bias}
                pt = None
                try:
                    pt = Point(torch, F, kd, kind, N, K, M, rts[kind], rt_default, bias)
                    run_point(torch, timer, kd, pt, a.rounds or (3 if a.grid == "fit" else 5), modes, row,
                              fit=a.grid == "fit")
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                    kd.set_runtime(None)
                done["rows"].append(row)
                have.add((kind, N, K, M))
                print(json.dumps({k: v for k, v in row.items() if not k.endswith("_kernels")}), flush=True)
                del pt
                save(done, path)
    done["complete"] = complete
    save(done, path)
    print(("COMPLETE" if complete else "INCOMPLETE") + f" {len(done['rows'])} points, {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
