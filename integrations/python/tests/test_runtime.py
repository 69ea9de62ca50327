# SPDX-License-Identifier: Apache-2.0
"""kdispatch.Runtime on the CPU backend: ops on numpy arrays (DLPack) against
numpy references, options, the table, tuning, errors."""

import ctypes
import os
import sys
import threading
import unittest
from decimal import Decimal

import numpy as np

import kdispatch
from kdispatch import Error, StatusCode
from support import TempDirTest


def rmsnorm_ref(x, w, eps):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


class PackageTest(unittest.TestCase):
    def test_versions_and_backend(self):
        self.assertEqual(kdispatch.ABI_VERSION, 1)
        self.assertRegex(kdispatch.__version__, r"^\d+\.\d+\.\d+$")
        want = os.environ.get("KDISPATCH_PYTHON_BACKEND", "auto")
        if want in ("native", "ctypes"):
            self.assertEqual(kdispatch.BACKEND, want)
        self.assertTrue(os.path.exists(kdispatch.library_path()), kdispatch.library_path())

    def test_status_codes_are_the_c_abi_numbers(self):
        self.assertEqual(int(StatusCode.invalid_argument), 1)
        self.assertEqual(int(StatusCode.not_found), 8)
        self.assertEqual(int(StatusCode.failed_precondition), 11)
        e = Error(8, "no table")
        self.assertIs(e.code, StatusCode.not_found)
        self.assertEqual((e.name, e.message, str(e)), ("not_found", "no table", "not_found: no table"))
        self.assertEqual(Error(42, "x").name, "unknown")


