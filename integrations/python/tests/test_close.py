# SPDX-License-Identifier: Apache-2.0
"""Runtime.close() while other threads call (issue 31): the C library's
kdispatch_runtime_close refuses new calls with failed_precondition and waits
for those in flight, so the layer under test (this suite runs once per
layer: KDISPATCH_PYTHON_BACKEND) never crashes; 200 races in a child
process whose exit status must be 0 (a signal is a negative status). An
interpreter exit with daemon threads still calling exits 0. The torch ops'
races are in test_torch_ops.py (CI's torch step runs that file). Strings
with a NUL are refused, naming the argument."""

import json
import os
import subprocess
import sys
import unittest

import numpy as np

import kdispatch
from kdispatch import Error, StatusCode

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "close_race_child.py")
ROUNDS = 200


def child(*args, timeout=600):
    """Runs close_race_child.py with this interpreter and environment."""
    return subprocess.run([sys.executable, CHILD, *args], capture_output=True, text=True, timeout=timeout)


def assert_exited_cleanly(test, p, what):
    test.assertEqual(p.returncode, 0, f"{what}: exit status {p.returncode} "
                     f"({'signal ' + str(-p.returncode) if p.returncode < 0 else 'error'})\n"
                     f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-4000:]}")


class CloseRaces(unittest.TestCase):
    def assertExitedCleanly(self, p, what):
        assert_exited_cleanly(self, p, what)

    def test_close_while_four_threads_call_200_rounds(self):
        p = child("race", str(ROUNDS))
        self.assertExitedCleanly(p, f"{ROUNDS} races ({kdispatch.BACKEND})")
        c = json.loads(p.stdout.strip().splitlines()[-1])
        sys.stderr.write(f"close race ({kdispatch.BACKEND}): {c['rounds']} rounds, {c['ok_calls']} calls OK, "
                         f"{c['refused']} refused, {len(c['other'])} other\n")
        self.assertEqual(c["rounds"], ROUNDS)
        self.assertEqual(c["other"], [])
        self.assertEqual(c["refused"], 4 * ROUNDS)  # every caller ends on failed_precondition
        self.assertGreaterEqual(c["ok_calls"], 4 * ROUNDS)
        self.assertEqual(c["late_call_refused"], ROUNDS)

    def test_interpreter_exit_with_daemon_threads_calling(self):
        for mode in ("owned", "default"):
            for i in range(5):
                p = child("exit", mode, timeout=120)
                self.assertExitedCleanly(p, f"exit with daemon threads calling ({mode} runtime, run {i})")
                self.assertIn("exiting with 4 daemon threads calling", p.stdout)


class CloseSemantics(unittest.TestCase):
    def test_a_closed_runtime_refuses_calls(self):
        rt = kdispatch.Runtime(shipped_configs=False, log_level="off")
        x, w = np.ones((2, 8), np.float32), np.ones(8, np.float32)
        rt.rmsnorm(x, x, w, 1e-6)
        rt.close()
        rt.close()  # a no-op
        with self.assertRaises(Error) as c:
            rt.rmsnorm(x, x, w, 1e-6)
        self.assertEqual(c.exception.code, StatusCode.failed_precondition)
        self.assertEqual(c.exception.message, "the runtime was closed")
        with self.assertRaises(Error) as c:
            rt.lookup(key="hidden=8,dtype=fp32", op="rmsnorm")
        self.assertEqual(c.exception.code, StatusCode.failed_precondition)
        kdispatch.default_runtime().close()  # a no-op: the default runtime lives until exit
        self.assertFalse(kdispatch.default_runtime().frozen)

    def test_the_handle_outlives_its_runtime(self):
        """Through the raw handle (as the torch ops hold it): after close,
        the C library refuses the call; nothing is freed under it."""
        from kdispatch import _capi
        _capi.init()
        rt = kdispatch.Runtime(shipped_configs=False, log_level="off")
        address = rt.handle
        rt._h.close()
        q, keep = _capi.make_query({"op": "rmsnorm", "key": "hidden=8,dtype=fp32", "M": 1})
        p = _capi.POINTER(_capi.c_char)()
        status = _capi.lib.kdispatch_lookup(_capi.c_void_p(address), _capi.byref(q), _capi.byref(p))
        self.assertEqual(status, StatusCode.failed_precondition)
        self.assertEqual(_capi.lib.kdispatch_last_error_message().decode(),
                         "kdispatch_lookup: the runtime was closed (kdispatch_runtime_close); no call may use it")


class NulInStrings(unittest.TestCase):
    """A NUL inside a string the C library takes would cut it there
    (issue 31: "hidden=64\\0junk" looked up "hidden=64"): refused."""

    def test_lookup_key_and_device_with_a_nul_are_refused(self):
        rt = kdispatch.Runtime(shipped_configs=False, log_level="off")
        try:
            with self.assertRaises(Error) as c:
                rt.lookup(op="rmsnorm", key="hidden=64\0,dtype=bf16", M=1)
            self.assertEqual(c.exception.code, StatusCode.invalid_argument)
            self.assertEqual(c.exception.message,
                             "key: contains a NUL character (at index 9); kdispatch strings end at the first NUL")
            with self.assertRaises(Error) as c:
                rt.lookup_table(op="rmsnorm", key="hidden=64,dtype=fp32\0")
            self.assertEqual(c.exception.message,
                             "key: contains a NUL character (at index 20); kdispatch strings end at the first NUL")
            with self.assertRaises(Error) as c:
                rt.lookup(op="rmsnorm", key="hidden=64,dtype=fp32", device="CPU\0x", M=1)
            self.assertTrue(c.exception.message.startswith("device: contains a NUL character (at index 3)"))
            # the same key without the NUL is fine
            self.assertEqual(rt.lookup(op="rmsnorm", key="hidden=64,dtype=fp32", M=1)["match"], "default")
        finally:
            rt.close()

    def test_option_strings_with_a_nul_are_refused(self):
        with self.assertRaises(Error) as c:
            kdispatch.Runtime(config_dirs=["/tmp\0/x"], shipped_configs=False, log_level="off")
        self.assertEqual(c.exception.code, StatusCode.invalid_argument)
        self.assertEqual(c.exception.message,
                         "config_dirs[0]: contains a NUL character (at index 4); kdispatch strings end at the first NUL")
        with self.assertRaises(Error) as c:
            kdispatch.Runtime(cache_dir="/tmp/c\0d", shipped_configs=False, log_level="off")
        self.assertTrue(c.exception.message.startswith("cache_dir: contains a NUL character (at index 6)"))


if __name__ == "__main__":
    unittest.main()
