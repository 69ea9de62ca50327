"""Host time per call (us) of the torch ops against torch's own, on tiny CUDA
tensors (launch-bound: the loop's wall time per call is the host cost)."""
import os
import sys
import time

import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "integrations", "python"))
import kdispatch  # noqa: E402

if os.environ.get("KD_TORCH_OPS"):  # another version of torch_ops.py, loaded as kdispatch.torch_ops
    import importlib.util
    spec = importlib.util.spec_from_file_location("kdispatch.torch_ops", os.environ["KD_TORCH_OPS"])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kdispatch.torch_ops"] = mod
    spec.loader.exec_module(mod)
else:
    import kdispatch.torch_ops  # noqa: F401

dev, dt = "cuda", torch.bfloat16
x = torch.randn(1, 4096, dtype=dt, device=dev)
r = torch.randn(1, 4096, dtype=dt, device=dev)
w = torch.randn(4096, dtype=dt, device=dev)
gu = torch.randn(1, 2 * 14336, dtype=dt, device=dev)
b = torch.randn(4096, 4096, dtype=dt, device=dev)
kd = torch.ops.kdispatch


def per_call(f, n=3000):
    for _ in range(50):
        f()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


rows = [
    ("rmsnorm", lambda: kd.rmsnorm(x, w, 1e-6), lambda: F.rms_norm(x, (4096,), w, 1e-6)),
    ("fused_add_rmsnorm_", lambda: kd.fused_add_rmsnorm_(x, r, w, 1e-6),
     lambda: (r.add_(x), F.rms_norm(r, (4096,), w, 1e-6))),
    ("silu_and_mul", lambda: kd.silu_and_mul(gu), lambda: F.silu(gu[:, :14336]) * gu[:, 14336:]),
    ("gemm", lambda: kd.gemm(x, b), lambda: F.linear(x, b)),
]
print("| op | kdispatch us/call | torch us/call |\n|---|---|---|")
for name, ours, theirs in rows:
    print(f"| {name} | {per_call(ours):.1f} | {per_call(theirs):.1f} |")
