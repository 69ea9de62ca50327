#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end decode: a small Llama-style decoder written in PyTorch (real model
dimensions, random weights, --layers layers), run twice on the same weights and
inputs: once on torch's own ops, once with RMSNorm, fused add+RMSNorm, SiLU*mul
and the linear layers going through the kdispatch ops (torch.ops.kdispatch.*), each in
eager mode and with the decode step captured in a CUDA graph. Reports decode
tokens/s of both, their ratio, and how far the outputs are apart.

One decode step (batch B = tokens decoded at once, one new token per sequence):

    residual = x                                   # the token embeddings [B, hidden]
    h = rmsnorm(x)                                 # first layer
    per layer:  h = fused_add_rmsnorm(h_prev, residual)        (layers after the first)
                qkv = linear(h, Wqkv [+ bqkv])     # N = (heads + 2 kv_heads) * head_dim
                a = attention stand-in(qkv)        # see below
                o = linear(a, Wo)
                h = fused_add_rmsnorm(o, residual)
                gu = linear(h, Wgate_up)           # N = 2 * intermediate
                h_prev = linear(silu_and_mul(gu), Wdown)  # silu(gu[:, :inter]) * gu[:, inter:]
    out = fused_add_rmsnorm(h_prev, residual)      # the final norm (as vLLM fuses it)

The attention is NOT what kdispatch dispatches, so a cheap elementwise stand-in
that keeps the shapes replaces it, identical in both runs: per KV group,
a = q * head_dim**-0.5 + k + v (attention over a context of one token returns v;
the q and k terms keep every column of the qkv GEMM in the output). No LM head,
no KV cache, no rotary embedding.

torch run: F.rms_norm, residual.add_ + F.rms_norm, F.silu(g) * u, F.linear (cuBLAS).
kdispatch run: torch.ops.kdispatch.rmsnorm / fused_add_rmsnorm_ / silu_and_mul / gemm, served by
one kdispatch.Runtime over --configs (tune="off", frozen: nothing is tuned,
reloaded or allocated by kdispatch while timing; under capture the ops pass
KDISPATCH_CALL_CAPTURING). Modes: eager (the step called in a loop; includes the
host cost of every op) and graph (one step captured with torch.cuda.graph after
warm-up on the capture stream, replayed; CUDA events around the replays).
tokens/s = batch * steps / seconds; the median of --repeats alternating
measurements. Correctness per batch: kdispatch's output vs torch's, relative L2
error < --tol (2e-2: bf16 through several layers), and each vs a float32 run of
the same model (the bf16 weights upcast), printed both.

Models (--model): llama3-8b (hidden 4096, 32 heads, 8 KV heads, head_dim 128,
intermediate 14336, eps 1e-5: qkv 6144x4096, o 4096x4096, gate_up 28672x4096,
down 4096x14336) and qwen2.5-0.5b (hidden 896, 14 heads, 2 KV heads, head_dim 64,
intermediate 4864, eps 1e-6, qkv bias: qkv 1152x896 + bias, o 896x896, gate_up
9728x896, down 896x4864). Target (the issue): in graph mode, kdispatch at least as
fast as torch at batch 1, 8 and 64.

Usage (on the GPU machine; bench/gpu/run_h200.sh --sections e2e runs all of it):
  python3 bench/gpu/e2e_decode.py --lib build/gpu/libkdispatch.so --model llama3-8b \\
      --configs configs --label "Llama-3-8B, committed configs" --out OUT
  python3 bench/gpu/e2e_decode.py --model qwen2.5-0.5b --write-shapes DIR   # DIR/gemm.csv, DIR/norms.csv
  kdispatch tune --backend cuda --op gemm --dtype bf16 --shapes DIR/gemm.csv --emit SCRATCH
  python3 bench/gpu/e2e_decode.py --lib ... --model qwen2.5-0.5b --configs SCRATCH,configs \\
      --label "Qwen2.5-0.5B, tuned" --out OUT
  python3 bench/gpu/e2e_decode.py --render OUT/e2e.json                      # e2e.md to stdout

