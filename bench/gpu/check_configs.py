#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The regression gate (as aiter's CI has one): re-benchmark every committed H200
row under configs/cuda/ against get_default's plan on the same shape, same run,
cold (bench/gpu/gpu_timing.py), and fail when a committed row is more than
--max-ratio (1.10) slower than the default. Exit 0 when every row passes."""
import argparse
import glob
import json
import os
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--configs", default="configs")
    ap.add_argument("--device-name", default="NVIDIA_H200")
    ap.add_argument("--max-ratio", type=float, default=1.10)
    ap.add_argument("--rep-ms", type=float, default=15.0)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    os.environ["KDISPATCH_LIBRARY"] = os.path.abspath(a.lib)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "integrations", "python"))
    sys.path.insert(0, here)
    import torch
    import kdispatch
    import kdispatch.torch_ops as kops
    from gpu_timing import Timer

    timer = Timer(torch)
    nocache = os.path.join(a.out, "no-cache")
    rt_tab = kdispatch.Runtime(config_dirs=[a.configs], shipped_configs=False, cache_dir=nocache)
    rt_def = kdispatch.Runtime(shipped_configs=False, cache_dir=nocache)
    DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    rows, bad = [], []
    for op in ("rmsnorm", "fused_add_rmsnorm", "gemm"):
        for path in sorted(glob.glob(os.path.join(a.configs, "cuda", op, "*.json"))):
            name = os.path.basename(path)
            if f"device_name={a.device_name}," not in name and not name.endswith(f"device_name={a.device_name}.json"):
                continue
            fields = dict(kv.split("=", 1) for kv in re.split(r",(?![^\[]*\])", name[:-5]))
            dt = DT[fields["dtype"]]
            table = json.load(open(path))
            for mk in sorted((k for k in table if k.isdigit()), key=int):
                M = int(mk)
                if op == "gemm":
                    N, K = int(fields["N"]), int(fields["K"])
                    x = torch.randn(M, K, dtype=dt, device="cuda")
                    w = torch.randn(N, K, dtype=dt, device="cuda") / K ** 0.5
                    fn = lambda: torch.ops.kdispatch.gemm(x, w, None)  # noqa: E731
                else:
                    H = int(fields["hidden"])
                    x = torch.randn(M, H, dtype=dt, device="cuda")
                    r = torch.randn(M, H, dtype=dt, device="cuda")
                    w = (1 + 0.1 * torch.randn(H, device="cuda")).to(dt)
                    if op == "rmsnorm":
                        fn = lambda: torch.ops.kdispatch.rmsnorm(x, w, 1e-6)  # noqa: E731
                    else:
                        fn = lambda: torch.ops.kdispatch.fused_add_rmsnorm_(x, r, w, 1e-6)  # noqa: E731
                kops.set_runtime(rt_tab)
                t_tab = timer.cold(fn, rep_ms=a.rep_ms)["us"]
                kops.set_runtime(rt_def)
                t_def = timer.cold(fn, rep_ms=a.rep_ms)["us"]
                ratio = t_tab / t_def
                row = {"file": name, "op": op, "M": M, "committed_us": t_tab, "default_us": t_def, "ratio": ratio,
                       "variant": table[mk].get("variant")}
                rows.append(row)
                if ratio > a.max_ratio:
                    bad.append(row)
                    print(f"FAIL {op} {name} M={M}: committed {t_tab:.2f} us vs default {t_def:.2f} us ({ratio:.2f}x)")
    json.dump({"rows": rows, "failed": bad, "max_ratio": a.max_ratio}, open(os.path.join(a.out, "check.json"), "w"), indent=1)
    print(f"check: {len(rows)} committed rows, {len(bad)} slower than {a.max_ratio:.2f}x get_default")
    sys.exit(1 if bad or not rows else 0)


if __name__ == "__main__":
    main()
