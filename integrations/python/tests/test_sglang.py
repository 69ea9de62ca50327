# SPDX-License-Identifier: Apache-2.0
"""kdispatch.sglang against a small pure-Python re-implementation of SGLang's
rule (fused_moe_triton_config.py: get_config_file_name, get_moe_configs,
get_default_config, try_get_optimal_moe_config) on real SGLang files: the
same answers, except nearest-M ties (documented: kdispatch takes the smaller
key, SGLang the first in file order)."""

import json
import os
import unittest

import kdispatch
import kdispatch.sglang as ks
from kdispatch import Error, StatusCode
from support import C06_CONFIG, SGLANG_MOE, TempDirTest, needs_shared

# ------------------------------------------------------------ SGLang's rule
_SUPPORTED = ["3.4.0", "3.3.1", "3.2.0", "3.1.0"]


def ref_file_name(E, N, dtype, device, block_shape=None, per_channel_quant=False):
    dev = device.replace(" ", "_")
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_selector = "" if not block_shape or not all(block_shape) else f",block_shape={block_shape}"
    pcq = ",per_channel_quant=True" if per_channel_quant else ""
    return f"E={E},N={N},device_name={dev}{dtype_selector}{block_selector}{pcq}.json"


def ref_get_moe_configs(configs_dir, triton_version, device, E, N, dtype, block_n=0, block_k=0,
                        per_channel_quant=False):
    name = ref_file_name(E, N, dtype, device, [block_n, block_k], per_channel_quant)
    for v in [triton_version] + [v for v in _SUPPORTED if v != triton_version]:
        path = os.path.join(configs_dir, f"triton_{v.replace('.', '_')}", name)
        if os.path.exists(path):
            with open(path) as f:
                return {int(k): val for k, val in json.load(f).items()}
    return None


def ref_get_default_config(M, E, N, K, topk, dtype, is_marlin, block_shape=None, is_hip=False):
    if dtype == "fp8_w8a8":
        if block_shape is None:
            config = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                      "num_warps": 8, "num_stages": 2 if is_hip else 4}
            if M <= E:
                config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                          "num_warps": 4, "num_stages": 2 if is_hip else 4}
        else:
            config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": block_shape[0], "BLOCK_SIZE_K": block_shape[1],
                      "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 2 if is_hip else 3}
    else:
        config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
        if M <= E or (is_marlin and M <= 32):
            config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return config


def ref_try_get_optimal(configs_dir, triton_version, device, w1_shape, w2_shape, top_k, dtype, M,
                        is_marlin=False, block_shape=None):
    E, _, N = w2_shape
    block_n = block_shape[0] if block_shape else 0
    block_k = block_shape[1] if block_shape else 0
    configs = ref_get_moe_configs(configs_dir, triton_version, device, E, N, dtype, block_n, block_k)
    if configs:
        return configs[min(configs.keys(), key=lambda x: abs(x - M))]
    return ref_get_default_config(M, E, N, w1_shape[2], top_k, dtype, is_marlin, block_shape)


