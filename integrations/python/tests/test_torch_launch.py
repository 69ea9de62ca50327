# SPDX-License-Identifier: Apache-2.0
"""kdispatch._torch_launch, the call path of the Python torch ops
(kdispatch.torch_ops without the native library): the workspace a call
asks for is kdispatch_op_workspace_bytes of its tensors (0 on the host; on
a GPU, past the stream's 32 MiB, a tensor of exactly that size), the GEMMs
are never asked, and a fused_moe call on CPU tensors runs through it on a
machine without CUDA, against an fp32 reference. The module needs no
torch.library.custom_op, so this runs with any torch (Debian's 1.13
included); skipped without torch."""

import ctypes
import json
import subprocess
import sys
import unittest

try:
    import torch
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

import kdispatch
from kdispatch import _capi

if HAVE_TORCH:
    from kdispatch import _torch_launch

OPS = {o["name"]: o for o in json.loads(_capi.op_list_json())}


def c_workspace_bytes(name, ptrs, n, sc, n_sc):
    """kdispatch_op_workspace_bytes called directly: (status, bytes)."""
    out = ctypes.c_int64(-1)
    s = _capi.lib.kdispatch_op_workspace_bytes(name.encode(), ptrs, n, sc, n_sc, ctypes.byref(out))
    return s, out.value


def moe_tensors(E, H, I, M, top_k, device="cpu", seed=0):
    """fused_moe's arguments in the op's order (hidden, w1, w2, topk_weights,
    topk_ids, out, w1_scale, w2_scale): bf16 activations and weights, fp32
    routing weights, int32 expert ids; no scales."""
    g = torch.Generator().manual_seed(seed)
    if device == "meta":  # shapes and dtypes only
        def make(shape, dtype):
            return torch.empty(shape, dtype=dtype, device="meta")
        ids = make((M, top_k), torch.int32)
        tw = make((M, top_k), torch.float32)
        x, w1, w2 = make((M, H), torch.bfloat16), make((E, 2 * I, H), torch.bfloat16), make((E, H, I), torch.bfloat16)
    else:
        x = torch.randn(M, H, generator=g).to(torch.bfloat16)
        w1 = (torch.randn(E, 2 * I, H, generator=g) * 0.1).to(torch.bfloat16)
        w2 = (torch.randn(E, H, I, generator=g) * 0.1).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(M)]).to(torch.int32)
        tw = torch.rand(M, top_k, generator=g)
    out = torch.empty(M, H, dtype=torch.bfloat16, device=x.device)
    return [x, w1, w2, tw, ids, out, None, None]


def moe_scalars():
    return [s["default"] for s in OPS["fused_moe"]["scalars"]]


