# SPDX-License-Identifier: Apache-2.0
"""torch.compile(mode="reduce-overhead") of a Llama-3-8B MLP block and of a
whole decoder layer, built on torch's ops and on torch.ops.kdispatch
(issue 32, item 7), at several batch sizes (decode: one token per sequence).

  mlp    h = x + down(silu(gate) * up), gate_up = fused [gate; up] @ rms_norm(x)
  layer  rms_norm -> qkv -> SDPA over a static KV cache (CTX tokens) -> o_proj
         -> residual add + rms_norm -> the MLP above -> residual add
torch side: F.rms_norm, F.linear, F.silu(g) * u, x + y; kdispatch side:
torch.ops.kdispatch.rmsnorm / fused_add_rmsnorm_ (in place, as engines call
it) / gemm / silu_and_mul; the attention is torch's SDPA on both sides.

Timing as served: each compiled step is called back to back (CALLS calls
between two CUDA events; each call replays the step's CUDA graph through
cudagraph trees, host cost included), R rounds, torch / kd / torch again
(A/A) / kd again (A/A), the order rotated per round; median per call.
Correctness first: both outputs against a float32 evaluation of the same
block. --profile B: torch.profiler over CALLS calls of each side at batch
B, the CUDA kernels by total time (where the difference goes).

  python3 bench/gpu/bench_compile.py --out DIR [--blocks mlp,layer]
         [--batches 1,8,64,256] [--rounds 5] [--profile 64]
writes DIR/compile.json and prints a markdown table.
"""
import argparse
import json
import os
import statistics
import sys
import time

H, I, NH, NKV, HD, EPS = 4096, 14336, 32, 8, 128, 1e-5


def build(torch, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def w(*shape, scale):
        return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * scale).to(torch.bfloat16)

    P = {
        "w_qkv": w((NH + 2 * NKV) * HD, H, scale=H ** -0.5),
        "w_o": w(H, NH * HD, scale=(NH * HD) ** -0.5),
        "w_gu": w(2 * I, H, scale=H ** -0.5),
        "w_down": w(H, I, scale=I ** -0.5),
        "n1": (1 + 0.1 * torch.randn(H, generator=g, device="cuda")).to(torch.bfloat16),
        "n2": (1 + 0.1 * torch.randn(H, generator=g, device="cuda")).to(torch.bfloat16),
    }
    # Parameters, as a model's weights are: cudagraph trees treat them as
    # static inputs (plain tensors in a closure would be copied into the
    # graph's buffers on every call: 250 us a step at batch 64).
    return {k: torch.nn.Parameter(v, requires_grad=False) for k, v in P.items()}


def as_module(torch, P, caches, fn):
    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for k, v in P.items():
                self.register_parameter(k, v)
            self.register_buffer("kcache", caches[0])
            self.register_buffer("vcache", caches[1])

        def forward(self, x):
            return fn(self, x)

    return Step()


def make_steps(torch, F, P, block, B, ctx):
    kd = torch.ops.kdispatch
    kcache = torch.randn(B, NKV, ctx, HD, device="cuda", dtype=torch.bfloat16)
    vcache = torch.randn(B, NKV, ctx, HD, device="cuda", dtype=torch.bfloat16)

    def attn(m, qkv):
        q, k, v = qkv.split([NH * HD, NKV * HD, NKV * HD], dim=-1)
        q = q.view(B, 1, NH, HD).transpose(1, 2)
        k = torch.cat([m.kcache, k.view(B, 1, NKV, HD).transpose(1, 2)], 2)
        v = torch.cat([m.vcache, v.view(B, 1, NKV, HD).transpose(1, 2)], 2)
        o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return o.transpose(1, 2).reshape(B, NH * HD)

    def mlp_torch(m, x):
        gu = F.linear(F.rms_norm(x, (H,), m.n2, EPS), m.w_gu)
        return x + F.linear(F.silu(gu[:, :I]) * gu[:, I:], m.w_down)

    def mlp_kd(m, x):
        gu = kd.gemm(kd.rmsnorm(x, m.n2, EPS), m.w_gu, None)
        return x + kd.gemm(kd.silu_and_mul(gu), m.w_down, None)

    def layer_torch(m, x):
        h = x + F.linear(attn(m, F.linear(F.rms_norm(x, (H,), m.n1, EPS), m.w_qkv)), m.w_o)
        gu = F.linear(F.rms_norm(h, (H,), m.n2, EPS), m.w_gu)
        return h + F.linear(F.silu(gu[:, :I]) * gu[:, I:], m.w_down)

    def layer_kd(m, x):
        o = kd.gemm(attn(m, kd.gemm(kd.rmsnorm(x, m.n1, EPS), m.w_qkv, None)), m.w_o, None)
        res = x.clone()
        kd.fused_add_rmsnorm_(o, res, m.n2, EPS)  # res = x + o; o = rms_norm(res) * n2 (in place)
        return res + kd.gemm(kd.silu_and_mul(kd.gemm(o, m.w_gu, None)), m.w_down, None)

    def reference(x):  # float32, the same block
        f = {k: v.float() for k, v in P.items()}

        def rms(t, w):
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + EPS) * w

        x = x.float()
        if block == "layer":
            q, k, v = F.linear(rms(x, f["n1"]), f["w_qkv"]).split([NH * HD, NKV * HD, NKV * HD], dim=-1)
            q = q.view(B, 1, NH, HD).transpose(1, 2)
            k = torch.cat([kcache.float(), k.view(B, 1, NKV, HD).transpose(1, 2)], 2)
            v = torch.cat([vcache.float(), v.view(B, 1, NKV, HD).transpose(1, 2)], 2)
            o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2).reshape(B, NH * HD)
            x = x + F.linear(o, f["w_o"])
        gu = F.linear(rms(x, f["n2"]), f["w_gu"])
        return x + F.linear(F.silu(gu[:, :I]) * gu[:, I:], f["w_down"])

    ft, fk = (mlp_torch, mlp_kd) if block == "mlp" else (layer_torch, layer_kd)
    return as_module(torch, P, (kcache, vcache), ft), as_module(torch, P, (kcache, vcache), fk), reference