class OpsTest(TempDirTest):
    def setUp(self):
        super().setUp()
        self.rt = self.quiet_runtime()

    def test_rmsnorm_matches_numpy(self):
        x, w = rand(5, 96), rand(96, seed=1)
        y = np.empty_like(x)
        self.assertIsNone(self.rt.rmsnorm(y, x, w, 1e-5))
        np.testing.assert_allclose(y, rmsnorm_ref(x, w, 1e-5), rtol=1e-5, atol=1e-6)

    def test_rmsnorm_in_place_and_on_strided_rows_writes_the_callers_memory(self):
        # rows with a stride larger than hidden (a slice of a wider buffer): no copy is made,
        # the result lands in the caller's buffer
        big_x, big_y = rand(4, 160), np.zeros((4, 160), np.float32)
        x, y, w = big_x[:, :128], big_y[:, :128], rand(128, seed=2)
        self.assertEqual(x.strides, (160 * 4, 4))
        self.rt.rmsnorm(y, x, w, 1e-6)
        np.testing.assert_allclose(big_y[:, :128], rmsnorm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)
        self.assertTrue((big_y[:, 128:] == 0).all())  # nothing outside the view
        x2 = x.copy()
        self.rt.rmsnorm(x2, x2, w, 1e-6)  # y is x
        np.testing.assert_allclose(x2, rmsnorm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)

    def test_fused_add_rmsnorm_exact_semantics(self):
        x, residual, w = rand(3, 64), rand(3, 64, seed=5), rand(64, seed=6)
        x0, r0 = x.copy(), residual.copy()
        self.assertIsNone(self.rt.fused_add_rmsnorm(x, residual, w, 1e-6))
        s = r0 + x0  # fp32 add, as the kernel rounds the sum to the residual dtype
        np.testing.assert_array_equal(residual, s)
        np.testing.assert_allclose(x, rmsnorm_ref(s, w, 1e-6), rtol=1e-5, atol=1e-6)

    def test_gemm_with_and_without_bias(self):
        a, b, bias = rand(7, 33), rand(19, 33, seed=3), rand(19, seed=4)
        d = np.empty((7, 19), np.float32)
        self.rt.gemm(a, b, d)
        np.testing.assert_allclose(d, a.astype(np.float64) @ b.T.astype(np.float64), rtol=1e-4, atol=1e-4)
        self.rt.gemm(a, b, d, bias=bias)
        np.testing.assert_allclose(d, a.astype(np.float64) @ b.T + bias, rtol=1e-4, atol=1e-4)

    def test_info(self):
        x, w = rand(2, 32), rand(32)
        info = self.rt.rmsnorm(x, x, w, 1e-6, info=True)
        self.assertEqual(info["source"], "default")
        self.assertIsNone(info["M"])
        self.assertTrue(info["variant"].startswith("rmsnorm_fp32__"))
        self.assertFalse(info["tuned_now"])
        self.assertIsNone(self.rt.rmsnorm(x, x, w, capturing=True))  # the capture flag is accepted

    def test_errors_name_the_argument(self):
        x, w, y = rand(2, 32), rand(32), np.empty((2, 32), np.float32)
        with self.assertRaises(Error) as c:
            self.rt.rmsnorm(y, x.astype(np.float64), w)
        self.assertIs(c.exception.code, StatusCode.unsupported_problem)
        self.assertEqual(c.exception.name, "unsupported_problem")
        self.assertIn("x", c.exception.message)
        with self.assertRaises(Error) as c:
            self.rt.rmsnorm(y, x, rand(31))
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        self.assertIn("w", c.exception.message)
        with self.assertRaises(Error) as c:
            self.rt.rmsnorm(y, x, w, 0.0)
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        self.assertIn("eps", c.exception.message)
        # A float scalar that is not a number, or past a float32 (1e300 would
        # run as inf): refused by name before the op, never parsed or rounded.
        for v, want in ((None, "eps: must be a number, got None (float() argument must be"),
                        ("1e-6", "eps: must be a number, got '1e-6' (a string)"),
                        (b"1e-6", "eps: must be a number, got b'1e-6' (a string)"),
                        (1e300, "eps: 1e+300 is not representable as a float32"),
                        (1e-50, "eps: 1e-50 is not representable as a float32"),  # would run as 0
                        (Decimal("1e400"), "eps: Decimal('1E+400') is not representable as a float32"),
                        (np.longdouble("1e4000") if np.finfo(np.longdouble).max > 1e4000 else 1e300, "eps: "),
                        (10**400, "eps: must be a number, got 1000"),
                        (np.timedelta64(1, "ns"), "eps: must be a number, got numpy.timedelta64(1,'ns') (a time")):
            with self.assertRaises(Error) as c:
                self.rt.rmsnorm(y, x, w, v)
            self.assertIs(c.exception.code, StatusCode.invalid_argument)
            self.assertTrue(c.exception.message.startswith(want), c.exception.message)
        # A switch (fp8's fast_accum) is False/True or exactly 0 or 1: 0.99999999
        # ran as fast, 1e-50 as not, "1" was taken; now each is refused by name,
        # through the method and pretune alike (before any tensor is looked at).
        a8, s1 = np.zeros((2, 16), np.uint8), np.ones(1, np.float32)
        for v in (0.99999999, 1.00000001, 1e-50, 2**24 + 1, "1", None, 1 + 0j, np.timedelta64(1)):
            for call in (lambda: self.rt.gemm_fp8_tensor(a8, a8, y, s1, s1, fast_accum=v),
                         lambda: self.rt.pretune("gemm_fp8_tensor", a8, a8, y, s1, s1, fast_accum=v)):
                with self.assertRaises(Error) as c:
                    call()
                self.assertEqual(c.exception.message, f"fast_accum: must be 0 or 1 (false or true), got {v!r}")
        with self.assertRaises(Error) as c:  # True passes the switch; the uint8 tensors are refused
            self.rt.gemm_fp8_tensor(a8, a8, y, s1, s1, fast_accum=True)
        self.assertNotIn("fast_accum", c.exception.message)
        with self.assertRaises(Error) as c:
            self.rt.rmsnorm(y, [[1.0] * 32] * 2, w)
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        self.assertIn("DLPack", c.exception.message)
        with self.assertRaises(Error) as c:
            self.rt.gemm(rand(3, 8), rand(4, 9), np.empty((3, 4), np.float32))
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        with self.assertRaises(Error) as c:
            self.rt.gemm(rand(3, 8), rand(4, 8), None)
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        with self.assertRaises(Error) as c:  # x and residual overlap
            self.rt.fused_add_rmsnorm(x, x, w)
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        with self.assertRaises(Error) as c:
            self.rt.rmsnorm(y, x.astype(np.uint16), w)  # numpy has no bf16: uint16 is not a float
        self.assertIs(c.exception.code, StatusCode.unsupported_problem)
        ro = np.empty((2, 32), np.float32)
        ro.flags.writeable = False
        with self.assertRaises((Error, BufferError)):  # numpy 1.x refuses to export it at all
            self.rt.rmsnorm(ro, x, w)

    def test_moe_align_sizes_past_2_24_are_refused_not_rounded(self):
        ids = np.array([[2, 0], [2, 3], [-1, 2]], np.int32)
        out = dict(sorted_token_ids=np.full(18, 99, np.int32), expert_ids=np.full(5, 99, np.int32),
                   num_tokens_post_pad=np.full(1, 99, np.int32))
        self.rt.moe_align(topk_ids=ids, num_experts=4, block_size=4, **out)
        self.assertEqual(out["num_tokens_post_pad"].tolist(), [12])
        for kw, got in (({"num_experts": 2**24 + 1, "block_size": 4}, "-1"),
                        ({"num_experts": 4, "block_size": 2**25}, "-1"),
                        ({"num_experts": 10**400, "block_size": 4}, "-1"),  # past a double too
                        ({"num_experts": 4.5, "block_size": 4}, "4.5"),
                        ({"num_experts": float("nan"), "block_size": 4}, "nan"),
                        ({"num_experts": 4, "block_size": float("-inf")}, "-inf")):
            with self.assertRaises(Error) as c:  # a float32 would round 2^24 + 1 to 2^24
                self.rt.moe_align(topk_ids=ids, **kw, **out)
            self.assertIs(c.exception.code, StatusCode.invalid_argument)
            name = next(k for k, v in kw.items() if v != 4)
            self.assertIn(f"{name}: must be a whole number in [1, 16777216], got {got}", c.exception.message)
        # A fraction a float32 would round to a whole size is refused before the
        # C ABI (it would run on 4), naming it and the value as given.
        with self.assertRaises(Error) as c:
            self.rt.moe_align(topk_ids=ids, num_experts=4, block_size=3.9999999999, **out)
        self.assertEqual(c.exception.message, "block_size: must be a whole number, got 3.9999999999")
        # One that a float64 would round to a whole size (Decimal, Fraction) or a string: the same.
        from decimal import Decimal
        from fractions import Fraction
        for v in (Decimal("3.99999999999999999999"), Fraction(4 * 10**20 + 1, 10**20)):
            with self.assertRaises(Error) as c:
                self.rt.moe_align(topk_ids=ids, num_experts=4, block_size=v, **out)
            self.assertEqual(c.exception.message, f"block_size: must be a whole number, got {v!r}")
        self.rt.moe_align(topk_ids=ids, num_experts=Fraction(8, 2), block_size=Decimal(4), **out)  # exactly 4
        # A number whose int() raises something else (a float tensor past int64
        # raises RuntimeError): refused by name, not a raw exception.
        class Huge:
            def __int__(self):
                raise RuntimeError("Overflow when unpacking long")

            def __float__(self):
                return 1e20

        with self.assertRaises(Error) as c:
            self.rt.moe_align(topk_ids=ids, num_experts=4, block_size=Huge(), **out)
        self.assertTrue(c.exception.message.startswith("block_size: must be a whole number, got <"), c.exception.message)
        # Not a number at all: refused by name, not Python's bare TypeError / ValueError.
        for v, why in ((None, "float() argument must be"), ("four", "a string"), ("4", "a string"),
                       (np.timedelta64(4), "a time, not a number")):  # int() took it as 4
            with self.assertRaises(Error) as c:
                self.rt.moe_align(topk_ids=ids, num_experts=4, block_size=v, **out)
            self.assertIn(f"block_size: must be a number, got {v!r} ({why}", c.exception.message)
        self.assertEqual(out["num_tokens_post_pad"].tolist(), [12])

    def test_used_dlpack_protocol(self):
        """Each capsule is consumed: renamed "used_dltensor", its deleter run once."""
        capsules = []

        class Producer:
            def __init__(self, a):
                self.a = a

            def __dlpack__(self, stream=None):
                cap = self.a.__dlpack__()
                capsules.append(cap)
                return cap

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()

        x, w = rand(2, 16), rand(16)
        y = np.empty_like(x)
        refs = [sys.getrefcount(a) for a in (x, w, y)]
        self.rt.rmsnorm(Producer(y), Producer(x), Producer(w), 1e-6)
        np.testing.assert_allclose(y, rmsnorm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)
        self.assertEqual(len(capsules), 3)
        is_valid = ctypes.pythonapi.PyCapsule_IsValid
        is_valid.restype, is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
        for cap in capsules:
            self.assertEqual(is_valid(cap, b"used_dltensor"), 1)
            self.assertEqual(is_valid(cap, b"dltensor"), 0)
        capsules.clear()
        # the deleters ran (each export's reference on its array is gone), exactly once
        self.assertEqual([sys.getrefcount(a) for a in (x, w, y)], refs)

        class Spent:  # hands out a capsule that was consumed already
            def __init__(self, cap):
                self.cap = cap

            def __dlpack__(self, stream=None):
                return self.cap

            def __dlpack_device__(self):
                return (1, 0)

        cap = x.__dlpack__()
        self.rt.rmsnorm(y, Spent(cap), w)  # consumes it
        with self.assertRaises(Error) as c:
            self.rt.rmsnorm(y, Spent(cap), w)
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        self.assertIn("capsule", c.exception.message)

    def test_concurrent_calls(self):
        w = rand(64)
        errors = []

        def work(seed):
            try:
                for i in range(50):
                    x = rand(3, 64, seed=seed * 100 + i)
                    y = np.empty_like(x)
                    self.rt.rmsnorm(y, x, w, 1e-6)
                    np.testing.assert_allclose(y, rmsnorm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)
            except Exception as e:  # pragma: no cover
                errors.append(e)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])


