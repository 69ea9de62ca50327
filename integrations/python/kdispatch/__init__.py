# SPDX-License-Identifier: Apache-2.0
"""kdispatch: per-call kernel-variant and launch-config dispatch, and a tuned
config service for kernels the engine owns.

    import numpy as np, kdispatch
    rt = kdispatch.Runtime(config_dirs=["/opt/engine/moe-configs"], backend_version="3.5.1")
    x = np.random.rand(4, 64).astype(np.float32); w = np.ones(64, np.float32)
    rt.rmsnorm(x, x, w, 1e-6)                       # in place, any __dlpack__ arrays
    rt.lookup(key="E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]", device="NVIDIA H200", M=64)

Modules: kdispatch.sglang (SGLang's fused-MoE and block-fp8 GEMM config lookups, drop-in),
kdispatch.torch_ops (torch.ops.kdispatch.*; imports torch).
"""

from . import _backend
from ._errors import Error, StatusCode
from ._runtime import Runtime, default_runtime
from ._fp8 import Fp8, fp8, from_fp8, to_fp8

#: The C ABI version the loaded libkdispatch implements.
ABI_VERSION = _backend.impl.abi_version()
#: The low-level layer in use: "native" (pybind11) or "ctypes".
BACKEND = _backend.name
__version__ = _backend.impl.version()


def library_path():
    """The path of the libkdispatch in use."""
    return _backend.impl.library_path()


def _where(what):
    try:
        from . import _build_config
    except ImportError:
        raise Error(StatusCode.not_found, "this kdispatch package has no _build_config.py (a copy of the sources, "
                    "not built by CMake or installed by pip): no " + what) from None
    return getattr(_build_config, what, None)


def get_include():
    """The directory holding <dispatch/dispatch.hpp> and <dispatch/c_api.h>
    (pass it as -I). A pip-installed package: <package>/include; a CMake
    build tree (PYTHONPATH=<build>/python): the source tree's include/.
    Raises kdispatch.Error (not_found) for a package not built by CMake/pip."""
    return _where("INCLUDE_DIR")


def get_lib_dir():
    """The directory holding libkdispatch.so (pass it as -L and as the
    rpath). A pip-installed package: <package>/lib."""
    return _where("LIB_DIR")


def get_cmake_dir():
    """The directory holding kdispatchConfig.cmake (pass it as kdispatch_DIR
    or put it on CMAKE_PREFIX_PATH) of a pip-installed package:
    <package>/lib/cmake/kdispatch. None in a CMake build tree (it has no
    installed CMake package)."""
    return _where("CMAKE_DIR")


__all__ = ["Runtime", "default_runtime", "Error", "StatusCode", "ABI_VERSION", "BACKEND", "library_path",
           "get_include", "get_lib_dir", "get_cmake_dir", "__version__", "Fp8", "fp8", "from_fp8", "to_fp8"]
