# SPDX-License-Identifier: Apache-2.0
"""Calls kdispatch's fp8 GEMM (the table's choice) twice per point, for ncu:

  ncu --clock-control none -k regex:skinny_mma_kernel --section ... \\
      python3 bench/gpu/fp8_profile.py --points tensor:7168x16384:16,block:7168x16384:16

Each point prints the variant the table served, so the profiled launches can be
matched to their points (two launches per point, in order). Used by
run_h200.sh's fp8-profile section to see where the block layout's decode time
goes against the per-tensor one on the same weight.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="libkdispatch.so")
    ap.add_argument("--points", default="tensor:7168x16384:16,block:7168x16384:16,tensor:7168x16384:1,block:7168x16384:1")
    args = ap.parse_args()
    if args.lib:
        os.environ.setdefault("KDISPATCH_LIBRARY", args.lib)
    import torch
    import kdispatch.torch_ops  # noqa: F401
    from bench_fp8 import quantise, weight_block_quant
    for p in args.points.split(","):
        layout, nk, m = p.split(":")
        N, K = (int(v) for v in nk.split("x"))
        M = int(m)
        w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda") * 0.02
        x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
        a8, sa = quantise(torch, x, layout)
        w8, sb = weight_block_quant(torch, w) if layout == "block" else quantise(torch, w, layout)
        sa_kd = sa.t().contiguous() if layout == "block" else sa.reshape(-1) if layout == "rowwise" else sa.reshape(1)
        sb_kd = sb if layout == "block" else sb.reshape(-1) if layout == "rowwise" else sb.reshape(1)
        out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        op = getattr(torch.ops.kdispatch, f"gemm_fp8_{layout}_out")
        for _ in range(2):
            op(out, a8, w8, sa_kd, sb_kd)
        torch.cuda.synchronize()
        src, variant, tm, _, _ = torch.ops.kdispatch._last_info()
        print(f"point {p}: {variant} (source {src}, table M {tm})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
