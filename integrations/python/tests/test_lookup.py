# SPDX-License-Identifier: Apache-2.0
"""Runtime.lookup / lookup_table over SGLang's committed tuning files."""

import os
import unittest

import kdispatch
from kdispatch import Error, StatusCode
from support import C06_CONFIG, C06_KEY, SGLANG_MOE, TempDirTest, needs_shared


@needs_shared
class LookupTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = kdispatch.Runtime(config_dirs=[SGLANG_MOE], backend_version="3.5.1", log_level="off")

    @classmethod
    def tearDownClass(cls):
        cls.rt.close()

    def test_c06(self):
        r = self.rt.lookup(key=C06_KEY, device="NVIDIA H200", M=1)
        self.assertEqual(r["config"], C06_CONFIG)
        self.assertEqual(list(r["config"]), list(C06_CONFIG))  # the file's key order
        self.assertEqual((r["match"], r["M"]), ("exact", 1))
        self.assertEqual(r["source"],
                         "triton_3_5_1/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json")
        self.assertEqual(r["source_dir"], SGLANG_MOE)
        self.assertTrue(r["key"].startswith("triton/triton_fused_moe|NVIDIA_H200|"))
        self.assertIn("exact M=1", r["why"])
        # the same part under its other name, and the key spelled as SGLang spells it
        r2 = self.rt.lookup(op="triton_fused_moe", key="E=257,N=256,dtype=fp8_w8a8,block_shape=[128, 128]",
                            device="NVIDIA H200 NVL", M=1)
        self.assertEqual(r2["config"], C06_CONFIG)
        # "fused_moe", the tables' name until 2026-12, answers for one release and says so
        r3 = self.rt.lookup(op="fused_moe", key=C06_KEY, device="NVIDIA H200", M=1)
        self.assertEqual((r3["config"], r3["key"]), (C06_CONFIG, r["key"]))
        self.assertIn("'fused_moe' for the engines' fused-MoE tables is deprecated", r3["why"])

    def test_nearest_and_whole_table(self):
        t = self.rt.lookup_table(key=C06_KEY, device="NVIDIA H200")
        self.assertEqual(t["rows"][1], C06_CONFIG)
        ms = list(t["rows"])
        self.assertEqual(ms, sorted(ms))
        self.assertTrue(all(isinstance(m, int) for m in ms))
        self.assertTrue(all(s.startswith("triton_3_5_1/") for s in t["sources"].values()))
        self.assertEqual(set(t["source_dirs"].values()), {SGLANG_MOE})
        for M in (3, 50, 100, 5000, 10 ** 6):
            r = self.rt.lookup(key=C06_KEY, device="NVIDIA H200", M=M)
            best = min(ms, key=lambda k: (abs(k - M), k))
            self.assertEqual(r["M"], best)
            self.assertEqual(r["match"], "exact" if best == M else "nearest")
            self.assertEqual(r["config"], t["rows"][best])

    def test_default_and_not_found(self):
        r = self.rt.lookup(op="triton_fused_moe", key="E=3,N=3,dtype=fp8_w8a8", device="NVIDIA H200", M=2)
        self.assertEqual((r["match"], r["M"], r["source"]), ("default", None, "default"))
        self.assertEqual(r["config"], {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128,
                                       "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 4})
        with self.assertRaises(Error) as c:
            self.rt.lookup_table(op="triton_fused_moe", key="E=3,N=3,dtype=fp8_w8a8", device="NVIDIA H200")
        self.assertIs(c.exception.code, StatusCode.not_found)
        with self.assertRaises(Error) as c:
            self.rt.lookup(op="triton_gemm", key="N=7,K=7,dtype=fp8_w8a8", device="NVIDIA H200")
        self.assertIs(c.exception.code, StatusCode.not_found)

    def test_down_tables(self):
        key = "E=128,N=1024,dtype=fp8_w8a8"
        dev = "NVIDIA H100 80GB HBM3"
        up = self.rt.lookup(key=key, device=dev, M=16)
        down = self.rt.lookup(key=key, device=dev, M=16, down=True)
        self.assertFalse(up["source"].endswith("_down.json"))
        self.assertTrue(down["source"].endswith("_down.json"), down["source"])
        d = self.rt.lookup(key=C06_KEY, device="NVIDIA H200", M=1, down=True)
        self.assertTrue(d["source"].startswith("triton_3_5_1/") and d["source"].endswith("]_down.json"))
        # no _down table for this key anywhere: the up table serves, as SGLang does
        up = self.rt.lookup(key="E=128,N=1344", device="NVIDIA B200", M=8)
        down = self.rt.lookup(key="E=128,N=1344", device="NVIDIA B200", M=8, down=True)
        self.assertEqual((down["source"], down["config"]), (up["source"], up["config"]))
        self.assertIn("_down table", down["why"])

    def test_query_errors(self):
        for kwargs, code in [
            (dict(key=None), StatusCode.invalid_argument),
            (dict(key=C06_KEY, M=0), StatusCode.invalid_argument),
            (dict(key="garbage"), StatusCode.invalid_argument),
            (dict(key=C06_KEY, op="no_such_op"), StatusCode.invalid_argument),
            (dict(key="N=7,K=7", op="triton_gemm", down=True), StatusCode.invalid_argument),
            (dict(key="hidden=64,dtype=fp32", op="rmsnorm", backend="tpu"), StatusCode.invalid_argument),
            # outside int64: an error naming M, never the row of M mod 2**64 (ctypes wrapped it)
            (dict(key=C06_KEY, M=2**64 + 16), StatusCode.invalid_argument),
            (dict(key=C06_KEY, M=-2**63 - 1), StatusCode.invalid_argument),
        ]:
            with self.subTest(**{k: str(v) for k, v in kwargs.items()}):
                with self.assertRaises(Error) as c:
                    self.rt.lookup(device="NVIDIA H200", **kwargs)
                self.assertIs(c.exception.code, code)
                self.assertTrue(c.exception.message)
                if "M" in kwargs and abs(kwargs["M"]) > 2**62:
                    self.assertIn("M: ", c.exception.message)


@needs_shared
class TieTest(unittest.TestCase):
    def test_c09_ties_go_to_the_smaller_key(self):
        with kdispatch.Runtime(config_dirs=[SGLANG_MOE], backend_version="3.1.0", log_level="off") as rt:
            r = rt.lookup(key="E=16,N=6400,dtype=fp8_w8a8", device="NVIDIA H100 80GB HBM3", M=3712)
        self.assertEqual(r["M"], 3584)
        self.assertEqual(r["config"], {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64,
                                       "GROUP_SIZE_M": 16, "num_warps": 4, "num_stages": 2})


class BoundedTest(TempDirTest):
    def test_lookup_table_finds_a_table_outside_m1s_bounded_range(self):
        self.write("c/E=8,N=16,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
                   '{"256": {"BLOCK_SIZE_M": 64}, "512": {"BLOCK_SIZE_M": 128}}')
        rt = self.quiet_runtime(config_dirs=[os.path.join(self.tmp, "c")], bounded_nearest=True)
        q = dict(op="triton_fused_moe", key="E=8,N=16,dtype=fp8_w8a8", device="NVIDIA_H200")
        self.assertEqual(rt.lookup(M=1, **q)["match"], "default")
        self.assertEqual(rt.lookup(M=300, **q)["M"], 256)
        self.assertEqual(rt.lookup_table(**q)["rows"], {256: {"BLOCK_SIZE_M": 64}, 512: {"BLOCK_SIZE_M": 128}})


if __name__ == "__main__":
    unittest.main()