def probe_ms(keys):
    """Every key, its neighbours, every midpoint, and far beyond."""
    ks_ = sorted(keys)
    ms = {1, 2, 3, 10 ** 6}
    for k in ks_:
        ms |= {k, k + 1, max(1, k - 1)}
    for a, b in zip(ks_, ks_[1:]):
        ms |= {(a + b) // 2, (a + b + 1) // 2}
    return sorted(ms)


# (triton version, device, E, N, dtype, block_shape, per_channel_quant): real SGLang files,
# read from the running version's folder, from an older folder SGLang also tries, and from
# a folder whose rows leave num_warps/num_stages out.
CASES = [
    ("3.5.1", "NVIDIA H200", 257, 256, "fp8_w8a8", [128, 128], False),   # C06, triton_3_5_1/
    ("3.5.1", "NVIDIA H100 80GB HBM3", 512, 128, None, None, False),     # only in triton_3_4_0/
    ("3.5.1", "NVIDIA H200", 128, 768, "fp8_w8a8", [128, 128], False),   # only in triton_3_2_0/
    ("3.6.0", "NVIDIA H100 80GB HBM3", 32, 768, None, None, False),      # rows without num_warps
    ("3.1.0", "NVIDIA H100 80GB HBM3", 16, 6400, "fp8_w8a8", None, False),  # C09: keys out of order
    ("3.5.1", "NVIDIA H200", 161, 192, "fp8_w8a8", None, True),          # per_channel_quant=True
]


@needs_shared
class SglangCompatTest(unittest.TestCase):
    runtimes = {}

    @classmethod
    def rt(cls, version):
        if version not in cls.runtimes:
            cls.runtimes[version] = kdispatch.Runtime(config_dirs=[SGLANG_MOE], backend_version=version,
                                                      shipped_configs=False, log_level="off")
        return cls.runtimes[version]

    @classmethod
    def tearDownClass(cls):
        for rt in cls.runtimes.values():
            rt.close()
        cls.runtimes.clear()

    def test_the_c06_answer(self):
        cfg = ks.try_get_optimal_moe_config((257, 512, 7168), (257, 7168, 256), 8, "fp8_w8a8", 1,
                                            block_shape=[128, 128], device_name="NVIDIA H200", runtime=self.rt("3.5.1"))
        self.assertEqual(cfg, C06_CONFIG)

    def test_get_moe_configs_returns_sglangs_table(self):
        for version, dev, E, N, dtype, block, pcq in CASES:
            with self.subTest(version=version, E=E, N=N, dtype=dtype):
                bn, bk = block or (0, 0)
                ref = ref_get_moe_configs(SGLANG_MOE, version, dev, E, N, dtype, bn, bk, pcq)
                self.assertIsNotNone(ref, "the test case's file is missing from the shared data")
                got = ks.get_moe_configs(E, N, dtype, bn, bk, pcq, device_name=dev, runtime=self.rt(version))
                self.assertEqual(got, ref)  # same M keys, same rows as written (num_warps absent where absent)

    def test_try_get_optimal_moe_config_same_except_ties(self):
        ties = 0
        for version, dev, E, N, dtype, block, pcq in CASES:
            if pcq:
                continue  # SGLang's try_get_optimal_moe_config has no per_channel_quant argument
            table = ref_get_moe_configs(SGLANG_MOE, version, dev, E, N, dtype, *(block or (0, 0)))
            w1, w2 = (E, 2 * N, 4096), (E, 4096, N)
            for M in probe_ms(table):
                with self.subTest(version=version, E=E, N=N, M=M):
                    got = ks.try_get_optimal_moe_config(w1, w2, 8, dtype, M, block_shape=block, device_name=dev,
                                                        runtime=self.rt(version))
                    want = ref_try_get_optimal(SGLANG_MOE, version, dev, w1, w2, 8, dtype, M, block_shape=block)
                    d = min(abs(k - M) for k in table)
                    tied = sorted(k for k in table if abs(k - M) == d)
                    if len(tied) > 1:  # the documented difference: the smaller key
                        ties += 1
                        self.assertEqual(got, table[tied[0]])
                    else:
                        self.assertEqual(got, want)
        self.assertGreater(ties, 0)

    def test_c09_tie_differs_from_sglang_on_purpose(self):
        table = ref_get_moe_configs(SGLANG_MOE, "3.1.0", "NVIDIA H100 80GB HBM3", 16, 6400, "fp8_w8a8")
        keys = list(table)
        self.assertLess(keys.index(3840), keys.index(3584))  # out of order in the file
        sglang = ref_try_get_optimal(SGLANG_MOE, "3.1.0", "NVIDIA H100 80GB HBM3", (16, 12800, 4096),
                                     (16, 4096, 6400), 2, "fp8_w8a8", 3712)
        ours = ks.try_get_optimal_moe_config((16, 12800, 4096), (16, 4096, 6400), 2, "fp8_w8a8", 3712,
                                             device_name="NVIDIA H100 80GB HBM3", runtime=self.rt("3.1.0"))
        self.assertEqual(sglang, table[3840])
        self.assertEqual(ours, table[3584])

    def test_defaults_when_there_is_no_table(self):
        rt = self.rt("3.5.1")
        for dtype, block, E, M, marlin in [("fp8_w8a8", None, 8, 4, False), ("fp8_w8a8", None, 8, 64, False),
                                           ("fp8_w8a8", [128, 128], 8, 64, False), (None, None, 8, 4, False),
                                           (None, None, 8, 64, False), (None, None, 8, 20, True),
                                           ("int8_w8a16", None, 8, 64, True), ("int4_w4a16", None, 3, 33, True)]:
            with self.subTest(dtype=dtype, block=block, M=M, marlin=marlin):
                w1, w2 = (E, 34, 64), (E, 64, 17)  # E, N = 17: no such file anywhere
                self.assertIsNone(ks.get_moe_configs(E, 17, dtype, *(block or (0, 0)), device_name="NVIDIA H200",
                                                     runtime=rt))
                got = ks.try_get_optimal_moe_config(w1, w2, 2, dtype, M, is_marlin=marlin, block_shape=block,
                                                    device_name="NVIDIA H200", runtime=rt)
                self.assertEqual(got, ref_get_default_config(M, E, 17, 64, 2, dtype, marlin, block))

    def test_down_table(self):
        rt = self.rt("3.5.1")
        dev = "NVIDIA H100 80GB HBM3"
        down = ks.get_moe_configs(128, 1024, "fp8_w8a8", down=True, device_name=dev, runtime=rt)
        with open(os.path.join(SGLANG_MOE, "triton_3_5_1",
                               "E=128,N=1024,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8_down.json")) as f:
            self.assertEqual(down, {int(k): v for k, v in json.load(f).items()})
        # no _down table for this key: the up table, as SGLang does
        self.assertEqual(ks.get_moe_configs(128, 1344, None, down=True, device_name="NVIDIA B200", runtime=rt),
                         ks.get_moe_configs(128, 1344, None, device_name="NVIDIA B200", runtime=rt))

    def test_file_name_and_device_errors(self):
        self.assertEqual(ks.get_config_file_name(257, 256, "fp8_w8a8", [128, 128], device_name="NVIDIA H200"),
                         ref_file_name(257, 256, "fp8_w8a8", "NVIDIA H200", [128, 128]))
        try:
            import torch  # noqa: F401
            has_cuda = torch.cuda.is_available()
        except ImportError:
            has_cuda = False
        if not has_cuda:
            with self.assertRaises(Error) as c:
                ks.get_moe_configs(257, 256, "fp8_w8a8", 128, 128, runtime=self.rt("3.5.1"))
            self.assertIs(c.exception.code, StatusCode.invalid_argument)
            self.assertIn("device_name", c.exception.message)


class SglangRuntimeTest(TempDirTest):
    def test_configure_and_reload_invalidates_the_cache(self):
        d = os.path.join(self.tmp, "configs")
        name = "triton_3_5_1/E=8,N=16,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
        self.write("configs/" + name, '{"1": {"BLOCK_SIZE_M": 16}, "64": {"BLOCK_SIZE_M": 64}}')
        rt = ks.configure(config_dirs=[d], backend_version="3.5.1", shipped_configs=False, log_level="off")
        self.addCleanup(rt.close)
        self.addCleanup(setattr, ks, "_runtime", None)  # back to the lazily built one
        self.assertIs(ks.get_runtime(), rt)
        args = ((8, 32, 128), (8, 128, 16), 2, "fp8_w8a8")
        self.assertEqual(ks.try_get_optimal_moe_config(*args, 40, device_name="NVIDIA H200"), {"BLOCK_SIZE_M": 64})
        self.write("configs/" + name, '{"1": {"BLOCK_SIZE_M": 16}, "32": {"BLOCK_SIZE_M": 32}}')
        # cached until the table changes through this runtime
        self.assertEqual(ks.try_get_optimal_moe_config(*args, 40, device_name="NVIDIA H200"), {"BLOCK_SIZE_M": 64})
        rt.reload()
        self.assertEqual(ks.try_get_optimal_moe_config(*args, 40, device_name="NVIDIA H200"), {"BLOCK_SIZE_M": 32})
        self.assertEqual(ks.get_moe_configs(8, 16, "fp8_w8a8", device_name="NVIDIA H200"),
                         {1: {"BLOCK_SIZE_M": 16}, 32: {"BLOCK_SIZE_M": 32}})
        # returned dicts are copies: mutating one changes nothing
        ks.get_moe_configs(8, 16, "fp8_w8a8", device_name="NVIDIA H200")[1]["BLOCK_SIZE_M"] = 999
        self.assertEqual(ks.get_moe_configs(8, 16, "fp8_w8a8", device_name="NVIDIA H200")[1], {"BLOCK_SIZE_M": 16})
        ks.cache_clear()
        with self.assertRaises(TypeError):
            ks.configure(rt, config_dirs=[d])


if __name__ == "__main__":
    unittest.main()