@unittest.skipUnless(HAVE_TORCH, "torch is not installed for this interpreter")
class TorchLaunchWorkspaceTest(unittest.TestCase):
    def test_rows(self):
        """The ops this path gives a workspace to: fused_moe takes one; the
        GEMMs take one too, but only the stream's."""
        self.assertTrue(OPS["fused_moe"]["workspace"])
        self.assertTrue(OPS["gemm"]["workspace"])
        self.assertEqual(_torch_launch.STREAM_WORKSPACE_BYTES, 32 * 1024 * 1024)

    def test_fused_moe_on_the_host_asks_for_none(self):
        """A fused_moe call on CPU tensors: the bytes this path computes are
        kdispatch_op_workspace_bytes' answer, 0 (no CPU variant takes a
        workspace), and the call gets no workspace of its own."""
        op = OPS["fused_moe"]
        for (E, H, I, M, top_k) in [(4, 32, 16, 3, 2), (8, 256, 128, 64, 4)]:
            keep = []
            tensors = moe_tensors(E, H, I, M, top_k)
            ptrs = _torch_launch.dl_array(tensors, keep)
            sc = _torch_launch.scalar_array(moe_scalars())
            status, direct = c_workspace_bytes("fused_moe", ptrs, len(tensors), sc, len(op["scalars"]))
            self.assertEqual(status, 0)
            self.assertEqual(direct, 0)
            asked = _torch_launch.workspace_bytes("fused_moe", ptrs, len(tensors), sc, len(op["scalars"]))
            self.assertEqual(asked, direct)
            self.assertIsNone(_torch_launch.call_workspace(op, ptrs, len(tensors), sc, len(op["scalars"]),
                                                           torch.device("cpu")))

    def test_refused_call_asks_for_none(self):
        """A call the library refuses (out of the wrong shape) asks for 0
        bytes, as the native ops do: the call itself then says why."""
        keep = []
        tensors = moe_tensors(4, 32, 16, 3, 2)
        tensors[5] = torch.empty(3, 31, dtype=torch.bfloat16)
        ptrs = _torch_launch.dl_array(tensors, keep)
        sc = _torch_launch.scalar_array(moe_scalars())
        status, _ = c_workspace_bytes("fused_moe", ptrs, len(tensors), sc, 2)
        self.assertNotEqual(status, 0)
        self.assertEqual(_torch_launch.workspace_bytes("fused_moe", ptrs, len(tensors), sc, 2), 0)

    def test_gpu_prefill_gets_its_own(self):
        """The same op described on a CUDA device (shapes only, data NULL, as
        kdispatch_op_workspace_bytes allows): a DeepSeek-sized prefill's
        tensor-core plans ask for more than the stream's 32 MiB, and
        call_workspace allocates exactly what the library says (on the meta
        device here, no memory); a GEMM is never asked."""
        op = OPS["fused_moe"]
        keep = []
        tensors = moe_tensors(E=8, H=7168, I=2048, M=4096, top_k=8, device="meta")
        ptrs = _torch_launch.dl_array(tensors, keep)
        for i, t in enumerate(tensors):
            if t is not None:
                ptrs[i].contents.device = _capi.DLDevice(_capi.kDLCUDA, 0)
        sc = _torch_launch.scalar_array(moe_scalars())
        status, direct = c_workspace_bytes("fused_moe", ptrs, len(tensors), sc, 2)
        self.assertEqual(status, 0)
        self.assertEqual(_torch_launch.workspace_bytes("fused_moe", ptrs, len(tensors), sc, 2), direct)
        ws = _torch_launch.call_workspace(op, ptrs, len(tensors), sc, 2, torch.device("meta"))
        if direct:  # a library with the CUDA backend: the most its bf16 variants ask, the grouped kernels'
            # a [P, I] and y [P, H] in fp32, each 256-byte aligned, and a counter per 16 rows of H
            P = 4096 * 8
            self.assertEqual(direct, P * 2048 * 4 + P * 7168 * 4 + 7168 // 16 * 4)  # 1207961344
            self.assertGreater(direct, _torch_launch.STREAM_WORKSPACE_BYTES)
            self.assertEqual(ws.dtype, torch.uint8)
            self.assertEqual(ws.numel(), direct)
        else:  # a library built without the CUDA backend: no variant asks
            self.assertIsNone(ws)
        gemm = OPS["gemm"]
        self.assertIsNone(_torch_launch.call_workspace(gemm, ptrs, 4, sc, 0, torch.device("meta")))


@unittest.skipUnless(HAVE_TORCH, "torch is not installed for this interpreter")
class TorchLaunchCpuTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = kdispatch.Runtime(shipped_configs=False, log_level="off")

    @classmethod
    def tearDownClass(cls):
        cls.rt.close()

    def test_fused_moe_runs_on_a_machine_without_cuda(self):
        """launch() of fused_moe on CPU tensors: the workspace branch is
        passed over (no GPU), the call serves, the result matches an fp32
        reference of silu(x W1_gate) * (x W1_up) W2, weighted per expert."""
        E, H, I, M, top_k = 4, 64, 32, 5, 2
        tensors = moe_tensors(E, H, I, M, top_k, seed=1)
        x, w1, w2, tw, ids, out = tensors[:6]
        scalars = [2.5, 0]  # routed_scaling_factor, activation (silu)
        self.assertEqual([s["name"] for s in OPS["fused_moe"]["scalars"]], ["routed_scaling_factor", "activation"])
        info = _capi.DispatchInfo()
        info.struct_size = ctypes.sizeof(_capi.DispatchInfo)
        _torch_launch.launch(self.rt, OPS["fused_moe"], tensors, scalars, info)
        self.assertTrue(info.variant.decode().startswith("fused_moe_"), info.variant)
        ref = torch.zeros(M, H)
        for t in range(M):
            for j in range(top_k):
                e = int(ids[t, j])
                h = w1[e].float() @ x[t].float()
                ref[t] += float(tw[t, j]) * (w2[e].float() @ (torch.nn.functional.silu(h[:I]) * h[I:]))
        ref *= 2.5
        self.assertLessEqual(float((out.float() - ref).abs().max()), 1.6e-2 * float(ref.abs().max()))
        self.assertGreater(float(ref.abs().max()), 0.0)

    def test_moe_align_size_past_2_24_is_refused_not_rounded(self):
        """An "int" scalar (a size) past 2^24 reaches the C ABI as -1, as
        Runtime's methods and the native ops pass it: refused by name, never
        the float32 neighbour (2^24 + 1 rounds to 2^24, which a call takes)."""
        self.assertEqual(list(_torch_launch.scalar_array([2**24 + 1, 2**24, 4.5], ["int", "int", "int"])),
                         [-1.0, 16777216.0, 4.5])
        self.assertEqual(list(_torch_launch.scalar_array([2.5, 0], ["float", "choice"])), [2.5, 0.0])
        # A choice's index a float32 would round to a label (0.999999999 to 1,
        # gelu) is refused naming it; one it holds (0.5) goes on, refused there.
        with self.assertRaises(kdispatch.Error) as c:
            _torch_launch.scalar_array([1.0, 0.999999999], ["float", "choice"], ["routed_scaling_factor", "activation"])
        self.assertEqual(c.exception.message, "activation: must be a whole number, got 0.999999999")
        self.assertEqual(list(_torch_launch.scalar_array([0.5], ["choice"])), [0.5])
        ids = torch.tensor([[2, 0], [2, 3], [-1, 2]], dtype=torch.int32)
        out = [torch.full((18,), 99, dtype=torch.int32), torch.full((5,), 99, dtype=torch.int32),
               torch.full((1,), 99, dtype=torch.int32)]
        _torch_launch.launch(self.rt, OPS["moe_align"], [ids] + out + [None], [4, 4])
        self.assertEqual(out[2].tolist(), [12])
        with self.assertRaises(kdispatch.Error) as c:
            _torch_launch.launch(self.rt, OPS["moe_align"], [ids] + out + [None], [2**24 + 1, 4])
        self.assertIn("num_experts: must be a whole number in [1, 16777216], got -1", c.exception.message)


# The Python custom_op module itself, in a child process: under a torch
# without torch.library.custom_op (< 2.4: Debian's 1.13) the two
# registration functions are stand-ins that return the function as it is,
# so the module's generated signatures and its calls run as written.
_CHILD = r"""
import json, torch
if not hasattr(torch.library, "custom_op"):
    torch.library.custom_op = lambda name, mutates_args=(): (lambda fn: fn)
    torch.library.register_fake = lambda name: (lambda fn: fn)
import kdispatch
from kdispatch import _torch_custom as C
C.set_runtime(kdispatch.Runtime(shipped_configs=False, log_level="off"))
g = torch.Generator().manual_seed(2)
E, H, I, M, top_k = 4, 64, 32, 3, 2
x = torch.randn(M, H, generator=g).to(torch.bfloat16)
w1 = (torch.randn(E, 2 * I, H, generator=g) * 0.1).to(torch.bfloat16)
w2 = (torch.randn(E, H, I, generator=g) * 0.1).to(torch.bfloat16)
ids = torch.tensor([[0, 2], [3, 1], [1, 0]], dtype=torch.int32)
tw = torch.rand(M, top_k, generator=g)
ref = torch.zeros(M, H)
for t in range(M):
    for j in range(top_k):
        e = int(ids[t, j])
        h = w1[e].float() @ x[t].float()
        ref[t] += float(tw[t, j]) * (w2[e].float() @ (torch.nn.functional.silu(h[:I]) * h[I:]))
y = C.fused_moe(x, w1, w2, tw, ids)  # the scalars' defaults: routed_scaling_factor 1, silu
y2 = C.fused_moe(x, w1, w2, tw, ids, routed_scaling_factor=2.5)
out, info = C.call_info("fused_moe", x, w1, w2, tw, ids)
r = torch.randn(4, 64, generator=g)
n = C.rmsnorm(r, torch.ones(64))  # eps=1e-06
# moe_gemm allocates its rank-3 out [M, top_k, N] (it allocated [N] before)
bs, cap = 4, M * top_k + min(E, M * top_k) * 3
sid, eid = torch.empty(cap, dtype=torch.int32), torch.empty(-(-cap // bs), dtype=torch.int32)
ntpp = torch.empty(1, dtype=torch.int32)
C.get_runtime().moe_align(sorted_token_ids=sid, expert_ids=eid, num_tokens_post_pad=ntpp, topk_ids=ids,
                          num_experts=E, block_size=bs)  # an op with no custom_op form
up = C.moe_gemm(x, w1, tw, sid, eid, ntpp, None, top_k, bs, 0)
# the fake (meta) allocation takes top_k from its scalar, as kdispatch binds
# it; the real call refuses the topk_weights that disagrees, naming it
fake = C._outputs(C._OPS["moe_gemm"], {"a": x, "w": w1, "topk_weights": tw, "sorted_token_ids": sid,
                                       "expert_ids": eid, "num_tokens_post_pad": ntpp, "w_scale": None,
                                       "top_k": 3, "block_size": bs, "mul_routed_weight": 0},
                  lambda shape, like, dtype: like.new_empty(shape, dtype=dtype))["out"]
try:
    C.moe_gemm(x, w1, tw, sid, eid, ntpp, None, 3, bs, 0)
    refused = ""
except kdispatch.Error as e:
    refused = e.message
# outputs as the native ops make them: the quant ops' q fp8 (where torch has
# it), scale fp32 [ceil(K/128), M] (group) or [1] (tensor); an fp8 GEMM's d
# bf16 (each was the first input's dtype, the group scale [M, ceil(K/128)],
# the tensor scale a KeyError)
alloc = lambda shape, like, dtype: torch.empty(shape, dtype=dtype)  # noqa: E731
qx = torch.randn(2, 3, 256).to(torch.bfloat16)
made = {n: C._outputs(C._OPS[n], {"x": qx}, alloc) for n in ("quant_fp8_group", "quant_fp8_tensor", "quant_fp8_token")}
made["gemm_fp8_block"] = C._outputs(C._OPS["gemm_fp8_block"], {"a": torch.empty(5, 256, dtype=torch.uint8),
                                    "b": torch.empty(7, 256, dtype=torch.uint8), "scale_a": torch.empty(2, 5),
                                    "scale_b": torch.empty(1, 2)}, alloc)
outs_made = {f"{n}.{k}": [list(t.shape), str(t.dtype)] for n, o in made.items() for k, t in o.items()}
# M = 0: kdispatch still checks the call (it returned [0, 7] unchecked)
try:
    C.gemm(torch.randn(0, 5), torch.randn(7, 6))
    m0 = ""
except kdispatch.Error as e:
    m0 = e.message
up_ref = torch.stack([torch.stack([w1[int(ids[t, j])].float() @ x[t].float() for j in range(top_k)]) for t in range(M)])
print(json.dumps({"moe": float((y.float() - ref).abs().max() / ref.abs().max()),
                  "moe_scaled": float((y2.float() - 2.5 * ref).abs().max() / ref.abs().max()),
                  "call_info_same": bool(torch.equal(out, y)), "variant": info["variant"],
                  "moe_gemm_shape": list(up.shape), "fake_top_k_3": list(fake.shape), "top_k_3": refused, "m0": m0, "outs_made": outs_made,
                  "m0_ok": list(C.gemm(torch.randn(0, 6), torch.randn(7, 6)).shape),
                  "moe_gemm": float((up.float() - up_ref).abs().max() / up_ref.abs().max()),
                  "rms": float((n - r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + 1e-6)).abs().max())}))
"""


@unittest.skipUnless(HAVE_TORCH, "torch is not installed for this interpreter")
class TorchCustomModuleTest(unittest.TestCase):
    def test_scalars_default_and_fused_moe_runs(self):
        """kdispatch._torch_custom builds (fused_moe's float scalars follow its
        optional scale tensors: they need defaults, as the native schemas
        have) and its ops run on CPU tensors through _torch_launch: fused_moe
        with the defaults and with routed_scaling_factor=2.5, rmsnorm with
        eps=1e-06, against fp32 references."""
        p = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertLessEqual(r["moe"], 1.6e-2)
        self.assertLessEqual(r["moe_scaled"], 1.6e-2)
        self.assertTrue(r["call_info_same"])
        self.assertTrue(r["variant"].startswith("fused_moe_"), r["variant"])
        self.assertLessEqual(r["rms"], 1e-5)
        self.assertEqual(r["moe_gemm_shape"], [3, 2, 64])
        self.assertEqual(r["fake_top_k_3"], [3, 3, 64])
        self.assertEqual(r["top_k_3"], "topk_weights: shape [3, 2] must be [M, top_k] = [3, 3]")
        self.assertEqual(r["m0"], "b: shape [7, 6] does not match a [0, 5]: b must be [N, K] with K = 5")
        self.assertEqual(r["m0_ok"], [0, 7])
        q8 = "torch.float8_e4m3fn" if hasattr(torch, "float8_e4m3fn") else "torch.bfloat16"  # 1.13: x's, named then
        self.assertEqual(r["outs_made"], {
            "quant_fp8_group.q": [[2, 3, 256], q8], "quant_fp8_group.scale": [[2, 6], "torch.float32"],
            "quant_fp8_tensor.q": [[2, 3, 256], q8], "quant_fp8_tensor.scale": [[1], "torch.float32"],
            "quant_fp8_token.q": [[2, 3, 256], q8], "quant_fp8_token.scale": [[6], "torch.float32"],
            "gemm_fp8_block.d": [[5, 7], "torch.bfloat16"]})
        self.assertLessEqual(r["moe_gemm"], 1e-2)


if __name__ == "__main__":
    unittest.main()