def time_calls(torch, fn, x, calls):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(calls):
        fn(x)
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000.0 / calls


def profile(torch, fn, x, calls):
    from torch.profiler import ProfilerActivity, profile as prof
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            fn(x)
        torch.cuda.synchronize()
    rows = []
    for e in p.key_averages():
        dev = getattr(e, "device_time_total", None)
        if dev is None:
            dev = getattr(e, "cuda_time_total", 0)
        if dev and e.key and not e.key.startswith("cuda") and e.count >= calls:
            rows.append((e.key, dev / calls, e.count // calls))
    rows.sort(key=lambda r: -r[1])
    seen, out = set(), []
    for k, us, n in rows:
        if k in seen:
            continue
        seen.add(k)
        out.append({"name": k[:120], "us_per_step": round(us, 2), "per_step": n})
    return out[:14]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--blocks", default="mlp,layer")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--profile", type=int, default=64, help="batch to profile (0: none)")
    ap.add_argument("--budget-s", type=float, default=500)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F

    from kdispatch import torch_ops  # noqa: F401  (loads the native ops)
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    P = build(torch)
    res = {"torch": torch.__version__, "rows": [], "profiles": {}}
    for block in a.blocks.split(","):
        for B in [int(b) for b in a.batches.split(",")]:
            if time.time() - t0 > a.budget_s:
                res["incomplete"] = True
                break
            torch._dynamo.reset()
            ft, fk, ref = make_steps(torch, F, P, block, B, a.ctx)
            x = torch.randn(B, H, device="cuda", dtype=torch.bfloat16)
            row = {"block": block, "batch": B}
            with torch.inference_mode():
                want = ref(x)
                for name, f in (("torch", ft), ("kd", fk)):
                    got = f(x).float()
                    row[f"{name}_eager_rel_err"] = ((got - want).norm() / want.norm()).item()
                ct = torch.compile(ft, mode="reduce-overhead", fullgraph=True)
                ck = torch.compile(fk, mode="reduce-overhead", fullgraph=True)
                try:
                    for _ in range(4):  # (cloned: a later replay may overwrite a graph's output)
                        yt = ct(x).clone()
                        yk = ck(x).clone()
                    torch.cuda.synchronize()
                    row["torch_rel_err"] = ((yt.float() - want).norm() / want.norm()).item()
                    row["kd_rel_err"] = ((yk.float() - want).norm() / want.norm()).item()
                    ways = [("torch", ct), ("kd", ck), ("torch_aa", ct), ("kd_aa", ck)]
                    t = {k: [] for k, _ in ways}
                    for r in range(a.rounds):
                        order = ways[r % 4:] + ways[:r % 4]
                        for k, f in order:
                            t[k].append(time_calls(torch, f, x, a.calls))
                    for k in t:
                        row[f"{k}_us"] = statistics.median(t[k])
                    row["x"] = row["torch_us"] / row["kd_us"]
                    row["aa"] = max(abs(row["torch_aa_us"] / row["torch_us"] - 1), abs(row["kd_aa_us"] / row["kd_us"] - 1))
                    if B == a.profile:
                        res["profiles"][f"{block}@{B}"] = {"torch": profile(torch, ct, x, 20), "kd": profile(torch, ck, x, 20)}
                except Exception as e:  # noqa: BLE001  (recorded: the table says what failed)
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
            with open(os.path.join(a.out, "compile.json"), "w") as f:
                json.dump(res, f, indent=1)
    print("| block | batch | torch us | kd us | x | A/A | rel err torch / kd |")
    print("|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        if "x" in r:
            print(f"| {r['block']} | {r['batch']} | {r['torch_us']:.1f} | {r['kd_us']:.1f} | {r['x']:.3f} | {r['aa']:.3f} | "
                  f"{r['torch_rel_err']:.4f} / {r['kd_rel_err']:.4f} |")
        else:
            print(f"| {r['block']} | {r['batch']} | - | - | - | - | {r.get('error')} |")
    for k, v in res["profiles"].items():
        for side in ("torch", "kd"):
            print(f"\nprofile {k} {side} (us per step):")
            for e in v[side]:
                print(f"  {e['us_per_step']:8.2f}  x{e['per_step']}  {e['name']}")
    print(("INCOMPLETE" if res.get("incomplete") else "COMPLETE") + f" {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
