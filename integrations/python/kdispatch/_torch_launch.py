# SPDX-License-Identifier: Apache-2.0
"""How the Python torch ops (_torch_custom.py) call kdispatch: DLTensors
viewing the torch tensors (no copy), torch's current stream and its capture
flag, and the call's workspace, through ctypes on the C ABI. Needs no
torch.library.custom_op, so it imports with any torch (its tests run under
Debian's torch 1.13).

The workspace, as the native ops give it (integrations/torch/src/
torch_ops.cpp): an op that takes one (its row's "workspace") gets, on a GPU,
the stream's attached workspace (32 MiB of kdispatch's own memory,
kdispatch_runtime_attach_stream), and, when kdispatch_op_workspace_bytes
says this call may ask for more (fused_moe's tensor-core plans, long
prefills), its own: a torch tensor of that many bytes, taken from torch's
caching allocator on the current stream (during a graph capture, from the
graph's private pool, kept for the graph's replays). The GEMMs are never
asked: their cuBLASLt and split-K plans take the stream's workspace, as
torch's own cuBLAS calls do.
"""

import ctypes

import torch

from . import _capi
from ._runtime import _scalar

_DTYPES = {torch.float32: (_capi.kDLFloat, 32), torch.float16: (_capi.kDLFloat, 16),
           torch.bfloat16: (_capi.kDLBfloat, 16), torch.float64: (_capi.kDLFloat, 64)}

#: The bytes of the workspace attached to a stream (torch's cuBLAS workspace
#: on Hopper; the native ops' kStreamWorkspaceBytes): a call that may ask for
#: more gets its own.
STREAM_WORKSPACE_BYTES = 32 << 20


def dl(t, keep):
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
    return ctypes.pointer(d)


def dl_array(tensors, keep):
    """The C array of DLTensor pointers of `tensors` (argument order, None =
    absent) that kdispatch_op_call and kdispatch_op_workspace_bytes take."""
    return (ctypes.POINTER(_capi.DLTensor) * max(1, len(tensors)))(
        *[dl(t, keep) if t is not None else None for t in tensors])


def scalar_array(scalars, kinds=(), names=()):
    """The C ABI's float scalars; `kinds`, `names`: the op's scalar kinds and
    names in order. An integer one (kind "int": a size; "choice": a label's
    index) as Runtime's methods pass it (_runtime._int_scalar): past 2^24,
    -1, which the library refuses by name (a float32 would round 2^24 + 1 to
    2^24, a size a call takes); a fraction a float32 would round to a whole
    number (0.999999999) refused here, naming it."""
    kinds = list(kinds) + [None] * (len(scalars) - len(kinds))
    names = list(names) + ["value"] * (len(scalars) - len(names))
    return (ctypes.c_float * max(1, len(scalars)))(*[_scalar(v, k, n) for v, k, n in zip(scalars, kinds, names)])


def workspace_bytes(name, ptrs, n_tensors, sc, n_scalars):
    """kdispatch_op_workspace_bytes of this call (`ptrs`, `sc` as
    kdispatch_op_call takes them): the most any variant of the tensors'
    backend may ask; 0 when the library refuses the call (the call itself
    then says why), as the native ops do."""
    out = ctypes.c_int64(0)
    s = _capi.lib.kdispatch_op_workspace_bytes(name.encode(), ptrs, n_tensors, sc, n_scalars, ctypes.byref(out))
    return out.value if s == 0 else 0


def call_workspace(op, ptrs, n_tensors, sc, n_scalars, device):
    """This call's own workspace: a uint8 tensor on `device` (torch's
    allocator, current stream) of workspace_bytes(...) bytes when the op
    takes a workspace, is not a GEMM (name starting with "gemm") and may ask
    for more than STREAM_WORKSPACE_BYTES; else None (the stream's attached
    workspace serves)."""
    if not op["workspace"] or op["name"].startswith("gemm"):
        return None
    need = workspace_bytes(op["name"], ptrs, n_tensors, sc, n_scalars)
    if need <= STREAM_WORKSPACE_BYTES:
        return None
    return torch.empty(need, dtype=torch.uint8, device=device)


# GEMM workspace per (runtime, device, stream): kdispatch's own device
# memory (kdispatch_runtime_attach_stream), attached on a stream's first
# call of an op that takes one, outside a graph capture. Never torch memory:
# a tensor taken during a cudagraph-trees warm-up or capture would live in
# a graph's private pool ("tensors in the cudagraph pool not tracked as
# outputs"), and could be handed to other tensors when the pool is reused.
_ATTACHED = set()


def _attach_workspace(rt, device, stream, capturing):
    """Attaches the stream's workspace once. A stream first seen while it is
    being captured gets none (its split-K plans fall back to the default
    plan inside the call)."""
    key = (rt.handle, device.index or 0, stream)
    if key in _ATTACHED or capturing:
        return
    _ATTACHED.add(key)  # a failure (64 streams) is not retried: no workspace
    _capi.lib.kdispatch_runtime_attach_stream(ctypes.c_void_p(rt.handle),
                                              _capi.kDLROCM if torch.version.hip else _capi.kDLCUDA,
                                              device.index or 0, ctypes.c_void_p(stream or 0),
                                              STREAM_WORKSPACE_BYTES)


def launch(rt, op, tensors, scalars, info=None):
    """Calls kdispatch op `op` (a row of the op list) of runtime `rt` on
    `tensors` (argument order, None = absent) on torch's current stream,
    with the capture flag when that stream is being captured, and on a GPU
    the workspace the op takes (the module's docstring). info: a
    _capi.DispatchInfo to fill (what served the call)."""
    first = next(t for t in tensors if t is not None)
    stream, flags = None, 0
    if first.device.type == "cuda":
        stream = torch.cuda.current_stream(first.device).cuda_stream
        if torch.cuda.is_current_stream_capturing():
            flags |= _capi.CALL_CAPTURING
    keep = []
    ptrs = dl_array(tensors, keep)
    sc = scalar_array(scalars, [s.get("kind") for s in op["scalars"]], [s["name"] for s in op["scalars"]])
    ws = None
    if op["workspace"] and first.device.type == "cuda":
        ws = call_workspace(op, ptrs, len(tensors), sc, len(scalars), first.device)
        if ws is None:
            _attach_workspace(rt, first.device, stream, bool(flags & _capi.CALL_CAPTURING))
    _capi.check(_capi.lib.kdispatch_op_call(
        ctypes.c_void_p(rt.handle), op["name"].encode(), ptrs, len(tensors), sc, len(scalars),
        ctypes.c_void_p(ws.data_ptr()) if ws is not None else None, ctypes.c_int64(ws.numel() if ws is not None else 0),
        ctypes.c_void_p(stream or 0), flags, ctypes.byref(info) if info is not None else None))
