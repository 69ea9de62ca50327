# SPDX-License-Identifier: Apache-2.0
"""kdispatch.sglang against a transcription of SGLang's own functions at the
commit the shared data tracks (d55f1c28, 2026-08-18), over every SGLang file
in ../shared/data: strict_sglang=True gives SGLang's answers everywhere; the
default mode gives them except the two documented differences (version
folders, nearest-M ties), each counted and shown on its example.

Where the transcription comes from (read with the project's search tool):

FMC = sgl-project/sglang, python/sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py,
      the version at d55f1c28 as the search index stores it (read_file id 54512172535; the index
      names no commit for that copy, and d55f1c28 itself is not stored). It is pinned to
      d55f1c28 by sgl-project/sglang issue #35252 (filed 2026-08-18, "the bug persists in the
      latest version"), which quotes "fused_moe_triton_config.py:284: E, _, N = w2_shape": line
      284 of this copy exactly. The index's older copies (sgl-project/sglang 7386515 and 02c7c97)
      lack the shared-memory fp8 default and the _down -> up-table fallback; a newer copy (id
      67541206396) adds ROCm padding-aware fp8 tiers and moves that line to ~400.
FP8K = sgl-project/sglang, python/sglang/kernels/ops/quantization/fp8_kernel.py at commit
      0fbab45d95dae9a425047dfb60d570fe2a1c08d8 (read_file id 54546178530), the nearest stored
      version with d55f1c28's layout (block-fp8 configs under kernels/ops/quantization/configs,
      shared/data/README.md). Its BLOCK_SIZE_K rule is sgl-project/sglang PR #27553 (2026-06-08,
      merged before d55f1c28). The index gives this file by character offset, not line:
      ``def get_w8a8_block_fp8_configs(`` starts at character 36003; lines below are counted
      from that ``def`` line (+0).
"""

import functools
import json
import os
import re
import unittest
import warnings

import kdispatch.sglang as ks
from kdispatch import Error, StatusCode
from support import C06_CONFIG, SGLANG_MOE, SHARED, TempDirTest, needs_shared

SGLANG_QUANT = os.path.join(SHARED, "data", "sglang-configs", "quantization")


# =========================================== SGLang at d55f1c28, transcribed
# FMC line 17
LOW_SMEM_FP8_DEFAULT_CUTOFF_BYTES = 128 * 1024


def sg_use_low_smem_fp8_default(smem_optin, is_hip):
    """FMC lines 20-33: torch's shared_memory_per_block_optin of the current
    device (None on ROCm, or when torch sees no GPU) below the cutoff."""
    smem_limit = None if is_hip else smem_optin
    return smem_limit is not None and smem_limit < LOW_SMEM_FP8_DEFAULT_CUTOFF_BYTES


def sg_get_config_file_name(device, E, N, dtype, block_shape=None, per_channel_quant=False, down_moe=False):
    """FMC lines 36-51 (get_device_name() is `device`)."""
    device_name = device.replace(" ", "_")
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_shape_selector = "" if not block_shape or not all(block_shape) else f",block_shape={block_shape}"
    per_channel_quant_selector = ",per_channel_quant=True" if per_channel_quant else ""
    down_moe_selector = "_down" if down_moe else ""
    return (f"E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}"
            f"{per_channel_quant_selector}{down_moe_selector}.json")


def _version_order(configs_root, triton_version, json_file_name, policy):
    """The folders tried after the running version's. "sglang": FMC lines
    114-124, every triton_* folder newest first. "kdispatch" (documented
    difference 1, docs/config-files.md): the newest older folder holding the
    table, then the newest newer one."""
    available_versions = sorted(
        (d.removeprefix("triton_").replace("_", ".") for d in os.listdir(configs_root) if d.startswith("triton_")),
        key=lambda v: tuple(int(x) for x in v.split(".")), reverse=True)
    if policy == "sglang":
        return available_versions
    run = tuple(int(x) for x in triton_version.split("."))
    have = [v for v in available_versions
            if os.path.exists(os.path.join(configs_root, f"triton_{v.replace('.', '_')}", json_file_name))]
    return ([v for v in have if tuple(int(x) for x in v.split(".")) <= run]
            + [v for v in have if tuple(int(x) for x in v.split(".")) > run])


@functools.lru_cache(maxsize=None)  # as FMC line 54
def sg_get_moe_configs(configs_root, triton_version, device, E, N, dtype, block_n=0, block_k=0,
                       per_channel_quant=False, down_moe=False, policy="sglang"):
    """FMC lines 54-177. config_dir/"configs" is `configs_root`,
    triton.__version__ is `triton_version`; the deterministic-inference early
    return (lines 72-76) is off."""
    json_file_name = sg_get_config_file_name(device, E, N, dtype, [block_n, block_k], per_channel_quant,
                                             down_moe=down_moe)
    config_file_path = os.path.join(configs_root, f"triton_{triton_version.replace('.', '_')}", json_file_name)
    if os.path.exists(config_file_path):  # lines 103-112
        with open(config_file_path) as f:
            return {int(key): val for key, val in json.load(f).items()}
    for try_triton_version in _version_order(configs_root, triton_version, json_file_name, policy):  # 126-140
        if try_triton_version == triton_version:
            continue
        try_config_file_path = os.path.join(configs_root, f"triton_{try_triton_version.replace('.', '_')}",
                                            json_file_name)
        if os.path.exists(try_config_file_path):
            with open(try_config_file_path) as f:
                return {int(key): val for key, val in json.load(f).items()}
    if down_moe:  # lines 142-161: no _down table anywhere: the up table
        up_configs = sg_get_moe_configs(configs_root, triton_version, device, E, N, dtype, block_n, block_k,
                                        per_channel_quant, down_moe=False, policy=policy)
        if up_configs is not None:
            return up_configs
    return None  # line 177


