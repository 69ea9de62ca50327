# SPDX-License-Identifier: Apache-2.0
"""kdispatch.torch_ops' Python path, used when libkdispatch_torch.so is not
built for the running torch: custom ops over kdispatch (torch >= 2.4, torch.library.custom_op),
one per op of the library's op list (kdispatch_op_list), for example:

    import kdispatch.torch_ops
    y = torch.ops.kdispatch.rmsnorm(x, w, 1e-6)                   # -> new tensor
    torch.ops.kdispatch.fused_add_rmsnorm_(x, residual, w, 1e-6)  # in place, -> None
    d = torch.ops.kdispatch.gemm(a, b, bias)                      # a @ b.T + bias

How an op becomes a torch op (from its row: argument names, roles, shapes):
- An op with outputs (arguments it only writes) is functional: it takes the
  arguments it reads and its scalars, allocates its outputs (torch memory,
  shaped from the inputs by the row's dims; leading dims of the first input
  kept) and returns them. An op that only modifies arguments in place is
  `<name>_`, mutates them (declared in its schema) and returns None.
- Inputs are [..., cols] with unit stride on the last dim; leading dims are
  flattened (views; in-place arguments must be viewable). dtypes as
  kdispatch computes them (float32, bfloat16; float16 where the backend has
  it).
- Fake (meta) implementations are registered (torch.library.register_fake),
  so torch.compile traces through the ops (fullgraph works).
- GPU tensors run on torch's current stream
  (torch.cuda.current_stream().cuda_stream). While that stream is being
  captured into a CUDA graph (torch.cuda.is_current_stream_capturing()) the
  call passes KDISPATCH_CALL_CAPTURING: kdispatch then never allocates,
  synchronises or tunes. Outputs are always allocated by torch (its graph
  pool during capture), outside the kdispatch call.
- Workspace (_torch_launch.py), as the native ops give it: on a GPU, the
  stream's attached 32 MiB; a call of a non-GEMM op that may ask for more
  (kdispatch_op_workspace_bytes: fused_moe at large M * top_k) gets its own
  torch tensor of that size on the current stream.
- The runtime: set_runtime(rt), else kdispatch.default_runtime() (the
  KDISPATCH_* environment; a KDISPATCH_CONFIG_DIRS dir that does not exist
  is skipped, with a RuntimeWarning at import).

The calls go through ctypes on the C ABI (pointers, shapes and strides
straight from the tensors; no DLPack export, no copy), so this module needs
nothing compiled for the running Python.
"""

import ctypes
import json
import struct
import threading
from typing import Optional  # noqa: F401  (the generated signatures use it)

import torch

from . import _backend  # noqa: F401  (loads the library the rest of the package uses)
from . import _capi, _torch_launch
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


def _launch(op, tensors, scalars, info=None):
    """Calls kdispatch op `op` on `tensors` with the runtime the ops use
    (_torch_launch.launch: torch's current stream, the capture flag, the
    stream's workspace and, where the op may ask for more, the call's own)."""
    _torch_launch.launch(get_runtime(), op, tensors, scalars, info)


def _rows(t, name, view):
    if t.dim() < 1:
        raise Error(StatusCode.invalid_argument, f"{name} must have at least one dimension")
    if t.dim() == 2:
        return t
    return t.view(-1, t.shape[-1]) if view else t.reshape(-1, t.shape[-1])


def _extent(e, dims):
    """The extent mul * dim / div (rounded up); no dim ("": quant_fp8_tensor's
    scale [1]) is 1."""
    v = (dims[e["dim"]] if e["dim"] else 1) * e["mul"]
    return v if e["div"] == 1 else -(-v // e["div"])


# The library's dtype names, as torch's (fp8 where this torch has it).
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
           "fp8_e4m3fn": getattr(torch, "float8_e4m3fn", None)}


def _out_dtype(op, a, like):
    """An output's dtype, as the native ops choose it: a fixed fp32 slot
    (quant_fp8_*'s scale) fp32; an "out" slot the op's default output dtype
    (fp8 for the quant ops, bf16 for the fp8 GEMMs) where it has one; else
    the first input's."""
    name = "fp32" if a.get("dtype") == "fp32" else op.get("default_out_dtype", "") if a.get("dtype") == "out" else ""
    return _DTYPES.get(name) or like.dtype


