# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the kdispatch Python tests."""

import os
import shutil
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("KDISPATCH_SHARED_DIR") or os.path.normpath(os.path.join(HERE, "..", "..", "..", "..", "shared"))
SGLANG_MOE = os.path.join(SHARED, "data", "sglang-configs", "fused_moe_triton")

# Case C06 (shared/cases/CASES.md)
C06_KEY = "E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]"
C06_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
              "num_stages": 5}


def have_shared():
    return os.path.isdir(SGLANG_MOE)


needs_shared = unittest.skipUnless(os.path.isdir(SGLANG_MOE), f"shared data not found at {SGLANG_MOE}")


class TempDirTest(unittest.TestCase):
    """A fresh temporary dir per test (self.tmp), removed afterwards."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kdispatch-py-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def write(self, rel, text):
        path = os.path.join(self.tmp, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def quiet_runtime(self, **kw):
        """A runtime without shipped configs, caching into self.tmp."""
        import kdispatch
        kw.setdefault("shipped_configs", False)
        kw.setdefault("log_level", "off")
        kw.setdefault("cache_dir", os.path.join(self.tmp, "cache"))
        rt = kdispatch.Runtime(**kw)
        self.addCleanup(rt.close)
        return rt