def sg_get_default_config(M, E, N, K, topk, dtype, is_marlin, block_shape=None, *, is_hip=False, smem_optin=None):
    """FMC lines 180-261 (`_is_hip` is `is_hip`; deterministic inference off)."""
    if dtype == "fp8_w8a8":
        if block_shape is None:
            if sg_use_low_smem_fp8_default(smem_optin, is_hip):  # lines 200-217
                config = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1,
                          "num_warps": 4, "num_stages": 4}
                if M > E:
                    config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 64,
                              "num_warps": 4, "num_stages": 2}
            else:  # lines 218-235
                config = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                          "num_warps": 8, "num_stages": 2 if is_hip else 4}
                if M <= E:
                    config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                              "num_warps": 4, "num_stages": 2 if is_hip else 4}
        else:  # lines 236-245
            config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": block_shape[0], "BLOCK_SIZE_K": block_shape[1],
                      "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 2 if is_hip else 3}
    else:  # lines 246-260
        config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
        if M <= E or (is_marlin and M <= 32):
            config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return config


def sg_try_get_optimal_moe_config(get_moe_configs, w1_shape, w2_shape, top_k, dtype, M, is_marlin=False,
                                  block_shape=None, per_channel_quant=False, return_down_config=False, *,
                                  is_hip=False, smem_optin=None, tie="file"):
    """FMC lines 264-340; `get_moe_configs(E, N, dtype, block_n, block_k,
    per_channel_quant, down_moe)` is the table source; get_config()'s
    override (lines 275, 279-281) is off. tie="file" is line 300's
    min(configs.keys(), key=lambda x: abs(x - M)); tie="smaller" is
    documented difference 2."""
    def nearest(configs):
        if tie == "file":
            return configs[min(configs.keys(), key=lambda x: abs(x - M))]
        return configs[min(configs.keys(), key=lambda x: (abs(x - M), x))]

    down_config = None
    max_block_m = None
    E, _, N = w2_shape  # line 284
    block_n = block_shape[0] if block_shape else 0
    block_k = block_shape[1] if block_shape else 0
    configs = get_moe_configs(E, N, dtype, block_n, block_k, per_channel_quant, False)
    if configs:  # lines 297-305
        config = nearest(configs)
    else:
        config = sg_get_default_config(M, E, N, w1_shape[2], top_k, dtype, is_marlin, block_shape, is_hip=is_hip,
                                       smem_optin=smem_optin)
    if return_down_config:  # lines 306-323
        down_configs = get_moe_configs(E, N, dtype, block_n, block_k, per_channel_quant, True)
        if down_configs:
            down_config = dict(**nearest(down_configs))
            max_block_m = max([cfg["BLOCK_SIZE_M"] for cfg in down_configs.values()])
    if return_down_config:  # lines 324-339
        if down_config is not None and config["BLOCK_SIZE_M"] != down_config["BLOCK_SIZE_M"]:
            down_config["BLOCK_SIZE_M"] = config["BLOCK_SIZE_M"]
        return config, (down_config, max_block_m)
    return config  # line 340


def sg_get_w8a8_block_fp8_configs(configs_dir, device, N, K, block_n, block_k, *, is_cuda):
    """FP8K def+0..+62 (torch._dynamo.is_compiling() off, lines +14/+15;
    `_is_cuda` is `is_cuda`)."""
    device_name = device.replace(" ", "_")  # +19
    json_file_name = f"N={N},K={K},device_name={device_name},dtype=fp8_w8a8,block_shape=[{block_n}, {block_k}].json"
    config_file_path = os.path.join(configs_dir, json_file_name)  # +22..+24
    if os.path.exists(config_file_path):  # +25..+31
        with open(config_file_path) as f:
            raw = {int(key): val for key, val in json.load(f).items()}
        sanitized = {}  # +33..+41
        for m_key, cfg in raw.items():
            if cfg["BLOCK_SIZE_K"] < block_k and (not is_cuda or block_k % cfg["BLOCK_SIZE_K"] != 0):
                cfg = {**cfg, "BLOCK_SIZE_K": block_k}
            sanitized[m_key] = cfg
        return sanitized  # +51
    return None  # +62


# ========================================================= the shared files
MOE_NAME = re.compile(r"^E=(\d+),N=(\d+),device_name=(.*?)(?:,dtype=([a-z0-9_]+?))?"
                      r"(?:,block_shape=\[(\d+), ?(\d+)\])?(,per_channel_quant=True)?(_down)?\.json$")
QUANT_NAME = re.compile(r"^N=(\d+),K=(\d+),device_name=(.*?),dtype=([a-z0-9_]+?)"
                        r"(?:,block_shape=\[(\d+), ?(\d+)\])?\.json$")


def torch_name(file_device):
    """The name torch reports for a file's device_name (files turn its spaces into '_')."""
    return file_device.replace("_", " ")


def moe_files():
    """[(folder, file name, key, is a _down table)] of every fused-MoE table;
    key = (E, N, device as the file spells it, dtype, block_shape, per_channel_quant)."""
    out = []
    for folder in sorted(os.listdir(SGLANG_MOE)):
        if not folder.startswith("triton_"):
            continue  # the 4 foreign JSON files at the top level (causal_conv1d_*, ...) are no tables
        for name in sorted(os.listdir(os.path.join(SGLANG_MOE, folder))):
            m = MOE_NAME.match(name)
            assert m, name
            E, N, dev, dtype, bn, bk, pcq, down = m.groups()
            block = [int(bn), int(bk)] if bn else None
            out.append((folder, name, (int(E), int(N), dev, dtype, None if block is None else tuple(block), bool(pcq)),
                        bool(down)))
    return out


