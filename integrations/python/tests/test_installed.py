# SPDX-License-Identifier: Apache-2.0
"""The pip-installed package, checked from outside the source tree (.ci/run's
pip step sets KDISPATCH_TEST_INSTALLED=<the source tree>; elsewhere these
tests skip): the package, its library, headers, CMake package, pkg-config
file, CLI and shipped configs are the wheel's own, and a C++ program builds
against it with the paths the package gives."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

SRC = os.environ.get("KDISPATCH_TEST_INSTALLED", "")


@unittest.skipUnless(SRC, "KDISPATCH_TEST_INSTALLED is not set (the pip step of .ci/run sets it)")
class InstalledPackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import kdispatch
        cls.kd = kdispatch
        cls.pkg = os.path.dirname(os.path.realpath(kdispatch.__file__))
        with open(os.path.join(SRC, "CMakeLists.txt")) as f:
            cls.version = re.search(r"project\(\s*kdispatch\s+VERSION\s+([0-9.]+)", f.read()).group(1)

    def test_the_package_is_the_installed_one(self):
        # not the sources nor a CMake build's staged copy (the venv itself may sit under build/)
        self.assertNotEqual(self.pkg, os.path.realpath(os.path.join(SRC, "integrations", "python", "kdispatch")))
        self.assertIn(os.sep + "site-packages" + os.sep, self.pkg + os.sep)
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(self.pkg), "..", "CMakeCache.txt")), self.pkg)
        self.assertEqual(os.path.realpath(self.kd.library_path()),
                         os.path.realpath(os.path.join(self.pkg, "lib", "libkdispatch.so.0")))

    def test_one_version(self):
        from importlib.metadata import version
        self.assertEqual(self.kd.__version__, self.version)   # the library's, from CMake's project()
        self.assertEqual(version("kdispatch"), self.version)  # the wheel's

    def test_paths_point_into_the_package(self):
        self.assertEqual(self.kd.get_include(), os.path.join(self.pkg, "include"))
        self.assertTrue(os.path.isfile(os.path.join(self.kd.get_include(), "dispatch", "c_api.h")))
        self.assertEqual(self.kd.get_lib_dir(), os.path.join(self.pkg, "lib"))
        self.assertTrue(os.path.isfile(os.path.join(self.kd.get_cmake_dir(), "kdispatchConfig.cmake")))
        with open(os.path.join(self.kd.get_lib_dir(), "pkgconfig", "kdispatch.pc")) as f:
            pc = f.read()
        self.assertIn("libdir=${pcfiledir}/..", pc)  # relocatable: the wheel's own dir
        self.assertIn("Libs: -L${libdir} -Wl,-rpath,${libdir} -lkdispatch", pc)
        self.assertIn(f"Version: {self.version}", pc)

    def test_shipped_configs_are_the_trees(self):
        shipped = os.path.join(self.pkg, "share", "kdispatch", "configs")
        mine = sorted(os.path.relpath(p, shipped) for p in glob.glob(os.path.join(shipped, "**", "*.json"),
                                                                       recursive=True))
        src = os.path.join(SRC, "configs")
        want = sorted(os.path.relpath(p, src) for p in glob.glob(os.path.join(src, "**", "*.json"), recursive=True))
        self.assertEqual(mine, want)
        self.assertGreater(len(mine), 0)

    def test_cli_on_the_path(self):
        exe = shutil.which("kdispatch", path=os.path.dirname(sys.executable))
        self.assertIsNotNone(exe, "no kdispatch next to " + sys.executable)
        out = subprocess.run([exe, "--version"], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(out.stdout.startswith(f"kdispatch {self.version} "), out.stdout)

    def test_native_torch_ops_for_the_torch_present(self):
        try:
            import torch
        except ImportError:
            self.skipTest("no torch at build time: no native ops")
        from kdispatch import torch_ops
        self.assertEqual(torch_ops.BUILT_FOR, torch.__version__)
        self.assertTrue(torch_ops.NATIVE)
        x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
        w = torch.ones(4)
        y = torch.ops.kdispatch.rmsnorm(x, w, 1e-6)
        # 1 / sqrt(mean(1, 4, 9, 16) + 1e-6) = 1 / sqrt(7.5)
        self.assertAlmostEqual(float(y[0, 3]), 4.0 / 7.5 ** 0.5, places=5)

    def test_a_cpp_program_builds_against_the_wheel(self):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "use.cpp")
            with open(src, "w") as f:
                f.write('#include <dispatch/dispatch.hpp>\n#include <cstdio>\n'
                        'int main() { std::printf("%s\\n", dispatch::version()); return 0; }\n')
            exe = os.path.join(d, "use")
            lib = self.kd.get_lib_dir()
            cc = subprocess.run(["g++", "-std=c++20", src, "-I", self.kd.get_include(), "-L", lib, f"-Wl,-rpath,{lib}",
                                 "-lkdispatch", "-o", exe], capture_output=True, text=True)
            self.assertEqual(cc.returncode, 0, cc.stderr)
            # the rpath, not LD_LIBRARY_PATH, finds libkdispatch: entries holding one are dropped (the
            # others stay: on the GPU machine simdjson / xxHash are unpacked .debs found through it)
            ld = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":")
                  if d and not glob.glob(os.path.join(d, "libkdispatch.so*"))]
            env = dict(os.environ, LD_LIBRARY_PATH=":".join(ld))
            out = subprocess.run([exe], capture_output=True, text=True, env=env)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.strip(), self.version)


if __name__ == "__main__":
    unittest.main()
