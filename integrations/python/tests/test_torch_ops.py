# SPDX-License-Identifier: Apache-2.0
"""torch.ops.kdispatch.* (kdispatch.torch_ops): results against float64
references, in-place semantics, the schemas, the Meta kernels, the errors;
the registrations (torch.library.opcheck) and torch.compile where the torch
has them (>= 2.4); on CUDA tensors when a CUDA device and kdispatch's CUDA
backend are there: streams, devices and CUDA-graph capture.

Runs with whichever implementation kdispatch.torch_ops picked (the native
libkdispatch_torch.so when it is built for this torch, else the Python
custom_op path, torch >= 2.4) and says which. Debian's python3-torch (1.13,
CPU only) runs the native ops; the compile/opcheck tests skip there with
the reason. Skipped without torch."""

import os
import sys
import unittest

try:
    import torch
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

import kdispatch
from kdispatch import Error, StatusCode

OPS = None
WHY_NOT = "torch is not installed for this interpreter"
if HAVE_TORCH:
    try:
        import kdispatch.torch_ops as OPS
        sys.stderr.write(f"kdispatch.torch_ops: {'native' if OPS.NATIVE else 'Python custom_op'} ops, "
                         f"torch {torch.__version__}\n")
    except ImportError as e:  # torch < 2.4 and no native library for it
        WHY_NOT = f"kdispatch.torch_ops does not import here: {e}"
SKIP = WHY_NOT
NATIVE = bool(OPS is not None and OPS.NATIVE)
HAVE_COMPILE = HAVE_TORCH and hasattr(torch, "compile") and hasattr(torch.library, "opcheck")
HAVE_FP8 = HAVE_TORCH and hasattr(torch, "float8_e4m3fn")  # torch >= 2.1
NO_COMPILE = (f"torch {torch.__version__ if HAVE_TORCH else ''} has no torch.compile / torch.library.opcheck "
              "(they came with 2.0 / 2.4): run on the GPU machine's torch")

# The torch error of each kdispatch status (native ops); the Python path
# raises kdispatch.Error with the code.
_NATIVE_ERRORS = {StatusCode.invalid_argument: ValueError, StatusCode.unsupported_problem: NotImplementedError,
                  StatusCode.unsupported_device: NotImplementedError}


def rms_ref(x, w, eps):
    x64 = x.double()
    return (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double())


def cuda_backend_available():
    if not HAVE_TORCH or not torch.cuda.is_available():
        return False, "no CUDA device visible to torch"
    try:
        kdispatch.default_runtime().device_info("hip" if torch.version.hip else "cuda", 0)
        return True, ""
    except Error as e:
        return False, f"this libkdispatch has no usable GPU backend ({e})"