class RuntimeTest(TempDirTest):
    def own_table(self, hidden=64):
        cpu = kdispatch.Runtime(shipped_configs=False, log_level="off").device_info()["device_name"]
        rel = f"configs/cpu/rmsnorm/hidden={hidden},device_name={cpu},dtype=fp32.json"
        self.write(rel, '{"1": {"variant": "rmsnorm_fp32__ref"}, "8": {"variant": "rmsnorm_fp32__vec", "vec": 8}}')
        return os.path.join(self.tmp, "configs"), rel[len("configs/"):]

    def test_options_errors(self):
        missing = os.path.join(self.tmp, "nope")
        with self.assertRaises(Error) as c:
            kdispatch.Runtime(config_dirs=[missing])
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        self.assertIn(missing, c.exception.message)
        with self.assertRaises(Error):
            kdispatch.Runtime(tune="sometimes")
        with self.assertRaises(Error):
            kdispatch.Runtime(log_level="loud")
        with self.assertRaises(Error):
            kdispatch.Runtime(tune_options={"no_such_knob": 1})
        # The routing MoE ops are tuned on: a missing .npy fails, naming it.
        with self.assertRaises(Error) as c:
            kdispatch.Runtime(tune_options={"routing": missing + ".npy"}, shipped_configs=False)
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        self.assertIn("tune.routing: ", c.exception.message)
        self.assertIn(missing + ".npy", c.exception.message)
        kdispatch.Runtime(tune_options={"routing": "skewed"}, shipped_configs=False).close()
        with self.assertRaises(Error) as c:
            kdispatch.Runtime(backend_version="three")
        self.assertIs(c.exception.code, StatusCode.invalid_argument)
        with self.assertRaises(Error) as c:
            kdispatch.Runtime(force=["rmsnorm=no_such_variant"], shipped_configs=False)
        self.assertIs(c.exception.code, StatusCode.no_variant)

    def test_table_hit_source_and_load_report(self):
        d, rel = self.own_table()
        self.write("configs/foreign.json", '{"something": "else"}')
        rt = self.quiet_runtime(config_dirs=d)
        x, w = rand(4, 64), rand(64)
        info = rt.rmsnorm(x, x, w, info=True)
        self.assertEqual((info["source"], info["M"], info["variant"]), ("table", 1, "rmsnorm_fp32__ref"))
        self.assertEqual(rt.source_path(info["source_id"]), (rel, d))
        with self.assertRaises(Error) as c:
            rt.source_path(0)
        self.assertIs(c.exception.code, StatusCode.not_found)
        rep = rt.load_report()
        by_path = {f["path"]: f for f in rep["files"]}
        self.assertEqual(by_path[rel]["status"], "loaded")
        self.assertEqual(by_path["foreign.json"]["status"], "skipped")
        self.assertGreaterEqual(rep["keys"], 1)

    def test_reload_freeze_and_stats(self):
        d, _ = self.own_table()
        rt = self.quiet_runtime(config_dirs=d)
        q = dict(op="triton_fused_moe", key="E=8,N=16,dtype=fp8_w8a8", device="NVIDIA H200", M=4)
        self.assertEqual(rt.lookup(**q)["match"], "default")
        self.write("configs/E=8,N=16,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
                   '{"4": {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}}')
        g = rt.generation
        rt.reload()
        self.assertEqual(rt.generation, g + 1)
        self.assertEqual(rt.lookup(**q)["match"], "exact")
        self.assertFalse(rt.frozen)
        rt.freeze()
        self.assertTrue(rt.frozen)
        self.assertTrue(rt.tune_stats()["frozen"])
        with self.assertRaises(Error) as c:
            rt.reload()
        self.assertIs(c.exception.code, StatusCode.failed_precondition)
        rt.freeze(False)
        self.assertFalse(rt.frozen)
        stats = rt.tune_stats()
        self.assertEqual(set(stats), {"misses", "queued", "dropped", "shapes_tuned", "shapes_skipped",
                                      "candidates_run", "candidates_rejected", "candidates_failed", "publishes",
                                      "pending", "tune_seconds", "frozen", "deferred", "capture_waits"})
        self.assertTrue(rt.wait_tuner_idle(1.0))

    def test_misses_export_and_device_info(self):
        rt = self.quiet_runtime()
        x, w = rand(3, 48), rand(48)
        rt.rmsnorm(x, x, w)
        self.assertGreaterEqual(rt.tune_stats()["misses"], 1)
        path = os.path.join(self.tmp, "misses.csv")
        rt.export_misses(path)
        self.assertGreater(os.path.getsize(path), 0)
        with self.assertRaises(Error) as c:
            rt.export_misses("/nonexistent-kdispatch-dir/m.csv")
        self.assertIs(c.exception.code, StatusCode.io_error)
        info = rt.device_info("cpu")
        self.assertTrue(info["device_name"].startswith("CPU_"), info)
        self.assertTrue(info["available"])
        with self.assertRaises(Error) as c:
            rt.device_info("cpu", 5)
        self.assertIs(c.exception.code, StatusCode.unsupported_device)
        with self.assertRaises(Error):
            rt.device_info("tpu")
        self.assertEqual(rt.cache_dir, os.path.join(self.tmp, "cache"))

    def test_pretune_then_hit(self):
        rt = self.quiet_runtime(tune_options=dict(time_budget_ms=50, reps=1, cold_cache=False))
        x, w = rand(4, 96), rand(96)
        y = np.empty_like(x)
        r = rt.pretune("rmsnorm", y, x, w, eps=1e-6)
        self.assertTrue(r["key"].startswith("cpu/rmsnorm|"), r)
        self.assertEqual(r["M"], 4)
        self.assertTrue(r["variant"].startswith("rmsnorm_fp32__"))
        self.assertTrue(r["persisted"])
        self.assertEqual(rt.rmsnorm(y, x, w, info=True)["source"], "table")
        g = rt.pretune("gemm", rand(8, 32), rand(16, 32), np.empty((8, 16), np.float32), bias=rand(16))
        self.assertIn("bias=true", g["key"])
        f = rt.pretune("fused_add_rmsnorm", rand(2, 96), rand(2, 96), w)
        self.assertTrue(f["key"].startswith("cpu/fused_add_rmsnorm|"))
        with self.assertRaises(Error):
            rt.pretune("softmax", x, x, w)
        rt.freeze()
        with self.assertRaises(Error) as c:
            rt.pretune("rmsnorm", y, x, w)
        self.assertIs(c.exception.code, StatusCode.failed_precondition)

    def test_sync_tuning_never_runs_while_capturing(self):
        rt = self.quiet_runtime(tune="sync", tune_options=dict(time_budget_ms=50, reps=1, cold_cache=False))
        x, w = rand(2, 128), rand(128)
        y = np.empty_like(x)
        info = rt.rmsnorm(y, x, w, capturing=True, info=True)
        self.assertEqual((info["source"], info["tuned_now"]), ("default", False))
        self.assertEqual(rt.tune_stats()["shapes_tuned"], 0)
        self.assertTrue(rt.rmsnorm(y, x, w, info=True)["tuned_now"])
        self.assertEqual(rt.tune_stats()["shapes_tuned"], 1)
        self.assertEqual(rt.rmsnorm(y, x, w, info=True)["source"], "table")
        np.testing.assert_allclose(y, rmsnorm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)

    def test_from_env_and_default_runtime(self):
        d, _ = self.own_table()
        old = {k: os.environ.get(k) for k in ("KDISPATCH_CONFIG_DIRS", "KDISPATCH_TUNE")}
        try:
            os.environ["KDISPATCH_TUNE"] = "bogus"
            with self.assertRaises(Error) as c:
                kdispatch.Runtime.from_env()
            self.assertIn("KDISPATCH_TUNE", c.exception.message)
            del os.environ["KDISPATCH_TUNE"]
            os.environ["KDISPATCH_CONFIG_DIRS"] = d
            rt = kdispatch.Runtime.from_env(shipped_configs=False, log_level="off")
            self.addCleanup(rt.close)
            self.assertEqual(rt.lookup(op="rmsnorm", key="hidden=64,dtype=fp32", M=1)["match"], "exact")
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        with self.assertRaises(TypeError):
            kdispatch.Runtime.from_env(colour="blue")
        rt1, rt2 = kdispatch.default_runtime(), kdispatch.default_runtime()
        self.assertIs(rt1, rt2)
        rt1.close()  # a no-op for the process-wide runtime
        x, w = rand(2, 16), rand(16)
        rt2.rmsnorm(x, x, w)

    def test_context_manager_closes(self):
        with kdispatch.Runtime(shipped_configs=False, log_level="off") as rt:
            self.assertIn("kdispatch.Runtime", repr(rt))
        with self.assertRaises(Error) as c:
            rt.tune_stats()
        self.assertIs(c.exception.code, StatusCode.failed_precondition)


if __name__ == "__main__":
    unittest.main()
