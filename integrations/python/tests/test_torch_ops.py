# SPDX-License-Identifier: Apache-2.0
"""torch.ops.kdispatch.* (kdispatch.torch_ops): results against torch
references, in-place semantics, the registrations (torch.library.opcheck),
torch.compile through the fake implementations, errors; on CUDA tensors when
a CUDA device and kdispatch's CUDA backend are there: streams and CUDA-graph
capture. Skipped without torch (Debian's python3 has none; run them with
torch's interpreter, e.g. /opt/torch/.venv/bin/python3 -m unittest)."""

import os
import unittest

try:
    import torch
    # torch.library.custom_op (the registrations) came with torch 2.4; an
    # older torch (Debian's python3-torch 1.13) counts as absent.
    HAVE_TORCH = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
except ImportError:
    HAVE_TORCH = False

import kdispatch
from kdispatch import Error, StatusCode

SKIP = ("torch >= 2.4 is not installed for this interpreter (torch tests run where it is, e.g. the GPU "
        "machines' /opt/torch/.venv/bin/python3)")


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


@unittest.skipUnless(HAVE_TORCH, SKIP)
class TorchOpsCpuTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import kdispatch.torch_ops as ops
        cls.ops = ops
        cls.rt = kdispatch.Runtime(shipped_configs=False, log_level="off")
        ops.set_runtime(cls.rt)

    @classmethod
    def tearDownClass(cls):
        cls.ops.set_runtime(None)
        cls.rt.close()

    def setUp(self):
        torch.manual_seed(0)

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
        with self.assertRaises(Error) as c:  # an odd last dim has no halves
            torch.ops.kdispatch.silu_and_mul(torch.ones(2, 7))
        self.assertIs(c.exception.code, StatusCode.invalid_argument)

    def test_errors(self):
        with self.assertRaises(Error) as c:
            torch.ops.kdispatch.rmsnorm(torch.ones(2, 8, dtype=torch.int32), torch.ones(8, dtype=torch.int32), 1e-6)
        self.assertIs(c.exception.code, StatusCode.unsupported_problem)
        with self.assertRaises(Error) as c:
            torch.ops.kdispatch.rmsnorm(torch.ones(2, 8), torch.ones(7), 1e-6)
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        with self.assertRaises(Error) as c:
            torch.ops.kdispatch.gemm(torch.ones(2, 8), torch.ones(4, 9))
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        x = torch.ones(2, 8)
        with self.assertRaises(Error):  # x and residual overlap
            torch.ops.kdispatch.fused_add_rmsnorm_(x, x, torch.ones(8), 1e-6)

    def test_opcheck(self):
        opcheck = getattr(torch.library, "opcheck", None)
        if opcheck is None:
            self.skipTest("torch.library.opcheck is not in this torch")
        opcheck(torch.ops.kdispatch.rmsnorm.default, (torch.randn(4, 32), torch.randn(32), 1e-6))
        opcheck(torch.ops.kdispatch.fused_add_rmsnorm_.default,
                (torch.randn(4, 32), torch.randn(4, 32), torch.randn(32), 1e-6))
        opcheck(torch.ops.kdispatch.gemm.default, (torch.randn(4, 32), torch.randn(8, 32), torch.randn(8)))
        opcheck(torch.ops.kdispatch.gemm.default, (torch.randn(4, 32), torch.randn(8, 32)))
        opcheck(torch.ops.kdispatch.silu_and_mul.default, (torch.randn(4, 64),))

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

    def test_fake_tensor_shapes(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            x, w = torch.empty(5, 3, 16), torch.empty(16)
            self.assertEqual(torch.ops.kdispatch.rmsnorm(x, w, 1e-6).shape, (5, 3, 16))
            self.assertEqual(torch.ops.kdispatch.gemm(x, torch.empty(8, 16)).shape, (5, 3, 8))
            self.assertEqual(torch.ops.kdispatch.silu_and_mul(x).shape, (5, 3, 8))


@unittest.skipUnless(HAVE_TORCH, SKIP)
class TorchOpsCudaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ok, why = cuda_backend_available()
        if not ok:
            raise unittest.SkipTest(why)
        import kdispatch.torch_ops as ops
        cls.ops = ops
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

    def test_compile_on_cuda(self):
        x = torch.randn(16, 256, dtype=torch.bfloat16, device=self.dev)
        w = torch.randn(256, dtype=torch.bfloat16, device=self.dev)
        f = torch.compile(lambda x, w: torch.ops.kdispatch.rmsnorm(x, w, 1e-6) + 1, fullgraph=True)
        torch.testing.assert_close(f(x, w), torch.ops.kdispatch.rmsnorm(x, w, 1e-6) + 1)


@unittest.skipIf(HAVE_TORCH, "torch is installed: the torch tests above ran")
class TorchAbsentTest(unittest.TestCase):
    def test_the_package_imports_without_torch(self):
        import kdispatch.sglang  # noqa: F401
        with self.assertRaises(ImportError):
            import kdispatch.torch_ops  # noqa: F401


if __name__ == "__main__":
    unittest.main()
