#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The regression gate (as aiter's CI has one): re-benchmark every committed H200
row under configs/cuda/ against get_default's plan on the same shape, same run,
cold (bench/gpu/gpu_timing.py), and fail when a committed row is more than
--max-ratio (1.10) slower than the default. Exit status: 0 when every row passes,
1 when a row fails (or there is none), 3 when the time budget (--budget-s) left rows
unmeasured: run again with --resume <the check.json it wrote>, which keeps the rows
measured so far."""
import argparse
import glob
import json
import os
import re
import sys
import tempfile
import time

T0 = time.time()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--configs", default="configs")
    ap.add_argument("--device-name", default="NVIDIA_H200")
    ap.add_argument("--max-ratio", type=float, default=1.10)
    ap.add_argument("--rep-ms", type=float, default=15.0)
    ap.add_argument("--out", default=".")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting new rows after this")
    ap.add_argument("--resume", default=None, help="check.json of an earlier run: keep its rows")
    a = ap.parse_args()
    prev = {}
    if a.resume and os.path.isfile(a.resume):
        with open(a.resume) as f:
            for row in json.load(f).get("rows", []):
                prev[(row["file"], row["M"])] = row
        print(f"resume: {len(prev)} row(s) from {a.resume}")
    os.environ["KDISPATCH_LIBRARY"] = os.path.abspath(a.lib)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "integrations", "python"))
    sys.path.insert(0, here)
    import torch
    import kdispatch
    import kdispatch.torch_ops as kops
    from gpu_timing import Timer

    timer = Timer(torch)
    nocache = tempfile.mkdtemp(prefix="kd-check-no-cache-")
    rt_tab = kdispatch.Runtime(config_dirs=[a.configs], shipped_configs=False, cache_dir=nocache)
    rt_def = kdispatch.Runtime(shipped_configs=False, cache_dir=nocache)
    DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    rows, bad = [], []
    left = 0
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
                if (name, M) in prev:
                    row = prev[(name, M)]
                    rows.append(row)
                    if row["ratio"] > a.max_ratio:
                        bad.append(row)
                    continue
                if time.time() - T0 > a.budget_s:
                    left += 1
                    continue
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
    with open(os.path.join(a.out, "check.json"), "w") as f:
        json.dump({"rows": rows, "failed": bad, "max_ratio": a.max_ratio, "left": left}, f, indent=1)
    print(f"check: {len(rows)} committed rows measured, {len(bad)} slower than {a.max_ratio:.2f}x get_default"
          + (f", {left} left for another run (time budget)" if left else ""))
    if bad or (not rows and not left):
        sys.exit(1)
    sys.exit(3 if left else 0)


if __name__ == "__main__":
    main()