def probe_ms(keys):
    """Every key, the two Ms around each midpoint (the midpoint itself when it
    is an integer: a tie), and the extremes: M <= 0, the largest int64, past it."""
    ks_ = sorted(keys)
    ms = set(ks_) | {-3, 0, 1, 2, 3, (1 << 63) - 1, 1 << 63, (1 << 64) + 5}
    for a, b in zip(ks_, ks_[1:]):
        ms |= {(a + b) // 2, (a + b + 1) // 2}
    return sorted(ms)


# Triton versions the tests run under: every folder, one between two
# folders (3.5.0), one below all (3.0.0), one above all (3.9.0).
FOLDER_VERSIONS = ["3.1.0", "3.2.0", "3.3.0", "3.3.1", "3.4.0", "3.5.1", "3.6.0", "3.7.1"]
VERSIONS = FOLDER_VERSIONS + ["3.0.0", "3.5.0", "3.9.0"]

# Devices for the no-table defaults: (is ROCm, shared_memory_per_block_optin) as the hardware has it.
DEVICE_FACTS = {
    "NVIDIA L40S": (False, 101376), "NVIDIA GeForce RTX 4090": (False, 101376), "NVIDIA L40": (False, 101376),
    "NVIDIA L20": (False, 101376), "NVIDIA RTX 6000 Ada Generation": (False, 101376), "NVIDIA A10": (False, 101376),
    "NVIDIA GB10": (False, 101376), "NVIDIA RTX PRO 6000 Blackwell Server Edition": (False, 101376),
    "NVIDIA H200": (False, 232448), "NVIDIA H100 80GB HBM3": (False, 232448), "NVIDIA H20": (False, 232448),
    "NVIDIA B200": (False, 232448), "NVIDIA A100-SXM4-80GB": (False, 166912), "NVIDIA A800-SXM4-80GB": (False, 166912),
    "AMD Instinct MI300X": (True, None), "AMD Instinct MI355X": (True, None), "AMD Radeon Graphics": (True, None),
    "Made-up Accelerator 9000": (False, None),  # unknown to the shim: SGLang without readable properties
}


class _Runtimes:
    """One runtime per Triton version over SGLang's two config folders, made
    with kdispatch.sglang.configure (which records the dirs and version the
    strict mode reads)."""
    runtimes = {}

    @classmethod
    def rt(cls, version):
        if version not in cls.runtimes:
            cls.runtimes[version] = ks.configure(config_dirs=[SGLANG_MOE, SGLANG_QUANT], backend_version=version,
                                                 shipped_configs=False, log_level="off")
        return cls.runtimes[version]

    @classmethod
    def close_all(cls):
        for rt in cls.runtimes.values():
            rt.close()
        cls.runtimes.clear()
        ks._runtime = None
        ks._strict = False


@needs_shared
class SglangOracleTest(unittest.TestCase):
    """The shim against the transcription, over every SGLang file in ../shared/data."""

    @classmethod
    def setUpClass(cls):
        cls.files = moe_files()

    @classmethod
    def tearDownClass(cls):
        _Runtimes.close_all()

    @staticmethod
    def oracle_tables(version, dev, policy):
        """The transcribed get_moe_configs for one running version and device."""
        return lambda E, N, dtype, bn, bk, pcq, down: sg_get_moe_configs(SGLANG_MOE, version, dev, E, N, dtype, bn, bk,
                                                                         pcq, down, policy)

    def test_every_moe_file_get_moe_configs(self):
        """Every key of every file (its up and _down tables), under the running
        versions that matter for it, both modes: strict = SGLang's table, in
        file order; default = the same but for the version folder (documented
        difference 1), keys ascending."""
        self.assertEqual(len(self.files), 264)
        folders = {}
        for folder, name, key, down in self.files:
            folders.setdefault(key, set()).add(folder[len("triton_"):].replace("_", "."))
        self.assertEqual(len(folders), 237)  # a key's up and _down files count once
        compared = folder_differs = found = 0
        for (E, N, dev, dtype, block, pcq), where_found in sorted(folders.items(), key=repr):
            # a key in one folder: that version, one between, below and above all; else all 11
            versions = VERSIONS if len(where_found) > 1 else sorted(where_found | {"3.0.0", "3.5.0", "3.9.0"})
            for version in versions:
                rt = _Runtimes.rt(version)
                bn, bk = block or (0, 0)
                for down in (False, True):
                    want = sg_get_moe_configs(SGLANG_MOE, version, dev, E, N, dtype, bn, bk, pcq, down)
                    want_kd = sg_get_moe_configs(SGLANG_MOE, version, dev, E, N, dtype, bn, bk, pcq, down, "kdispatch")
                    strict = ks.get_moe_configs(E, N, dtype, bn, bk, pcq, down, device_name=torch_name(dev), runtime=rt,
                                                strict_sglang=True)
                    got = ks.get_moe_configs(E, N, dtype, bn, bk, pcq, down_moe=down, device_name=torch_name(dev),
                                             runtime=rt)
                    where = (version, E, N, dev, dtype, block, pcq, down)
                    self.assertEqual(strict and list(strict.items()), want and list(want.items()), where)  # file order
                    self.assertEqual(got, want_kd, where)
                    self.assertEqual(got and list(got), got and sorted(got), where)  # kdispatch's: ascending keys
                    compared += 2
                    found += want is not None
                    folder_differs += want != want_kd
        self.assertEqual(compared, 4128)  # 2,064 (key, version, up/_down) tables, each asked in both modes
        self.assertEqual(found, 2044)  # the other 20: the up table of the 5 keys that have only _down files
        # documented difference 1: SGLang takes a newer folder where kdispatch takes an older one
        self.assertEqual(folder_differs, 34)

    def test_every_moe_file_try_get_optimal_moe_config(self):
        """Every key at Triton 3.5.1 (a key in several folders: under all 11
        versions), at its keys, around each midpoint and at the extremes, in
        both call forms and both modes: strict = SGLang; default = SGLang but
        for the two documented differences, each counted."""
        by_key = {}
        for folder, name, key, down in self.files:
            by_key.setdefault(key, set()).add(folder)
        self.assertEqual(len(by_key), 237)  # a key's up and _down files count once
        lookups = folder_differs = ties = 0
        for key, folders in sorted(by_key.items(), key=lambda kv: repr(kv[0])):
            E, N, dev, dtype, block, pcq = key
            bs = None if block is None else list(block)
            w1, w2 = (E, 2 * N, 4096), (E, 4096, N)
            for version in (VERSIONS if len(folders) > 1 else ["3.5.1"]):
                rt = _Runtimes.rt(version)
                sg = self.oracle_tables(version, dev, "sglang")
                kd = self.oracle_tables(version, dev, "kdispatch")
                ms = probe_ms(set(sg(E, N, dtype, *(block or (0, 0)), pcq, False) or ())
                              | set(sg(E, N, dtype, *(block or (0, 0)), pcq, True) or ()))
                for M in ms:
                    where = (version, key, M)
                    want = sg_try_get_optimal_moe_config(sg, w1, w2, 8, dtype, M, False, bs, pcq, True)
                    want_kd = sg_try_get_optimal_moe_config(kd, w1, w2, 8, dtype, M, False, bs, pcq, True,
                                                            tie="smaller")
                    for strict, expected in ((True, want), (False, want_kd)):
                        self.assertEqual(ks.try_get_optimal_moe_config(w1, w2, 8, dtype, M, False, bs, pcq, True,
                                                                       device_name=torch_name(dev), runtime=rt,
                                                                       strict_sglang=strict),
                                         expected, (strict,) + where)
                        self.assertEqual(ks.try_get_optimal_moe_config(w1, w2, 8, dtype, M, block_shape=bs,
                                                                       per_channel_quant=pcq,
                                                                       device_name=torch_name(dev), runtime=rt,
                                                                       strict_sglang=strict),
                                         expected[0], (strict,) + where)
                        lookups += 2
                    if want != sg_try_get_optimal_moe_config(kd, w1, w2, 8, dtype, M, False, bs, pcq, True):
                        folder_differs += 1  # difference 1: kdispatch's folder, another table
                    elif want != want_kd:
                        ties += 1  # difference 2: the same table, a tie broken the other way
        self.assertEqual(lookups, 55876)  # 13,969 (key, version, M), 4 calls each
        self.assertEqual((folder_differs, ties), (624, 13))

    def test_the_two_documented_differences(self):
        # 1. version folders: Triton 3.4.0, DeepSeek-V3 on an H200 (files in 3.2.0, 3.3.1, 3.5.1)
        rt = _Runtimes.rt("3.4.0")
        args = ((257, 512, 7168), (257, 7168, 256), 8, "fp8_w8a8", 1)
        strict = ks.try_get_optimal_moe_config(*args, block_shape=[128, 128], device_name="NVIDIA H200", runtime=rt,
                                               strict_sglang=True)
        ours = ks.try_get_optimal_moe_config(*args, block_shape=[128, 128], device_name="NVIDIA H200", runtime=rt)
        self.assertEqual(strict, C06_CONFIG)  # triton_3_5_1's row
        self.assertEqual(ours, {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16,
                                "num_warps": 4, "num_stages": 4})  # triton_3_3_1's row
        # 2. ties: triton_3_1_0/E=16,N=6400 H100 lists 3840 before 3584; M = 3712 is halfway
        rt = _Runtimes.rt("3.1.0")
        table = sg_get_moe_configs(SGLANG_MOE, "3.1.0", "NVIDIA_H100_80GB_HBM3", 16, 6400, "fp8_w8a8")
        keys = list(table)
        self.assertLess(keys.index(3840), keys.index(3584))
        args = ((16, 12800, 4096), (16, 4096, 6400), 2, "fp8_w8a8", 3712)
        strict = ks.try_get_optimal_moe_config(*args, device_name="NVIDIA H100 80GB HBM3", runtime=rt,
                                               strict_sglang=True)
        ours = ks.try_get_optimal_moe_config(*args, device_name="NVIDIA H100 80GB HBM3", runtime=rt)
        self.assertEqual(strict, table[3840])
        self.assertEqual(strict, {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 8,
                                  "num_warps": 4, "num_stages": 4})
        self.assertEqual(ours, table[3584])
        self.assertEqual(ours, {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16,
                                "num_warps": 4, "num_stages": 2})
        # configure(..., strict_sglang=True) makes strict the default
        rt = ks.configure(config_dirs=[SGLANG_MOE], backend_version="3.1.0", shipped_configs=False, log_level="off",
                          strict_sglang=True)
        self.addCleanup(rt.close)
        self.assertEqual(ks.try_get_optimal_moe_config(*args, device_name="NVIDIA H100 80GB HBM3"), table[3840])
        self.assertEqual(ks.try_get_optimal_moe_config(*args, device_name="NVIDIA H100 80GB HBM3",
                                                       strict_sglang=False), table[3584])
        ks.configure(rt)  # back to the default mode
        self.assertEqual(ks.try_get_optimal_moe_config(*args, device_name="NVIDIA H100 80GB HBM3"), table[3584])

    def test_the_c06_answer_and_m_extremes(self):
        rt = _Runtimes.rt("3.5.1")
        w1, w2 = (257, 512, 7168), (257, 7168, 256)
        table = ks.get_moe_configs(257, 256, "fp8_w8a8", 128, 128, device_name="NVIDIA H200", runtime=rt)
        self.assertEqual(min(table), 1)
        self.assertEqual(max(table), 1024)
        for strict in (False, True):
            def get(M):
                return ks.try_get_optimal_moe_config(w1, w2, 8, "fp8_w8a8", M, block_shape=[128, 128],
                                                     device_name="NVIDIA H200", runtime=rt, strict_sglang=strict)
            self.assertEqual(get(1), C06_CONFIG)
            self.assertEqual(get(0), C06_CONFIG)        # M = 0: the smallest key's row (it raised before)
            self.assertEqual(get(-5), C06_CONFIG)
            biggest = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                       "num_warps": 4, "num_stages": 4}
            self.assertEqual(table[1024], biggest)
            self.assertEqual(get(1 << 63), biggest)     # past int64: the largest key's row
            self.assertEqual(get((1 << 64) + 16), biggest)

    def test_return_down_config(self):
        rt = _Runtimes.rt("3.5.1")
        w1, w2 = (257, 512, 7168), (257, 7168, 256)
        for strict in (False, True):
            config, (down, max_block_m) = ks.try_get_optimal_moe_config(
                w1, w2, 8, "fp8_w8a8", 1, block_shape=[128, 128], return_down_config=True, device_name="NVIDIA H200",
                runtime=rt, strict_sglang=strict)
            self.assertEqual(config, C06_CONFIG)
            # triton_3_5_1/..._down.json's M=1 row (BLOCK_SIZE_M 16 like the up row), and its largest BLOCK_SIZE_M
            self.assertEqual(down, {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16,
                                    "num_warps": 4, "num_stages": 2, "USE_TMA": True})
            self.assertEqual(max_block_m, 64)
        # a down row whose BLOCK_SIZE_M differs from the up row's takes the up row's (one shared sort)
        raw = ks.get_moe_configs(257, 256, "fp8_w8a8", 128, 128, down_moe=True, device_name="NVIDIA H200", runtime=rt)
        overridden = 0
        for M in probe_ms(raw):
            config, (down, _) = ks.try_get_optimal_moe_config(w1, w2, 8, "fp8_w8a8", M, block_shape=[128, 128],
                                                              return_down_config=True, device_name="NVIDIA H200",
                                                              runtime=rt)
            row = raw[min(raw, key=lambda k: (abs(k - M), k))]
            self.assertEqual(down, {**row, "BLOCK_SIZE_M": config["BLOCK_SIZE_M"]}, M)
            overridden += row["BLOCK_SIZE_M"] != config["BLOCK_SIZE_M"]
        self.assertEqual(overridden, 0)  # SGLang's tuner keeps them equal here (the override: SglangRuntimeTest)
        # no _down table: the up table serves both (SGLang at d55f1c28), max over the up rows
        config, (down, max_block_m) = ks.try_get_optimal_moe_config(
            (128, 1536, 2048), (128, 2048, 768), 8, None, 1, return_down_config=True, device_name="NVIDIA H200",
            runtime=rt)
        self.assertEqual(down, config)
        self.assertEqual(max_block_m, 128)
        # no table at all: the default, and (None, None)
        self.assertEqual(ks.try_get_optimal_moe_config((8, 34, 64), (8, 64, 17), 2, None, 64, return_down_config=True,
                                                       device_name="NVIDIA H200", runtime=rt),
                         ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}, (None, None)))
        # the _down table itself, as written, and the former spelling down=True
        with open(os.path.join(SGLANG_MOE, "triton_3_5_1",
                               "E=128,N=1024,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8_down.json")) as f:
            want = {int(k): v for k, v in json.load(f).items()}
        self.assertEqual(ks.get_moe_configs(128, 1024, "fp8_w8a8", down_moe=True, device_name="NVIDIA H100 80GB HBM3",
                                            runtime=rt), want)
        self.assertEqual(ks.get_moe_configs(128, 1024, "fp8_w8a8", down=True, device_name="NVIDIA H100 80GB HBM3",
                                            runtime=rt), want)

    def test_defaults_and_the_shared_memory_rule(self):
        """No table: SGLang's get_default_config, by device, for every dtype
        branch and M around E; fp8 without a block shape is the smaller tile on
        the < 128 KiB CUDA GPUs (the device-name table), never on ROCm."""
        rt = _Runtimes.rt("3.5.1")
        compared = low = 0
        cases = [("fp8_w8a8", None, False), ("fp8_w8a8", [128, 128], False), ("fp8_w8a8", [64, 32], False),
                 (None, None, False), (None, None, True), ("int8_w8a16", None, True), ("int4_w4a16", None, True),
                 ("int8_w8a8", [128, 128], False)]
        for dev, (is_hip, smem) in DEVICE_FACTS.items():
            for dtype, block, marlin in cases:
                for E in (1, 8, 64, 257):
                    for M in (-1, 0, 1, 31, 32, 33, E - 1, E, E + 1, 4096, 1 << 64):
                        w1, w2 = (E, 34, 64), (E, 64, 17)  # N = 17: no such file anywhere
                        want = sg_get_default_config(M, E, 17, 64, 2, dtype, marlin, block, is_hip=is_hip,
                                                     smem_optin=smem)
                        for strict in (False, True):
                            got = ks.try_get_optimal_moe_config(w1, w2, 2, dtype, M, marlin, block, device_name=dev,
                                                                runtime=rt, strict_sglang=strict)
                            self.assertEqual(got, want, (dev, dtype, block, marlin, E, M))
                        self.assertEqual(ks.get_default_config(M, E, 17, 64, 2, dtype, marlin, block, device_name=dev),
                                         want)
                        compared += 3
                        low += want.get("BLOCK_SIZE_K") == 256
        self.assertEqual(compared, 3 * len(DEVICE_FACTS) * len(cases) * 4 * 11)
        self.assertEqual(low, 8 * 4 * 11)  # 8 devices below 128 KiB, fp8 without a block shape only
        # known values: L40S / RTX 4090 (99 KiB) against H200 (227 KiB) and MI300X (ROCm)
        for dev in ("NVIDIA L40S", "NVIDIA GeForce RTX 4090"):
            self.assertEqual(ks.get_default_config(4, 8, 17, 64, 2, "fp8_w8a8", False, device_name=dev),
                             {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1,
                              "num_warps": 4, "num_stages": 4})
            self.assertEqual(ks.get_default_config(64, 8, 17, 64, 2, "fp8_w8a8", False, device_name=dev),
                             {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 64,
                              "num_warps": 4, "num_stages": 2})
        self.assertEqual(ks.get_default_config(64, 8, 17, 64, 2, "fp8_w8a8", False, device_name="NVIDIA H200"),
                         {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                          "num_warps": 8, "num_stages": 4})
        self.assertEqual(ks.get_default_config(64, 8, 17, 64, 2, "fp8_w8a8", False, device_name="AMD Instinct MI300X"),
                         {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                          "num_warps": 8, "num_stages": 2})
        # the argument: for a device the table does not know, and over the table; never on ROCm
        small = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 64, "num_warps": 4,
                 "num_stages": 2}
        for dev in ("Made-up Accelerator 9000", "NVIDIA H200"):
            self.assertEqual(ks.get_default_config(64, 8, 17, 64, 2, "fp8_w8a8", False, device_name=dev,
                                                   shared_memory_per_block_optin=99 * 1024), small)
            self.assertEqual(ks.try_get_optimal_moe_config((8, 34, 64), (8, 64, 17), 2, "fp8_w8a8", 64,
                                                           device_name=dev, runtime=rt,
                                                           shared_memory_per_block_optin=99 * 1024), small)
        self.assertEqual(ks.get_default_config(64, 8, 17, 64, 2, "fp8_w8a8", False, device_name="NVIDIA L40S",
                                               shared_memory_per_block_optin=227 * 1024)["BLOCK_SIZE_K"], 128)
        self.assertEqual(ks.get_default_config(64, 8, 17, 64, 2, "fp8_w8a8", False, device_name="AMD Instinct MI300X",
                                               shared_memory_per_block_optin=64 * 1024)["num_stages"], 2)
        # deterministic inference (SGLang's server flag)
        det = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
        self.assertEqual(ks.get_default_config(1, 8, 17, 64, 2, "fp8_w8a8", False, device_name="NVIDIA L40S",
                                               deterministic_inference=True), det)
        self.assertEqual(ks.try_get_optimal_moe_config((257, 512, 7168), (257, 7168, 256), 8, "fp8_w8a8", 1,
                                                       block_shape=[128, 128], return_down_config=True,
                                                       device_name="NVIDIA H200", runtime=rt,
                                                       deterministic_inference=True), (det, (None, None)))
        self.assertIsNone(ks.get_moe_configs(257, 256, "fp8_w8a8", 128, 128, device_name="NVIDIA H200", runtime=rt,
                                             deterministic_inference=True))

    def test_every_quantization_file_block_fp8(self):
        """get_w8a8_block_fp8_configs for the (N, K, device, block) of every
        file in quantization/ (fp8, int8 and channelwise alike: the function
        reads only fp8 block files), both modes, with the BLOCK_SIZE_K rule."""
        rt = _Runtimes.rt("3.5.1")
        names = sorted(os.listdir(SGLANG_QUANT))
        self.assertEqual(len(names), 113)
        compared = tables = clamped = kept = 0
        for name in names:
            m = QUANT_NAME.match(name)
            self.assertIsNotNone(m, name)
            N, K, dev, dtype, bn, bk = m.groups()
            N, K, bn, bk = int(N), int(K), int(bn or 128), int(bk or 128)
            is_cuda = not dev.startswith("AMD")
            want = sg_get_w8a8_block_fp8_configs(SGLANG_QUANT, dev, N, K, bn, bk, is_cuda=is_cuda)
            for strict in (False, True):
                got = ks.get_w8a8_block_fp8_configs(N, K, bn, bk, device_name=torch_name(dev), runtime=rt,
                                                    strict_sglang=strict)
                self.assertEqual(got, want, (name, strict))
                if strict and want is not None:
                    self.assertEqual(list(got), list(want))  # file order
                compared += 1
            if want is not None and dtype == "fp8_w8a8":
                tables += 1
                with open(os.path.join(SGLANG_QUANT, name)) as f:
                    raw = {int(k): v for k, v in json.load(f).items()}
                clamped += sum(raw[k]["BLOCK_SIZE_K"] != want[k]["BLOCK_SIZE_K"] for k in raw)
                kept += sum(raw[k]["BLOCK_SIZE_K"] == want[k]["BLOCK_SIZE_K"] < bk for k in raw)
        self.assertEqual(compared, 226)
        self.assertEqual(tables, 84)
        self.assertEqual((clamped, kept), (1, 9))  # ROCm clamps 64 -> 128; CUDA keeps 64 when it divides 128
        # known values: a ROCm row clamped, a CUDA row kept (the L40 case of PR #27553: 128 would not fit in smem)
        self.assertEqual(ks.get_w8a8_block_fp8_configs(7168, 256, 128, 128, device_name="AMD Radeon Graphics",
                                                       runtime=rt)[2],
                         {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 8,
                          "num_warps": 4, "num_stages": 2, "waves_per_eu": 0})
        self.assertEqual(ks.get_w8a8_block_fp8_configs(2048, 4096, 128, 128, device_name="NVIDIA L40", runtime=rt)[16],
                         {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                          "num_warps": 4, "num_stages": 4})
        self.assertIsNone(ks.get_w8a8_block_fp8_configs(1536, 1537, 128, 128, device_name="NVIDIA H20", runtime=rt))
        self.assertEqual(ks.get_w8a8_block_fp8_configs(1536, 1536, 128, 128, device_name="NVIDIA H20", runtime=rt)[1],
                         {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 64,
                          "num_warps": 8, "num_stages": 4})

    def test_file_names_and_argument_errors(self):
        rt = _Runtimes.rt("3.5.1")
        for down in (False, True):
            self.assertEqual(ks.get_config_file_name(257, 256, "fp8_w8a8", [128, 128], down_moe=down,
                                                     device_name="NVIDIA H200"),
                             sg_get_config_file_name("NVIDIA H200", 257, 256, "fp8_w8a8", [128, 128], down_moe=down))
        self.assertEqual(ks.get_config_file_name(8, 7168, None, [0, 0], device_name="NVIDIA H200"),
                         "E=8,N=7168,device_name=NVIDIA_H200.json")
        args = ((257, 512, 7168), (257, 7168, 256), 8, "fp8_w8a8")
        with self.assertRaises(TypeError) as c:
            ks.try_get_optimal_moe_config(*args, 1.5, device_name="NVIDIA H200", runtime=rt)
        self.assertIn("M:", str(c.exception))
        with self.assertRaises(ValueError) as c:
            ks.try_get_optimal_moe_config(args[0], (257, 7168), 8, "fp8_w8a8", 1, device_name="NVIDIA H200", runtime=rt)
        self.assertIn("w2_shape", str(c.exception))
        with self.assertRaises(ValueError) as c:
            ks.try_get_optimal_moe_config(*args, 1, block_shape=[128, 128, 1], device_name="NVIDIA H200", runtime=rt)
        self.assertIn("block_shape", str(c.exception))
        with self.assertRaises(ValueError) as c:
            ks.try_get_optimal_moe_config((8,), (8, 64, 17), 2, None, 1, device_name="NVIDIA H200", runtime=rt)
        self.assertIn("w1_shape", str(c.exception))
        with self.assertRaises(ValueError) as c:
            ks.get_default_config(1, 8, 17, 64, 2, "fp8_w8a8", False, device_name="NVIDIA H200",
                                  shared_memory_per_block_optin=-1)
        self.assertIn("shared_memory_per_block_optin", str(c.exception))
        with self.assertRaises(Error) as c:
            ks.get_moe_configs(257, 256, "fp8_w8a8", 128, 128, device_name=7, runtime=rt)
        self.assertIn("device_name", c.exception.message)
        try:
            import torch
            has_cuda = torch.cuda.is_available()
        except ImportError:
            has_cuda = False
        if not has_cuda:
            for call in (lambda: ks.get_moe_configs(257, 256, "fp8_w8a8", 128, 128, runtime=rt),
                         lambda: ks.try_get_optimal_moe_config(*args, 1, runtime=rt),
                         lambda: ks.get_w8a8_block_fp8_configs(1536, 1536, 128, 128, runtime=rt)):
                with self.assertRaises(Error) as c:
                    call()
                self.assertIs(c.exception.code, StatusCode.invalid_argument)
                self.assertIn("device_name", c.exception.message)
            # the default needs no device: SGLang's regular CUDA default
            self.assertEqual(ks.get_default_config(64, 8, 17, 64, 2, "fp8_w8a8", False)["BLOCK_SIZE_K"], 128)


