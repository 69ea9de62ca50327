# SPDX-License-Identifier: Apache-2.0
"""One block-scaled fp8 GEMM call, for compute-sanitizer: which of torch._scaled_mm,
the floor and get_default's rule reads out of bounds at ceil(K/128) % 4 != 0.

  python3 bench/gpu/probe_block_k.py torch|floor|rule N K M
prints the call's relative error against the float64 dequantised product.
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    which, N, K, M = sys.argv[1], *map(int, sys.argv[2:5])
    import torch
    import bench_fp8 as b8
    import kdispatch
    from kdispatch import torch_ops as kd
    torch.manual_seed(0)
    x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    a8, sa = b8.quantise(torch, x, "block")
    w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda") / math.sqrt(K)
    w8, sb = b8.weight_block_quant(torch, w)
    sa_kd = sa.t().contiguous()
    ref = b8.dequant(torch, a8, sa, "block") @ b8.dequant(torch, w8, sb, "block", rows_are_weight=True).t()
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    if which == "torch":
        out = torch._scaled_mm(a8, w8.t(), sa_kd.t(), sb.t(), out_dtype=torch.bfloat16)
    else:
        force = "gemm_fp8_block=gemm_fp8_block_e4m3fn__cublaslt:algo_id=-2" if which == "floor" else ""
        rt = kdispatch.Runtime(force=force, shipped_configs=False) if force else kdispatch.Runtime(shipped_configs=False)
        kd.set_runtime(rt)
        kd.gemm_fp8_block_out(out, a8, w8, sa_kd, sb)
    torch.cuda.synchronize()
    err = float((out.double() - ref).norm() / ref.norm())
    print(f"{which} N={N} K={K} M={M}: rel err {err:.3e}")


if __name__ == "__main__":
    main()
