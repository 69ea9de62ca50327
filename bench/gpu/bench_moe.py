# SPDX-License-Identifier: Apache-2.0
"""fused_moe on the GPU beside SGLang's Triton fused_moe_kernel (issue 35).

kdispatch's whole op (torch.ops.kdispatch.fused_moe: up GEMM + activation +
down GEMM + top-k sum) against the peer's two GEMM kernels on SGLang's
shipped H200 configs (../shared/peers/sglang_moe/peer_moe.py, imported from
where it lies, never copied into the repository), same process, per point
kdispatch then the peer, R routings (softmax top-k) captured back to back in
one CUDA graph, median replay / R; correctness against an fp32 reference on
up to 8 tokens. The read floor: the experts the routings touch (mean unique
experts x per-expert weight bytes) at the read bandwidth measured here.

Per point (case, routing, M): --rounds rounds, each timing kdispatch (the
default plan and every --variants plan forced, each through its own
runtime), then the peer (its harness draws its own routings: uniform, or
under --routing skewed the same skew added to its logits through
SkewedLogits, a stand-in for the harness's `torch` module name), then
kdispatch's default again (the A/A control); the SM clock is read
(nvidia-smi) at each round's start. Medians over the rounds; the A/A spread
(|A - A'| / A) is the margin a ratio must beat. Besides the graphs: the
default cold (one call, L2 flushed; gpu_timing.Timer.cold) and, at M >= 256
in bf16, torch._grouped_mm on the same tokens sorted by expert (the two
GEMMs, as the peer's GEMM-only time).

  python3 bench/gpu/bench_moe.py --lib build/gpu/libkdispatch.so --peers DIR --out OUT
  python3 bench/gpu/bench_moe.py --render OUT/moe_bench.json   # a results file as a markdown table

--mode gemm also takes SGLang's fp8_w8a8 without block_shape (the cases marked fp8-tensor and
fp8-channel): moe_gemm_fp8_tensor (static a1/a2 scales) and moe_gemm_fp8_channel (per-token
activations) beside the peer's kernel in those modes (per channel: its per_channel_quant=True
launch through PerChannelKernel). The fused mode runs those cases as fused_moe_fp8_tensor (static
scales) and fused_moe_fp8_channel, correctness and time without the peer (its harness's run_case
runs block fp8 only).
"""
import argparse, json, os, statistics, subprocess, sys, time

import torch
import torch.nn.functional as F

CASES = [  # name, E, H, I, top_k, fp8: False, True (block fp8, 128x128 scales), "tensor" or "channel"
    ("Qwen3-30B-A3B TP1 bf16", 128, 2048, 768, 8, False),
    ("Qwen3-235B-A22B TP4 bf16", 128, 4096, 384, 8, False),
    ("Mixtral-8x7B TP2 bf16", 8, 4096, 7168, 2, False),
    ("DeepSeek-V3 TP8 fp8-block (shared expert fused: E=257, top-9)", 257, 7168, 256, 9, True),
    ("Qwen3-30B-A3B TP1 fp8-block", 128, 2048, 768, 8, True),
    ("Qwen3-235B-A22B TP4 fp8-block", 128, 4096, 384, 8, True),
    # SGLang's fp8_w8a8 without block_shape (moe_gemm_fp8_tensor / _channel, fused_moe_fp8_tensor / _channel;
    # the peer beside them in --mode gemm only: its harness's run_case is block fp8's):
    # Mixtral-8x7B-Instruct-FP8 at TP2 (per tensor, static activation scales; SGLang ships
    # E=8,N=7168,...,dtype=fp8_w8a8 rows), a Qwen3-30B-A3B FP8-dynamic checkpoint (per channel,
    # per-token activations; SGLang's per_channel_quant=True files do not cover E=128: its default).
    ("Mixtral-8x7B TP2 fp8-tensor", 8, 4096, 7168, 2, "tensor"),
    ("Qwen3-30B-A3B TP1 fp8-channel", 128, 2048, 768, 8, "channel"),
]
FP8 = getattr(torch, "float8_e4m3fn", None)  # (None on an old torch: --render needs no fp8)