Each run adds its rows (under --label) to OUT/e2e.json, keeping the other labels'
rows (from OUT/e2e.json, else from --resume), and rewrites OUT/e2e.md from all of
them. With --resume, batches of this label that the resumed file already holds are
not measured again. Exit status: 0 done, 3 when --budget-s left batches out (run
again with --resume), 1 on an error, 4 when an output check failed.
"""
import argparse
import atexit
import json
import math
import os
import shutil
import sys
import tempfile
import time

T0 = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))

MODELS = {
    "llama3-8b": dict(name="Llama-3-8B", hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, eps=1e-5,
                      qkv_bias=False),
    "qwen2.5-0.5b": dict(name="Qwen2.5-0.5B", hidden=896, heads=14, kv_heads=2, head_dim=64, inter=4864, eps=1e-6,
                         qkv_bias=True),
}
MODES = ("eager", "graph")


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def linear_shapes(d):
    """(name, N, K, bias) of one layer's linear layers (W is [N, K] as nn.Linear stores it)."""
    q = d["heads"] * d["head_dim"]
    return [("qkv", (d["heads"] + 2 * d["kv_heads"]) * d["head_dim"], d["hidden"], d["qkv_bias"]),
            ("o", d["hidden"], q, False),
            ("gate_up", 2 * d["inter"], d["hidden"], False),
            ("down", d["hidden"], d["inter"], False)]


