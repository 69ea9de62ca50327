# SPDX-License-Identifier: Apache-2.0
"""pip's build of kdispatch: setuptools with a build_ext that runs the
project's CMake (configure, build, install into the wheel's package dir).

    /usr/bin/python3 -m venv --system-site-packages $VENV
    $VENV/bin/pip install --no-build-isolation --no-index .

The wheel's `kdispatch/` holds the Python package, the pybind11 module
(_kdispatch*.so), when torch is importable by the building interpreter
libkdispatch_torch.so (built for that torch: kdispatch.torch_ops.BUILT_FOR),
lib/ (libkdispatch.so.0, the OpenBLAS plugin, cmake/kdispatch,
pkgconfig/kdispatch.pc), bin/kdispatch (the CLI; `kdispatch` on the venv's
PATH runs it), include/ and share/kdispatch/configs (the shipped configs).
Libraries find each other by $ORIGIN-relative rpaths; libtorch is the
imported torch's, never bundled.

Environment:
  KDISPATCH_CMAKE_ARGS          extra CMake arguments (shell-split), e.g.
                                "-DKDISPATCH_CUDA=OFF -DKDISPATCH_HIP=OFF"
  KDISPATCH_CUDA_ARCHITECTURES  -> -DKDISPATCH_CUDA_ARCHITECTURES (default 90a-real;90-virtual)
  KDISPATCH_TORCH               ON | OFF | AUTO (default AUTO: ON when `import torch` works)
  CMAKE_BUILD_PARALLEL_LEVEL    build jobs (default: the CPU count)
Everything is built under build/pip (CMake) and build/ (setuptools).
"""
import os
import re
import shlex
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.egg_info import egg_info

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(ROOT, "build")


def version():
    """CMake's project version: the one version source."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(\s*kdispatch\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not m:
        raise RuntimeError("setup.py: no `project(kdispatch VERSION x.y.z` in CMakeLists.txt")
    return m.group(1)


def torch_importable():
    r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    return r.returncode == 0


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures, builds and installs the CMake project into the package dir
    setuptools is assembling (build/lib.*/kdispatch)."""

    def run(self):
        for ext in self.extensions:
            self.build_cmake(ext)

    def build_cmake(self, ext):
        pkg = os.path.abspath(os.path.dirname(self.get_ext_fullpath(ext.name)))  # <build_lib>/kdispatch
        root = os.path.dirname(pkg)
        bdir = os.path.join(BUILD, "pip")
        torch = os.environ.get("KDISPATCH_TORCH", "AUTO").upper()
        if torch == "AUTO":
            torch = "ON" if torch_importable() else "OFF"
        args = [
            "-S", ROOT, "-B", bdir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_INSTALL_PREFIX={root}",
            # everything inside the package: the library, CLI, headers, CMake and pkg-config files, configs
            "-DCMAKE_INSTALL_LIBDIR=kdispatch/lib", "-DCMAKE_INSTALL_BINDIR=kdispatch/bin",
            "-DCMAKE_INSTALL_INCLUDEDIR=kdispatch/include", "-DCMAKE_INSTALL_DATADIR=kdispatch/share",
            "-DKDISPATCH_PYTHON_INSTALL_DIR:STRING=.", "-DKDISPATCH_PYTHON=ON", f"-DPython3_EXECUTABLE={sys.executable}",
            "-DKDISPATCH_BUILD_TESTS=OFF", "-DKDISPATCH_BUILD_BENCH=OFF", "-DKDISPATCH_BUILD_CLI=ON",
            f"-DKDISPATCH_TORCH={torch}",
        ]
        if torch == "ON":
            args.append(f"-DKDISPATCH_TORCH_PYTHON={sys.executable}")
        if os.environ.get("KDISPATCH_CUDA_ARCHITECTURES"):
            args.append("-DKDISPATCH_CUDA_ARCHITECTURES=" + os.environ["KDISPATCH_CUDA_ARCHITECTURES"])
        args += shlex.split(os.environ.get("KDISPATCH_CMAKE_ARGS", ""))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        for cmd in (["cmake"] + args, ["cmake", "--build", bdir, "-j", jobs], ["cmake", "--install", bdir]):
            print("kdispatch setup.py:", " ".join(shlex.quote(c) for c in cmd), flush=True)
            subprocess.check_call(cmd)


class EggInfo(egg_info):
    """Metadata under build/, never in the source tree."""

    def initialize_options(self):
        super().initialize_options()
        os.makedirs(BUILD, exist_ok=True)
        self.egg_base = os.path.relpath(BUILD, os.getcwd())


setup(
    version=version(),
    packages=["kdispatch"],
    py_modules=["kdispatch_cli"],  # the `kdispatch` command (kdispatch_cli.py: finds the package without importing it)
    package_dir={"": "integrations/python"},
    ext_modules=[CMakeExtension("kdispatch._kdispatch")],
    cmdclass={"build_ext": CMakeBuild, "egg_info": EggInfo},
    zip_safe=False,
)