def quant_groups(x, g=128):
    """Per-token 1x128 groups to e4m3fn values times their scales (the op's rule), in fp32."""
    T, K = x.shape
    xv = x.float().view(T, K // g, g)
    s = xv.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448.0
    return ((xv / s).clamp(-448, 448).to(FP8).float() * s).view(T, K)


def quant_weight(w):
    """[E, N, K] bf16 -> e4m3fn [E, N, K] and fp32 scales [E, N/128, K/128] (128x128 blocks)."""
    E, N, K = w.shape
    wv = w.float().view(E, N // 128, 128, K // 128, 128)
    s = wv.abs().amax(dim=(2, 4)).clamp(min=1e-10) / 448.0
    q = (wv / s[:, :, None, :, None]).clamp(-448, 448).to(FP8).view(E, N, K)
    return q, s.contiguous()


def dequant_weight(q, s):
    E, N, K = q.shape
    if s.dim() == 1:  # per tensor [E]
        return q.float() * s[:, None, None]
    if s.dim() == 2 and s.shape[1] == N:  # per channel [E, N]
        return q.float() * s[:, :, None]
    return (q.float().view(E, N // 128, 128, K // 128, 128) * s[:, :, None, :, None]).view(E, N, K)


def quant_weight_scaled(w, channel):
    """[E, N, K] bf16 -> e4m3fn and fp32 scales [E] (per tensor) or [E, N] (per channel)."""
    amax = w.float().abs().amax(dim=2) if channel else w.float().abs().flatten(1).amax(dim=1)
    s = amax.clamp(min=1e-10) / 448.0
    q = (w.float() / (s[:, :, None] if channel else s[:, None, None])).clamp(-448, 448).to(FP8)
    return q, s.contiguous()


def quant_rows(x, scale=None):
    """fp8_w8a8's activations: e4m3fn values and their scale, static (`scale`, [1]) or per token
    ([rows, 1], max(amax, 1e-10) / 448), in fp32 (codes) and the scale tensor."""
    s = scale if scale is not None else x.float().abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448.0
    return (x.float() / s).clamp(-448, 448).to(FP8), s


def routings(M, E, H, top_k, R, dev, skew=False):
    sets = []
    for _ in range(R):
        x = torch.randn(M, H, device=dev, dtype=torch.bfloat16)
        logits = torch.randn(M, E, device=dev, dtype=torch.float32)
        if skew:
            logits += torch.linspace(3, 0, E, device=dev)
        tw, tid = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
        sets.append((x, (tw / tw.sum(-1, keepdim=True)).contiguous(), tid.to(torch.int32).contiguous()))
    return sets


class SkewedLogits:
    """Stands in for the peer harness's module-level `torch` during one
    run_case: its router logits (an fp32 randn of [M, E]) get routings()'s
    skew, so the peer draws the same skewed distribution as kdispatch; every
    other torch call passes through unchanged (the harness is imported from
    where it lies, never copied or edited)."""

    def __init__(self, M, E):
        self.M, self.E = M, E

    def randn(self, *shape, **kw):
        t = torch.randn(*shape, **kw)
        if tuple(shape) == (self.M, self.E) and kw.get("dtype") == torch.float32:
            t += torch.linspace(3, 0, self.E, device=t.device)
        return t

    def __getattr__(self, name):
        return getattr(torch, name)


def peer_run(peer, routing, name, E, H, I, top_k, fp8, M, R):
    """The peer's GEMM timings at one point, on `routing`'s distribution."""
    if routing != "skewed":
        return peer.run_case(name, E, H, I, top_k, "fp8_w8a8" if fp8 else None, fp8, [M], R=R)[0]
    saved = peer.torch
    peer.torch = SkewedLogits(M, E)
    try:
        return peer.run_case(name, E, H, I, top_k, "fp8_w8a8" if fp8 else None, fp8, [M], R=R)[0]
    finally:
        peer.torch = saved


def reference(x, w1, w2, tw, tid, I, fp8=False, a_scales=(None, None)):
    """fp32; fp8: w1, w2 dequantised, the activations quantised as the op quantises them (block fp8 per
    1x128 group; per tensor by the static a_scales; per channel per row)."""
    def q(v, s):
        if fp8 is True:
            return quant_groups(v)
        codes, scale = quant_rows(v, s)
        return codes.float() * scale
    ref = torch.zeros(x.shape[0], x.shape[1], device=x.device, dtype=torch.float32)
    xr = q(x, a_scales[0]) if fp8 else x.float()
    for k in range(tid.shape[1]):
        e = tid[:, k].long()
        h1 = torch.bmm(w1[e].float(), xr[:, :, None])[..., 0]
        a = F.silu(h1[:, :I]) * h1[:, I:]
        if fp8:
            a = q(a, a_scales[1])
        ref += tw[:, k:k + 1] * torch.bmm(w2[e].float(), a[:, :, None])[..., 0]
    return ref


def static_scales(sets, w1r, I, top_k):
    """Per tensor: static a1/a2 scales (an activation_scheme "static" checkpoint's): amax / 448 of hidden
    over the sets and of the intermediate of set 0's first 8 tokens (quantised as the op does), with a
    margin of 1.25 (values past it clamp on both sides alike)."""
    a1 = (max(x.float().abs().max() for x, _, _ in sets) / 448.0).reshape(1).contiguous()
    x, _, tid = sets[0]
    mm = min(x.shape[0], 8)
    codes, s = quant_rows(x[:mm], a1)
    xr = codes.float() * s
    amax = 0.0
    for k in range(tid.shape[1]):
        h1 = torch.bmm(w1r[tid[:mm, k].long()].float(), xr[:, :, None])[..., 0]
        amax = max(amax, (F.silu(h1[:, :I]) * h1[:, I:]).abs().max().item())
    return a1, torch.tensor([1.25 * amax / 448.0], device=x.device, dtype=torch.float32)


def served():
    """The variant the thread's last kdispatch call ran (the native ops), else None. A variant forced
    on another op's or dtype's call is skipped by the runtime, which serves its default: compared, so
    such a time is never recorded under the forced name."""
    try:
        return torch.ops.kdispatch._last_info()[1]
    except Exception:
        return None


def served_from():
    """What the thread's last kdispatch call ran and why: "<variant> (table|default|forced)" (the
    native ops), else None: the default runtime may serve a shipped row or get_default."""
    try:
        src, variant = torch.ops.kdispatch._last_info()[:2]
        return f"{variant} ({('table', 'default', 'forced')[src] if 0 <= src < 3 else src})"
    except Exception:
        return None


def graph_us(fn, R, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / R)
    return statistics.median(ts)


def read_bw(dev):
    x = torch.empty(1 << 29, dtype=torch.bfloat16, device=dev).normal_()
    for _ in range(3):
        x.sum()
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.sum()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return x.numel() * 2 / (statistics.median(ts) * 1e-3) / 1e9


def sm_clock_mhz():
    """The SM clock now (nvidia-smi), None where it cannot be read."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i",
                              str(torch.cuda.current_device())], capture_output=True, text=True, timeout=5).stdout
        return int(out.split()[0])
    except Exception:  # no nvidia-smi here: the rows say None
        return None


def grouped_mm_us(x, w1, w2, tid, I, reps=20):
    """torch._grouped_mm's two GEMMs on x's (token, choice) pairs sorted by
    expert (the sort outside the timing): graph time of one call."""
    E, top_k = w1.shape[0], tid.shape[1]
    order = tid.flatten().long().argsort(stable=True)
    xs = x[order // top_k].contiguous()
    offs = torch.cumsum(torch.bincount(tid.flatten().long(), minlength=E), 0).to(torch.int32)
    b1, b2 = w1.transpose(1, 2), w2.transpose(1, 2)
    h = torch._grouped_mm(xs, b1, offs=offs)
    a = (F.silu(h[:, :I]) * h[:, I:]).contiguous()
    return graph_us(lambda: (torch._grouped_mm(xs, b1, offs=offs), torch._grouped_mm(a, b2, offs=offs)), 1, reps)


def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


def render(path):
    """A results file (moe_bench.json or moe_gemm_bench.json) as a markdown table."""
    doc = json.load(open(path))
    info, rows = doc["info"], doc["rows"]
    print(f"{info['device']}, torch {info['torch']}, read bandwidth {info['read_bw_GBps']:.0f} GB/s, commit "
          f"{info['commit']}, {info['date']}, {info['rounds']} rounds of {info['sets']} routings\n")
    gemm = any(r.get("mode") == "gemm" for r in rows)
    if gemm:
        print("| shape | routing | M | block_size | kd up / down µs | peer up / down µs | kd / peer speed | "
              "% of read floor kd (peer) | A/A spread | rel. err kd up, down / peer up, down |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    else:
        print("| shape | routing | M | kd µs (A/A) | cold µs | peer GEMMs µs | kd / peer speed | "
              "% of read floor kd (peer) | TFLOP/s | rel. err kd / peer |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    f = lambda v, d=1: "—" if v is None else f"{v:.{d}f}"
    for r in rows:
        if "kd_us" not in r:
            why = r.get("error") or r.get("kd_error") or r.get("kd_error[default]") or r.get("skipped")
            print(f"| {r['case']} | {r.get('routing', '')} | {r['M']} | {why} |")
            continue
        if gemm:
            print(f"| {r['case']} | {r['routing']} | {r['M']} | {r['block_size']} | {f(r['kd_up_us'])} / "
                  f"{f(r['kd_down_us'])} | {f(r['peer_up_us'])} / {f(r['peer_down_us'])} | "
                  f"{f(r['speedup_vs_peer'], 2)}x | {f(r['kd_floor_pct'], 0)} % ({f(r['peer_floor_pct'], 0)} %) | "
                  f"{100 * r['aa_spread']:.1f} % | {f(r.get('kd_rel_err_up'), 4)}, {f(r.get('kd_rel_err_down'), 4)} / "
                  f"{f(r.get('peer_rel_err_up'), 4)}, {f(r.get('peer_rel_err_down'), 4)} |")
        else:
            sp = r.get("speedup_vs_peer_gemms")
            print(f"| {r['case']} | {r['routing']} | {r['M']} | {f(r['kd_us'])} ({f(r['kd_us_aa'])}) | "
                  f"{f(r.get('kd_cold_us'))} | {f(r.get('peer_us_gemms'))} | {f(sp, 2)}x | "
                  f"{f(r['kd_floor_pct'], 0)} % ({f(r.get('peer_floor_pct'), 0)} %) | {f(r['kd_tflops'], 1)} | "
                  f"{f(r['kd_rel_err'], 4)} / {f(r.get('peer_rel_err'), 4)} |")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--render":
        return render(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--peers", default="", help="folder with SGLang's peer_moe.py (the peer is skipped without it)")
    ap.add_argument("--configs", default="", help="SGLang's fused_moe_triton config folder for the peer")
    ap.add_argument("--out", default=".")
    ap.add_argument("--m", default="1,4,16,64")
    ap.add_argument("--sets", type=int, default=16, help="routings captured back to back in one graph")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per point (medians)")
    ap.add_argument("--routing", default="uniform", help="uniform,skewed: the routings measured")
    ap.add_argument("--variants", default="", help="comma list of fused_moe variants also timed, each forced")
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--cases", default="", help="comma list of substrings: only the cases whose name has one")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--force", default="", help="KDISPATCH_FORCE for this process (one variant serves every call)")
    ap.add_argument("--mode", default="fused", choices=("fused", "gemm"),
                    help="fused: the whole op vs the peer's GEMMs; gemm: moe_gemm's up and down calls vs the "
                         "peer's invoke_fused_moe_kernel launches on the same aligned ids (gemm_point)")
    args = ap.parse_args()
    t0 = time.time()
    os.environ.setdefault("KDISPATCH_LIBRARY", args.lib)
    if args.force:
        os.environ["KDISPATCH_FORCE"] = args.force
    import kdispatch
    import kdispatch.torch_ops as kd_ops  # registers torch.ops.kdispatch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_timing import Timer
    peer = None
    if args.peers and not args.no_peer and os.path.exists(os.path.join(args.peers, "peer_moe.py")):
        if args.configs:
            os.environ["SGLANG_MOE_CONFIGS"] = args.configs
        os.environ["BUDGET_S"] = str(args.budget_s)
        sys.path.insert(0, args.peers)
        import peer_moe as peer  # SGLang's kernel, launched as SGLang does
    dev = torch.device("cuda")
    bw = read_bw(dev)
    timer = Timer(torch)
    info = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "read_bw_GBps": bw,
            "commit": args.commit, "date": time.strftime("%Y-%m-%d"), "peer": bool(peer), "force": args.force,
            "rounds": args.rounds, "sets": args.sets, "variants": args.variants}
    print(json.dumps(info), flush=True)
    # One runtime per forced variant (torch_ops.set_runtime switches between them).
    runtimes = {"default": None}
    for v in [v for v in args.variants.split(",") if v]:  # --mode gemm: moe_gemm variants
        op_of = v.split("_fp8_e4m3fn__")[0] if "_fp8_e4m3fn__" in v else None  # moe_gemm_fp8_tensor_fp8_e4m3fn__ring
        runtimes[v] = kdispatch.Runtime(shipped_configs=False, log_level="error",
                                        force=[f"{op_of or ('moe_gemm' if args.mode == 'gemm' else 'fused_moe')}={v}"])
    op = torch.ops.kdispatch.fused_moe
    rows = []
    wanted = [c for c in args.cases.split(",") if c]
    for name, E, H, I, top_k, fp8 in CASES:
        if wanted and not any(c in name for c in wanted):
            continue
        torch.manual_seed(0)
        w1 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02
        w2 = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) * 0.02
        s1 = s2 = None
        per_expert = (2 * I * H + H * I) * 2
        if fp8 is True:  # the weights as the peer quantises them
            (w1, s1), (w2, s2) = quant_weight(w1), quant_weight(w2)
            per_expert = 3 * I * H + (s1[0].numel() + s2[0].numel()) * 4
        elif fp8:  # per tensor or per channel
            (w1, s1), (w2, s2) = quant_weight_scaled(w1, fp8 == "channel"), quant_weight_scaled(w2, fp8 == "channel")
            per_expert = 3 * I * H + (s1[0].numel() + s2[0].numel()) * 4
        w1r, w2r = (dequant_weight(w1, s1), dequant_weight(w2, s2)) if fp8 else (w1, w2)
        for routing in [r for r in args.routing.split(",") if r]:
            for M in [int(m) for m in args.m.split(",")]:
                if time.time() - t0 > args.budget_s:
                    print(json.dumps({"case": name, "M": M, "routing": routing, "skipped": "budget"}), flush=True)
                    continue
                if args.mode == "gemm":
                    rows.append(gemm_point(args, name, E, H, I, top_k, fp8, M, routing, w1, w2, s1, s2, w1r, w2r,
                                           per_expert, bw, peer, dev, runtimes, kd_ops))
                else:
                    rows.append(point(args, name, E, H, I, top_k, fp8, M, routing, w1, w2, s1, s2, w1r, w2r,
                                      per_expert, bw, op, kd_ops, runtimes, peer, timer, dev))
                print(json.dumps(rows[-1]), flush=True)
        del w1, w2, w1r, w2r
        torch.cuda.empty_cache()
    kd_ops.set_runtime(None)
    with open(os.path.join(args.out, "moe_gemm_bench.json" if args.mode == "gemm" else "moe_bench.json"), "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)


def point(args, name, E, H, I, top_k, fp8, M, routing, w1, w2, s1, s2, w1r, w2r, per_expert, bw, op, kd_ops,
          runtimes, peer, timer, dev):
    """One (case, routing, M): correctness, then the interleaved rounds."""
    sets = routings(M, E, H, top_k, args.sets, dev, skew=routing == "skewed")
    uniq = statistics.mean(len(torch.unique(s[2]).tolist()) for s in sets)
    floor_us = (uniq * per_expert + 2 * M * H * 2) / (bw * 1e3)
    flops = 2 * M * top_k * 3 * I * H
    row = {"case": name, "E": E, "H": H, "I": I, "top_k": top_k, "M": M, "fp8": fp8, "routing": routing,
           "experts_touched": uniq, "floor_us": floor_us, "flops": flops}
    x, tw, tid = sets[0]
    mm = min(M, 8)
    # fp8_w8a8 (fused_moe_fp8_tensor with static a1/a2 scales, fused_moe_fp8_channel per token): the op and
    # its extra arguments; the peer's harness runs block fp8 only (--mode gemm compares the GEMMs).
    scaled = fp8 in ("tensor", "channel")
    a_scales = static_scales(sets, w1r, I, top_k) if fp8 == "tensor" else (None, None)
    if scaled:
        row["a_scales"] = [None if v is None else v.item() for v in a_scales]
        base = torch.ops.kdispatch.fused_moe_fp8_tensor if fp8 == "tensor" else torch.ops.kdispatch.fused_moe_fp8_channel
        base_out = (torch.ops.kdispatch.fused_moe_fp8_tensor_out if fp8 == "tensor"
                    else torch.ops.kdispatch.fused_moe_fp8_channel_out)
        op = lambda x, w1, w2, tw, tid, s1, s2, rsf, act: base(x, w1, w2, tw, tid, s1, s2, *a_scales, rsf, act)
        call_out = lambda o, x, tw, tid: base_out(o, x, w1, w2, tw, tid, s1, s2, *a_scales, 1.0, 0)
        peer = None
    else:
        call_out = lambda o, x, tw, tid: torch.ops.kdispatch.fused_moe_out(o, x, w1, w2, tw, tid, s1, s2, 1.0, 0)
    ref = reference(x[:mm], w1r, w2r, tw[:mm], tid[:mm], I, fp8, a_scales)
    outs = [torch.empty(M, H, device=dev, dtype=torch.bfloat16) for _ in sets]

    def kd(rt):
        kd_ops.set_runtime(runtimes[rt])
        return lambda: [call_out(o, x, tw, tid) for (x, tw, tid), o in zip(sets, outs)]

    usable = []  # the default, and each forced variant that computes this point (else its error is the row's)
    for rt in runtimes:
        kd_ops.set_runtime(runtimes[rt])
        try:
            y = op(x, w1, w2, tw, tid, s1, s2, 1.0, 0)
            row[f"kd_served[{rt}]"] = served_from()
            if rt != "default" and served() not in (None, rt):
                raise RuntimeError(f"forced {rt}, served {served()} (a variant of another op or dtype)")
        except Exception as ex:  # e.g. a bf16 variant forced on an fp8 case: said, not fatal
            row[f"kd_error[{rt}]"] = repr(ex)[-300:]
            continue
        row[f"kd_rel_err[{rt}]"] = ((y[:mm].float() - ref).norm() / ref.norm()).item()
        usable.append(rt)
    kd_ops.set_runtime(None)
    if "default" not in usable:
        return row
    row["kd_rel_err"] = row["kd_rel_err[default]"]
    runtimes = {rt: runtimes[rt] for rt in usable}
    times = {rt: [] for rt in runtimes}
    aa, peer_us, peer_err, clocks = [], [], [], []
    for _ in range(args.rounds):
        clocks.append(sm_clock_mhz())
        for rt in runtimes:
            times[rt].append(graph_us(kd(rt), len(sets)))
        if peer is not None:
            try:
                pr = peer_run(peer, routing, name, E, H, I, top_k, fp8, M, args.sets)
                peer_us.append(pr.get("tuned_us_gemms") or pr.get("default_us_gemms"))
                peer_err.append(pr.get("tuned_rel_err"))
                row["peer_experts_touched"] = pr.get("experts_touched_mean")
            except Exception as ex:  # the peer's failure is recorded, ours is not hidden
                row["peer_error"] = repr(ex)[-400:]
        aa.append(graph_us(kd("default"), len(sets)))
    row["kd_us"] = med(times["default"])
    row["kd_us_rounds"] = times["default"]
    row["kd_us_aa"] = med(aa)
    row["aa_spread"] = abs(row["kd_us"] - row["kd_us_aa"]) / row["kd_us"]
    row["kd_floor_pct"] = 100 * floor_us / row["kd_us"]
    row["kd_tflops"] = flops / row["kd_us"] / 1e6
    for rt in runtimes:
        if rt != "default":
            row[f"kd_us[{rt}]"] = med(times[rt])
    row["sm_clock_mhz"] = clocks
    if peer_us:
        row["peer_us_gemms"] = med(peer_us)
        row["peer_us_rounds"] = peer_us
        row["peer_rel_err"] = med(peer_err)
        if row["peer_us_gemms"]:
            row["peer_floor_pct"] = 100 * floor_us / row["peer_us_gemms"]
            row["speedup_vs_peer_gemms"] = row["peer_us_gemms"] / row["kd_us"]
    kd_ops.set_runtime(None)
    row["kd_cold_us"] = timer.cold(lambda: call_out(outs[0], x, tw, tid))["us"]
    if M >= 256 and not fp8 and hasattr(torch, "_grouped_mm"):
        try:
            row["grouped_mm_us"] = grouped_mm_us(x, w1, w2, tid, I)
        except Exception as ex:  # torch's grouped GEMM refuses the layout: said, not hidden
            row["grouped_mm_error"] = repr(ex)[-300:]
    return row


def peer_config(peer, E, I, fp8, M):
    """The peer's row at M (SGLang's shipped file by SGLang's rule, else its
    default): its BLOCK_SIZE_M is the align both sides use. Per tensor: the
    dtype=fp8_w8a8 file; per channel: the harness reads no per_channel_quant
    file, so SGLang's fp8 default."""
    dtype, block = ("fp8_w8a8" if fp8 else None), fp8 is True
    folder, cfgs = peer.load_cfgs(E, I, dtype, block) if fp8 != "channel" else (None, None)
    return (peer.pick(cfgs, M), folder) if cfgs else (peer.default_cfg(M, E, dtype, block), "default")


class PerChannelKernel:
    """The peer's fused_moe_kernel with per_channel_quant=True: the shared
    harness's launch passes False, so a per-channel launch goes through it
    with the harness's module attribute swapped for this (the harness is
    imported from where it lies, never copied or edited)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        run = self.kernel[grid]
        return lambda *a, **kw: run(*a, **{**kw, "per_channel_quant": True})


def peer_launch(peer, fp8, *args):
    """peer.launch, per channel through PerChannelKernel; block fp8 with its block_shape."""
    if fp8 != "channel":
        return peer.launch(*args, bool(fp8), fp8 is True)
    saved = peer.fused_moe_kernel
    peer.fused_moe_kernel = PerChannelKernel(saved)
    try:
        return peer.launch(*args, True, False)
    finally:
        peer.fused_moe_kernel = saved


def gemm_point(args, name, E, H, I, top_k, fp8, M, routing, w1, w2, s1, s2, w1r, w2r, per_expert, bw, peer, dev,
               runtimes=None, kd_ops=None):
    """--mode gemm at one (case, routing, M): moe_gemm's two calls (up: x by
    w1 into [M, top_k, 2I]; down: the activated [M*top_k, I] by w2 with the
    routed weight, top_k 1) against the peer's two fused_moe_kernel launches
    (peer_moe.launch, as invoke_fused_moe_kernel launches it) on the same
    sorted ids, block size = the peer's BLOCK_SIZE_M at M. kdispatch takes
    bf16 activations (block fp8: quantised inside its kernels); the peer
    takes them quantised beforehand (outside its time, as the peer's own
    GEMM-only numbers). Correctness: every written row of both calls against
    fp32 on set 0. Each forced runtime of `runtimes` (--variants: moe_gemm
    variants) is checked and timed the same way: kd_<variant>_{up,down}_us."""
    if peer is None:
        return {"case": name, "M": M, "routing": routing, "error": "--mode gemm needs the peer's harness (--peers)"}
    cfg, folder = peer_config(peer, E, I, fp8, M)
    bm = int(cfg["BLOCK_SIZE_M"])
    sets = routings(M, E, H, top_k, args.sets, dev, skew=routing == "skewed")
    uniq = statistics.mean(len(torch.unique(s[2]).tolist()) for s in sets)
    floor_us = (uniq * per_expert + 2 * M * H * 2 + 2 * M * top_k * (3 * I + H) * 2) / (bw * 1e3)
    row = {"mode": "gemm", "case": name, "E": E, "H": H, "I": I, "top_k": top_k, "M": M, "fp8": fp8,
           "routing": routing, "block_size": bm, "peer_cfg": cfg, "peer_cfg_folder": folder,
           "experts_touched": uniq, "floor_us": floor_us, "flops": 2 * M * top_k * 3 * I * H}
    bf = torch.bfloat16
    scaled = fp8 in ("tensor", "channel")
    # Per tensor: static activation scales (an activation_scheme "static" checkpoint's), one for x and
    # one for the intermediate, the same on both sides; per channel: per token, dynamic.
    a1 = a2 = None
    prep = []
    for x, tw, tid in sets:
        sid, eid, ntpp = peer.align(tid, bm, E)
        c1 = torch.empty(M, top_k, 2 * I, device=dev, dtype=bf)
        h = torch.randn(M * top_k, 2 * I, device=dev, dtype=bf)
        c2 = (F.silu(h[:, :I].float()) * h[:, I:].float()).to(bf) * 0.1
        c3 = torch.empty(M, top_k, H, device=dev, dtype=bf)
        if fp8 == "tensor" and a1 is None:
            a1 = (x.float().abs().max() / 448.0).reshape(1).contiguous()
            a2 = (c2.float().abs().max() / 448.0).reshape(1).contiguous()
        if scaled:
            (xq, xs), (aq, as_) = quant_rows(x, a1), quant_rows(c2, a2)
        else:
            xq, xs = peer.q_group(x) if fp8 else (x, None)
            aq, as_ = peer.q_group(c2) if fp8 else (c2, None)
        prep.append((x, tw, tid, sid, eid, ntpp, c1, c2, c3, xq, xs, aq, as_))
    op = (torch.ops.kdispatch.moe_gemm_fp8_tensor_out if fp8 == "tensor" else
          torch.ops.kdispatch.moe_gemm_fp8_channel_out if fp8 == "channel" else torch.ops.kdispatch.moe_gemm_out)
    extra_up, extra_down = ((a1,), (a2,)) if scaled else ((), ())

    def kd_up(p):
        op(p[6], p[0], w1, p[1], p[3], p[4], p[5], s1, *extra_up, top_k, bm, 0)

    def kd_down(p):
        op(p[8].view(M * top_k, 1, H), p[7], w2, p[1].view(M * top_k, 1), p[3], p[4], p[5], s2, *extra_down, 1, bm,
           1)

    def peer_up(p):
        peer_launch(peer, fp8, p[9], w1, p[6], p[10], s1 if fp8 != "channel" else s1[:, :, None], p[1], p[3], p[4],
                    p[5], M * top_k, False, top_k, cfg)

    def peer_down(p):
        peer_launch(peer, fp8, p[11], w2, p[8], p[12], s2 if fp8 != "channel" else s2[:, :, None], p[1], p[3], p[4],
                    p[5], M * top_k, True, 1, cfg)

    # Correctness on set 0, both sides, on the pairs of its first min(M, 8) tokens: fp32 on the dequantised
    # weights, one expert at a time (fp8: the activations as each side quantises them); out NaN before each side.
    p = prep[0]
    x, tw, tid, c2 = p[0], p[1], p[2], p[7]
    mm = min(M, 8)
    e = tid[:mm].flatten().long()
    if scaled:  # each side's rows as quant_rows quantises them (the same scales)
        qx, sx = quant_rows(x[:mm], a1)
        qa, sa = quant_rows(c2[:mm * top_k], a2)
        xr, ar = (qx.float() * sx).repeat_interleave(top_k, 0), qa.float() * sa
    else:
        xr = (quant_groups(x[:mm]) if fp8 else x[:mm].float()).repeat_interleave(top_k, 0)
        ar = quant_groups(c2[:mm * top_k]) if fp8 else c2[:mm * top_k].float()
    ref_up = torch.empty(mm * top_k, 2 * I, device=dev)
    ref_down = torch.empty(mm * top_k, H, device=dev)
    for ex in torch.unique(e).tolist():
        idx = (e == ex).nonzero().flatten()
        ref_up[idx] = xr[idx] @ w1r[ex].float().T
        ref_down[idx] = (ar[idx] @ w2r[ex].float().T) * tw[:mm].flatten()[idx, None]
    forced = {v: rt for v, rt in (runtimes or {}).items() if rt is not None}

    def on(rt, fn):
        def go(q):
            kd_ops.set_runtime(rt)
            try:
                fn(q)
            finally:
                kd_ops.set_runtime(None)
        return go
    sides = [("kd", kd_up, kd_down), ("peer", peer_up, peer_down)]
    sides += [(f"kd_{v.split('__')[-1]}", on(rt, kd_up), on(rt, kd_down)) for v, rt in forced.items()]
    forced_of = {f"kd_{v.split('__')[-1]}": v for v in forced}
    for who, up, down in sides:
        p[6].fill_(float("nan"))
        p[8].fill_(float("nan"))
        try:
            up(p)
            got, got_from = served(), served_from()
            down(p)
            if who == "kd":  # what the default runtime served and why (a shipped row or get_default)
                row["kd_served_up"], row["kd_served_down"] = got_from, served_from()
            if who in forced_of and got is not None and {got, served()} != {forced_of[who]}:
                raise RuntimeError(f"forced {forced_of[who]}, served {got} / {served()} (another op's or dtype's)")
            torch.cuda.synchronize()
        except Exception as ex:  # recorded with the row, never hidden
            row[f"{who}_error"] = repr(ex)[-400:]
            continue
        got_up, got_down = p[6].view(-1, 2 * I)[:mm * top_k].float(), p[8].view(-1, H)[:mm * top_k].float()
        row[f"{who}_rel_err_up"] = ((got_up - ref_up).norm() / ref_up.norm()).item()
        row[f"{who}_rel_err_down"] = ((got_down - ref_down).norm() / ref_down.norm()).item()
    if "kd_error" in row or "peer_error" in row:
        return row
    fns = {"kd_up": kd_up, "kd_down": kd_down, "peer_up": peer_up, "peer_down": peer_down}
    for who, up, down in sides[2:]:
        if f"{who}_error" not in row:
            fns[f"{who}_up"], fns[f"{who}_down"] = up, down
    times = {k: [] for k in list(fns) + ["kd_up_aa", "kd_down_aa"]}
    clocks = []
    for _ in range(args.rounds):
        clocks.append(sm_clock_mhz())
        for k in fns:
            times[k].append(graph_us(lambda f=fns[k]: [f(q) for q in prep], len(prep)))
        for k in ("kd_up", "kd_down"):
            times[k + "_aa"].append(graph_us(lambda f=fns[k]: [f(q) for q in prep], len(prep)))
    for k, v in times.items():
        row[f"{k}_us"] = med(v)
    row["kd_us"] = row["kd_up_us"] + row["kd_down_us"]
    row["peer_us"] = row["peer_up_us"] + row["peer_down_us"]
    row["aa_spread"] = max(abs(row[f"{k}_us"] - row[f"{k}_aa_us"]) / row[f"{k}_us"] for k in ("kd_up", "kd_down"))
    row["speedup_vs_peer"] = row["peer_us"] / row["kd_us"]
    for who, _, _ in sides[2:]:
        if f"{who}_up_us" in row:
            row[f"{who}_us"] = row[f"{who}_up_us"] + row[f"{who}_down_us"]
            row[f"{who}_speedup_vs_peer"] = row["peer_us"] / row[f"{who}_us"]
    row["kd_floor_pct"] = 100 * floor_us / row["kd_us"]
    row["peer_floor_pct"] = 100 * floor_us / row["peer_us"]
    row["sm_clock_mhz"] = clocks
    return row


if __name__ == "__main__":
    main()