def write_shapes(d, batches, folder):
    """The shape CSVs `kdispatch tune` reads: gemm.csv (M,N,K,bias), norms.csv (M,hidden), silu.csv (M,d)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "gemm.csv"), "w") as f:
        f.write("M,N,K,bias\n")
        for m in batches:
            for _, n, k, bias in linear_shapes(d):
                f.write(f"{m},{n},{k},{'true' if bias else 'false'}\n")
    with open(os.path.join(folder, "norms.csv"), "w") as f:
        f.write("M,hidden\n")
        for m in batches:
            f.write(f"{m},{d['hidden']}\n")
    with open(os.path.join(folder, "silu.csv"), "w") as f:
        f.write("M,d\n")
        for m in batches:
            f.write(f"{m},{d['inter']}\n")
    return [os.path.join(folder, n) for n in ("gemm.csv", "norms.csv", "silu.csv")]


# ---------------------------------------------------------------- rendering (no torch)
def fnum(v, fmt="{:.0f}"):
    return "-" if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))) else fmt.format(v)


def render(doc):
    m = doc.get("meta", {})
    when = time.strftime("%Y-%m-%d", time.gmtime())  # the day of rendering (the run's day in run_h200.sh)
    out = [f"# End-to-end decode: torch ops vs kdispatch ops — {when}, commit {os.environ.get('KD_COMMIT', 'unknown')}", "",
           f"Device `{m.get('device', '?')}`; torch {m.get('torch', '?')} (CUDA {m.get('torch_cuda', '?')}); "
           f"kdispatch {m.get('kdispatch', '?')}. Produced by `bench/gpu/run_h200.sh --sections e2e` "
           "(bench/gpu/e2e_decode.py). A Llama-style decoder with the real dimensions and random weights; "
           "RMSNorm, fused add+RMSNorm, SiLU*mul and the linear layers on torch's ops or on kdispatch's, the same weights "
           "and inputs. Attention is replaced by an elementwise stand-in that keeps the shapes "
           "(q*scale + k + v per KV group; not dispatched by kdispatch, the same in both runs); no LM head. "
           "tok/s = batch * steps / s (median of alternating repeats); eager includes each op's host cost, "
           "graph = the decode step captured in one CUDA graph. ratio = kdispatch tok/s / torch tok/s "
           "(> 1: kdispatch faster). rel err = relative L2 distance of kdispatch's output to torch's "
           "(bf16; the check is < tol); in brackets torch's and kdispatch's distance to a float32 run.", "",
           "| model | batch | mode | torch tok/s | kdispatch tok/s | ratio | rel err |",
           "|---|---|---|---|---|---|---|"]
    runs = doc.get("runs", {})
    for label, run in runs.items():
        for r in sorted(run.get("rows", []), key=lambda r: (r["batch"], MODES.index(r["mode"]))):
            err = fnum(r.get("rel_err"), "{:.1e}")
            if r.get("rel_err_torch_vs_fp32") is not None:
                err += f" ({fnum(r.get('rel_err_torch_vs_fp32'), '{:.1e}')} / {fnum(r.get('rel_err_kd_vs_fp32'), '{:.1e}')})"
            if r.get("ok") is False:
                err += " FAIL"
            out.append(f"| {label} | {r['batch']} | {r['mode']} | {fnum(r.get('torch_tok_s'))} | "
                       f"{fnum(r.get('kd_tok_s'))} | {fnum(r.get('ratio'), '{:.3f}')} | {err} |")
    out.append("")
    for label, run in runs.items():
        g = {r["batch"]: r.get("ratio") for r in run.get("rows", []) if r["mode"] == "graph"}
        want = run.get("target_batches", [1, 8, 64])
        parts = []
        for b in want:
            v = g.get(b)
            parts.append(f"batch {b}: {fnum(v, '{:.3f}')}" + ("" if v is None else (" met" if v >= 1.0 else " MISSED")))
        out.append(f"- **{label}** ({run.get('model_name', '?')}, {run.get('layers', '?')} layers; configs: "
                   f"{', '.join(run.get('configs') or []) or 'none'}"
                   f"{'; + shipped' if run.get('shipped_configs') else ''}). Target, graph mode, kdispatch >= torch: "
                   + "; ".join(parts) + ".")
        groups = {}  # the same assignment at several batches: one line
        for b, ops in run.get("served", {}).items():
            groups.setdefault(", ".join(f"{op} {v}" for op, v in ops.items()), []).append(b)
        for text, bs in groups.items():
            out.append(f"  Served by kdispatch at batch {', '.join(bs)}: {text or '-'}.")
        for n in run.get("notes", []):
            out.append(f"  Note: {n}")
        if run.get("left"):
            out.append(f"  Not measured (time budget): batch {', '.join(str(b) for b in run['left'])}.")
    errs = [f"{label}: {e}" for label, run in runs.items() for e in run.get("errors", [])]
    if errs:
        out += ["", "## Errors", ""] + [f"- {e}" for e in errs[:50]]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the model
class Decoder:
    def __init__(self, torch, d, layers, dev, seed):
        self.torch, self.d, self.L, self.dev = torch, d, layers, dev
        torch.manual_seed(seed)
        bf = torch.bfloat16
        H = d["hidden"]

        def lin(n, k):
            return (torch.randn(n, k, device=dev) * k ** -0.5).to(bf)

        def nw():
            return (1 + 0.1 * torch.randn(H, device=dev)).to(bf)
        sh = {name: (n, k, b) for name, n, k, b in linear_shapes(d)}
        self.p = {"w_in": [], "qkv": [], "qkv_b": [], "o": [], "w_post": [], "gate_up": [], "down": []}
        for _ in range(layers):
            self.p["w_in"].append(nw())
            self.p["qkv"].append(lin(*sh["qkv"][:2]))
            self.p["qkv_b"].append((0.02 * torch.randn(sh["qkv"][0], device=dev)).to(bf) if d["qkv_bias"] else None)
            self.p["o"].append(lin(*sh["o"][:2]))
            self.p["w_post"].append(nw())
            self.p["gate_up"].append(lin(*sh["gate_up"][:2]))
            self.p["down"].append(lin(*sh["down"][:2]))
        self.p["w_final"] = nw()

    def params(self, dtype):
        if dtype == self.torch.bfloat16:
            return self.p
        return {k: ([t.to(dtype) if t is not None else None for t in v] if isinstance(v, list) else v.to(dtype))
                for k, v in self.p.items()}

    def step(self, ops, x, p=None):
        """One decode step on x [B, hidden] (x is not modified); returns [B, hidden]."""
        torch, d = self.torch, self.d
        p = p or self.p
        F = torch.nn.functional
        eps, B = d["eps"], x.shape[0]
        hq, kv, hd, inter = d["heads"], d["kv_heads"], d["head_dim"], d["inter"]
        res = x.clone()  # the residual stream, updated in place by the fused ops
        h = ops.rmsnorm(x, p["w_in"][0], eps)
        h_prev = None
        for layer in range(self.L):
            if layer > 0:
                h = ops.add_rmsnorm(h_prev, res, p["w_in"][layer], eps)
            qkv = ops.linear(h, p["qkv"][layer], p["qkv_b"][layer])
            q = qkv[:, :hq * hd].view(B, kv, hq // kv, hd)
            k = qkv[:, hq * hd:(hq + kv) * hd].view(B, kv, 1, hd)
            v = qkv[:, (hq + kv) * hd:].view(B, kv, 1, hd)
            a = (q * hd ** -0.5 + (k + v)).reshape(B, hq * hd)  # the attention stand-in
            o = ops.linear(a, p["o"][layer], None)
            h = ops.add_rmsnorm(o, res, p["w_post"][layer], eps)
            gu = ops.linear(h, p["gate_up"][layer], None)
            h_prev = ops.linear(ops.silu_and_mul(gu), p["down"][layer], None)
        return ops.add_rmsnorm(h_prev, res, p["w_final"], eps)


def torch_ops_set(torch):
    F = torch.nn.functional
    rms = getattr(F, "rms_norm", None)

    def rmsnorm(x, w, eps):
        if rms is not None:
            return rms(x, (x.shape[-1],), w, eps)
        xf = x.float()  # torch < 2.4 (local tests only)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    def add_rmsnorm(x, res, w, eps):
        res.add_(x)
        return rmsnorm(res, w, eps)

    def silu_and_mul(gu):
        d = gu.shape[-1] // 2
        return F.silu(gu[:, :d]) * gu[:, d:]

    def linear(x, w, b):
        return F.linear(x, w, b)
    return _ns(rmsnorm=rmsnorm, add_rmsnorm=add_rmsnorm, silu_and_mul=silu_and_mul, linear=linear)


def kd_ops_set(torch):
    def rmsnorm(x, w, eps):
        return torch.ops.kdispatch.rmsnorm(x, w, eps)

    def add_rmsnorm(x, res, w, eps):
        torch.ops.kdispatch.fused_add_rmsnorm_(x, res, w, eps)
        return x

    def silu_and_mul(gu):
        return torch.ops.kdispatch.silu_and_mul(gu)

    def linear(x, w, b):
        return torch.ops.kdispatch.gemm(x, w, b)
    return _ns(rmsnorm=rmsnorm, add_rmsnorm=add_rmsnorm, silu_and_mul=silu_and_mul, linear=linear)


def _ns(**kw):
    import types
    return types.SimpleNamespace(**kw)


def rel_err(torch, a, b):
    a, b = a.double(), b.double()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


class Timer:
    """Wall time of work enqueued on the current stream: CUDA events (cuda), perf_counter (cpu)."""

    def __init__(self, torch, dev):
        self.torch, self.cuda = torch, dev == "cuda"

    def run(self, fn, n):
        torch = self.torch
        if self.cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record()
            for _ in range(n):
                fn()
            e.record()
            e.synchronize()
            return s.elapsed_time(e) / 1e3
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0


def measure(timer, fn, target_s, lo, hi):
    """Seconds per call of fn, over about target_s of calls."""
    est = timer.run(fn, 3) / 3
    n = int(min(hi, max(lo, target_s / max(est, 1e-7))))
    return timer.run(fn, n) / n, n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="llama3-8b", help="the dimensions (default llama3-8b)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    ap.add_argument("--batches", default="1,8,64", help="batch sizes = GEMM M (default 1,8,64)")
    ap.add_argument("--lib", help="path of libkdispatch.so (with the CUDA backend); required to measure")
    ap.add_argument("--configs", default="configs",
                    help="config dirs of kdispatch's runtime, comma-separated, highest precedence first "
                         "(default configs; '' for none: get_default everywhere)")
    ap.add_argument("--shipped-configs", action="store_true", help="also load the configs shipped with kdispatch")
    ap.add_argument("--label", default=None, help="the row label in e2e.md (default: model and configs)")
    ap.add_argument("--out", default=".", help="folder of e2e.json and e2e.md (default .)")
    ap.add_argument("--resume", default=None, help="e2e.json of an earlier call: keep its rows, skip its batches")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting new batches after this (default 540)")
    ap.add_argument("--measure-ms", type=float, default=300.0, help="time per measurement (default 300 ms)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating torch/kdispatch measurements (default 3)")
    ap.add_argument("--tol", type=float, default=2e-2, help="max rel. L2 error kdispatch vs torch (default 2e-2)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (default); cpu: a smoke test of this script's logic only (no graphs, meaningless times)")
    ap.add_argument("--write-shapes", metavar="DIR", help="write DIR/gemm.csv and DIR/norms.csv (the model's shapes "
                    "at --batches, for `kdispatch tune --shapes`) and exit; needs no torch")
    ap.add_argument("--render", metavar="JSON", help="print the markdown of an e2e.json and exit; needs no torch")
    args = ap.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
        if not batches or min(batches) < 1:
            raise ValueError("batches must be >= 1")
    except ValueError as e:
        ap.error(f"--batches: {e}")
    if args.layers < 1:
        ap.error("--layers must be >= 1")
    d = MODELS[args.model]
    if args.render:
        with open(args.render) as f:
            sys.stdout.write(render(json.load(f)))
        return 0
    if args.write_shapes:
        for p in write_shapes(d, batches, args.write_shapes):
            print(p)
        return 0
    if not args.lib:
        ap.error("--lib is required to measure")
    configs = [c for c in args.configs.split(",") if c.strip()]
    label = args.label or f"{d['name']}, {args.layers} layers, configs {','.join(configs) or 'none'}"

    # ---- earlier results: other labels are kept, this label's measured batches skipped (--resume only)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "e2e.json")
    doc = {"meta": {}, "runs": {}}
    resumed_run = {}

    def load(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            log(f"cannot read {path}: {e!r}")
            return {}
    if os.path.isfile(json_path):  # an earlier run of this call (another label)
        doc.update(load(json_path))
        doc.setdefault("runs", {})
    if args.resume and os.path.isfile(args.resume):  # an earlier call
        old = load(args.resume)
        for lb, r in old.get("runs", {}).items():
            doc["runs"].setdefault(lb, r)
        resumed_run = old.get("runs", {}).get(label, {})
        doc["meta"] = doc.get("meta") or old.get("meta", {})

    def save(run):
        doc["runs"][label] = run
        tmp = json_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        os.replace(tmp, json_path)
        with open(os.path.join(args.out, "e2e.md"), "w") as f:
            f.write(render(doc))

    os.environ["KDISPATCH_LIBRARY"] = os.path.abspath(args.lib)
    sys.path.insert(0, os.path.join(HERE, "..", "..", "integrations", "python"))
    sys.path.insert(0, HERE)
    import torch
    import kdispatch
    import kdispatch.torch_ops as kops
    from bench_gpu import cublaslt_versions

    dev = args.device
    cuda = dev == "cuda"
    # Graphs need CUDA; KD_E2E_CPU_GRAPHS=1 runs the capture code on the CPU too (testing this
    # script without a GPU, with torch.cuda's graph calls stubbed).
    with_graphs = cuda or os.environ.get("KD_E2E_CPU_GRAPHS") == "1"
    doc["meta"].update({"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
                        "torch_cuda": torch.version.cuda, "kdispatch": getattr(kdispatch, "__version__", "?")})
    run = {"model": args.model, "model_name": d["name"], "dims": d, "layers": args.layers, "batches": batches,
           "target_batches": [1, 8, 64], "configs": configs, "shipped_configs": args.shipped_configs,
           "linear_shapes": [list(x) for x in linear_shapes(d)], "rows": [], "served": {}, "notes": [],
           "errors": [], "left": []}
    run["notes"].append("attention replaced by an elementwise stand-in (q*scale + k + v per KV group): attention "
                        "is not dispatched by kdispatch; identical in both runs")
    for c in configs:
        if not os.path.isdir(c):
            run["errors"].append(f"config dir {c} does not exist")
    nocache = tempfile.mkdtemp(prefix="kd-e2e-no-cache-")  # tune is off: nothing is written there
    atexit.register(shutil.rmtree, nocache, True)
    rt = kdispatch.Runtime(config_dirs=[c for c in configs if os.path.isdir(c)], shipped_configs=args.shipped_configs,
                           cache_dir=nocache, tune="off")
    rt.freeze()  # no tuning, no reload while timing
    rep = rt.load_report()
    run["load_report"] = {k: v for k, v in rep.items() if k != "files"}
    kops.set_runtime(rt)
    log(f"{label}: {d['name']} dims, {args.layers} layers, batches {batches}; kdispatch configs "
        f"{configs or 'none'} ({run['load_report'].get('rows', '?')} rows loaded), frozen={rt.frozen}")

    model = Decoder(torch, d, args.layers, dev, args.seed)
    tops, kops_set = torch_ops_set(torch), kd_ops_set(torch)
    timer = Timer(torch, dev)
    target_s = args.measure_ms / 1e3
    failed_check = False
    deadline = T0 + args.budget_s

    def served(B):
        """What kdispatch serves this batch, through the runtime (its dispatch info)."""
        out = {}
        x = torch.randn(B, d["hidden"], dtype=torch.bfloat16, device=dev)
        stream = torch.cuda.current_stream() if cuda else None
        for name, n, k, bias in linear_shapes(d):
            try:
                a = torch.randn(B, k, dtype=torch.bfloat16, device=dev)
                w = model.p[name][0]
                dd = torch.empty(B, n, dtype=torch.bfloat16, device=dev)
                i = rt.gemm(a, w, dd, model.p["qkv_b"][0] if name == "qkv" else None, stream=stream, info=True)
                out[f"{name} {n}x{k}"] = f"{i['variant']} ({i['source']})"
            except Exception as e:  # noqa: BLE001
                out[f"{name} {n}x{k}"] = f"error {e!r}"
        try:
            i = rt.rmsnorm(torch.empty_like(x), x, model.p["w_in"][0], d["eps"], stream=stream, info=True)
            out["rmsnorm"] = f"{i['variant']} ({i['source']})"
            r = torch.randn_like(x)
            i = rt.fused_add_rmsnorm(x, r, model.p["w_in"][0], d["eps"], stream=stream, info=True)
            out["fused_add_rmsnorm"] = f"{i['variant']} ({i['source']})"
        except Exception as e:  # noqa: BLE001
            out["norms"] = f"error {e!r}"
        try:
            gu = torch.randn(B, 2 * d["inter"], dtype=torch.bfloat16, device=dev)
            act = torch.empty(B, d["inter"], dtype=torch.bfloat16, device=dev)
            i = rt.silu_and_mul(act, gu, stream=stream, info=True)
            out["silu_and_mul"] = f"{i['variant']} ({i['source']})"
        except Exception as e:  # noqa: BLE001
            out["silu_and_mul"] = f"error {e!r}"
        if cuda:
            torch.cuda.synchronize()
        return out

    def capture(ops, x):
        """One decode step captured in a CUDA graph, after warm-up on the capture stream."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model.step(ops, x)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            y = model.step(ops, x)
        g.replay()
        torch.cuda.synchronize()
        return g, y

    for B in batches:
        rows = [r for r in resumed_run.get("rows", []) if r.get("batch") == B]
        if len(rows) == len(MODES):  # measured by an earlier call (--resume)
            run["rows"] += rows
            run["served"][str(B)] = resumed_run.get("served", {}).get(str(B), {})
            log(f"batch {B}: resumed from {args.resume}")
            continue
        if time.time() > deadline:
            run["left"].append(B)
            continue
        try:
            x = torch.randn(B, d["hidden"], dtype=torch.bfloat16, device=dev)
            run["served"][str(B)] = served(B)
            log(f"batch {B}: kdispatch serves " + ", ".join(f"{k} {v}" for k, v in run["served"][str(B)].items()))
            # correctness (eager), then the float32 run of the same model
            y_t = model.step(tops, x)
            y_k = model.step(kops_set, x)
            p32 = model.params(torch.float32)
            y_32 = model.step(torch_ops_set(torch), x.float(), p32)
            del p32
            err = {"eager": rel_err(torch, y_k, y_t)}
            e_t32, e_k32 = rel_err(torch, y_t, y_32), rel_err(torch, y_k, y_32)
            log(f"batch {B}: eager rel err kdispatch vs torch {err['eager']:.2e} (torch vs fp32 {e_t32:.2e}, "
                f"kdispatch vs fp32 {e_k32:.2e})")
            # graphs
            graphs, gerr = {}, {}
            for name, ops in (("torch", tops), ("kdispatch", kops_set)) if with_graphs else ():
                try:
                    graphs[name] = capture(ops, x)
                except Exception as e:  # noqa: BLE001
                    gerr[name] = repr(e)
                    run["errors"].append(f"batch {B}: {name} graph capture: {e!r}")
                    log(f"batch {B}: {name} graph capture FAILED: {e!r}")
            if "kdispatch" in graphs:
                err["graph"] = rel_err(torch, graphs["kdispatch"][1], y_t)
            if "torch" in graphs:
                err["graph_torch_vs_eager"] = rel_err(torch, graphs["torch"][1], y_t)
            # timing: alternate torch and kdispatch, each mode, --repeats times
            fns = {("eager", "torch"): (lambda: model.step(tops, x)),
                   ("eager", "kdispatch"): (lambda: model.step(kops_set, x))}
            for name, (g, _) in graphs.items():
                fns[("graph", name)] = g.replay
            times = {k: [] for k in fns}
            for _ in range(args.repeats):
                for k, fn in fns.items():
                    lo, hi = (10, 2000) if k[0] == "eager" else (20, 20000)
                    t, n = measure(timer, fn, target_s, lo, hi)
                    times[k].append(t)
            for mode in MODES:
                row = {"batch": B, "mode": mode}
                tt, tk = times.get((mode, "torch")), times.get((mode, "kdispatch"))
                if tt:
                    row["torch_step_us"] = sorted(tt)[len(tt) // 2] * 1e6
                    row["torch_tok_s"] = B / (row["torch_step_us"] / 1e6)
                if tk:
                    row["kd_step_us"] = sorted(tk)[len(tk) // 2] * 1e6
                    row["kd_tok_s"] = B / (row["kd_step_us"] / 1e6)
                if tt and tk:
                    row["ratio"] = row["kd_tok_s"] / row["torch_tok_s"]
                row["rel_err"] = err.get(mode)
                row["rel_err_torch_vs_fp32"], row["rel_err_kd_vs_fp32"] = e_t32, e_k32
                if mode == "graph":
                    row["rel_err_torch_graph_vs_eager"] = err.get("graph_torch_vs_eager")
                    if gerr:
                        row["graph_errors"] = gerr
                    if not with_graphs:
                        row["graph_errors"] = "graph modes need --device cuda"
                if mode == "graph" and not with_graphs:
                    row["ok"] = None  # not run (--device cpu)
                else:
                    row["ok"] = row["rel_err"] is not None and row["rel_err"] < args.tol
                    failed_check = failed_check or not row["ok"]
                run["rows"].append(row)
                log(f"batch {B} {mode}: torch {fnum(row.get('torch_tok_s'))} tok/s "
                    f"({fnum(row.get('torch_step_us'), '{:.1f}')} us/step), kdispatch {fnum(row.get('kd_tok_s'))} "
                    f"tok/s ({fnum(row.get('kd_step_us'), '{:.1f}')} us/step), ratio "
                    f"{fnum(row.get('ratio'), '{:.3f}')}, rel err {fnum(row['rel_err'], '{:.2e}')}"
                    f"{' FAIL' if row['ok'] is False else ''}")
            del graphs, fns
        except Exception as e:  # noqa: BLE001
            run["errors"].append(f"batch {B}: {e!r}")
            log(f"ERROR batch {B}: {e!r}")
            failed_check = True
        save(run)
        if cuda:
            torch.cuda.empty_cache()
    run["tune_stats"] = rt.tune_stats()
    run["cublaslt"] = cublaslt_versions()
    if run["tune_stats"].get("shapes_tuned"):
        run["errors"].append(f"the runtime tuned {run['tune_stats']['shapes_tuned']} shape(s): it should not have")
    save(run)
    log(f"wrote {json_path} and e2e.md ({label}: {len(run['rows'])} row(s), {len(run['left'])} batch(es) left)")
    if run["left"]:
        return 3
    if failed_check or run["errors"]:
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
