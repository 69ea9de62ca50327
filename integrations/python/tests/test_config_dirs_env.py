# SPDX-License-Identifier: Apache-2.0
"""A KDISPATCH_CONFIG_DIRS dir that does not exist (issue 33): `import
kdispatch` warns (RuntimeWarning) naming it, and the default runtime serves
from the other dirs; the ops, the torch ops included where they import,
run instead of raising at the first call. Each case in a fresh interpreter:
the default runtime is built once per process."""

import json
import os
import subprocess
import sys
import textwrap
import unittest

from support import TempDirTest

CHILD = textwrap.dedent("""
    import json, sys, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import kdispatch
    import numpy as np
    print(json.dumps([[w.category.__name__, str(w.message)] for w in caught]))
    rt = kdispatch.default_runtime()
    x = np.ones((3, 64), np.float32)
    y = np.empty_like(x)
    w = np.ones(64, np.float32)
    info = rt.rmsnorm(y, x, w, 1e-6, info=True)
    path, d = rt.source_path(info["source_id"])
    print(json.dumps([info["source"], info["M"], path, d]))
    try:
        import torch
        import kdispatch.torch_ops as ops
    except ImportError as e:
        print(json.dumps("torch ops: not here"))
        sys.exit(0)
    out, served = ops.call_info("rmsnorm", torch.ones(3, 64), torch.ones(64), eps=1e-6)
    print(json.dumps([served["source"], served["M"], round(float(out.sum()), 3)]))  # 192 / sqrt(1 + 1e-6)
""")


class ConfigDirsEnvTest(TempDirTest):
    def run_child(self, **env):
        e = {k: v for k, v in os.environ.items() if not k.startswith("KDISPATCH_") or k in (
            "KDISPATCH_PYTHON_BACKEND", "KDISPATCH_CACHE_DIR", "KDISPATCH_LIBRARY")}
        e.update(env)
        return subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=e, timeout=300)

    def setUp(self):
        super().setUp()
        import kdispatch
        dev = kdispatch.default_runtime().device_info("cpu")["device_name"]
        self.file = f"cpu/rmsnorm/hidden=64,device_name={dev},dtype=fp32.json"
        self.dir = os.path.dirname(os.path.dirname(os.path.dirname(
            self.write(os.path.join("dirs", self.file), '{"3": {"variant": "rmsnorm_fp32__ref"}}'))))
        self.missing = os.path.join(self.tmp, "not-mounted")
        self.value = f"{self.missing}:{self.dir}"
        self.line = f"KDISPATCH_CONFIG_DIRS='{self.value}': config dir '{self.missing}' does not exist; serving without it"

    def test_missing_dir_warns_at_import_and_the_rest_serve(self):
        r = self.run_child(KDISPATCH_CONFIG_DIRS=self.value, KDISPATCH_SHIPPED_CONFIGS="0")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(json.loads(lines[0]), [["RuntimeWarning", self.line]])
        self.assertEqual(json.loads(lines[1]), ["table", 3, self.file, self.dir])
        if json.loads(lines[2]) != "torch ops: not here":
            self.assertEqual(json.loads(lines[2]), ["table", 3, 3 * 64.0])
        # The library says it once on stderr too, when it builds the runtime.
        said = [ln for ln in r.stderr.splitlines() if "KDISPATCH_CONFIG_DIRS" in ln]
        self.assertEqual(said, ["kdispatch: " + self.line])

    def test_log_level_off_says_nothing(self):
        r = self.run_child(KDISPATCH_CONFIG_DIRS=self.value, KDISPATCH_SHIPPED_CONFIGS="0", KDISPATCH_LOG_LEVEL="off")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(json.loads(lines[0]), [])
        self.assertEqual(json.loads(lines[1]), ["table", 3, self.file, self.dir])
        self.assertEqual([ln for ln in r.stderr.splitlines() if "KDISPATCH_CONFIG_DIRS" in ln], [])


if __name__ == "__main__":
    unittest.main()
