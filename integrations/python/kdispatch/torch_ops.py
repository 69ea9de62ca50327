# SPDX-License-Identifier: Apache-2.0
"""PyTorch custom ops over kdispatch (torch >= 2.4, torch.library.custom_op):

    import kdispatch.torch_ops
    y = torch.ops.kdispatch.rmsnorm(x, w, 1e-6)                   # -> new tensor
    torch.ops.kdispatch.fused_add_rmsnorm_(x, residual, w, 1e-6)  # in place, -> None
    d = torch.ops.kdispatch.gemm(a, b, bias)                      # a @ b.T + bias

- Inputs are [..., hidden] / [..., K] with unit stride on the last dim;
  leading dims are flattened (views; the in-place op needs viewable x and
  residual). dtypes as kdispatch computes them (float32, bfloat16; float16
  where the backend has it); outputs have the input's dtype.
- Fake (meta) implementations are registered (torch.library.register_fake),
  so torch.compile traces through the ops (fullgraph works).
- GPU tensors run on torch's current stream
  (torch.cuda.current_stream().cuda_stream). While that stream is being
  captured into a CUDA graph (torch.cuda.is_current_stream_capturing()) the
  call passes KDISPATCH_CALL_CAPTURING: kdispatch then never allocates,
  synchronises or tunes. Outputs are always allocated by torch (its graph
  pool during capture), outside the kdispatch call.
- The runtime: set_runtime(rt), else kdispatch.default_runtime() (the
  KDISPATCH_* environment).

The calls go through ctypes on the C ABI (pointers, shapes and strides
straight from the tensors; no DLPack export, no copy), so this module needs
nothing compiled for the running Python.
"""

import ctypes
import threading
from typing import Optional

import torch

from . import _backend  # noqa: F401  (loads the library the rest of the package uses)
from . import _capi
from ._errors import Error, StatusCode
from ._runtime import default_runtime

if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_fake"):
    raise ImportError(f"kdispatch.torch_ops needs torch >= 2.4 (torch.library.custom_op); this is {torch.__version__}")

_lock = threading.Lock()
_runtime = None


def set_runtime(rt):
    """Serves the ops from `rt` (a kdispatch.Runtime); None: the default runtime."""
    global _runtime
    with _lock:
        _runtime = rt


def get_runtime():
    with _lock:
        rt = _runtime
    return rt if rt is not None else default_runtime()


_DTYPES = {torch.float32: (_capi.kDLFloat, 32), torch.float16: (_capi.kDLFloat, 16),
           torch.bfloat16: (_capi.kDLBfloat, 16), torch.float64: (_capi.kDLFloat, 64)}


def _dl(t, keep):
    """A DLTensor viewing `t` (no copy); its buffers are appended to `keep`."""
    if t.dtype in _DTYPES:
        code, bits = _DTYPES[t.dtype]
    elif t.dtype.is_complex:
        code, bits = 5, t.element_size() * 8  # kDLComplex
    else:
        code, bits = (_capi.kDLInt if t.dtype.is_signed else _capi.kDLUInt), t.element_size() * 8
    if t.device.type == "cpu":
        dev = (_capi.kDLCPU, 0)
    elif t.device.type == "cuda":
        dev = (_capi.kDLROCM if torch.version.hip else _capi.kDLCUDA, t.device.index or 0)
    else:
        dev = (-1, 0)  # kdispatch answers unsupported_device
    n = t.dim()
    shape = (ctypes.c_int64 * max(1, n))(*t.shape)
    strides = (ctypes.c_int64 * max(1, n))(*t.stride())
    d = _capi.DLTensor()
    d.data = t.data_ptr() or None
    d.device = _capi.DLDevice(dev[0], dev[1])
    d.ndim = n
    d.dtype = _capi.DLDataType(code, bits, 1)
    d.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    d.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    d.byte_offset = 0
    keep += [shape, strides, d]
    return ctypes.byref(d)


# GEMM workspace per (device, stream): torch memory, allocated on a stream's
# first gemm outside a graph capture and kept (kdispatch itself never
# allocates in a call). 32 MiB, the size kdispatch's tuner measures with.
_WORKSPACE_BYTES = 32 << 20
_WORKSPACES = {}


def _workspace(device, stream, capturing):
    """The stream's workspace, allocated on its first gemm outside a graph
    capture. A stream first seen while it is being captured gets none (its
    split-K plans fall back to the default plan inside the call): memory
    taken from a graph's private pool and kept here could be handed to
    other tensors when the pool is reused (cudagraph trees), while the
    captured kernels still write into it."""
    key = (device.index or 0, stream)
    ws = _WORKSPACES.get(key)
    if ws is None and not capturing:
        ws = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _WORKSPACES[key] = ws
    return ws