def _bind(op, given, scalars=None):
    """The op's dims from the tensors it reads ({"M": .., "K": ..}), by its
    row: a plain extent binds its dim, a multiple (2*d) binds dim = extent /
    mul. `given`: argument name -> tensor (as [rows, cols] or [cols]).
    `scalars` (name -> value): the dims an "int" scalar sets (moe_gemm's
    top_k) bind first, as kdispatch binds them, so outputs take them and a
    tensor that disagrees is refused by kdispatch naming that tensor."""
    dims = {}
    for s in op["scalars"] if scalars else ():
        v = scalars.get(s["name"])
        if s.get("kind") == "int" and s.get("dim") and isinstance(v, (int, float)) and 1 <= v <= 1 << 24 \
                and v == int(v):  # another value: kdispatch refuses it naming the scalar
            dims[s["dim"]] = int(v)
    for a in op["args"]:
        t = given.get(a["name"])
        if t is None:
            continue
        if a["rank"] == 3:  # [batch, rows, cols] as it is (experts' weights [E, N, K])
            exts, sizes = [a["batch"], a["rows"], a["cols"]], list(t.shape[:3])
        else:
            exts = ([a["rows"]] if a["rank"] == 2 else []) + [a["cols"]]
            sizes = (list(t.shape[:1]) if a["rank"] == 2 else []) + [t.shape[-1]]
        for e, n in zip(exts, sizes):
            if e["dim"] and e["dim"] not in dims and e["div"] == 1:
                if n % e["mul"]:  # x [..., 2*d] with an odd last dim: no d (refused even when empty)
                    raise Error(StatusCode.invalid_argument,
                                f"{a['name']}: size {n} is not {e['mul']}*{e['dim']} (a multiple of {e['mul']})")
                dims[e["dim"]] = n // e["mul"]
    return dims


def _outputs(op, inputs, alloc):
    """Allocates (alloc(shape, like, dtype): torch.empty or new_empty) the
    op's pure outputs as the native ops do: rows of M ([M, N]) take the
    leading dims of its first 2-D input ([B, T, K] in, [B, T, N] out); rows
    of another dim (quant_fp8_group's scale [ceil(K/128), M]) or with no 2-D
    input (moe_sum's [M, top_k, hidden]) come from the dims, as does rank 3
    (moe_gemm's out [M, top_k, N]); the dtype by _out_dtype, the device of
    its first input."""
    given = {a["name"]: inputs[a["name"]].reshape(-1, inputs[a["name"]].shape[-1])
             if a["rank"] == 2 and inputs.get(a["name"]) is not None else inputs.get(a["name"])
             for a in op["args"] if a["name"] in inputs}
    dims = _bind(op, given, inputs)
    read = [inputs[a["name"]] for a in op["args"] if inputs.get(a["name"]) is not None]
    first = next((inputs[a["name"]] for a in op["args"] if inputs.get(a["name"]) is not None and a["rank"] == 2),
                 None)
    outs = {}
    for a in op["args"]:
        if a["written"] and not a["read"]:
            cols = _extent(a["cols"], dims)
            rows = a["rows"]
            if a["rank"] == 3:  # moe_gemm's out [M, top_k, N]
                lead = (_extent(a["batch"], dims), _extent(rows, dims))
            elif a["rank"] != 2:
                lead = ()
            elif first is not None and rows["dim"] == op["m_name"] and rows["mul"] == 1 and rows["div"] == 1:
                lead = tuple(first.shape[:-1])
            else:
                lead = (_extent(rows, dims),)
            outs[a["name"]] = alloc((*lead, cols), read[0], _out_dtype(op, a, read[0]))
    return outs


# An op's answer on an empty reduction that kdispatch refuses (gemm with
# K = 0: torch's F.linear gives bias or zeros).
def _gemm_k0(inputs, outs):
    d = outs["d"].zero_()
    if inputs.get("bias") is not None:
        d += inputs["bias"]


def _moe_sum_k0(inputs, outs):
    outs["out"].zero_()


_EMPTY_REDUCTION = {"gemm": ("K", _gemm_k0), "moe_sum": ("top_k", _moe_sum_k0)}


def _call(op, inputs, info=None):
    """Runs `op` on `inputs` (argument name -> tensor or None, plus the
    scalars by name); returns its outputs {name: tensor}."""
    outs = _outputs(op, inputs, lambda shape, like, dtype: torch.empty(shape, dtype=dtype, device=like.device))
    tensors, any_empty, empty_3d = [], False, False
    for a in op["args"]:
        t = outs[a["name"]] if a["name"] in outs else inputs.get(a["name"])
        if t is not None and a["rank"] == 2:
            any_empty = any_empty or t.numel() == 0
            t = _rows(t, a["name"], view=a["written"])
        empty_3d = empty_3d or (t is not None and a["rank"] == 3 and t.numel() == 0)
        tensors.append(t)
    reduction = _EMPTY_REDUCTION.get(op["name"])
    if any_empty or (empty_3d and reduction):  # moe_sum's top_k = 0: a 3-D input alone is empty
        dims = _bind(op, {a["name"]: t for a, t in zip(op["args"], tensors) if t is not None and not a["written"]})
        if reduction and dims.get(reduction[0]) == 0 and all(t.numel() for t in outs.values()):
            reduction[1](inputs, outs)
            return outs
        # M = 0 alone: kdispatch checks the call (a K that disagrees, a top_k
        # its topk_weights do not have) and writes what is not empty
        # (quant_fp8_tensor's scale [1]), as the native ops' call does.
        if not all(v for d, v in dims.items() if d != op["m_name"]):
            return outs
    _launch(op, tensors, [inputs[s["name"]] for s in op["scalars"]], info)
    return outs