class SglangRuntimeTest(TempDirTest):
    def tearDown(self):
        ks._runtime = None  # back to the lazily built one
        ks._strict = False

    def test_configure_and_reload_invalidates_the_cache(self):
        d = os.path.join(self.tmp, "configs")
        name = "triton_3_5_1/E=8,N=16,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
        self.write("configs/" + name, '{"1": {"BLOCK_SIZE_M": 16}, "64": {"BLOCK_SIZE_M": 64}}')
        rt = ks.configure(config_dirs=[d], backend_version="3.5.1", shipped_configs=False, log_level="off")
        self.addCleanup(rt.close)
        self.assertIs(ks.get_runtime(), rt)
        args = ((8, 32, 128), (8, 128, 16), 2, "fp8_w8a8")
        for strict in (False, True):
            self.assertEqual(ks.try_get_optimal_moe_config(*args, 40, device_name="NVIDIA H200", strict_sglang=strict),
                             {"BLOCK_SIZE_M": 64})
        self.write("configs/" + name, '{"1": {"BLOCK_SIZE_M": 16}, "32": {"BLOCK_SIZE_M": 32}}')
        # cached until the table changes through this runtime
        for strict in (False, True):
            self.assertEqual(ks.try_get_optimal_moe_config(*args, 40, device_name="NVIDIA H200", strict_sglang=strict),
                             {"BLOCK_SIZE_M": 64})
        rt.reload()
        for strict in (False, True):
            self.assertEqual(ks.try_get_optimal_moe_config(*args, 40, device_name="NVIDIA H200", strict_sglang=strict),
                             {"BLOCK_SIZE_M": 32})
        self.assertEqual(ks.get_moe_configs(8, 16, "fp8_w8a8", device_name="NVIDIA H200"),
                         {1: {"BLOCK_SIZE_M": 16}, 32: {"BLOCK_SIZE_M": 32}})
        # returned dicts are copies: mutating one changes nothing
        ks.get_moe_configs(8, 16, "fp8_w8a8", device_name="NVIDIA H200")[1]["BLOCK_SIZE_M"] = 999
        ks.try_get_optimal_moe_config(*args, 1, device_name="NVIDIA H200")["BLOCK_SIZE_M"] = 999
        self.assertEqual(ks.get_moe_configs(8, 16, "fp8_w8a8", device_name="NVIDIA H200")[1], {"BLOCK_SIZE_M": 16})
        self.assertEqual(ks.try_get_optimal_moe_config(*args, 1, device_name="NVIDIA H200"), {"BLOCK_SIZE_M": 16})
        ks.cache_clear()
        with self.assertRaises(TypeError):
            ks.configure(rt, config_dirs=[d])

    def test_a_watched_runtime_is_not_cached_past_its_watcher(self):
        # The file watcher publishes a new table without Runtime.reload(): the
        # shim must answer the new row (the third attack's finding 1).
        import time
        d = os.path.join(self.tmp, "configs")
        name = "triton_3_5_1/E=8,N=16,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
        self.write("configs/" + name, '{"1": {"BLOCK_SIZE_M": 16}, "64": {"BLOCK_SIZE_M": 64}}')
        rt = ks.configure(config_dirs=[d], backend_version="3.5.1", shipped_configs=False, log_level="off",
                          watch=True)
        self.addCleanup(rt.close)
        args = ((8, 32, 128), (8, 128, 16), 2, "fp8_w8a8", 40)
        self.assertEqual(ks.try_get_optimal_moe_config(*args, device_name="NVIDIA H200"), {"BLOCK_SIZE_M": 64})
        tmp = self.write("configs/" + name + ".tmp", '{"1": {"BLOCK_SIZE_M": 16}, "32": {"BLOCK_SIZE_M": 32}}')
        os.rename(tmp, os.path.join(d, name))
        key = "E=8,N=16,dtype=fp8_w8a8"
        for _ in range(100):  # the watcher's reload, up to 10 s
            if rt.lookup("triton_fused_moe", key, "NVIDIA H200", M=40)["config"]["BLOCK_SIZE_M"] == 32:
                break
            time.sleep(0.1)
        self.assertEqual(rt.lookup("triton_fused_moe", key, "NVIDIA H200", M=40)["config"]["BLOCK_SIZE_M"], 32)
        self.assertEqual(rt.generation, 0)  # the watcher does not count here: hence no cache
        self.assertEqual(ks.try_get_optimal_moe_config(*args, device_name="NVIDIA H200"), {"BLOCK_SIZE_M": 32})
        self.assertEqual(ks.get_moe_configs(8, 16, "fp8_w8a8", device_name="NVIDIA H200"),
                         {1: {"BLOCK_SIZE_M": 16}, 32: {"BLOCK_SIZE_M": 32}})

    def test_the_down_config_takes_the_up_block_size_m(self):
        # FMC lines 324-338: both GEMMs share one moe_align_block_size sort
        self.write("configs/triton_3_5_1/E=8,N=16,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
                   '{"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64}, "64": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64}}')
        self.write("configs/triton_3_5_1/E=8,N=16,device_name=NVIDIA_H200,dtype=fp8_w8a8_down.json",
                   '{"1": {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "USE_TMA": true}, '
                   '"64": {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "USE_TMA": false}}')
        rt = ks.configure(config_dirs=[os.path.join(self.tmp, "configs")], backend_version="3.5.1",
                          shipped_configs=False, log_level="off")
        self.addCleanup(rt.close)
        for strict in (False, True):
            self.assertEqual(ks.try_get_optimal_moe_config((8, 32, 128), (8, 128, 16), 2, "fp8_w8a8", 1,
                                                           return_down_config=True, device_name="NVIDIA H200",
                                                           strict_sglang=strict),
                             ({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64},
                              ({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "USE_TMA": True}, 128)))
        # no up table for E=8,N=17 but a _down one: the down row takes the default config's BLOCK_SIZE_M
        self.write("configs/triton_3_5_1/E=8,N=17,device_name=NVIDIA_H200,dtype=fp8_w8a8_down.json",
                   '{"4": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128}}')
        rt.reload()
        for strict in (False, True):
            config, (down, max_block_m) = ks.try_get_optimal_moe_config(
                (8, 34, 64), (8, 64, 17), 2, "fp8_w8a8", 4, return_down_config=True, device_name="NVIDIA H200",
                strict_sglang=strict)
            self.assertEqual(config["BLOCK_SIZE_M"], 64)  # get_default_config, M <= E
            self.assertEqual((down, max_block_m), ({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128}, 16))

    def test_empty_device_name_reads_sglangs_device_name_files(self):
        # SGLang has tables named "device_name=" (a device reporting an empty name); kdispatch's
        # runtime reads "" as the host CPU, so the shim reads them itself
        name = "triton_3_4_0/E=4,N=8,device_name=,dtype=int4_w4a16.json"
        self.write("configs/" + name, '{"16": {"BLOCK_SIZE_M": 16}, "8": {"BLOCK_SIZE_M": 8}}')
        rt = ks.configure(config_dirs=[os.path.join(self.tmp, "configs")], backend_version="3.5.1",
                          shipped_configs=False, log_level="off")
        self.addCleanup(rt.close)
        for strict in (False, True):
            self.assertEqual(ks.get_moe_configs(4, 8, "int4_w4a16", device_name="", strict_sglang=strict),
                             {16: {"BLOCK_SIZE_M": 16}, 8: {"BLOCK_SIZE_M": 8}})
        # M = 12 ties between 8 and 16: file order (16 first) strictly, the smaller key by default
        self.assertEqual(ks.try_get_optimal_moe_config((4, 16, 32), (4, 32, 8), 2, "int4_w4a16", 12, device_name="",
                                                       strict_sglang=True), {"BLOCK_SIZE_M": 16})
        self.assertEqual(ks.try_get_optimal_moe_config((4, 16, 32), (4, 32, 8), 2, "int4_w4a16", 12, device_name=""),
                         {"BLOCK_SIZE_M": 8})

    def test_a_runtime_without_config_dirs_says_so(self):
        env = {k: os.environ.pop(k) for k in ("KDISPATCH_CONFIG_DIRS", "SGLANG_MOE_CONFIG_DIR") if k in os.environ}
        self.addCleanup(os.environ.update, env)
        if ks._sglang_config_dirs():
            self.skipTest("SGLang is installed: its config dirs serve")
        ks._runtime, ks._warned_no_dirs = None, False
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            rt = ks.get_runtime()
        self.addCleanup(rt.close)
        self.assertTrue(any(issubclass(x.category, RuntimeWarning) and "no config dirs" in str(x.message) for x in w))
        self.assertIsNone(ks.get_moe_configs(257, 256, "fp8_w8a8", 128, 128, device_name="NVIDIA H200"))


if __name__ == "__main__":
    unittest.main()