def _launch(fn, tensors, tail, workspace=False, info=None):
    """Calls a C ABI op on `tensors` (None = absent) on torch's current
    stream, with the capture flag when that stream is being captured.
    workspace=True (gemm): kdispatch_gemm_ws with the stream's workspace.
    info: a _capi.DispatchInfo to fill (what served the call)."""
    rt = get_runtime()
    first = tensors[0]
    stream, flags = None, 0
    if first.device.type == "cuda":
        stream = torch.cuda.current_stream(first.device).cuda_stream
        if torch.cuda.is_current_stream_capturing():
            flags |= _capi.CALL_CAPTURING
    keep = []
    args = [_dl(t, keep) if t is not None else None for t in tensors]
    if workspace:
        ws = _workspace(first.device, stream, bool(flags & _capi.CALL_CAPTURING)) if first.device.type == "cuda" else None
        tail = (*tail, ctypes.c_void_p(ws.data_ptr() if ws is not None else 0),
                ctypes.c_int64(ws.numel() if ws is not None else 0))
    _capi.check(fn(ctypes.c_void_p(rt.handle), *args, *tail, ctypes.c_void_p(stream or 0), flags,
                   ctypes.byref(info) if info is not None else None))


def _rows(t, name, view):
    if t.dim() < 1:
        raise Error(StatusCode.invalid_argument, f"{name} must have at least one dimension")
    if t.dim() == 2:
        return t
    return t.view(-1, t.shape[-1]) if view else t.reshape(-1, t.shape[-1])


@torch.library.custom_op("kdispatch::rmsnorm", mutates_args=())
def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x**2, -1) + eps) * w, a new tensor shaped like x."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    _launch(_capi.lib.kdispatch_rmsnorm, [_rows(y, "y", True), _rows(x, "x", False), w], (float(eps),))
    return y


@torch.library.register_fake("kdispatch::rmsnorm")
def _rmsnorm_fake(x, w, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("kdispatch::fused_add_rmsnorm_", mutates_args=("x", "residual"))
def fused_add_rmsnorm_(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float) -> None:
    """In place: residual += x; x = rmsnorm(residual) * w."""
    if x.numel() == 0:
        return
    _launch(_capi.lib.kdispatch_fused_add_rmsnorm, [_rows(x, "x", True), _rows(residual, "residual", True), w],
            (float(eps),))


@torch.library.register_fake("kdispatch::fused_add_rmsnorm_")
def _fused_add_rmsnorm_fake(x, residual, w, eps):
    return None


@torch.library.custom_op("kdispatch::gemm", mutates_args=())
def gemm(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """a[..., K] @ b[N, K].T (+ bias[N]) -> [..., N], a's dtype; b as
    torch.nn.Linear stores its weight."""
    d = torch.empty((*a.shape[:-1], b.shape[0]), dtype=a.dtype, device=a.device)
    if d.numel() == 0:
        return d
    if a.shape[-1] == 0:  # K = 0: nothing to accumulate
        d.zero_()
        if bias is not None:
            d += bias
        return d
    _launch(_capi.lib.kdispatch_gemm_ws, [_rows(a, "a", False), b, _rows(d, "d", True), bias], (), workspace=True)
    return d


def gemm_info(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None):
    """Runs gemm exactly as torch.ops.kdispatch.gemm does (same stream, same
    workspace) and returns (d, info): info is what served the call, as
    kdispatch.Runtime ops report it ({"source", "variant", "M", ...}). For
    benchmarks and debugging; not a registered op."""
    if a.shape[-1] == 0 or b.shape[0] == 0 or a.numel() == 0:
        return gemm(a, b, bias), {"source": None, "variant": "", "M": None, "source_id": 0, "tuned_now": False}
    d = torch.empty((*a.shape[:-1], b.shape[0]), dtype=a.dtype, device=a.device)
    i = _capi.DispatchInfo()
    i.struct_size = ctypes.sizeof(_capi.DispatchInfo)
    _launch(_capi.lib.kdispatch_gemm_ws, [_rows(a, "a", False), b, _rows(d, "d", True), bias], (), workspace=True,
            info=i)
    return d, _capi.info_dict(i)


@torch.library.register_fake("kdispatch::gemm")
def _gemm_fake(a, b, bias=None):
    return a.new_empty((*a.shape[:-1], b.shape[0]))


__all__ = ["rmsnorm", "fused_add_rmsnorm_", "gemm", "gemm_info", "set_runtime", "get_runtime"]
