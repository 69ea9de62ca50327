# SPDX-License-Identifier: Apache-2.0
"""PyTorch ops over kdispatch: torch.ops.kdispatch.*, one set per op of the
library's op list (kdispatch_op_list), for example:

    import kdispatch.torch_ops
    y = torch.ops.kdispatch.rmsnorm(x, w, 1e-6)                   # -> new tensor
    torch.ops.kdispatch.rmsnorm_out(y, x, w, 1e-6)                # into y, allocates nothing
    torch.ops.kdispatch.fused_add_rmsnorm_(x, residual, w, 1e-6)  # in place, -> None
    d = torch.ops.kdispatch.gemm(a, b, bias)                      # a @ b.T + bias
    torch.ops.kdispatch_vllm.rms_norm(out, x, w, 1e-6)            # vLLM's _C name and argument order

Two implementations, the same ops and semantics:
- native (NATIVE = True): libkdispatch_torch.so, the ops registered from
  C++ (TORCH_LIBRARY; CPU, CUDA, Meta and Autograd kernels): tensors read
  straight off torch's dispatcher stack, torch's current stream of the
  tensors' device (a device guard makes that device current), the capture
  flag from the stream's capture status, a gemm workspace per (device,
  stream) that kdispatch allocates itself (never in a graph pool). Built
  with -DKDISPATCH_TORCH=ON for one torch; loaded only when its recorded
  version equals torch.__version__ (torch 1.13, Debian's, works: CPU ops).
  Adds the `<op>_out` variants and torch.ops.kdispatch_vllm (vLLM's
  rms_norm, fused_add_rms_norm, silu_and_mul and moe_sum, argument order
  included).
  Errors are torch's: ValueError (invalid_argument), NotImplementedError
  (unsupported dtype or device), RuntimeError (the rest; a gradient
  asked of these inference-only ops), the message naming the op, the
  kdispatch status and the argument.
- Python (NATIVE = False): torch.library.custom_op over the C ABI through
  ctypes (torch >= 2.4; ~50 us more host time per call), used when the
  native library is not built for this torch; import prints one line
  saying why. Its errors are kdispatch.Error. No out variants, no
  kdispatch_vllm namespace.

$KDISPATCH_TORCH_OPS = auto (default) | native | python forces one
(native fails the import when the library cannot be loaded).

Common to both: an op with outputs (arguments it only writes) is
functional (allocates its outputs with torch, shaped from the inputs; the
leading dims of the first 2-D input kept, or, with none, the op's dims:
moe_sum's [M, top_k, hidden] input gives [M, hidden]); an op that only modifies
arguments in place is `<name>_` and returns None. Inputs are [..., cols]
with unit stride on the last dim; leading dims are flattened (views;
in-place and output arguments must be viewable). The runtime:
set_runtime(rt), else kdispatch.default_runtime() (the KDISPATCH_*
environment; a KDISPATCH_CONFIG_DIRS dir that does not exist is skipped,
with a RuntimeWarning at import, and the ops serve from the other dirs
instead of raising at the first call).
"""

import operator
import os
import sys
import threading

import torch

from . import _backend  # noqa: F401  (loads the library the rest of the package uses)
from . import _capi
from ._runtime import Runtime, _scalar, default_runtime

_mode = os.environ.get("KDISPATCH_TORCH_OPS", "auto").strip().lower() or "auto"
if _mode not in ("auto", "native", "python"):
    raise ImportError(f"KDISPATCH_TORCH_OPS='{_mode}' is not auto, native or python")


def _native_library():
    """(path, None) when libkdispatch_torch.so is built for this torch, else (None, why)."""
    try:
        from . import _torch_build
    except ImportError:
        return None, "libkdispatch_torch.so is not built (configure with -DKDISPATCH_TORCH=ON)"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _torch_build.LIBRARY)
    if not os.path.exists(path):
        return None, f"{path} is missing"
    if _torch_build.TORCH_VERSION != torch.__version__:
        return None, (f"libkdispatch_torch.so was built for torch {_torch_build.TORCH_VERSION}, "
                      f"this is torch {torch.__version__}")
    return path, None


try:
    from . import _torch_build as _tb
    #: The torch version libkdispatch_torch.so was built for (None: not built).
    #: The native ops load only under that exact torch.
    BUILT_FOR = _tb.TORCH_VERSION
except ImportError:
    BUILT_FOR = None
NATIVE = False
_why = "KDISPATCH_TORCH_OPS=python"
if _mode != "python":
    _path, _why = _native_library()
    if _path is not None:
        torch.ops.load_library(_path)
        import ctypes
        _native = ctypes.CDLL(_path)  # the same loaded library: kdispatch_torch_set_runtime
        _native.kdispatch_torch_set_runtime.argtypes = [ctypes.c_void_p]
        _native.kdispatch_torch_set_runtime.restype = None
        _native.kdispatch_torch_park_at_exit.argtypes = []
        _native.kdispatch_torch_park_at_exit.restype = None
        _lib = torch.ops.kdispatch._library_path()
        if os.path.realpath(_lib) != os.path.realpath(_backend.impl.library_path()):
            raise ImportError(f"kdispatch.torch_ops: libkdispatch_torch.so uses {_lib}, the package "
                              f"{_backend.impl.library_path()}: two copies of libkdispatch in one process")
        NATIVE = True
    elif _mode == "native":
        raise ImportError(f"KDISPATCH_TORCH_OPS=native, but {_why}")