def _routed_3x2(E, bs):
    """Three tokens' top-2 routing over E >= 4 experts and moe_align's
    buffers for it in blocks of bs: (topk_ids, topk_weights,
    sorted_token_ids, expert_ids, num_tokens_post_pad)."""
    ids = torch.tensor([[0, 2], [3, 1], [1, 0]], dtype=torch.int32)
    tw = torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]])
    cap = 6 + min(E, 6) * (bs - 1)
    sid, eid = torch.empty(cap, dtype=torch.int32), torch.empty(-(-cap // bs), dtype=torch.int32)
    ntpp = torch.empty(1, dtype=torch.int32)
    torch.ops.kdispatch.moe_align_out(sid, eid, ntpp, ids, None, E, bs)
    return ids, tw, sid, eid, ntpp


@unittest.skipUnless(OPS is not None, SKIP)
class TorchOpsCpuTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = OPS
        cls.rt = kdispatch.Runtime(shipped_configs=False, log_level="off")
        cls.ops.set_runtime(cls.rt)

    @classmethod
    def tearDownClass(cls):
        cls.ops.set_runtime(None)
        cls.rt.close()

    def setUp(self):
        torch.manual_seed(0)

    def assertOpError(self, code, fn, *args, text=None):
        """fn(*args) fails with kdispatch status `code` (torch's error type
        for it on the native ops), its message naming `text`."""
        want = _NATIVE_ERRORS.get(code, RuntimeError) if NATIVE else Error
        with self.assertRaises(want) as c:
            fn(*args)
        msg = str(c.exception)
        if NATIVE:
            self.assertIn(code.name, msg)
        else:
            self.assertIs(c.exception.code, code)
        if text is not None:
            self.assertIn(text, msg)
        return msg

    def test_sglang_fused_experts(self):
        """kdispatch.sglang.fused_experts: SGLang's arguments (TopK output,
        runner config) through torch.ops.kdispatch.fused_moe, against an fp32
        reference; what the op does not compute is refused by name."""
        import types
        from kdispatch import sglang
        E, H, I, M = 4, 32, 16, 3
        x = torch.randn(M, H).to(torch.bfloat16)
        w1 = (torch.randn(E, 2 * I, H) * 0.1).to(torch.bfloat16)
        w2 = (torch.randn(E, H, I) * 0.1).to(torch.bfloat16)
        ids = torch.tensor([[0, 2], [3, 1], [1, 0]])  # int64, as a router may give them
        tw = torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]], dtype=torch.bfloat16)
        ref = torch.zeros(M, H)
        for t in range(M):
            for j in range(2):
                e = int(ids[t, j])
                h = w1[e].float() @ x[t].float()
                a = torch.nn.functional.silu(h[:I]) * h[I:]
                ref[t] += float(tw[t, j]) * (w2[e].float() @ a)
        ref *= 2.5
        cfg = types.SimpleNamespace(activation="silu", routed_scaling_factor=2.5, inplace=False,
                                    apply_router_weight_on_input=False, no_combine=False)
        out = sglang.fused_experts(x, w1, w2, (tw, ids, None), cfg)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertEqual(tuple(out.shape), (M, H))
        self.assertLessEqual(float((out.float() - ref).abs().max()), 1.6e-2 * float(ref.abs().max()))
        topk = types.SimpleNamespace(topk_weights=tw.float(), topk_ids=ids.to(torch.int32), router_logits=None)
        same = sglang.fused_experts(x, w1, w2, topk, cfg)
        self.assertTrue(torch.equal(same, out))
        cfg.inplace = True
        y = x.clone()
        self.assertIs(sglang.fused_experts(y, w1, w2, topk, cfg), y)
        self.assertTrue(torch.equal(y, out))
        with self.assertRaisesRegex(NotImplementedError, "b1 is not supported"):
            sglang.fused_experts(x, w1, w2, topk, None, b1=torch.zeros(E, 2 * I))
        with self.assertRaisesRegex(NotImplementedError, r"needs \[128, 128\]"):
            sglang.fused_experts(x, w1, w2, topk, None, use_fp8_w8a8=True, block_shape=[64, 64])
        with self.assertRaisesRegex(ValueError, "come with use_fp8_w8a8=True"):
            sglang.fused_experts(x, w1, w2, topk, None, per_channel_quant=True)
        with self.assertRaisesRegex(NotImplementedError, "activation 'relu'"):
            sglang.fused_experts(x, w1, w2, topk, types.SimpleNamespace(activation="relu"))

        # vLLM's call: the same result; under expert parallelism its expert_map
        # sends another rank's experts to -1 (they contribute nothing).
        from kdispatch import vllm
        self.assertTrue(torch.equal(vllm.fused_experts(x, w1, w2, tw, ids),
                                    sglang.fused_experts(x, w1, w2, (tw, ids, None), None)))
        local = torch.tensor([0, 1, -1, -1], dtype=torch.int32)  # this rank holds global experts 0 and 1
        y = vllm.fused_experts(x, w1[:2].contiguous(), w2[:2].contiguous(), tw, ids, expert_map=local,
                               global_num_experts=4)
        part = torch.zeros(M, H)
        for t in range(M):
            for j in range(2):
                e = int(ids[t, j])
                if e < 2:
                    h = w1[e].float() @ x[t].float()
                    part[t] += float(tw[t, j]) * (w2[e].float() @ (torch.nn.functional.silu(h[:I]) * h[I:]))
        self.assertLessEqual(float((y.float() - part).abs().max()), 1.6e-2 * float(part.abs().max()))
        with self.assertRaisesRegex(NotImplementedError, "kdispatch.vllm.fused_experts: apply_router_weight_on_input"):
            vllm.fused_experts(x, w1, w2, tw, ids, apply_router_weight_on_input=True)


    @unittest.skipUnless(HAVE_FP8, "torch.float8_e4m3fn needs torch >= 2.1")
    def test_sglang_fused_experts_fp8_w8a8_per_tensor_and_per_channel(self):
        """kdispatch.sglang.fused_experts on an fp8_w8a8 checkpoint without a
        block shape: per tensor with static a1/a2 scales (0-dim, as SGLang's
        loader leaves them) through fused_moe_fp8_tensor, per channel
        (w scales [E, N, 1], dynamic per-token activations) through
        fused_moe_fp8_channel, each against SGLang's math in fp32; one static
        scale alone is refused by name."""
        import types
        from kdispatch import sglang
        E, H, I, M = 4, 32, 16, 3
        f8 = torch.float8_e4m3fn
        x = torch.randn(M, H).to(torch.bfloat16)
        w1 = (torch.randn(E, 2 * I, H) * 0.5).to(f8)
        w2 = (torch.randn(E, H, I) * 0.5).to(f8)
        ids = torch.tensor([[0, 2], [3, 1], [1, 0]], dtype=torch.int32)
        tw = torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]])
        topk = types.SimpleNamespace(topk_weights=tw, topk_ids=ids, router_logits=None)

        def q(v, scale):  # e4m3fn(clamp(v / scale)) * scale
            return (v / scale).clamp(-448.0, 448.0).to(f8).float() * scale

        def reference(ws1, ws2, a1=None, a2=None):  # ws: [E] or [E, N]; a: static scales or None (per token)
            out = torch.zeros(M, H)
            for t in range(M):
                xt = x[t].float()
                xq = q(xt, a1 if a1 is not None else xt.abs().max().clamp(min=1e-10) / 448)
                for j in range(2):
                    e = int(ids[t, j])
                    s1 = ws1[e] if ws1.dim() == 1 else ws1[e].reshape(-1, 1)
                    s2 = ws2[e] if ws2.dim() == 1 else ws2[e].reshape(-1, 1)
                    h = (w1[e].float() * s1) @ xq
                    a = torch.nn.functional.silu(h[:I]) * h[I:]
                    aq = q(a, a2 if a2 is not None else a.abs().max().clamp(min=1e-10) / 448)
                    out[t] += float(tw[t, j]) * ((w2[e].float() * s2) @ aq)
            return out

        ws1, ws2 = torch.rand(E) + 0.5, torch.rand(E) + 0.5
        a1, a2 = torch.tensor(0.01), torch.tensor(0.02)
        got = sglang.fused_experts(x, w1, w2, topk, None, use_fp8_w8a8=True, w1_scale=ws1, w2_scale=ws2,
                                   a1_scale=a1, a2_scale=a2)
        ref = reference(ws1, ws2, a1, a2)
        self.assertEqual(got.dtype, torch.bfloat16)
        self.assertLessEqual(float((got.float() - ref).abs().max()), 3e-2 * float(ref.abs().max()))

        wc1, wc2 = torch.rand(E, 2 * I, 1) + 0.5, torch.rand(E, H, 1) + 0.5
        got = sglang.fused_experts(x, w1, w2, topk, None, use_fp8_w8a8=True, per_channel_quant=True,
                                   w1_scale=wc1, w2_scale=wc2)
        ref = reference(wc1.reshape(E, -1), wc2.reshape(E, -1))
        self.assertLessEqual(float((got.float() - ref).abs().max()), 3e-2 * float(ref.abs().max()))

        with self.assertRaisesRegex(NotImplementedError, "a2_scale is None while the other is given"):
            sglang.fused_experts(x, w1, w2, topk, None, use_fp8_w8a8=True, w1_scale=ws1, w2_scale=ws2, a1_scale=a1)

    def test_sglang_invoke_fused_moe_kernel(self):
        """kdispatch.sglang.invoke_fused_moe_kernel: SGLang's two grouped
        GEMM calls over its aligned ids (the up with top_k, the down with
        top_k 1 and the routed weight) through moe_gemm_out, composed as
        SGLang composes them, against an fp32 reference; a pair the sort
        drops leaves its rows of C alone; the unsupported is refused by name."""
        from kdispatch import sglang
        E, H, I, M, k, bs = 4, 32, 16, 3, 2, 4
        x = torch.randn(M, H).to(torch.bfloat16)
        w1 = (torch.randn(E, 2 * I, H) * 0.1).to(torch.bfloat16)
        w2 = (torch.randn(E, H, I) * 0.1).to(torch.bfloat16)
        ids = torch.tensor([[0, 2], [3, 1], [1, 0]], dtype=torch.int32)
        tw = torch.tensor([[0.7, 0.3], [0.5, 0.5], [0.9, 0.1]])
        # moe_align_block_size's output, by hand: each expert's pairs ascending, padded with M * k.
        pairs = ids.flatten().tolist()
        sorted_ids, experts = [], []
        for e in range(E):
            mine = [i for i, x_e in enumerate(pairs) if x_e == e]
            while len(mine) % bs:
                mine.append(M * k)
            sorted_ids += mine
            experts += [e] * (len(mine) // bs)
        total = torch.tensor([len(sorted_ids)], dtype=torch.int32)
        cap = M * k + min(E, M * k) * (bs - 1)
        sorted_t = torch.tensor(sorted_ids + [M * k] * (cap - len(sorted_ids)), dtype=torch.int32)
        experts_t = torch.tensor(experts + [-1] * ((cap + bs - 1) // bs - len(experts)), dtype=torch.int32)
        cfg = {"BLOCK_SIZE_M": bs, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
        c1 = torch.empty(M, k, 2 * I, dtype=torch.bfloat16)
        sglang.invoke_fused_moe_kernel(x, w1, None, c1, None, None, None, tw, ids, sorted_t, experts_t, total, False,
                                       k, cfg, None, False, False, False, False, False)
        g = c1.view(-1, 2 * I).float()
        c2 = (torch.nn.functional.silu(g[:, :I]) * g[:, I:]).to(torch.bfloat16)
        c3 = torch.empty(M, k, H, dtype=torch.bfloat16)
        sglang.invoke_fused_moe_kernel(c2, w2, None, c3, None, None, None, tw, ids, sorted_t, experts_t, total, True,
                                       1, cfg, None, False, False, False, False, False)
        out = c3.float().sum(1)
        ref = torch.zeros(M, H)
        for t in range(M):
            for j in range(k):
                e = int(ids[t, j])
                h = w1[e].float() @ x[t].float()
                a = torch.nn.functional.silu(h[:I]) * h[I:]
                ref[t] += float(tw[t, j]) * (w2[e].float() @ a)
        self.assertLessEqual(float((out - ref).abs().max()), 2e-2 * float(ref.abs().max()))
        # A pair the sort drops (its id -1 under expert parallelism): its rows of C are left alone.
        dropped = [M * k if i == 1 else i for i in sorted_ids]
        c4 = torch.full((M, k, 2 * I), 7.0, dtype=torch.bfloat16)
        sglang.invoke_fused_moe_kernel(x, w1, None, c4, None, None, None, tw, ids,
                                       torch.tensor(dropped + [M * k] * (cap - len(dropped)), dtype=torch.int32),
                                       experts_t, total, False, k, cfg, None, False, False, False, False, False)
        self.assertTrue(bool((c4.view(-1, 2 * I)[1] == 7.0).all()))
        self.assertTrue(torch.equal(c4.view(-1, 2 * I)[0], c1.view(-1, 2 * I)[0]))
        with self.assertRaisesRegex(NotImplementedError, "bias is not supported"):
            sglang.invoke_fused_moe_kernel(x, w1, torch.zeros(E, 2 * I), c1, None, None, None, tw, ids, sorted_t,
                                           experts_t, total, False, k, cfg, None, False, False, False, False, False)
        with self.assertRaisesRegex(NotImplementedError, "c_sorted is not supported"):
            sglang.invoke_fused_moe_kernel(x, w1, None, c1, None, None, None, tw, ids, sorted_t, experts_t, total,
                                           False, k, cfg, None, False, False, False, False, False, c_sorted=True)
    def test_rmsnorm(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            with self.subTest(dtype=dtype):
                x, w = torch.randn(5, 96, dtype=dtype), torch.randn(96, dtype=dtype)
                y = torch.ops.kdispatch.rmsnorm(x, w, 1e-6)
                self.assertEqual((y.shape, y.dtype), (x.shape, dtype))
                torch.testing.assert_close(y.double(), rms_ref(x, w, 1e-6), rtol=tol, atol=tol)
        x3 = torch.randn(2, 3, 64)  # leading dims are flattened
        w = torch.randn(64)
        torch.testing.assert_close(torch.ops.kdispatch.rmsnorm(x3, w, 1e-5).double(), rms_ref(x3, w, 1e-5),
                                   rtol=1e-5, atol=1e-5)
        wide = torch.randn(4, 160)[:, :128]  # rows with a stride larger than hidden
        w = torch.randn(128)
        torch.testing.assert_close(torch.ops.kdispatch.rmsnorm(wide, w, 1e-6).double(), rms_ref(wide, w, 1e-6),
                                   rtol=1e-5, atol=1e-5)
        self.assertEqual(torch.ops.kdispatch.rmsnorm(torch.empty(0, 64), torch.ones(64), 1e-6).shape, (0, 64))

    def test_fused_add_rmsnorm_in_place(self):
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            with self.subTest(dtype=dtype):
                x, r, w = torch.randn(3, 64, dtype=dtype), torch.randn(3, 64, dtype=dtype), torch.randn(64, dtype=dtype)
                x0, r0 = x.clone(), r.clone()
                xp, rp = x.data_ptr(), r.data_ptr()
                self.assertIsNone(torch.ops.kdispatch.fused_add_rmsnorm_(x, r, w, 1e-6))
                self.assertEqual((x.data_ptr(), r.data_ptr()), (xp, rp))  # in place
                s = r0 + x0  # rounded to the storage dtype, as the kernel does
                torch.testing.assert_close(r, s, rtol=0, atol=0)
                torch.testing.assert_close(x.double(), rms_ref(s, w, 1e-6), rtol=tol, atol=tol)

    def test_gemm(self):
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
            with self.subTest(dtype=dtype):
                a, b, bias = torch.randn(7, 40, dtype=dtype), torch.randn(24, 40, dtype=dtype), torch.randn(24, dtype=dtype)
                ref = a.double() @ b.double().T
                torch.testing.assert_close(torch.ops.kdispatch.gemm(a, b).double(), ref, rtol=tol, atol=tol * 10)
                torch.testing.assert_close(torch.ops.kdispatch.gemm(a, b, bias).double(), ref + bias.double(),
                                           rtol=tol, atol=tol * 10)
        a3 = torch.randn(2, 3, 16)
        b = torch.randn(8, 16)
        self.assertEqual(torch.ops.kdispatch.gemm(a3, b).shape, (2, 3, 8))
        torch.testing.assert_close(torch.ops.kdispatch.gemm(a3, b), torch.nn.functional.linear(a3, b),
                                   rtol=1e-4, atol=1e-4)

    def test_silu_and_mul(self):
        # silu(x[..., :d]) * x[..., d:], a new [..., d] tensor (vLLM's SiluAndMul)
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            with self.subTest(dtype=dtype):
                x = torch.randn(6, 2 * 48, dtype=dtype)
                out = torch.ops.kdispatch.silu_and_mul(x)
                self.assertEqual((out.shape, out.dtype), ((6, 48), dtype))
                g, u = x.double()[:, :48], x.double()[:, 48:]
                torch.testing.assert_close(out.double(), g / (1 + torch.exp(-g)) * u, rtol=tol, atol=tol)
        x3 = torch.randn(2, 3, 64)  # leading dims are flattened
        torch.testing.assert_close(torch.ops.kdispatch.silu_and_mul(x3),
                                   torch.nn.functional.silu(x3[..., :32]) * x3[..., 32:], rtol=1e-5, atol=1e-5)
        self.assertEqual(torch.ops.kdispatch.silu_and_mul(torch.empty(0, 64)).shape, (0, 32))
        # an odd last dim has no halves
        self.assertOpError(StatusCode.invalid_argument, torch.ops.kdispatch.silu_and_mul, torch.ones(2, 7),
                           text="x: size 7 is not 2*d")

    def test_moe_sum(self):
        # out[t] = routed_scaling_factor * input[t].sum(0) over top_k, a new [M, hidden] tensor
        # (vLLM's moe_sum, SGLang's moe_sum_reduce); fp32 accumulation, one rounding
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
            for top_k in (1, 2, 8):
                with self.subTest(dtype=dtype, top_k=top_k):
                    x = torch.randn(5, top_k, 40, dtype=dtype)
                    out = torch.ops.kdispatch.moe_sum(x)
                    self.assertEqual((out.shape, out.dtype), ((5, 40), dtype))
                    torch.testing.assert_close(out.double(), x.double().sum(1), rtol=tol, atol=tol)
                    scaled = torch.ops.kdispatch.moe_sum(x, 2.5)
                    torch.testing.assert_close(scaled.double(), 2.5 * x.double().sum(1), rtol=tol, atol=tol)
        # worked by hand: exact in fp32
        x = torch.tensor([[[1.0, 2.0], [0.5, -1.0], [10.0, 0.25]]])
        self.assertEqual(torch.ops.kdispatch.moe_sum(x, 2.0).tolist(), [[23.0, 2.5]])
        self.assertEqual(torch.ops.kdispatch.moe_sum(torch.empty(0, 4, 16)).shape, (0, 16))
        # input must be [M, top_k, hidden]; out of another dtype; the factor > 0
        self.assertOpError(StatusCode.invalid_argument, torch.ops.kdispatch.moe_sum, torch.ones(4, 16),
                           text="input: must be 3-D" if NATIVE else "input: must be rank 3")
        self.assertOpError(StatusCode.invalid_argument, torch.ops.kdispatch.moe_sum, torch.ones(2, 3, 16), 0.0,
                           text="routed_scaling_factor: must be > 0")

    def test_errors(self):
        r = torch.ops.kdispatch.rmsnorm
        self.assertOpError(StatusCode.unsupported_problem, r, torch.ones(2, 8, dtype=torch.int32),
                           torch.ones(8, dtype=torch.int32), 1e-6, text="int32")
        self.assertOpError(StatusCode.invalid_argument, r, torch.ones(2, 8), torch.ones(7), 1e-6,
                           text="w: must have 8 elements, has 7")
        self.assertOpError(StatusCode.invalid_argument, torch.ops.kdispatch.gemm, torch.ones(2, 8), torch.ones(4, 9))
        x = torch.ones(2, 8)
        self.assertOpError(StatusCode.invalid_argument, torch.ops.kdispatch.fused_add_rmsnorm_, x, x, torch.ones(8),
                           1e-6, text="overlap")
        # A choice (fused_moe's activation, a float in the schema) that is not
        # a whole number is refused naming the value, never run as the label a
        # float32 would round it to (0.999999999: gelu).
        h, w1, w2 = torch.ones(1, 4), torch.ones(2, 8, 4), torch.ones(2, 4, 4)
        tw, ids = torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.int32)
        for act, text in ((0.999999999, "activation: must be a whole number, got 0.999999999"),
                          (0.99999999999, "activation: must be a whole number, got 0.99999999999"),
                          (0.5, "activation: must be one of 0 (silu), 1 (gelu), got 0.5"),
                          (float("nan"), "activation: must be one of 0 (silu), 1 (gelu), got nan")):
            self.assertOpError(StatusCode.invalid_argument, torch.ops.kdispatch.fused_moe, h, w1, w2, tw, ids, None,
                               None, 1.0, act, text=text)

    @unittest.skipUnless(HAVE_COMPILE, NO_COMPILE)
    def test_opcheck(self):
        opcheck = torch.library.opcheck
        opcheck(torch.ops.kdispatch.rmsnorm.default, (torch.randn(4, 32), torch.randn(32), 1e-6))
        opcheck(torch.ops.kdispatch.fused_add_rmsnorm_.default,
                (torch.randn(4, 32), torch.randn(4, 32), torch.randn(32), 1e-6))
        opcheck(torch.ops.kdispatch.gemm.default, (torch.randn(4, 32), torch.randn(8, 32), torch.randn(8)))
        opcheck(torch.ops.kdispatch.gemm.default, (torch.randn(4, 32), torch.randn(8, 32)))
        opcheck(torch.ops.kdispatch.silu_and_mul.default, (torch.randn(4, 64),))
        opcheck(torch.ops.kdispatch.moe_sum.default, (torch.randn(4, 3, 64), 2.5))

    @unittest.skipUnless(HAVE_COMPILE, NO_COMPILE)
    def test_torch_compile_traces_through_the_fakes(self):
        def block(x, residual, w_norm, w_proj, bias):
            torch.ops.kdispatch.fused_add_rmsnorm_(x, residual, w_norm, 1e-6)
            h = torch.ops.kdispatch.gemm(x, w_proj, bias)
            return torch.ops.kdispatch.rmsnorm(h, torch.ones(h.shape[-1]), 1e-6) * 2

        args = (torch.randn(6, 64), torch.randn(6, 64), torch.randn(64), torch.randn(32, 64), torch.randn(32))
        eager_args = tuple(a.clone() for a in args)
        want = block(*eager_args)
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
        got = compiled(*args)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(args[0], eager_args[0])  # the in-place op's effects survive compilation
        torch.testing.assert_close(args[1], eager_args[1])
        # and with the shapes left dynamic
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True, dynamic=True, backend="aot_eager")
        for tokens in (3, 9):
            a = (torch.randn(tokens, 64), torch.randn(tokens, 64), args[2], args[3], args[4])
            e = tuple(t.clone() for t in a)
            torch.testing.assert_close(compiled(*a), block(*e), rtol=1e-5, atol=1e-5)

    @unittest.skipUnless(HAVE_COMPILE, NO_COMPILE)
    def test_dynamic_m_compiles_once(self):
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        def block(x, w, b):
            return torch.ops.kdispatch.gemm(torch.ops.kdispatch.rmsnorm(x, w, 1e-6), b)

        w, b = torch.randn(64), torch.randn(32, 64)
        torch._dynamo.reset()
        f = torch.compile(block, backend=backend, fullgraph=True, dynamic=True)
        for m in (3, 5, 9, 17, 1000):
            x = torch.randn(m, 64)
            torch.testing.assert_close(f(x, w, b), block(x, w, b), rtol=1e-5, atol=1e-5)
        self.assertEqual(len(graphs), 1, "one graph for every M")

    def test_fake_tensor_shapes(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            x, w = torch.empty(5, 3, 16), torch.empty(16)
            self.assertEqual(torch.ops.kdispatch.rmsnorm(x, w, 1e-6).shape, (5, 3, 16))
            self.assertEqual(torch.ops.kdispatch.gemm(x, torch.empty(8, 16)).shape, (5, 3, 8))
            self.assertEqual(torch.ops.kdispatch.silu_and_mul(x).shape, (5, 3, 8))
            self.assertEqual(torch.ops.kdispatch.moe_sum(torch.empty(7, 8, 16, dtype=torch.bfloat16)).shape, (7, 16))


@unittest.skipUnless(NATIVE, "the native ops (libkdispatch_torch.so) are not loaded here: " + SKIP)
class TorchNativeTest(unittest.TestCase):
    """What only the C++ registrations have: exact schemas, out variants,
    vLLM's names, Meta kernels on any torch, the autograd policy, the floor
    ops, the runtime switch."""

    def setUp(self):
        torch.manual_seed(0)

    def test_schemas(self):
        want = {
            "rmsnorm": "kdispatch::rmsnorm(Tensor x, Tensor w, float eps=9.9999999999999995e-07) -> Tensor",
            "rmsnorm_out": "kdispatch::rmsnorm_out(Tensor(a!) y, Tensor x, Tensor w, "
                           "float eps=9.9999999999999995e-07) -> ()",
            "gemm": "kdispatch::gemm(Tensor a, Tensor b, Tensor? bias=None) -> Tensor",
            "gemm_out": "kdispatch::gemm_out(Tensor(a!) d, Tensor a, Tensor b, Tensor? bias=None) -> ()",
            "fused_add_rmsnorm_": "kdispatch::fused_add_rmsnorm_(Tensor(a!) x, Tensor(b!) residual, Tensor w, "
                                  "float eps=9.9999999999999995e-07) -> ()",
            "silu_and_mul": "kdispatch::silu_and_mul(Tensor x) -> Tensor",
            "silu_and_mul_out": "kdispatch::silu_and_mul_out(Tensor(a!) out, Tensor x) -> ()",
            "moe_sum": "kdispatch::moe_sum(Tensor input, float routed_scaling_factor=1.) -> Tensor",
            "moe_sum_out": "kdispatch::moe_sum_out(Tensor(a!) out, Tensor input, float routed_scaling_factor=1.) -> ()",
            # moe_align's outputs are sized by a formula: the out form only.
            "moe_align_out": "kdispatch::moe_align_out(Tensor(a!) sorted_token_ids, Tensor(b!) expert_ids, "
                             "Tensor(c!) num_tokens_post_pad, Tensor topk_ids, Tensor? expert_map=None, "
                             "int num_experts=0, int block_size=64) -> ()",
            # SGLang's grouped GEMM: its outputs are plain [M, top_k, N], so both forms.
            "moe_gemm_out": "kdispatch::moe_gemm_out(Tensor(a!) out, Tensor a, Tensor w, Tensor topk_weights, "
                            "Tensor sorted_token_ids, Tensor expert_ids, Tensor num_tokens_post_pad, "
                            "Tensor? w_scale=None, int top_k=0, int block_size=64, float mul_routed_weight=0.) -> ()",
            "_floor_gemm": "kdispatch::_floor_gemm(Tensor a, Tensor b, Tensor? bias=None) -> Tensor",
            # The fp8 GEMMs' switch: a bool after bias, off by default (calls
            # written before it keep working).
            "gemm_fp8_tensor": "kdispatch::gemm_fp8_tensor(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, "
                               "Tensor? bias=None, bool fast_accum=False) -> Tensor",
            "gemm_fp8_block_out": "kdispatch::gemm_fp8_block_out(Tensor(a!) d, Tensor a, Tensor b, Tensor scale_a, "
                                  "Tensor scale_b, Tensor? bias=None, bool fast_accum=False) -> ()",
        }
        for name, schema in want.items():
            self.assertEqual(str(getattr(torch.ops.kdispatch, name).default._schema), schema)
        vllm = {
            "rms_norm": "kdispatch_vllm::rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float epsilon) -> ()",
            "fused_add_rms_norm": "kdispatch_vllm::fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, "
                                  "Tensor weight, float epsilon) -> ()",
            "silu_and_mul": "kdispatch_vllm::silu_and_mul(Tensor(a!) out, Tensor input) -> ()",
            # csrc/moe/torch_bindings.cpp: moe_sum(Tensor input, Tensor! output) -> ()
            "moe_sum": "kdispatch_vllm::moe_sum(Tensor input, Tensor(a!) output) -> ()",
            # moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, Tensor! sorted_token_ids,
            # Tensor! experts_ids, Tensor! num_tokens_post_pad, Tensor? maybe_expert_map) -> ()
            "moe_align_block_size": "kdispatch_vllm::moe_align_block_size(Tensor topk_ids, int num_experts, "
                                    "int block_size, Tensor(a!) sorted_token_ids, Tensor(b!) experts_ids, "
                                    "Tensor(c!) num_tokens_post_pad, Tensor? maybe_expert_map=None) -> ()",
        }
        for name, schema in vllm.items():
            self.assertEqual(str(getattr(torch.ops.kdispatch_vllm, name).default._schema), schema)

    def test_out_variants_allocate_nothing(self):
        x, w = torch.randn(5, 64), torch.randn(64)
        y = torch.full((5, 64), 7.0)
        p = y.data_ptr()
        self.assertIsNone(torch.ops.kdispatch.rmsnorm_out(y, x, w, 1e-6))
        self.assertEqual(y.data_ptr(), p)
        torch.testing.assert_close(y.double(), rms_ref(x, w, 1e-6), rtol=1e-5, atol=1e-5)
        a, b, bias = torch.randn(3, 2, 16), torch.randn(8, 16), torch.randn(8)
        d = torch.empty(3, 2, 8)
        torch.ops.kdispatch.gemm_out(d, a, b, bias)
        torch.testing.assert_close(d, torch.nn.functional.linear(a, b, bias), rtol=1e-4, atol=1e-4)
        xs = torch.randn(4, 64)
        out = torch.empty(4, 32)
        torch.ops.kdispatch.silu_and_mul_out(out, xs)
        torch.testing.assert_close(out, torch.nn.functional.silu(xs[:, :32]) * xs[:, 32:], rtol=1e-5, atol=1e-5)
        # an output slice of a wider buffer (row stride > cols) is written in place
        wide = torch.zeros(5, 96)
        torch.ops.kdispatch.rmsnorm_out(wide[:, :64], x, w, 1e-6)
        torch.testing.assert_close(wide[:, :64], y)
        self.assertEqual(wide[:, 64:].abs().sum().item(), 0.0)

    def test_vllm_names_and_argument_order(self):
        x, r, w = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64)
        out = torch.empty(3, 64)
        torch.ops.kdispatch_vllm.rms_norm(out, x, w, 1e-6)
        torch.testing.assert_close(out, torch.ops.kdispatch.rmsnorm(x, w, 1e-6), rtol=0, atol=0)
        x1, r1, x2, r2 = x.clone(), r.clone(), x.clone(), r.clone()
        torch.ops.kdispatch_vllm.fused_add_rms_norm(x1, r1, w, 1e-6)
        torch.ops.kdispatch.fused_add_rmsnorm_(x2, r2, w, 1e-6)
        torch.testing.assert_close((x1, r1), (x2, r2), rtol=0, atol=0)
        g = torch.randn(3, 128)
        o = torch.empty(3, 64)
        torch.ops.kdispatch_vllm.silu_and_mul(o, g)
        torch.testing.assert_close(o, torch.ops.kdispatch.silu_and_mul(g), rtol=0, atol=0)
        # vLLM's moe_sum(input, output): input first, routed_scaling_factor 1, against a torch sum
        for dtype in (torch.float32, torch.bfloat16):
            e = torch.randn(4, 6, 96, dtype=dtype)
            y = torch.full((4, 96), float("nan"), dtype=dtype)
            self.assertIsNone(torch.ops.kdispatch_vllm.moe_sum(e, y))
            torch.testing.assert_close(y, torch.ops.kdispatch.moe_sum(e), rtol=0, atol=0)
            torch.testing.assert_close(y.double(), e.double().sum(1), rtol=1e-2, atol=1e-2)
            y2 = torch.empty(4, 96, dtype=dtype)
            torch.ops.kdispatch.moe_sum_out(y2, e, 1.0)
            torch.testing.assert_close(y2, y, rtol=0, atol=0)
        with self.assertRaises(ValueError) as c:  # output of another hidden: named by the op's argument, out
            torch.ops.kdispatch_vllm.moe_sum(torch.randn(4, 6, 96), torch.empty(4, 95))
        self.assertIn("out", str(c.exception))

    def test_vllm_moe_align_block_size(self):
        # vLLM's moe_align_block_size as vLLM's Python wrapper allocates its
        # buffers (numel + E * (block - 1); SGLang's (E + 1) * (block - 1) is
        # larger: both taken). M = 3, top_k = 2, E = 4, block 4: pairs 0: e2,
        # 1: e0, 2: e2, 3: e3, 4: -1 (dropped), 5: e2.
        ids = torch.tensor([[2, 0], [2, 3], [-1, 2]], dtype=torch.int32)
        for pad in (ids.numel() + 4 * 3, ids.numel() + 5 * 3):
            sorted_ids = torch.full((pad,), 99, dtype=torch.int32)
            experts = torch.full(((pad + 3) // 4,), 99, dtype=torch.int32)
            total = torch.empty(1, dtype=torch.int32)
            self.assertIsNone(torch.ops.kdispatch_vllm.moe_align_block_size(ids, 4, 4, sorted_ids, experts, total))
            self.assertEqual(sorted_ids[:18].tolist(), [1, 6, 6, 6, 0, 2, 5, 6, 3, 6, 6, 6] + [6] * 6)
            self.assertEqual(sorted_ids[18:].tolist(), [99] * (pad - 18))  # past the op's size: untouched
            self.assertEqual(experts[:5].tolist(), [0, 2, 3, -1, -1])
            self.assertEqual(total.tolist(), [12])
        # vLLM's expert_map: local ids, -1 where not local.
        torch.ops.kdispatch_vllm.moe_align_block_size(ids, 4, 4, sorted_ids, experts, total,
                                                       torch.tensor([-1, 5, 0, 1], dtype=torch.int32))
        self.assertEqual(experts[:5].tolist(), [-1, 0, 1, -1, -1])
        # The out form, kdispatch's argument order.
        s2, e2, t2 = torch.empty(18, dtype=torch.int32), torch.empty(5, dtype=torch.int32), torch.empty(1, dtype=torch.int32)
        torch.ops.kdispatch.moe_align_out(s2, e2, t2, ids, None, 4, 4)
        self.assertEqual(s2.tolist(), sorted_ids[:18].tolist())
        with self.assertRaises(ValueError) as c:  # a buffer shorter than the op's size: named
            torch.ops.kdispatch_vllm.moe_align_block_size(ids, 4, 4, torch.empty(17, dtype=torch.int32), experts, total)
        self.assertIn("sorted_token_ids: must have at least 18 elements", str(c.exception))
        # M = 0 (an empty batch): vLLM's kernel writes num_tokens_post_pad = 0.
        total.fill_(99)
        torch.ops.kdispatch_vllm.moe_align_block_size(torch.empty(0, 2, dtype=torch.int32), 4, 4,
                                                      torch.empty(0, dtype=torch.int32),
                                                      torch.empty(0, dtype=torch.int32), total)
        self.assertEqual(total.tolist(), [0])
        # top_k = 0: refused by the library, not computed on a stand-in of top_k = 1.
        with self.assertRaises(ValueError) as c:
            torch.ops.kdispatch_vllm.moe_align_block_size(torch.empty(3, 0, dtype=torch.int32), 4, 4, sorted_ids,
                                                          experts, total)
        self.assertIn("top_k must be >= 1", str(c.exception))

    @unittest.skipUnless(HAVE_TORCH and hasattr(torch, "float8_e4m3fn"), "torch.float8_e4m3fn needs torch >= 2.1")
    def test_fp8_block_gemm_takes_torch_fp8_and_returns_bf16(self):
        """gemm_fp8_block on torch.float8_e4m3fn tensors (CPU variants), the
        functional op's d in bf16, against a float64 reference of the
        dequantised inputs; scale_a M-major as a transposed view of SGLang's
        column-major scales."""
        g = torch.Generator().manual_seed(0)
        m, n, k = 5, 136, 264
        a8 = (torch.rand(m, k, generator=g) * 4 - 2).to(torch.float8_e4m3fn)
        b8 = (torch.rand(n, k, generator=g) * 4 - 2).to(torch.float8_e4m3fn)
        kb, nb = -(-k // 128), -(-n // 128)
        sa = torch.rand(kb, m, generator=g) + 0.5  # [ceil(K/128), M]: each group's token scales contiguous
        sb = torch.rand(nb, kb, generator=g) + 0.5
        d = torch.ops.kdispatch.gemm_fp8_block(a8, b8, sa, sb)
        self.assertEqual(d.dtype, torch.bfloat16)
        self.assertEqual(tuple(d.shape), (m, n))
        af, bf = a8.double(), b8.double()
        want = torch.zeros(m, n, dtype=torch.float64)
        for gi in range(kb):
            sl = slice(gi * 128, min(k, (gi + 1) * 128))
            sbc = sb[:, gi].double().repeat_interleave(128)[:n]
            want += (af[:, sl] @ bf[:, sl].T) * sa[gi].double()[:, None] * sbc[None, :]
        torch.testing.assert_close(d.double(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
        out = torch.empty(m, n, dtype=torch.float32)
        torch.ops.kdispatch.gemm_fp8_block_out(out, a8, b8, sa, sb)
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        meta = torch.ops.kdispatch.gemm_fp8_block(a8.to("meta"), b8.to("meta"), sa.to("meta"), sb.to("meta"))
        self.assertEqual((meta.dtype, tuple(meta.shape)), (torch.bfloat16, (m, n)))
        # fast_accum=True: the CPU variants accumulate in fp32 anyway (the
        # same bits), under the fast key (call_info passes it by name).
        fast = torch.ops.kdispatch.gemm_fp8_block(a8, b8, sa, sb, None, True)
        self.assertTrue(torch.equal(fast, d))
        fast2, info = OPS.call_info("gemm_fp8_block", a8, b8, sa, sb, fast_accum=True)
        self.assertTrue(torch.equal(fast2, d))
        self.assertEqual(info["variant"], "gemm_fp8_block_e4m3fn__tiled")

    def test_moe_gemm_functional_allocates_its_rank3_out(self):
        """The functional moe_gemm allocates out [M, top_k, N] (until this
        test it allocated [N] and refused its own output: "out: must be rank
        3, got rank 1"); its values are moe_gemm_out's, bit for bit, and a
        meta call gives the shape."""
        E, K, N, M, top_k, bs = 4, 32, 16, 3, 2, 4
        g = torch.Generator().manual_seed(2)
        a = torch.randn(M, K, generator=g).to(torch.bfloat16)
        w = (torch.randn(E, N, K, generator=g) * 0.5).to(torch.bfloat16)
        ids, tw, sid, eid, ntpp = _routed_3x2(E, bs)
        got = torch.ops.kdispatch.moe_gemm(a, w, tw, sid, eid, ntpp, None, top_k, bs, 1)
        self.assertEqual((got.dtype, tuple(got.shape)), (torch.bfloat16, (M, top_k, N)))
        want = torch.full((M, top_k, N), float("nan"), dtype=torch.bfloat16)
        torch.ops.kdispatch.moe_gemm_out(want, a, w, tw, sid, eid, ntpp, None, top_k, bs, 1)
        self.assertTrue(torch.equal(got, want))
        ref = torch.stack([torch.stack([(w[int(ids[t, j])].float() @ a[t].float()) * tw[t, j]
                                        for j in range(top_k)]) for t in range(M)])
        torch.testing.assert_close(got.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
        metas = [x.to("meta") for x in (a, w, tw, sid, eid, ntpp)]
        meta = torch.ops.kdispatch.moe_gemm(*metas, None, top_k, bs, 1)
        self.assertEqual(tuple(meta.shape), (M, top_k, N))
        # top_k binds its dim before the tensors, as kdispatch binds it: a meta
        # call checks topk_weights against it (it gave [3, 2, 16] for any
        # top_k), and refuses a top_k kdispatch refuses, in its words.
        for k, want in ((3, "topk_weights: sizes [3, 2] are not [3 rows, 3] (M, top_k)"),
                        (0, "top_k: must be a whole number in [1, 16777216], got 0"),
                        (2**30, "top_k: must be a whole number in [1, 16777216], got -1 (an integer size past 2^24")):
            with self.subTest(top_k=k):
                with self.assertRaises(ValueError) as cm:
                    torch.ops.kdispatch.moe_gemm(*metas, None, k, bs, 1)
                self.assertIn(want, str(cm.exception))
        with self.assertRaisesRegex(ValueError, r"topk_weights: shape \[3, 2\] must be \[M, top_k\] = \[3, 3\]"):
            torch.ops.kdispatch.moe_gemm(a, w, tw, sid, eid, ntpp, None, 3, bs, 1)
        # call_info on an op with only an out form (moe_align): its outputs first, as
        # to moe_align_out (it looked up a functional moe_align_ and raised AttributeError).
        sid2, eid2, ntpp2 = torch.full_like(sid, -7), torch.full_like(eid, -7), torch.full_like(ntpp, -7)
        _, info = OPS.call_info("moe_align", sid2, eid2, ntpp2, ids, num_experts=E, block_size=bs)
        self.assertTrue(torch.equal(sid2, sid) and torch.equal(eid2, eid) and torch.equal(ntpp2, ntpp))
        self.assertTrue(info["variant"].startswith("moe_align"), info)

    @unittest.skipUnless(HAVE_FP8, "torch.float8_e4m3fn needs torch >= 2.1")
    def test_moe_gemm_fp8_ops_take_their_nine_tensors(self):
        """moe_gemm_fp8_tensor_out (static a_scale) and moe_gemm_fp8_channel_out
        (per-token a, the routed weight) take 9 tensors: until 37de793 the
        binding held 8 and a call on torch >= 2.1 wrote past them. Each pair's
        row against SGLang's math in fp32 (q(a) . w[e] * scales)."""
        E, K, N, M, top_k, bs = 4, 32, 16, 3, 2, 4
        f8 = torch.float8_e4m3fn
        g = torch.Generator().manual_seed(1)
        a = torch.randn(M, K, generator=g).to(torch.bfloat16)
        w = (torch.randn(E, N, K, generator=g) * 0.5).to(f8)
        ids, tw, sid, eid, ntpp = _routed_3x2(E, bs)

        def q(v, s):  # e4m3fn(clamp(v / s)) * s
            return (v / s).clamp(-448.0, 448.0).to(f8).float() * s

        ws, wc, a_s = torch.rand(E) + 0.5, torch.rand(E, N) + 0.5, torch.tensor([0.01])
        got_t = torch.full((M, top_k, N), float("nan"), dtype=torch.bfloat16)
        got_c = torch.full((M, top_k, N), float("nan"), dtype=torch.bfloat16)
        torch.ops.kdispatch.moe_gemm_fp8_tensor_out(got_t, a, w, tw, sid, eid, ntpp, ws, a_s, top_k, bs, 0)
        torch.ops.kdispatch.moe_gemm_fp8_channel_out(got_c, a, w, tw, sid, eid, ntpp, wc, None, top_k, bs, 1)
        want_t, want_c = torch.zeros(M, top_k, N), torch.zeros(M, top_k, N)
        for t in range(M):
            row = a[t].float()
            per_token = row.abs().max().clamp(min=1e-10) / 448
            for j in range(top_k):
                e = int(ids[t, j])
                want_t[t, j] = (w[e].float() @ q(row, a_s)) * ws[e]
                want_c[t, j] = (w[e].float() @ q(row, per_token)) * wc[e] * tw[t, j]
        for got, want in ((got_t, want_t), (got_c, want_c)):
            self.assertEqual(got.dtype, torch.bfloat16)
            torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())

    def test_fp8_fast_accum_reaches_kdispatch(self):
        """The bool switch is read off the stack on any torch: fp32 tensors
        with fast_accum=True get kdispatch's own refusal (no fp8; on a torch
        without float8 dtypes, that torch's), not a schema error."""
        a, b, s = torch.randn(3, 16), torch.randn(8, 16), torch.ones(1)
        for fast in (False, True):
            with self.assertRaises(NotImplementedError) as c:
                torch.ops.kdispatch.gemm_fp8_tensor(a, b, s, s, None, fast)
            self.assertIn("fp32 inputs" if HAVE_FP8 else "has no float8 dtype", str(c.exception))
        with self.assertRaises(NotImplementedError):
            torch.ops.kdispatch.gemm_fp8_tensor(a, b, s, s, fast_accum=True)

    @unittest.skipIf(HAVE_FP8, "this torch has float8 dtypes (>= 2.1)")
    def test_fp8_ops_say_this_torch_has_no_float8_dtype(self):
        """torch < 2.1 (Debian's 1.13): every fp8 op, real or meta, fails
        saying the torch has no float8 dtype (issue 31: it said "no cpu
        variant ... fp32", after allocating float32 outputs)."""
        a, b, s = torch.randn(4, 32), torch.randn(8, 32), torch.ones(1)
        calls = {"gemm_fp8_tensor": (a, b, s, s), "gemm_fp8_rowwise": (a, b, torch.ones(4), torch.ones(8)),
                 "gemm_fp8_block": (a, b, torch.ones(1, 4), torch.ones(1, 1)), "quant_fp8_tensor": (a,),
                 "quant_fp8_token": (a,), "quant_fp8_group": (a,)}
        for name, args in calls.items():
            for meta in (False, True):
                with self.subTest(op=name, meta=meta):
                    with self.assertRaises(NotImplementedError) as c:
                        getattr(torch.ops.kdispatch, name)(*[x.to("meta") if meta else x for x in args])
                    # the version libtorch's headers give (1.13.0 for Debian's 1.13.0a0)
                    self.assertRegex(str(c.exception).splitlines()[0],
                                     rf"^kdispatch::{name}: unsupported_problem: this torch \(1\.[0-9.]+\) has no float8 "
                                     rf"dtype \(torch\.float8_e4m3fn came with torch 2\.1\): {name} takes or returns "
                                     rf"float8 tensors$")
        with self.assertRaises(NotImplementedError) as c:
            torch.ops.kdispatch.gemm_fp8_tensor_out(torch.empty(4, 8), a, b, s, s)
        self.assertIn("has no float8 dtype", str(c.exception))

    @unittest.skipUnless(HAVE_FP8, "torch.float8_e4m3fn needs torch >= 2.1")
    def test_quant_fp8_tensor_allocates_its_one_scale(self):
        """quant_fp8_tensor's scale is [1] (no dim): the functional op
        allocates it (it said "internal: the size of dim  is not given by
        any input")."""
        x = torch.randn(3, 64)
        q, scale = torch.ops.kdispatch.quant_fp8_tensor(x)
        self.assertEqual((q.dtype, tuple(q.shape)), (torch.float8_e4m3fn, (3, 64)))
        self.assertEqual((scale.dtype, tuple(scale.shape)), (torch.float32, (1,)))
        self.assertAlmostEqual(scale.item(), x.abs().max().item() / 448.0, places=5)
        mq, ms = torch.ops.kdispatch.quant_fp8_tensor(x.to("meta"))
        self.assertEqual((tuple(mq.shape), tuple(ms.shape)), ((3, 64), (1,)))

    @unittest.skipUnless(HAVE_FP8, "torch.float8_e4m3fn needs torch >= 2.1")
    def test_quant_fp8_tensor_writes_its_scale_at_m_0(self):
        """No tokens (M = 0): the scale of an empty x, 1e-10 / 448, on both
        paths (the Python one returned its torch.empty scale unwritten)."""
        want = (torch.tensor(1e-10, dtype=torch.float32) / 448).item()  # in float32, as the kernels
        for _ in range(3):  # torch.empty may hand back a block that held a scale
            x = torch.empty(0, 64)
            q, scale = torch.ops.kdispatch.quant_fp8_tensor(x)
            self.assertEqual(tuple(q.shape), (0, 64))
            self.assertEqual(scale.item(), want)
        out = torch.full((1,), 99.0)
        torch.ops.kdispatch.quant_fp8_tensor_out(q, out, x)  # outputs first (q, scale), then x
        self.assertEqual(out.item(), want)

    def test_meta_kernels(self):
        m = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
        self.assertEqual(torch.ops.kdispatch.rmsnorm(m(5, 3, 16), m(16), 1e-6).shape, (5, 3, 16))
        self.assertEqual(torch.ops.kdispatch.gemm(m(5, 3, 16), m(8, 16)).shape, (5, 3, 8))
        self.assertEqual(torch.ops.kdispatch.gemm(m(4, 16), m(8, 16), m(8)).device.type, "meta")
        self.assertEqual(torch.ops.kdispatch.silu_and_mul(m(7, 64)).shape, (7, 32))
        self.assertEqual(torch.ops.kdispatch.silu_and_mul(m(7, 64).to(torch.bfloat16)).dtype, torch.bfloat16)
        self.assertEqual(torch.ops.kdispatch.moe_sum(m(7, 8, 64).to(torch.bfloat16)).shape, (7, 64))
        self.assertEqual(torch.ops.kdispatch.moe_sum(m(7, 8, 64).to(torch.bfloat16)).dtype, torch.bfloat16)
        self.assertIsNone(torch.ops.kdispatch_vllm.moe_sum(m(7, 8, 64), m(7, 64)))
        self.assertIsNone(torch.ops.kdispatch.fused_add_rmsnorm_(m(4, 16), m(4, 16), m(16), 1e-6))
        with self.assertRaises(ValueError) as c:  # the same shape checks as the real kernels
            torch.ops.kdispatch.silu_and_mul(m(2, 7))
        self.assertIn("x: size 7 is not 2*d", str(c.exception))

    def test_inference_only(self):
        x, w = torch.randn(2, 32, requires_grad=True), torch.randn(32)
        with self.assertRaises(RuntimeError) as c:
            torch.ops.kdispatch.rmsnorm(x, w, 1e-6)
        self.assertIn("kdispatch::rmsnorm: failed_precondition: kdispatch ops are inference-only", str(c.exception))
        with torch.no_grad():
            torch.testing.assert_close(torch.ops.kdispatch.rmsnorm(x, w, 1e-6).double(), rms_ref(x.detach(), w, 1e-6),
                                       rtol=1e-5, atol=1e-5)
        with torch.inference_mode():
            self.assertEqual(torch.ops.kdispatch.gemm(torch.randn(2, 32), torch.randn(4, 32)).shape, (2, 4))

    def test_strides(self):
        w = torch.randn(64)
        # a read input whose leading dims do not collapse: copied to rows
        x = torch.randn(6, 4, 64).transpose(0, 1)
        torch.testing.assert_close(torch.ops.kdispatch.rmsnorm(x, w, 1e-6).double(), rms_ref(x, w, 1e-6),
                                   rtol=1e-5, atol=1e-5)
        # a written one cannot be copied back: refused, naming it
        y = torch.empty(6, 4, 64).transpose(0, 1)
        with self.assertRaises(ValueError) as c:
            torch.ops.kdispatch.rmsnorm_out(y, x.contiguous(), w, 1e-6)
        self.assertIn("y: the leading dims of a tensor of sizes [4, 6, 64] do not collapse into rows", str(c.exception))
        # a column stride other than 1: kdispatch's own rule and message
        with self.assertRaises(ValueError) as c:
            torch.ops.kdispatch.rmsnorm(torch.randn(64, 8).t(), torch.randn(64), 1e-6)
        self.assertIn("x: needs unit stride along its last dimension", str(c.exception))

    def test_empty_and_k0(self):
        self.assertEqual(torch.ops.kdispatch.rmsnorm(torch.empty(0, 64), torch.ones(64), 1e-6).shape, (0, 64))
        bias = torch.arange(4.0)
        torch.testing.assert_close(torch.ops.kdispatch.gemm(torch.ones(3, 0), torch.ones(4, 0), bias),
                                   bias.expand(3, 4))
        torch.testing.assert_close(torch.ops.kdispatch.gemm(torch.ones(3, 0), torch.ones(4, 0)), torch.zeros(3, 4))
        # moe_sum with top_k = 0: the empty sum, zeros (as torch's sum over an empty dim)
        torch.testing.assert_close(torch.ops.kdispatch.moe_sum(torch.ones(3, 0, 8)), torch.zeros(3, 8))

    def test_review_edges(self):
        """What an attack on the native ops found (each refused with the op
        and the argument named, or answered as torch answers it)."""
        K, V = torch.ops.kdispatch, torch.ops.kdispatch_vllm
        x, w = torch.randn(4, 8), torch.randn(8)

        def refused(exc, text, fn, *args):
            with self.assertRaises(exc) as c:
                fn(*args)
            self.assertIn(text, str(c.exception))

        # a meta tensor beside CPU tensors: refused (the call lands in the meta kernel)
        refused(ValueError, "w: on meta, while x is on cpu", K.rmsnorm, x, torch.empty(8, device="meta"), 1e-6)
        refused(ValueError, "x: on meta, while y is on cpu", V.rms_norm, torch.empty(4, 8),
                torch.empty(4, 8, device="meta"), w, 1e-6)
        # the meta kernels check shapes and dtypes as the real ones
        refused(ValueError, "w: must have 8 elements, has 5", K.rmsnorm, torch.empty(4, 8, device="meta"),
                torch.empty(5, device="meta"), 1e-6)
        refused(NotImplementedError, "x: dtype Double", K.rmsnorm, torch.empty(4, 8, device="meta").double(),
                torch.empty(8, device="meta").double(), 1e-6)
        # a dtype kdispatch has no name for is named on the input, not on the output made from it
        refused(NotImplementedError, "x: dtype Long", K.silu_and_mul, torch.ones(2, 8, dtype=torch.long))
        # None for a required tensor; a scalar float32 cannot hold
        refused(ValueError, "w: a tensor is required, got None", K.rmsnorm, x, None, 1e-6)
        refused(ValueError, "eps: 1e-50 is not representable as a float32", K.rmsnorm, x, w, 1e-50)
        # an empty dim other than the batch: checked, then answered as torch
        refused(ValueError, "residual: shape [0, 8] must equal x's [4, 8]", V.fused_add_rms_norm, x.clone(),
                torch.empty(0, 8), w, 1e-6)
        refused(ValueError, "d: sizes [5, 9] are not [4 rows, 3]", K.gemm_out, torch.empty(5, 9), torch.ones(4, 0),
                torch.ones(3, 0), None)
        refused(ValueError, "bias: must have 3 elements, has 1", K.gemm, torch.ones(4, 0), torch.ones(3, 0),
                torch.ones(1))
        refused(ValueError, "b: sizes [3, 5] are not [3 rows, 0]", K.gemm, torch.ones(4, 0), torch.ones(3, 5))
        refused(ValueError, "eps: must be > 0", K.rmsnorm, torch.empty(4, 0), torch.empty(0), float("nan"))
        self.assertEqual(K.gemm(torch.ones(4, 8), torch.ones(0, 8)).shape, (4, 0))
        self.assertEqual(K.rmsnorm(torch.empty(2, 0, 8), w, 1e-6).shape, (2, 0, 8))  # no rows: any strides
        self.assertEqual(K.silu_and_mul(torch.empty(3, 0, 2, 8)).shape, (3, 0, 2, 4))
        # a non-unit last stride is refused whatever the rank (never copied into shape)
        refused(ValueError, "x: needs unit stride along its last dimension", K.rmsnorm,
                torch.randn(2, 8, 3).transpose(1, 2), torch.randn(3), 1e-6)
        # updates bump torch's version counter (autograd sees them), and an
        # inference tensor is refused as an output outside inference mode
        y = torch.empty(4, 8)
        v0 = y._version
        K.rmsnorm_out(y, x, w, 1e-6)
        self.assertEqual(y._version, v0 + 1)
        with torch.inference_mode():
            it = torch.empty(4, 8)
        refused(RuntimeError, "y: an inference tensor cannot be updated in place outside torch.inference_mode()",
                K.rmsnorm_out, it, x, w, 1e-6)
        with torch.inference_mode():
            K.rmsnorm_out(it, x, w, 1e-6)
        # the runtime setter takes a kdispatch.Runtime; call_info names an unknown scalar
        with self.assertRaises(TypeError):
            OPS.set_runtime(type("Fake", (), {"handle": 12345})())
        with self.assertRaises(TypeError):
            OPS.call_info("rmsnorm", x, w, epz=0.1)
        # an "int" scalar is never truncated (4.9 is not 4) nor a bare int() error (NaN)
        ids = torch.zeros(1, 1, dtype=torch.int32)
        for v in (4.9, float("nan")):
            with self.assertRaisesRegex(ValueError, f"block_size: must be a whole number, got {v!r}"):
                OPS.call_info("moe_align", ids, num_experts=4, block_size=v)
        self.assertFalse(hasattr(torch.ops.kdispatch, "_set_runtime"))

    def test_floor_ops(self):
        # the same schema and outputs as the op, and no kdispatch call
        x, w = torch.randn(5, 64), torch.randn(64)
        y = torch.ops.kdispatch._floor_rmsnorm(x, w, 1e-6)
        self.assertEqual((y.shape, y.dtype), (x.shape, x.dtype))
        self.assertIsNone(torch.ops.kdispatch._floor_fused_add_rmsnorm_(x, x.clone(), w, 1e-6))

    def test_runtime_switch_and_call_info(self):
        rt = kdispatch.Runtime(shipped_configs=False, log_level="off", force=["rmsnorm=rmsnorm_fp32__ref"])
        try:
            OPS.set_runtime(rt)
            x, w = torch.randn(3, 64), torch.randn(64)
            y, info = OPS.call_info("rmsnorm", x, w, eps=1e-6)
            self.assertEqual((info["source"], info["variant"]), ("forced", "rmsnorm_fp32__ref"))
            torch.testing.assert_close(y.double(), rms_ref(x, w, 1e-6), rtol=1e-5, atol=1e-5)
            OPS.set_runtime(None)
            _, info = OPS.call_info("rmsnorm", x, w, eps=1e-6)
            self.assertNotEqual(info["source"], "forced")
            # closing the runtime the ops are served from sends them back to the default runtime
            OPS.set_runtime(rt)
            rt.close()
            self.assertIsNot(OPS.get_runtime(), rt)
            _, info = OPS.call_info("rmsnorm", x, w, eps=1e-6)
            self.assertNotEqual(info["source"], "forced")
        finally:
            OPS.set_runtime(None)
            rt.close()


@unittest.skipUnless(NATIVE, "the native ops (libkdispatch_torch.so) are not loaded here: " + SKIP)
class TorchNativeCudaTest(unittest.TestCase):
    """The native ops on CUDA tensors: devices, the capture flag, the
    workspace outside every graph pool, torch.compile's re-inplacing."""

    @classmethod
    def setUpClass(cls):
        ok, why = cuda_backend_available()
        if not ok:
            raise unittest.SkipTest(why)
        cls.dev = torch.device("cuda", 0)

    def test_tensors_on_another_device_than_the_current_one(self):
        if torch.cuda.device_count() < 2:
            self.skipTest("one CUDA device: the device guard is exercised with two")
        d1 = torch.device("cuda", 1)
        x, w = torch.randn(7, 512, dtype=torch.bfloat16, device=d1), torch.randn(512, dtype=torch.bfloat16, device=d1)
        b = torch.randn(256, 512, dtype=torch.bfloat16, device=d1)
        with torch.cuda.device(0):
            y = torch.ops.kdispatch.rmsnorm(x, w, 1e-6)
            d = torch.ops.kdispatch.gemm(y, b)
            self.assertEqual(torch.cuda.current_device(), 0)
        self.assertEqual((y.device, d.device), (d1, d1))
        torch.cuda.synchronize(d1)
        torch.testing.assert_close(y.double(), rms_ref(x, w, 1e-6), rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(d.float(), y.float() @ b.float().T, rtol=3e-2, atol=1.0)

    def test_opcheck_on_cuda(self):
        if not HAVE_COMPILE:
            self.skipTest(NO_COMPILE)
        opcheck = torch.library.opcheck
        bf = dict(dtype=torch.bfloat16, device=self.dev)
        opcheck(torch.ops.kdispatch.rmsnorm.default, (torch.randn(4, 256, **bf), torch.randn(256, **bf), 1e-6))
        opcheck(torch.ops.kdispatch.rmsnorm_out.default,
                (torch.empty(4, 256, **bf), torch.randn(4, 256, **bf), torch.randn(256, **bf), 1e-6))
        opcheck(torch.ops.kdispatch.fused_add_rmsnorm_.default,
                (torch.randn(4, 256, **bf), torch.randn(4, 256, **bf), torch.randn(256, **bf), 1e-6))
        opcheck(torch.ops.kdispatch.gemm.default, (torch.randn(4, 256, **bf), torch.randn(128, 256, **bf)))
        opcheck(torch.ops.kdispatch.silu_and_mul.default, (torch.randn(4, 512, **bf),))
        opcheck(torch.ops.kdispatch_vllm.silu_and_mul.default, (torch.empty(4, 256, **bf), torch.randn(4, 512, **bf)))
        opcheck(torch.ops.kdispatch_vllm.fused_add_rms_norm.default,
                (torch.randn(4, 256, **bf), torch.randn(4, 256, **bf), torch.randn(256, **bf), 1e-6))

    def test_reduce_overhead_no_skip_no_pool_error(self):
        """torch.compile(mode="reduce-overhead") of a decoder MLP block: no
        cudagraph skip (the gemm workspace is kdispatch's memory, attached
        outside the warm-up and the capture), results as eager.

        The block updates x and residual in place, so they are an engine's
        persistent buffers, marked static: cudagraph trees skip any graph
        that mutates an input whose address is not static, torch's own
        in-place ops included (`residual.add_(x)` is skipped the same way;
        seen on the H200 with torch 2.11: "skipping cudagraphs due to
        mutated inputs")."""
        if not HAVE_COMPILE:
            self.skipTest(NO_COMPILE)
        from torch._dynamo.utils import counters
        bf = dict(dtype=torch.bfloat16, device=self.dev)
        h, inter = 1024, 2816
        w_norm, w_gu, w_down = torch.randn(h, **bf), torch.randn(2 * inter, h, **bf) * 0.02, \
            torch.randn(h, inter, **bf) * 0.02

        def mlp(x, residual):
            torch.ops.kdispatch.fused_add_rmsnorm_(x, residual, w_norm, 1e-6)
            return torch.ops.kdispatch.gemm(torch.ops.kdispatch.silu_and_mul(torch.ops.kdispatch.gemm(x, w_gu)),
                                            w_down)

        torch._dynamo.reset()
        counters.clear()
        x, r = torch.empty(8, h, **bf), torch.empty(8, h, **bf)
        torch._dynamo.mark_static_address(x)
        torch._dynamo.mark_static_address(r)
        f = torch.compile(mlp, mode="reduce-overhead", fullgraph=True)
        with torch.inference_mode():
            for step in range(4):
                x.copy_(torch.randn(8, h, **bf))
                r.copy_(torch.randn(8, h, **bf))
                xe, re_ = x.clone(), r.clone()
                got = f(x, r).clone()
                want = mlp(xe, re_)
                torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
                torch.testing.assert_close((x, r), (xe, re_))
        skips = {k: v for k, v in counters["inductor"].items() if "skip" in k}
        self.assertEqual(sum(skips.values()), 0, f"cudagraph skips: {skips}")

    def test_compiled_block_reinplaces_the_fused_norm(self):
        """In a compiled block fused_add_rmsnorm_ runs on the graph's inputs:
        no copy of x or residual in the generated code."""
        if not HAVE_COMPILE:
            self.skipTest(NO_COMPILE)
        from torch._inductor.utils import run_and_get_code
        bf = dict(dtype=torch.bfloat16, device=self.dev)
        w, b = torch.randn(512, **bf), torch.randn(256, 512, **bf)

        def block(x, residual):
            torch.ops.kdispatch.fused_add_rmsnorm_(x, residual, w, 1e-6)
            return torch.ops.kdispatch.gemm(x, b)

        torch._dynamo.reset()
        x, r = torch.randn(8, 512, **bf), torch.randn(8, 512, **bf)
        _, codes = run_and_get_code(torch.compile(block, fullgraph=True), x, r)
        code = "\n".join(codes)
        self.assertIn("kdispatch.fused_add_rmsnorm_", code)
        copies = [ln for ln in code.splitlines() if ".copy_(" in ln or "aten.copy" in ln or "clone" in ln]
        self.assertEqual(copies, [], "a copy of x or residual around the in-place op")


def _gemm_kernel_names(fn):
    """The GEMM kernels one call of fn launches, as torch.profiler names them
    (the bias copy and elementwise kernels left out)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    hints = ("gemm", "nvjet", "xmma", "cutlass", "sm90", "splitK", "splitk", "reduce")
    return [e.name for e in prof.events() if "cuda" in str(getattr(e, "device_type", "")).lower()
            and any(h in e.name for h in hints) and "elementwise" not in e.name]


@unittest.skipUnless(NATIVE, "the native ops (libkdispatch_torch.so) are not loaded here: " + SKIP)
class TorchFloorCudaTest(unittest.TestCase):
    """The floor (issue 32): gemm_bf16__cublas runs the kernel F.linear runs
    (torch.profiler's names) with a bitwise-equal result, with and without a
    bias, in eager mode and in a CUDA graph; the fp8 floor (cuBLASLt asked as
    torch._scaled_mm asks) likewise against torch._scaled_mm per tensor."""

    SHAPES = [(4608, 3584, 16), (5120, 4096, 1), (3584, 18944, 4), (9216, 3072, 64), (2560, 7680, 256),
              (6144, 5120, 1024)]

    @classmethod
    def setUpClass(cls):
        ok, why = cuda_backend_available()
        if not ok or torch.version.hip:
            raise unittest.SkipTest(why or "HIP: the floor is hipBLASLt, compile-checked only")
        cls.dev = torch.device("cuda", 0)
        cls.rt = kdispatch.Runtime(force=["gemm=gemm_bf16__cublas",
                                          "gemm_fp8_tensor=gemm_fp8_tensor_e4m3fn__cublaslt:algo_id=-2"],
                                   shipped_configs=False)

    def tearDown(self):
        OPS.set_runtime(None)

    def check(self, name, torch_fn, kd_fn):
        OPS.set_runtime(self.rt)
        want = torch_fn()
        got = kd_fn()
        torch.cuda.synchronize()
        _, variant, _, _, _ = torch.ops.kdispatch._last_info()
        self.assertTrue(variant.endswith("__cublas") or variant.endswith("__cublaslt"), f"{name}: served by {variant}")
        self.assertTrue(torch.equal(got.view(torch.int16), want.view(torch.int16)),
                        f"{name}: not bitwise equal to torch (max |diff| {(got.float() - want.float()).abs().max()})")
        tk, kk = _gemm_kernel_names(torch_fn), _gemm_kernel_names(kd_fn)
        self.assertTrue(tk, f"{name}: torch launched no GEMM kernel the profiler names")
        self.assertEqual(kk, tk, f"{name}: the floor ran other kernels than torch")

    def test_bf16_floor_is_f_linear(self):
        bf = dict(dtype=torch.bfloat16, device=self.dev)
        for n, k, m in self.SHAPES:
            x, w, b = torch.randn(m, k, **bf), torch.randn(n, k, **bf) * 0.02, torch.randn(n, **bf)
            self.check(f"{n}x{k} M={m}", lambda: torch.nn.functional.linear(x, w), lambda: torch.ops.kdispatch.gemm(x, w))
            self.check(f"{n}x{k} M={m} bias", lambda: torch.nn.functional.linear(x, w, b),
                       lambda: torch.ops.kdispatch.gemm(x, w, b))

    def test_bf16_floor_in_a_graph(self):
        """Captured, the floor still has a workspace (attached at the capture
        stream's first call) and matches F.linear captured the same way."""
        bf = dict(dtype=torch.bfloat16, device=self.dev)
        n, k, m = 4608, 3584, 16
        x, w = torch.randn(m, k, **bf), torch.randn(n, k, **bf) * 0.02
        OPS.set_runtime(self.rt)
        outs = {}
        for name, fn in (("torch", lambda: torch.nn.functional.linear(x, w)),
                         ("kd", lambda: torch.ops.kdispatch.gemm(x, w))):
            # warmed up on a side stream first, as torch's graph docs ask
            # (torch creates its cuBLAS handle there, never inside a capture)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                outs[name] = fn()
            g.replay()
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(outs["kd"].view(torch.int16), outs["torch"].view(torch.int16)))

    @unittest.skipUnless(HAVE_FP8, "torch.float8_e4m3fn needs torch >= 2.1")
    def test_fp8_tensor_floor_is_scaled_mm(self):
        for n, k, m in self.SHAPES:
            a = (torch.randn(m, k, device=self.dev) * 0.5).to(torch.float8_e4m3fn)
            w = (torch.randn(n, k, device=self.dev) * 0.5).to(torch.float8_e4m3fn)
            sa, sb = torch.tensor(0.7, device=self.dev), torch.tensor(1.3, device=self.dev)
            out = torch.empty(m, n, dtype=torch.bfloat16, device=self.dev)
            self.check(f"fp8 {n}x{k} M={m}",
                       lambda: torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16),
                       lambda: (torch.ops.kdispatch.gemm_fp8_tensor_out(out, a, w, sa.reshape(1), sb.reshape(1)), out)[1])


@unittest.skipUnless(OPS is not None, SKIP)
class TorchOpsCudaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ok, why = cuda_backend_available()
        if not ok:
            raise unittest.SkipTest(why)
        cls.ops = OPS
        cls.dev = torch.device("cuda", 0)

    def test_ops_on_the_current_stream(self):
        s = torch.cuda.Stream()
        for dtype, tol in ((torch.bfloat16, 3e-2), (torch.float16, 3e-3)):
            with self.subTest(dtype=dtype):
                x = torch.randn(37, 1024, dtype=dtype, device=self.dev)
                r = torch.randn(37, 1024, dtype=dtype, device=self.dev)
                w = torch.randn(1024, dtype=dtype, device=self.dev)
                b = torch.randn(512, 1024, dtype=dtype, device=self.dev)
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):  # the ops must run on s, ordered with torch's own work there
                    y = torch.ops.kdispatch.rmsnorm(x, w, 1e-6)
                    d = torch.ops.kdispatch.gemm(y, b)
                    x2, r2 = x.clone(), r.clone()
                    torch.ops.kdispatch.fused_add_rmsnorm_(x2, r2, w, 1e-6)
                torch.cuda.current_stream().wait_stream(s)
                torch.testing.assert_close(y.double(), rms_ref(x, w, 1e-6), rtol=tol, atol=tol)
                torch.testing.assert_close(d.float(), (y.float() @ b.float().T), rtol=tol, atol=tol * 40)
                torch.testing.assert_close(r2, r + x)
                torch.testing.assert_close(x2.double(), rms_ref(r + x, w, 1e-6), rtol=tol, atol=tol)

    def test_silu_and_mul_on_cuda(self):
        F = torch.nn.functional
        s = torch.cuda.Stream()
        for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float16, 2e-3), (torch.float32, 1e-5)):
            for tokens, d in ((1, 4864), (37, 14336), (300, 18944), (5, 7)):  # d = 7: the generic family
                with self.subTest(dtype=dtype, tokens=tokens, d=d):
                    x = torch.randn(tokens, 2 * d, dtype=dtype, device=self.dev)
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        out = torch.ops.kdispatch.silu_and_mul(x)
                    torch.cuda.current_stream().wait_stream(s)
                    g, u = x.double()[:, :d], x.double()[:, d:]
                    torch.testing.assert_close(out.double(), F.silu(g) * u, rtol=tol, atol=tol)

    def test_moe_sum_on_cuda(self):
        # both names, against a torch sum in float64 (one rounding of an fp32 sum)
        for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float16, 4e-3), (torch.float32, 1e-5)):
            for tokens, top_k, hidden in ((1, 8, 7168), (37, 6, 2048), (300, 2, 4096), (5, 3, 7)):
                with self.subTest(dtype=dtype, tokens=tokens, top_k=top_k, hidden=hidden):
                    x = torch.randn(tokens, top_k, hidden, dtype=dtype, device=self.dev)
                    want = x.double().sum(1)
                    torch.testing.assert_close(torch.ops.kdispatch.moe_sum(x, 2.5).double(), 2.5 * want,
                                               rtol=tol, atol=tol)
                    if NATIVE:
                        out = torch.empty(tokens, hidden, dtype=dtype, device=self.dev)
                        torch.ops.kdispatch_vllm.moe_sum(x, out)
                        torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)

    def test_cuda_graph_capture_and_replay(self):
        rt = kdispatch.Runtime(tune="sync", log_level="off",
                               tune_options=dict(time_budget_ms=200, reps=2, cold_cache=False),
                               cache_dir=os.environ.get("KDISPATCH_TEST_CACHE_DIR"))
        self.ops.set_runtime(rt)
        try:
            dtype = torch.bfloat16
            x = torch.randn(8, 2048, dtype=dtype, device=self.dev)
            w = torch.randn(2048, dtype=dtype, device=self.dev)
            b = torch.randn(1024, 2048, dtype=dtype, device=self.dev)
            tuned_before = rt.tune_stats()["shapes_tuned"]
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                with torch.cuda.graph(g, stream=s):
                    y = torch.ops.kdispatch.rmsnorm(x, w, 1e-6)
                    d = torch.ops.kdispatch.gemm(y, b)
                    act = torch.ops.kdispatch.silu_and_mul(d)
            torch.cuda.current_stream().wait_stream(s)
            # nothing was tuned during the capture, even with sync tuning on
            self.assertEqual(rt.tune_stats()["shapes_tuned"], tuned_before)
            for _ in range(3):
                x.copy_(torch.randn_like(x))
                g.replay()
                torch.cuda.synchronize()
                ref_y = rms_ref(x, w, 1e-6)
                torch.testing.assert_close(y.double(), ref_y, rtol=3e-2, atol=3e-2)
                torch.testing.assert_close(d.float(), y.float() @ b.float().T, rtol=3e-2, atol=1.0)
                dd = d.double()
                torch.testing.assert_close(act.double(), torch.nn.functional.silu(dd[:, :512]) * dd[:, 512:],
                                           rtol=3e-2, atol=3e-2)
        finally:
            self.ops.set_runtime(None)
            rt.close()

    @unittest.skipUnless(HAVE_COMPILE, NO_COMPILE)
    def test_compile_on_cuda(self):
        x = torch.randn(16, 256, dtype=torch.bfloat16, device=self.dev)
        w = torch.randn(256, dtype=torch.bfloat16, device=self.dev)
        f = torch.compile(lambda x, w: torch.ops.kdispatch.rmsnorm(x, w, 1e-6) + 1, fullgraph=True)
        torch.testing.assert_close(f(x, w), torch.ops.kdispatch.rmsnorm(x, w, 1e-6) + 1)


@unittest.skipUnless(OPS is not None, SKIP)
class TorchOpsCloseTest(unittest.TestCase):
    """Runtime.close() while threads call the torch ops (issue 31): the C
    library's kdispatch_runtime_close makes a call through the closed
    runtime's handle fail (failed_precondition), never a crash; and an
    interpreter exit with daemon threads in the ops exits 0. In child
    processes (close_race_child.py): a signal is a negative exit status."""

    def test_close_while_four_threads_call_the_ops_200_rounds(self):
        from test_close import ROUNDS, assert_exited_cleanly, child
        import json
        p = child("torch-race", str(ROUNDS))
        assert_exited_cleanly(self, p, f"{ROUNDS} torch-op races")
        c = json.loads(p.stdout.strip().splitlines()[-1])
        sys.stderr.write(f"torch close race: {c['rounds']} rounds, {c['ok_calls']} calls OK, {c['refused']} refused, "
                         f"{c['wrong']} wrong, {len(c['other'])} other\n")
        self.assertEqual(c["rounds"], ROUNDS)
        self.assertEqual(c["other"], [])
        self.assertEqual(c["wrong"], 0)
        # The odd rounds close the handle under the ops (which keep it):
        # each of their 4 threads ends refused.
        self.assertGreaterEqual(c["refused"], 4 * (ROUNDS // 2))

    def test_interpreter_exit_with_daemon_threads_in_the_ops(self):
        from test_close import assert_exited_cleanly, child
        # The control first: where torch cannot exit under daemon threads in
        # its own ops (torch 2.11: SIGABRT in 8 of 8 runs), an exit under ours
        # tests torch's teardown, not kdispatch's (bench/results/h200_any_model.md).
        for i in range(2):
            c = child("exit-control", timeout=120)
            if c.returncode != 0:
                self.skipTest(f"torch {torch.__version__} itself fails to exit with daemon threads in its own ops "
                              f"(control: exit status {c.returncode})")
        for mode in ("torch-owned", "torch-default"):
            for i in range(2):
                p = child("exit", mode, timeout=120)
                assert_exited_cleanly(self, p, f"exit with daemon threads calling torch ops ({mode}, run {i})")
                self.assertIn("exiting with 4 daemon threads calling", p.stdout)


@unittest.skipIf(HAVE_TORCH, "torch is installed: the torch tests above ran")
class TorchAbsentTest(unittest.TestCase):
    def test_the_package_imports_without_torch(self):
        import kdispatch.sglang  # noqa: F401
        with self.assertRaises(ImportError):
            import kdispatch.torch_ops  # noqa: F401


if __name__ == "__main__":
    unittest.main()
