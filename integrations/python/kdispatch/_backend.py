# SPDX-License-Identifier: Apache-2.0
"""Chooses the low-level layer: the pybind11 module (kdispatch._kdispatch)
when it is built for this interpreter, else ctypes (kdispatch._capi).
$KDISPATCH_PYTHON_BACKEND = native | ctypes | auto (default) forces one."""

import atexit
import os

from . import _capi

_choice = os.environ.get("KDISPATCH_PYTHON_BACKEND", "auto").strip().lower() or "auto"
if _choice not in ("auto", "native", "ctypes"):
    raise ImportError(f"KDISPATCH_PYTHON_BACKEND='{_choice}' is not auto, native or ctypes")

native = None
if _choice in ("auto", "native"):
    try:
        from . import _kdispatch as native  # noqa: F401
    except ImportError as e:
        if _choice == "native":
            raise ImportError(f"KDISPATCH_PYTHON_BACKEND=native, but kdispatch._kdispatch does not import: {e}") from e
        native = None

if native is not None:
    impl = native
    name = "native"
    # ctypes (torch_ops) must use the very library the module is linked to.
    _capi.init(prefer=native.library_path())
else:
    impl = _capi
    name = "ctypes"
    _capi.init()



def _park_calls_at_exit():
    """At interpreter exit (atexit runs before finalization): a kdispatch call
    that ends on another thread from now on blocks there instead of returning
    (kdispatch_park_calls_at_exit): a daemon thread that took the GIL back
    during finalization would be ended by a forced unwind, which a noexcept
    C++ frame of its caller's (torch's dispatcher around a custom op) turns
    into std::terminate. The short sleep lets threads already waiting for the
    GIL through, into their next call."""
    import threading
    import time
    _capi.lib.kdispatch_park_calls_at_exit()
    if threading.active_count() > 1:
        time.sleep(0.02)


atexit.register(_park_calls_at_exit)

if impl.abi_version() != _capi.ABI_VERSION:
    raise ImportError(f"kdispatch: the library implements C ABI {impl.abi_version()}, "
                      f"the package needs {_capi.ABI_VERSION}")