if not NATIVE:
    if not hasattr(torch.library, "custom_op"):  # torch < 2.4: no Python path either, one line says both
        raise ImportError(f"kdispatch.torch_ops: {_why}, and the Python custom_op path needs torch >= 2.4 "
                          f"(this is {torch.__version__})")
    sys.stderr.write(f"kdispatch.torch_ops: {_why}; using the Python custom_op path (slower)\n")
    from . import _torch_custom as _impl
    from ._torch_custom import call_info, gemm_info, get_runtime, set_runtime  # noqa: F401
    __all__ = list(_impl.__all__) + ["NATIVE", "BUILT_FOR"]
    for _q in _impl.__all__:
        globals()[_q] = getattr(_impl, _q)
else:
    import json

    import atexit
    import time

    def _park_at_exit():
        """At interpreter exit: a native op that returns on another thread
        from now on parks there (never takes the GIL back: torch's binding
        would std::terminate the process taking it back during
        finalization); the short sleep lets the threads already waiting for
        the GIL through first."""
        _native.kdispatch_torch_park_at_exit()
        if threading.active_count() > 1:
            time.sleep(0.02)

    atexit.register(_park_at_exit)

    _lock = threading.Lock()
    _runtime = None
    # Every runtime the native ops were given, kept until exit: an op may
    # have read its handle just before set_runtime() moved on, so the handle
    # (a few hundred bytes once closed) must stay valid; a call through a
    # closed one raises failed_precondition (kdispatch_runtime_close).
    _given = []
    _OPS = {o["name"]: o for o in json.loads(_capi.op_list_json())}
    _SOURCES = ("table", "default", "forced")

    def set_runtime(rt):
        """Serves the ops from `rt` (a kdispatch.Runtime); None: the default
        runtime. The runtime must stay open while ops may run."""
        global _runtime
        if rt is not None and not isinstance(rt, Runtime):
            raise TypeError(f"set_runtime() takes a kdispatch.Runtime or None, not {type(rt).__name__}")
        with _lock:
            _native.kdispatch_torch_set_runtime(ctypes.c_void_p(rt.handle if rt is not None else 0))  # raises for a closed runtime
            if rt is not None and all(r is not rt for r in _given):
                _given.append(rt)
            _runtime = rt

    def get_runtime():
        with _lock:
            rt = _runtime
        return rt if rt is not None else default_runtime()

    def _qual(op):
        outputs = [a for a in op["args"] if a["written"] and not a["read"]]
        return op["name"] if outputs else op["name"] + "_"

    def call_info(name, *tensors, **scalars):
        """Runs op `name` exactly as its torch op does and returns (outputs,
        info): outputs as the op returns them, info what served the call
        ({"source", "variant", "M", "source_id", "tuned_now"}). For
        benchmarks and debugging; not a registered op. An op whose output
        size is a formula (moe_align) has only its out form: pass its outputs
        first, as to torch.ops.kdispatch.<op>_out."""
        op = _OPS[name]
        unknown = set(scalars) - {s["name"] for s in op["scalars"]}
        if unknown:
            raise TypeError(f"call_info('{name}'): unknown scalar(s) {sorted(unknown)}; "
                            f"{name} takes {[s['name'] for s in op['scalars']]}")
        args = list(tensors)
        readable = [a for a in op["args"] if a["read"] or not a["written"]]
        outs = [a for a in op["args"] if a["written"] and not a["read"]]
        out_form = any(a.get("computed") for a in outs)
        args += [None] * (len(readable) + (len(outs) if out_form else 0) - len(args))
        args += [_schema_scalar(scalars.get(s["name"], s["default"]), s) for s in op["scalars"]]
        out = getattr(torch.ops.kdispatch, name + "_out" if out_form else _qual(op))(*args)
        source, variant, m, source_id, tuned = torch.ops.kdispatch._last_info()
        served = {"source": _SOURCES[source] if 0 <= source <= 2 else None, "variant": variant,
                  "M": m if m >= 0 else None, "source_id": source_id, "tuned_now": tuned}
        return out, served

    def _schema_scalar(v, s):
        """A scalar for the op's schema argument, checked as Runtime's
        methods check it (_runtime._scalar, which names a refused one): a
        switch a bool (0.99999999 is refused, never True), an "int" a whole
        number as an int (4.9 is never truncated to 4: ValueError naming
        it), a choice or a float as a float (1e300 refused: no float32)."""
        kind, name = s.get("kind"), s["name"]
        if kind == "int":
            try:
                return operator.index(v)  # np.int64(2**53 + 1) as it is, not through a float
            except TypeError:
                pass
            try:
                f = float(v)
                ok = f == f and f.is_integer() and bool(v == f)
            except Exception:
                ok = False
            if not ok:
                raise ValueError(f"{name}: must be a whole number, got {v!r}")
            return int(f)
        f = _scalar(v, kind, name)
        return f == 1.0 if kind == "bool" else f

    def gemm_info(a, b, bias=None):
        """call_info("gemm", a, b, bias): (d, info)."""
        return call_info("gemm", a, b, bias)

    __all__ = ["set_runtime", "get_runtime", "call_info", "gemm_info", "NATIVE", "BUILT_FOR"]
    for _o in _OPS.values():
        _q = _qual(_o)
        # An output whose size is a formula (moe_align's): out form only (the caller allocates).
        if not any(a.get("computed") and a["written"] and not a["read"] for a in _o["args"]):
            globals()[_q] = getattr(torch.ops.kdispatch, _q)
            __all__.append(_q)
        if _q == _o["name"]:
            globals()[_q + "_out"] = getattr(torch.ops.kdispatch, _q + "_out")
            __all__.append(_q + "_out")