def _float32_text(v):
    """The shortest float literal of float32 `v` ("1e-06", "1.0", as the
    native schemas' defaults; not 9.999999974752427e-07, its float64 digits)."""
    def f32(x):
        return struct.unpack("f", struct.pack("f", x))[0]
    t = next(t for t in (f"{f32(v):.{p}g}" for p in range(1, 10)) if f32(float(t)) == f32(v))
    if t in ("inf", "-inf", "nan"):
        return f"float('{t}')"
    return t if any(c in t for c in ".e") else t + ".0"  # "1" -> "1.0"


def _register(op):
    """torch.ops.kdispatch.<name> (functional) or <name>_ (in place)."""
    outputs = [a for a in op["args"] if a["written"] and not a["read"]]
    mutated = [a["name"] for a in op["args"] if a["written"] and a["read"]]
    params = []
    trailing = len(op["args"])
    while trailing > 0 and op["args"][trailing - 1]["optional"]:
        trailing -= 1
    for i, a in enumerate(op["args"]):
        if a in outputs:
            continue
        params.append(f"{a['name']}: Optional[torch.Tensor] = None" if i >= trailing else f"{a['name']}: torch.Tensor")
    # Every scalar has its default, as in the native schemas (rmsnorm's
    # eps=1e-06): a scalar follows the optional tensors (fused_moe's
    # w1_scale, w2_scale), and a switch (kind "bool": fast_accum) added later
    # keeps older calls working.
    params += [f"{s['name']}: bool = {bool(s['default'])}" if s.get("kind") == "bool"
               else f"{s['name']}: float = {_float32_text(s['default'])}" for s in op["scalars"]]
    names = [a["name"] for a in op["args"] if a not in outputs] + [s["name"] for s in op["scalars"]]
    qual = op["name"] if outputs else op["name"] + "_"
    ret = "None" if not outputs else "torch.Tensor" if len(outputs) == 1 else \
        "tuple[" + ", ".join("torch.Tensor" for _ in outputs) + "]"
    pick = "None" if not outputs else f"outs['{outputs[0]['name']}']" if len(outputs) == 1 else \
        "(" + ", ".join(f"outs['{o['name']}']" for o in outputs) + ")"
    src = (f"def {qual}({', '.join(params)}) -> {ret}:\n"
           f"    outs = _call(_OP, {{{', '.join(repr(n) + ': ' + n for n in names)}}})\n"
           f"    return {pick}\n"
           f"def fake({', '.join(params)}):\n"
           f"    outs = _outputs(_OP, {{{', '.join(repr(n) + ': ' + n for n in names)}}}, "
           f"lambda shape, like, dtype: like.new_empty(shape, dtype=dtype))\n"
           f"    return {pick}\n")
    scope = {"torch": torch, "Optional": Optional, "_call": _call, "_outputs": _outputs, "_OP": op}
    exec(compile(src, f"<kdispatch.torch_ops:{qual}>", "exec"), scope)
    fn = scope[qual]
    fn.__doc__ = op.get("doc", "")
    registered = torch.library.custom_op(f"kdispatch::{qual}", mutates_args=tuple(mutated))(fn)
    torch.library.register_fake(f"kdispatch::{qual}")(scope["fake"])
    return qual, registered


_OPS = {o["name"]: o for o in json.loads(_capi.op_list_json())}
__all__ = ["set_runtime", "get_runtime", "call_info", "gemm_info"]
for _o in _OPS.values():
    # This path registers functional ops; an op whose outputs are sized by a
    # formula (moe_align) has only the native library's out forms.
    if any(a.get("computed") and a["written"] and not a["read"] for a in _o["args"]):
        continue
    _qual, _fn = _register(_o)
    globals()[_qual] = _fn
    __all__.append(_qual)


def call_info(name, *tensors, **scalars):
    """Runs op `name` exactly as its torch op does (same stream, same
    workspace) and returns (outputs, info): outputs as the op returns them,
    info what served the call ({"source", "variant", "M", ...}). For
    benchmarks and debugging; not a registered op."""
    op = _OPS[name]
    readable = [a for a in op["args"] if a["read"] or not a["written"]]
    inputs = {a["name"]: t for a, t in zip(readable, tensors)}
    for a in readable[len(tensors):]:
        inputs.setdefault(a["name"], None)
    for s in op["scalars"]:
        inputs[s["name"]] = scalars.get(s["name"], s["default"])
    i = _capi.DispatchInfo()
    i.struct_size = ctypes.sizeof(_capi.DispatchInfo)
    outs = _call(op, inputs, info=i)
    result = tuple(outs.values())
    served = _capi.info_dict(i) if i.variant else {"source": None, "variant": "", "M": None, "source_id": 0,
                                                   "tuned_now": False}
    return (result[0] if len(result) == 1 else result if result else None), served


def gemm_info(a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None):
    """call_info("gemm", a, b, bias): (d, info)."""
    return call_info("gemm", a, b, bias)

