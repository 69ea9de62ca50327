# SPDX-License-Identifier: Apache-2.0
"""SGLang's fused-MoE and block-fp8 GEMM config lookup, served by kdispatch.

Drop-in replacements for SGLang's functions as they are at the SGLang commit
the project's reference data tracks (d55f1c28, 2026-08-18):

- from ``sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config``:
  ``get_config_file_name``, ``get_moe_configs`` (with ``down_moe``),
  ``get_default_config`` (with its shared-memory-dependent fp8 default) and
  ``try_get_optimal_moe_config`` (with ``per_channel_quant`` and
  ``return_down_config``);
- from ``sglang.kernels.ops.quantization.fp8_kernel``:
  ``get_w8a8_block_fp8_configs`` (with its BLOCK_SIZE_K adjustment);
- from ``sglang.srt.layers.moe.fused_moe_triton.fused_moe``:
  ``fused_experts`` (TopK output and MoeRunnerConfig unpacked into
  ``torch.ops.kdispatch.fused_moe``: bf16/fp16 and block-fp8 experts; needs
  torch).

Each takes SGLang's positional and keyword arguments and returns what SGLang
returns, for every M (M = 0 and below get the smallest key's row, M past
int64 the largest key's). Keyword-only extras: ``device_name=`` (else torch's
current GPU), ``runtime=``, ``strict_sglang=`` and, for the defaults,
``shared_memory_per_block_optin=`` and ``deterministic_inference=``.

Where the tables come from
--------------------------
A kdispatch runtime's config dirs: SGLang's own ``configs/`` folders, read as
they are. Which runtime: ``configure(...)``, else the ``runtime=`` argument,
else one built on first use from the environment (KDISPATCH_* variables) with
these dirs: $SGLANG_MOE_CONFIG_DIR/configs when set, else the installed
SGLang package's fused-MoE ``configs/``; plus the package's block-fp8
``configs/`` (``kernels/ops/quantization/configs``, older releases
``srt/layers/quantization/configs``); ``backend_version = triton.__version__``
when Triton is installed (KDISPATCH_BACKEND_VERSION overrides). Without
SGLang installed and without KDISPATCH_CONFIG_DIRS, that runtime has no
tables: every lookup answers SGLang's default config (a RuntimeWarning says
so once). To serve a tree, name it::

    from kdispatch import sglang
    sglang.configure(config_dirs=["/path/to/triton_utils/configs",      # holds triton_3_5_1/ ...
                                  "/path/to/quantization/configs"],     # N=...,K=... block-fp8 files
                     backend_version="3.5.1")                           # triton.__version__
    sglang.try_get_optimal_moe_config((257, 512, 7168), (257, 7168, 256), 8, "fp8_w8a8", 1,
                                      block_shape=[128, 128], device_name="NVIDIA H200")
    # -> {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
    #     "num_warps": 4, "num_stages": 5}     (triton_3_5_1/E=257,N=256,...,block_shape=[128, 128].json)

The device is ``device_name=`` when given (torch's spelling, "NVIDIA H200";
"" is a name too: SGLang's ``device_name=`` files), else
``torch.cuda.get_device_name()`` when torch sees a CUDA/ROCm GPU; without
either, table lookups raise kdispatch.Error (invalid_argument).

The shared-memory-dependent fp8 default
---------------------------------------
With no table, SGLang's fp8_w8a8 default without a block shape is a smaller
tile (BLOCK_SIZE_K 256; BLOCK_SIZE_M 32 when M <= E, else 64) on a CUDA GPU
whose ``shared_memory_per_block_optin`` is below 128 KiB (Ampere's sm_86 and
Ada's sm_89: A10, L4, L20, L40, L40S, RTX 4090, RTX 6000 Ada; consumer
Blackwell sm_120/121: RTX 5090, RTX PRO 6000, GB10), never on ROCm. The shim
takes that limit from torch's device properties where torch (already
imported, or imported to name the device) sees the named GPU, else from a
table of device names (``SHARED_MEMORY_PER_BLOCK_OPTIN``), else from the
``shared_memory_per_block_optin=`` argument (bytes). The argument, when
given, overrides the other two (a caller who knows better); a device none of
them knows gets the regular default, as SGLang does where it cannot read the
properties. ROCm (``num_stages`` 2, never the smaller tile) is told by torch,
else by an AMD device name.

Two documented differences (default mode), reproduced under strict_sglang=True
---------------------------------------------------------------------------------
By default the tables are kdispatch's (``Runtime.lookup_table`` /
``Runtime.lookup``), and two rules are kdispatch's own:

1. Triton version folders. SGLang: the running version's
   ``triton_X_Y_Z/`` folder, else every ``triton_*`` folder newest first,
   newer ones included. kdispatch: the running version's folder, else the
   newest older folder holding the table, else the newest newer one.
   Example: Triton 3.4.0, DeepSeek-V3 on an H200
   (``E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json``
   exists in ``triton_3_2_0/``, ``triton_3_3_1/`` and ``triton_3_5_1/``):
   SGLang serves the 3.5.1 table, kdispatch the 3.3.1 one; at M = 1
   SGLang's row is BLOCK_SIZE_N 64, GROUP_SIZE_M 1, num_stages 5,
   kdispatch's BLOCK_SIZE_N 128, GROUP_SIZE_M 16, num_stages 4.
2. Nearest-M ties (M exactly halfway between two keys) go to the smaller
   key; SGLang's ``min(configs.keys(), key=lambda x: abs(x - M))`` takes the
   key that comes first in the file. Example:
   ``triton_3_1_0/E=16,N=6400,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json``
   lists 3840 before 3584; at M = 3712 SGLang serves the 3840 row,
   kdispatch the 3584 row (``get_moe_configs`` returns kdispatch's tables
   with ascending keys, so SGLang's own ``min`` over them agrees).

``strict_sglang=True`` (per call, or ``configure(..., strict_sglang=True)``)
reproduces SGLang exactly instead: the tables are read by SGLang's rules, in
Python, from the config dirs and Triton version given to ``configure()``
(for a runtime configure did not build: the dirs it loaded files from, and
``triton.__version__``, KDISPATCH_BACKEND_VERSION overriding); the first dir
holding the table serves (SGLang has one); no merging, aliases or tuning
cache; ties go to file order; tables come back in file order.

What kdispatch's tables add in the default mode (strict mode has none of
it): rows merged across config dirs and the tuning cache (the first dir
given wins on an M); device aliases (``NVIDIA H200 NVL`` is served the
``NVIDIA_H200`` files, where SGLang has no file and answers its default);
``block_shape=[128,128]`` spelled without the space; ``null`` rows and
vLLM's ``"triton_version"`` metadata tolerated (SGLang fails on them). On one
SGLang tree with tuning off only the aliases change an answer, and only for
a device that has no file under its own name.

Not done in either mode: SGLang's ``get_config()`` override (its
override_config context; an engine keeps that check on its side), the
server's deterministic-inference flag (pass
``deterministic_inference=True``) and ``torch._dynamo.is_compiling()``
(``get_w8a8_block_fp8_configs`` answers the table under torch.compile too).

Results are cached per (runtime, arguments); ``cache_clear()`` empties the
cache, and ``Runtime.reload()`` through Python invalidates it. Returned
dicts are copies.
"""

import importlib
import importlib.util
import json
import operator
import os
import sys
import threading
import warnings

from ._errors import Error, StatusCode
from ._runtime import Runtime

__all__ = ["configure", "get_runtime", "cache_clear", "get_config_file_name", "get_moe_configs",
           "get_default_config", "try_get_optimal_moe_config", "get_w8a8_block_fp8_configs",
           "SHARED_MEMORY_PER_BLOCK_OPTIN", "fused_experts", "invoke_fused_moe_kernel"]

_lock = threading.Lock()
_runtime = None
_strict = False
_warned_no_dirs = False
_CACHE_MAX = 65536
_INT64_MAX = (1 << 63) - 1
_LOW_SMEM_FP8_DEFAULT_CUTOFF_BYTES = 128 * 1024  # SGLang's cutoff (fused_moe_triton_config.py)
_SOURCE_ATTR = "_kdispatch_sglang_source"

# torch.cuda.get_device_properties(...).shared_memory_per_block_optin, bytes,
# by device name as SGLang spells it (torch's name, spaces -> "_"). Only the
# side of 128 KiB matters: sm_70 96 KiB, sm_75 64 KiB, sm_80/87 163 KiB,
# sm_86/89 99 KiB, sm_90/100/103 227 KiB, sm_120/121 99 KiB.
_KIB = 1024
SHARED_MEMORY_PER_BLOCK_OPTIN = {
    **dict.fromkeys(("Tesla_V100-SXM2-16GB", "Tesla_V100-SXM2-32GB", "Tesla_V100-PCIE-16GB",
                     "Tesla_V100-PCIE-32GB", "Tesla_V100S-PCIE-32GB", "Tesla_V100-SXM3-32GB"), 96 * _KIB),
    **dict.fromkeys(("Tesla_T4", "NVIDIA_T4", "Quadro_RTX_8000", "Quadro_RTX_6000",
                     "NVIDIA_GeForce_RTX_2080_Ti"), 64 * _KIB),
    **dict.fromkeys(("NVIDIA_A100-SXM4-40GB", "NVIDIA_A100-SXM4-80GB", "NVIDIA_A100-PCIE-40GB",
                     "NVIDIA_A100_80GB_PCIe", "NVIDIA_A800-SXM4-80GB", "NVIDIA_A800-SXM4-40GB",
                     "NVIDIA_A800_80GB_PCIe", "NVIDIA_A30"), 163 * _KIB),
    **dict.fromkeys(("NVIDIA_A10", "NVIDIA_A10G", "NVIDIA_A16", "NVIDIA_A2", "NVIDIA_A40", "NVIDIA_RTX_A4000",
                     "NVIDIA_RTX_A5000", "NVIDIA_RTX_A6000", "NVIDIA_GeForce_RTX_3080", "NVIDIA_GeForce_RTX_3090",
                     "NVIDIA_GeForce_RTX_3090_Ti",
                     "NVIDIA_L4", "NVIDIA_L20", "NVIDIA_L40", "NVIDIA_L40S", "NVIDIA_GeForce_RTX_4080",
                     "NVIDIA_GeForce_RTX_4090", "NVIDIA_GeForce_RTX_4090_D", "NVIDIA_RTX_4000_Ada_Generation",
                     "NVIDIA_RTX_5000_Ada_Generation", "NVIDIA_RTX_5880_Ada_Generation",
                     "NVIDIA_RTX_6000_Ada_Generation"), 99 * _KIB),
    **dict.fromkeys(("NVIDIA_H100_80GB_HBM3", "NVIDIA_H100_PCIe", "NVIDIA_H100_NVL", "NVIDIA_H800",
                     "NVIDIA_H800_PCIe", "NVIDIA_H20", "NVIDIA_H20-3e", "NVIDIA_H200", "NVIDIA_H200_NVL",
                     "NVIDIA_GH200_480GB", "NVIDIA_GH200_144G_HBM3e",
                     "NVIDIA_B200", "NVIDIA_GB200", "NVIDIA_B300_SXM6_AC", "NVIDIA_GB300"), 227 * _KIB),
    **dict.fromkeys(("NVIDIA_GeForce_RTX_5080", "NVIDIA_GeForce_RTX_5090",
                     "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition",
                     "NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition",
                     "NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition", "NVIDIA_GB10"), 99 * _KIB),
}


# ------------------------------------------------------------------ runtime
def _package_dir(root, candidates, module_file):
    """The first candidate configs/ folder whose parent holds `module_file`
    (the module that reads it), else the first that exists."""
    found = [os.path.join(root, *rel) for rel in candidates if os.path.isdir(os.path.join(root, *rel))]
    for d in found:
        if os.path.isfile(os.path.join(os.path.dirname(d), module_file)):
            return d
    return found[0] if found else None


def _sglang_config_dirs():
    """SGLang's config folders as SGLang itself would read them."""
    dirs = []
    try:
        spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    except (ImportError, ValueError):
        spec = None
    root = list(spec.submodule_search_locations)[0] if spec is not None and spec.submodule_search_locations else None
    env = os.environ.get("SGLANG_MOE_CONFIG_DIR")
    if env:
        d = os.path.join(env, "configs")
        if os.path.isdir(d):
            dirs.append(d)
    elif root:
        d = _package_dir(root, (("srt", "layers", "moe", "moe_runner", "triton_utils", "configs"),
                                ("srt", "layers", "moe", "fused_moe_triton", "configs")),
                         "fused_moe_triton_config.py")
        if d:
            dirs.append(d)
    if root:
        d = _package_dir(root, (("kernels", "ops", "quantization", "configs"),
                                ("srt", "layers", "quantization", "configs")), "fp8_kernel.py")
        if d:
            dirs.append(d)
    return dirs


def _triton_version():
    try:
        import triton
        return triton.__version__
    except Exception:
        return None


def configure(runtime=None, *, strict_sglang=False, **runtime_kwargs):
    """Sets the runtime the functions use, and their mode.

    runtime: a kdispatch.Runtime, or None to build one from `runtime_kwargs`
    (Runtime's keywords: ``configure(config_dirs=[moe_configs, quant_configs],
    backend_version="3.5.1")``; config_dirs are SGLang's ``configs/``
    folders, backend_version the Triton version whose ``triton_X_Y_Z/``
    folder serves first, by default ``triton.__version__`` as in SGLang).
    strict_sglang: the default of every function's ``strict_sglang=`` (True:
    SGLang's own rules, see the module docstring). Returns the runtime.
    Raises TypeError when given both a runtime and keyword arguments, and
    what Runtime() raises (kdispatch.Error naming a config dir that does not
    exist)."""
    global _runtime, _strict
    if runtime is None:
        runtime_kwargs.setdefault("backend_version", _triton_version())
        runtime = Runtime(**runtime_kwargs)
        dirs = runtime_kwargs.get("config_dirs") or ()
        if isinstance(dirs, (str, bytes, os.PathLike)):
            dirs = [dirs]
        setattr(runtime, _SOURCE_ATTR,
                (tuple(os.fspath(d) for d in dirs), runtime_kwargs.get("backend_version")))
    elif runtime_kwargs:
        raise TypeError("configure(): pass a runtime or keyword arguments, not both")
    with _lock:
        _runtime = runtime
        _strict = bool(strict_sglang)
    return runtime


def get_runtime():
    """The runtime in use (built from the environment on first use)."""
    global _runtime, _warned_no_dirs
    with _lock:
        if _runtime is None:
            dirs = _sglang_config_dirs()
            if not dirs and not os.environ.get("KDISPATCH_CONFIG_DIRS") and not _warned_no_dirs:
                _warned_no_dirs = True
                warnings.warn("kdispatch.sglang: no config dirs (no SGLang config folder in an installed sglang "
                              "package or $SGLANG_MOE_CONFIG_DIR/configs, and KDISPATCH_CONFIG_DIRS is unset): "
                              "get_moe_configs returns None and try_get_optimal_moe_config SGLang's default config "
                              "for every key. Name a tree with "
                              "kdispatch.sglang.configure(config_dirs=[...], backend_version=...).",
                              RuntimeWarning, stacklevel=3)
            _runtime = Runtime.from_env(config_dirs=dirs, backend_version=_triton_version())
        return _runtime


def cache_clear():
    """Forgets every cached answer (of every runtime)."""
    global _clears
    with _lock:
        _clears += 1


_MISSING = object()
_clears = 0  # bumped by cache_clear(): every runtime's cache starts over


def _cached(rt, key, compute):
    """Per-runtime cache (kept on the Runtime object, so it dies with it),
    invalidated by Runtime.reload() and cache_clear(). A watched runtime
    (watch=True, KDISPATCH_WATCH=1) is not cached: its watcher publishes new
    tables that Runtime.generation does not count."""
    if getattr(rt, "_watching", False):
        return compute()
    stamp = (rt.generation, _clears)
    c = getattr(rt, "_sglang_cache", None)
    if c is None or c[0] != stamp:
        c = (stamp, {})
        rt._sglang_cache = c
    v = c[1].get(key, _MISSING)
    if v is _MISSING:
        v = compute()
        if len(c[1]) >= _CACHE_MAX:
            c[1].clear()
        c[1][key] = v
    return v


def _source(rt):
    """(config dirs, Triton version) the Python readers use: as given to
    configure(), else the dirs the runtime loaded files from and
    $KDISPATCH_BACKEND_VERSION or triton.__version__."""
    s = getattr(rt, _SOURCE_ATTR, None)
    if s is None:
        dirs = []
        for f in rt.load_report().get("files", ()):
            d = f.get("dir")
            if d and d not in dirs:
                dirs.append(d)
        s = (tuple(dirs), os.environ.get("KDISPATCH_BACKEND_VERSION") or _triton_version())
        try:
            setattr(rt, _SOURCE_ATTR, s)
        except AttributeError:
            pass
    return s


# ------------------------------------------------------------------ devices
def _torch_gpu():
    """(name, "cuda" | "hip", shared_memory_per_block_optin or None) of
    torch's current GPU, or None when torch sees none."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name()
        if getattr(torch.version, "hip", None) is not None:
            return name, "hip", None
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return name, "cuda", getattr(props, "shared_memory_per_block_optin", None)
    except (AssertionError, RuntimeError):
        return None


def _device(device_name):
    if device_name is not None:
        if not isinstance(device_name, str):
            raise Error(StatusCode.invalid_argument, f"device_name: expected a str, got {device_name!r}")
        return device_name
    try:
        importlib.import_module("torch")  # to name the device (_torch_gpu reads sys.modules)
    except ImportError:
        pass
    gpu = _torch_gpu()
    if gpu is not None:
        return gpu[0]
    raise Error(StatusCode.invalid_argument,
                "device_name is required: torch with a CUDA/ROCm device is not available to name the device")


def _name_kind(name):
    n = name.lower()
    if n.startswith("amd") or "radeon" in n or "instinct" in n:
        return "hip"
    if n.startswith(("nvidia", "tesla", "quadro", "geforce")):
        return "cuda"
    return "other"


def _smem_arg(smem):
    if smem is None:
        return None
    try:
        smem = operator.index(smem)
    except TypeError:
        raise TypeError(f"shared_memory_per_block_optin: expected bytes as an int, got {smem!r}") from None
    if smem <= 0:
        raise ValueError(f"shared_memory_per_block_optin: expected a positive number of bytes, got {smem}")
    return smem


def _platform(device_name, smem=None):
    """("cuda" | "hip" | "other", shared_memory_per_block_optin or None) of
    the device: torch's when it sees that GPU, else by name; `smem` wins
    (and makes an unknown name a CUDA device)."""
    smem = _smem_arg(smem)
    gpu = _torch_gpu()
    if gpu is not None and (device_name is None or device_name == gpu[0]):
        kind, known = gpu[1], gpu[2]
    elif device_name is None:
        kind, known = "other", None
    else:
        kind = _name_kind(device_name)
        known = SHARED_MEMORY_PER_BLOCK_OPTIN.get(device_name.replace(" ", "_")) if kind == "cuda" else None
    if smem is not None and kind != "hip":
        return "cuda", smem
    return kind, known


# ------------------------------------------------------------- arguments
def _index(name, v):
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {v!r}") from None


def _block(block_shape):
    """(block_n, block_k) as SGLang takes them: 0, 0 without a block shape."""
    if not block_shape:
        return 0, 0
    try:
        if len(block_shape) != 2:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"block_shape: expected [block_n, block_k] or None, got {block_shape!r}") from None
    return block_shape[0], block_shape[1]


def _key(E, N, dtype, block_n, block_k, per_channel_quant):
    """kdispatch's key for SGLang's file name (the fields other than device_name)."""
    key = f"E={int(E)},N={int(N)}"
    if dtype:
        key += f",dtype={dtype}"
    if block_n and block_k:  # SGLang: no block_shape unless all(block_shape)
        key += f",block_shape=[{int(block_n)},{int(block_k)}]"
    if per_channel_quant:
        key += ",per_channel_quant=True"
    return key


def _strict_mode(strict_sglang):
    return _strict if strict_sglang is None else bool(strict_sglang)


# ---------------------------------------------------- Python table readers
def _version_tuple(v):
    """3.5.1 -> (3, 5, 1); None when not all-numeric (a folder SGLang's sort refuses)."""
    try:
        return tuple(int(x) for x in v.split("."))
    except ValueError:
        return None


def _running_tuple(version):
    """The numeric part of a running version ('3.4.0+git...' -> (3, 4, 0))."""
    parts = []
    for x in version.split("."):
        digits = ""
        for ch in x:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if digits != x:
            break
    return tuple(parts) if parts else None


def _read_rows(path):
    with open(path) as f:
        return {int(key): val for key, val in json.load(f).items()}


def _version_folders(root):
    try:
        names = os.listdir(root)
    except OSError:
        return []
    out = []
    for d in names:
        if d.startswith("triton_"):
            v = d[len("triton_"):].replace("_", ".")
            t = _version_tuple(v)
            if t is not None:
                out.append((t, v))
    return out


def _read_moe_table(dirs, version, name, policy):
    """The table file `name` under one of `dirs` (each a ``configs/`` folder
    holding ``triton_X_Y_Z/``), by `policy`: "sglang" (the running version's
    folder, else every folder newest first) or "kdispatch" (the running
    version's, else the newest older holding it, else the newest newer).
    The first dir holding the table serves. None when none does."""
    for root in dirs:
        if version:
            path = os.path.join(root, f"triton_{version.replace('.', '_')}", name)
            if os.path.exists(path):
                return _read_rows(path)
        folders = sorted(_version_folders(root), reverse=True)
        if policy == "sglang":
            order = [v for _, v in folders if v != version]
        else:
            run = _running_tuple(version) if version else None
            have = [(t, v) for t, v in folders if v != version
                    and os.path.exists(os.path.join(root, f"triton_{v.replace('.', '_')}", name))]
            if run is None:
                order = [v for _, v in have]
            else:
                order = [v for t, v in have if t <= run] + [v for t, v in have if t > run]
        for v in order:
            path = os.path.join(root, f"triton_{v.replace('.', '_')}", name)
            if os.path.exists(path):
                return _read_rows(path)
    return None


def _file_name(E, N, dtype, block_shape, per_channel_quant, down_moe, device):
    """SGLang's get_config_file_name, for a given device name."""
    device_name = device.replace(" ", "_")
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_shape_selector = "" if not block_shape or not all(block_shape) else f",block_shape={block_shape}"
    per_channel_quant_selector = ",per_channel_quant=True" if per_channel_quant else ""
    down_moe_selector = "_down" if down_moe else ""
    return (f"E={E},N={N},device_name={device_name}{dtype_selector}{block_shape_selector}"
            f"{per_channel_quant_selector}{down_moe_selector}.json")


# ------------------------------------------------------------ the tables
def _moe_table(rt, dev, E, N, dtype, block_n, block_k, per_channel_quant, down, strict):
    """{M: row} (shared, not copied) or None."""

    def compute():
        if strict or dev == "":  # kdispatch reads "" as the host CPU: SGLang's "device_name=" files in Python
            dirs, version = _source(rt)
            name = _file_name(E, N, dtype, [block_n, block_k], per_channel_quant, down, dev)
            rows = _read_moe_table(dirs, version, name, "sglang" if strict else "kdispatch")
            if rows is None and down:  # no _down table: the up table (SGLang since the TMA down path)
                rows = _moe_table(rt, dev, E, N, dtype, block_n, block_k, per_channel_quant, False, strict)
            return rows
        try:
            t = _engine_moe(rt.lookup_table, key=_key(E, N, dtype, block_n, block_k, per_channel_quant),
                            device=dev, down=down)
        except Error as e:
            if e.code == StatusCode.not_found:
                return None
            raise
        return t["rows"]

    return _cached(rt, ("moe_table", strict, dev, E, N, dtype, block_n, block_k, bool(per_channel_quant),
                        bool(down)), compute)


def _engine_moe(call, **kw):
    """call(op=..., **kw) on the engines' fused-MoE tables: "triton_fused_moe";
    a libkdispatch older than 2026-12 (the same ABI) knows them as "fused_moe"."""
    try:
        return call(op="triton_fused_moe", **kw)
    except Error as e:
        if e.code == StatusCode.invalid_argument and "unknown op 'triton_fused_moe'" in str(e):
            return call(op="fused_moe", **kw)
        raise


def _nearest(rows, M, strict):
    if strict:  # SGLang: a tie goes to the key first in file order
        return rows[min(rows.keys(), key=lambda x: abs(x - M))]
    return rows[min(rows.keys(), key=lambda x: (abs(x - M), x))]


def _moe_row(rt, rows, dev, key, M, down, strict):
    """The row serving M: SGLang's nearest key; kdispatch's lookup (ties to
    the smaller key; a forced config wins) in default mode."""
    if strict or dev == "":
        return _nearest(rows, M, strict)
    r = _engine_moe(rt.lookup, key=key, device=dev, M=min(max(M, 1), _INT64_MAX), down=down)
    if r["match"] == "forced":
        return r["config"]
    if r["match"] in ("exact", "nearest") and r["M"] in rows:
        return rows[r["M"]]
    return _nearest(rows, M, False)


def _copy_rows(rows):
    return None if rows is None else {m: dict(c) if isinstance(c, dict) else c for m, c in rows.items()}


# -------------------------------------------------------------- public API
def get_config_file_name(E, N, dtype, block_shape=None, per_channel_quant=False, down_moe=False, *,
                         device_name=None):
    """SGLang's config file name for this key (for messages and tools):
    ``E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json``.

    E: experts; N: the down projection's input width (w2_shape[2]); dtype:
    "fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16", ... or None (bf16/fp16);
    block_shape: [block_n, block_k] or None (no field unless both are
    non-zero); down_moe: the ``_down`` table's name. Raises kdispatch.Error
    (invalid_argument) when no device is named and torch sees none."""
    return _file_name(E, N, dtype, block_shape, per_channel_quant, down_moe, _device(device_name))


def get_moe_configs(E, N, dtype, block_n=0, block_k=0, per_channel_quant=False, down_moe=False, *, down=None,
                    device_name=None, runtime=None, strict_sglang=None, deterministic_inference=False):
    """The whole tuned table of the fused-MoE kernel, as SGLang returns it:
    ``{M: config_dict}`` (int keys, rows as written in the files), or None
    when no table exists for (E, N, dtype, block_n/block_k,
    per_channel_quant, device).

    down_moe=True: the ``_down`` table (the second GEMM's), else the up
    table, as SGLang does (``down=`` is the former spelling). Default mode:
    kdispatch's table, keys ascending (version folders by kdispatch's rule);
    strict_sglang=True: the file SGLang reads, keys in file order (module
    docstring). deterministic_inference=True: None (SGLang with
    --enable-deterministic-inference). Raises kdispatch.Error
    (invalid_argument) when no device is named and torch sees none."""
    if down is not None:
        down_moe = bool(down) or bool(down_moe)
    if deterministic_inference:
        return None
    rt = runtime or get_runtime()
    dev = _device(device_name)
    strict = _strict_mode(strict_sglang)
    return _copy_rows(_moe_table(rt, dev, E, N, dtype, block_n or 0, block_k or 0, per_channel_quant,
                                 bool(down_moe), strict))


def get_default_config(M, E, N, K, topk, dtype, is_marlin, block_shape=None, *, device_name=None,
                       shared_memory_per_block_optin=None, deterministic_inference=False):
    """SGLang's fused-MoE config when no table serves the key (a new dict).

    M: tokens; E: experts; N, K: the GEMM's widths (unused by the rule);
    topk: experts per token (unused); dtype: "fp8_w8a8", ... or None;
    is_marlin: the fused-Marlin small-M tile for M <= 32; block_shape:
    [block_n, block_k] for block-quantized fp8 (BLOCK_SIZE_N/K = the block).

    fp8_w8a8 without a block shape: the smaller tile on a CUDA GPU with
    shared_memory_per_block_optin < 128 KiB (module docstring: torch's
    device properties, else the device-name table, else the
    shared_memory_per_block_optin= argument in bytes, which wins when
    given); num_stages 2 on ROCm (torch, else an AMD device name), else 4
    (3 with a block shape). device_name: torch's spelling; None: torch's
    current GPU, or none (the regular CUDA default). Raises TypeError /
    ValueError naming shared_memory_per_block_optin when it is not a
    positive int."""
    if deterministic_inference:
        return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
    if dtype == "fp8_w8a8":
        kind, smem = _platform(device_name, shared_memory_per_block_optin)
        hip = kind == "hip"
        if block_shape is None:
            if kind == "cuda" and smem is not None and smem < _LOW_SMEM_FP8_DEFAULT_CUTOFF_BYTES:
                config = {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1,
                          "num_warps": 4, "num_stages": 4}
                if M > E:
                    config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 64,
                              "num_warps": 4, "num_stages": 2}
            else:
                config = {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                          "num_warps": 8, "num_stages": 2 if hip else 4}
                if M <= E:
                    config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                              "num_warps": 4, "num_stages": 2 if hip else 4}
        else:
            config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": block_shape[0], "BLOCK_SIZE_K": block_shape[1],
                      "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 2 if hip else 3}
    else:
        config = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}
        if M <= E or (is_marlin and M <= 32):
            config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return config


def try_get_optimal_moe_config(w1_shape, w2_shape, top_k, dtype, M, is_marlin=False, block_shape=None,
                               per_channel_quant=False, return_down_config=False, *, device_name=None,
                               runtime=None, strict_sglang=None, shared_memory_per_block_optin=None,
                               deterministic_inference=False):
    """The config SGLang's fused-MoE kernel launches with for M tokens.

    w1_shape: (E, 2N, K) of the gate/up weight (K read only for the
    default); w2_shape: (E, K, N) of the down weight (E and N key the table);
    top_k: experts per token; dtype: "fp8_w8a8", ... or None; M: tokens, any
    integer (<= 0: the smallest key's row, past int64: the largest's);
    block_shape: [block_n, block_k] or None; per_channel_quant: the
    ``per_channel_quant=True`` tables.

    Returns the nearest-M row of the table, else get_default_config's
    answer. return_down_config=True: ``(config, (down_config, max_block_m))``
    as SGLang returns it: the nearest row of the ``_down`` table (else of the
    up table; None when neither exists) with BLOCK_SIZE_M set to config's
    (both GEMMs share one moe_align_block_size sort), and the largest
    BLOCK_SIZE_M of that table. Ties, version folders and strict_sglang:
    module docstring. Raises TypeError naming M when it is not an integer,
    ValueError naming w2_shape / w1_shape / block_shape when malformed,
    kdispatch.Error (invalid_argument) when no device is named and torch
    sees none."""
    try:
        E, _, N = w2_shape
    except (TypeError, ValueError):
        raise ValueError(f"w2_shape: expected the down weight's shape (E, K, N), got {w2_shape!r}") from None
    M = _index("M", M)
    block_n, block_k = _block(block_shape)
    smem = _smem_arg(shared_memory_per_block_optin)
    if deterministic_inference:
        config = get_default_config(M, E, N, None, top_k, dtype, is_marlin, block_shape, deterministic_inference=True)
        return (config, (None, None)) if return_down_config else config
    rt = runtime or get_runtime()
    dev = _device(device_name)
    strict = _strict_mode(strict_sglang)
    key = _key(E, N, dtype, block_n, block_k, per_channel_quant)
    try:  # K: read only for the default, as SGLang does (a bad w1_shape fails there only)
        K = w1_shape[2]
        hash(K)
    except (TypeError, IndexError, KeyError):
        K = _MISSING

    def compute():
        up = _moe_table(rt, dev, E, N, dtype, block_n, block_k, per_channel_quant, False, strict)
        if up:
            config = dict(_moe_row(rt, up, dev, key, M, False, strict))
        else:
            if K is _MISSING:
                raise ValueError(f"w1_shape: expected the gate/up weight's shape (E, 2N, K), got {w1_shape!r}")
            config = get_default_config(M, E, N, K, top_k, dtype, is_marlin, block_shape, device_name=dev,
                                        shared_memory_per_block_optin=smem)
        if not return_down_config:
            return config
        down_config = max_block_m = None
        down = _moe_table(rt, dev, E, N, dtype, block_n, block_k, per_channel_quant, True, strict)
        if down:
            down_config = dict(_moe_row(rt, down, dev, key, M, True, strict))
            max_block_m = max(cfg["BLOCK_SIZE_M"] for cfg in down.values())
        if down_config is not None and config["BLOCK_SIZE_M"] != down_config["BLOCK_SIZE_M"]:
            down_config["BLOCK_SIZE_M"] = config["BLOCK_SIZE_M"]
        return config, (down_config, max_block_m)

    v = _cached(rt, ("config", strict, dev, E, N, dtype, repr(block_shape), bool(per_channel_quant), M,
                     bool(is_marlin), bool(return_down_config), smem, K), compute)
    if return_down_config:
        config, (down_config, max_block_m) = v
        return dict(config), (None if down_config is None else dict(down_config), max_block_m)
    return dict(v)


def get_w8a8_block_fp8_configs(N, K, block_n, block_k, *, device_name=None, runtime=None, strict_sglang=None):
    """The tuned table of SGLang's block-fp8 GEMM (w8a8_block_fp8_matmul):
    ``{M: config_dict}`` from ``N=<N>,K=<K>,device_name=<dev>,dtype=fp8_w8a8,
    block_shape=[<block_n>, <block_k>].json``, or None when there is none
    (SGLang's matmul then uses BLOCK_SIZE_M 64, BLOCK_SIZE_N block_n,
    BLOCK_SIZE_K block_k, GROUP_SIZE_M 32, num_warps 4, num_stages 3).

    N, K: the weight's output and input widths; block_n, block_k: the
    quantization block. A row whose BLOCK_SIZE_K is below block_k is served
    with BLOCK_SIZE_K = block_k, except on CUDA where block_k is a multiple
    of it (SGLang: the scale stepping needs BLOCK_SIZE_K >= block_k
    elsewhere); CUDA or not is told by torch, else by the device name
    (NVIDIA: CUDA). Default mode: kdispatch's table; strict_sglang=True: the
    file under the first config dir holding it. Raises kdispatch.Error
    (invalid_argument) when no device is named and torch sees none."""
    rt = runtime or get_runtime()
    dev = _device(device_name)
    strict = _strict_mode(strict_sglang)

    def compute():
        if strict or dev == "":
            dirs, _ = _source(rt)
            name = (f"N={N},K={K},device_name={dev.replace(' ', '_')},dtype=fp8_w8a8,"
                    f"block_shape=[{block_n}, {block_k}].json")
            raw = None
            for d in dirs:
                path = os.path.join(d, name)
                if os.path.exists(path):
                    raw = _read_rows(path)
                    break
        else:
            try:
                raw = rt.lookup_table(op="triton_gemm", key=f"N={int(N)},K={int(K)},dtype=fp8_w8a8,"
                                                             f"block_shape=[{int(block_n)},{int(block_k)}]",
                                      device=dev)["rows"]
            except Error as e:
                if e.code != StatusCode.not_found:
                    raise
                raw = None
        if raw is None:
            return None
        is_cuda = _platform(dev)[0] == "cuda"
        sanitized = {}
        for m_key, cfg in raw.items():
            if cfg["BLOCK_SIZE_K"] < block_k and (not is_cuda or block_k % cfg["BLOCK_SIZE_K"] != 0):
                cfg = {**cfg, "BLOCK_SIZE_K": block_k}
            sanitized[m_key] = cfg
        return sanitized

    return _copy_rows(_cached(rt, ("w8a8_block_fp8", strict, dev, N, K, block_n, block_k), compute))


# ------------------------------------------------------------------ fused_experts
def fused_experts(hidden_states, w1, w2, topk_output, moe_runner_config=None, b1=None, b2=None,
                  use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False,
                  per_channel_quant=False, w1_scale=None, w2_scale=None, w1_zp=None, w2_zp=None, a1_scale=None,
                  a2_scale=None, block_shape=None):
    """SGLang's ``fused_experts`` (``sglang.srt.layers.moe.fused_moe_triton``)
    served by ``torch.ops.kdispatch.fused_moe``: same arguments, same result.

    - ``topk_output``: SGLang's StandardTopKOutput, or any tuple whose first
      two items (or an object whose ``topk_weights``/``topk_ids``) are the
      router's [M, top_k] weights and ids (ids cast to int32, weights to
      fp32 when they are not).
    - ``moe_runner_config``: SGLang's MoeRunnerConfig, or None (its
      defaults): ``activation`` ("silu" or "gelu"), ``routed_scaling_factor``
      (None: 1), ``inplace`` (the result written into ``hidden_states``,
      which is returned).
    - Weights: bf16/fp16 (``w1`` [E, 2I, H], ``w2`` [E, H, I]), or block fp8
      (``use_fp8_w8a8=True``, ``block_shape=[128, 128]``, e4m3fn weights with
      ``w1_scale``/``w2_scale`` [E, N/128, K/128] fp32; the activations
      quantised per 1x128 group inside the op, ``a1_scale``/``a2_scale``
      None), or fp8_w8a8 without a block shape: per tensor
      (``fused_moe_fp8_tensor``, ``w1_scale``/``w2_scale`` [E]) or, with
      ``per_channel_quant=True``, per channel (``fused_moe_fp8_channel``,
      [E, N, 1]); ``a1_scale``/``a2_scale`` static (both given) or dynamic
      (both None: per tensor, resp. per token), as SGLang quantises them.

    What kdispatch's ops do not compute raises NotImplementedError naming
    the argument (biases, int8/int4, zero points, one static activation
    scale without the other, ``apply_router_weight_on_input``,
    ``no_combine``), rather than computing something else. The per-tensor
    and per-channel ops run on the CPU and on CUDA.
    """
    from ._moe import experts

    cfg = moe_runner_config
    if hasattr(topk_output, "topk_ids"):
        topk_weights, topk_ids = topk_output.topk_weights, topk_output.topk_ids
    else:
        topk_weights, topk_ids = topk_output[0], topk_output[1]
    return experts("kdispatch.sglang.fused_experts", hidden_states, w1, w2, topk_weights, topk_ids,
                   activation=getattr(cfg, "activation", "silu"),
                   routed_scaling_factor=getattr(cfg, "routed_scaling_factor", None),
                   inplace=bool(getattr(cfg, "inplace", False)), use_fp8_w8a8=use_fp8_w8a8, w1_scale=w1_scale,
                   w2_scale=w2_scale, block_shape=block_shape, per_channel_quant=per_channel_quant,
                   a1_scale=a1_scale, a2_scale=a2_scale,
                   unsupported={"b1": b1 is not None, "b2": b2 is not None, "use_int8_w8a8": use_int8_w8a8,
                                "use_int8_w8a16": use_int8_w8a16, "use_int4_w4a16": use_int4_w4a16,
                                "w1_zp": w1_zp is not None, "w2_zp": w2_zp is not None,
                                "apply_router_weight_on_input":
                                    bool(getattr(cfg, "apply_router_weight_on_input", False)),
                                "no_combine": bool(getattr(cfg, "no_combine", False))})


def invoke_fused_moe_kernel(A, B, bias, C, A_scale, B_scale, B_zp, topk_weights, topk_ids, sorted_token_ids,
                            expert_ids, num_tokens_post_padded, mul_routed_weight, top_k, config, compute_type=None,
                            use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False,
                            per_channel_quant=False, block_shape=None, **options):
    """SGLang's ``invoke_fused_moe_kernel`` (one grouped GEMM over
    ``moe_align_block_size``'s sorted ids, ``fused_moe_triton_kernels``)
    served by ``torch.ops.kdispatch.moe_gemm_out``: same arguments, the
    result written into ``C``.

    - ``A`` [rows, K]: hidden (the up call, ``top_k`` the router's) or the
      activated intermediate (the down call, ``top_k`` = 1); ``B`` [E, N, K];
      ``C`` [rows * top_k, N] in any shape with those elements, contiguous
      (SGLang's [M, top_k, N] caches).
    - ``config["BLOCK_SIZE_M"]`` is the block size the sorted ids were
      aligned with (the op's ``block_size``); the rest of SGLang's row
      (BLOCK_SIZE_N/K, GROUP_SIZE_M, num_warps, num_stages) is the Triton
      kernel's tile and does not bind kdispatch's kernels, which choose
      their own (the key's ``block_size`` and the table do).
    - ``compute_type`` is ignored (C's dtype is the output's).
    - Block fp8: ``use_fp8_w8a8=True``, ``block_shape=[128, 128]``,
      ``B_scale`` [E, N/128, K/128] fp32, ``A`` in bf16 (quantised per
      1x128 group inside the op; ``A_scale`` must be None).

    What the op does not compute raises NotImplementedError naming the
    argument (a bias, zero points, static activation scales, int8/int4,
    per-channel fp8, SGLang's fused epilogue options such as ``c_sorted``,
    ``fuse_sum_all_reduce``, ``fuse_add_to_output``, ``mask_output``). Needs
    the native torch ops (``-DKDISPATCH_TORCH=ON``): the Python custom_op
    fallback has no out forms.
    """
    import torch
    from . import torch_ops  # noqa: F401  registers torch.ops.kdispatch

    who = "kdispatch.sglang.invoke_fused_moe_kernel"
    if not hasattr(torch.ops.kdispatch, "moe_gemm_out"):
        raise NotImplementedError(f"{who}: needs the native torch ops (libkdispatch_torch.so, configure with "
                                  f"-DKDISPATCH_TORCH=ON): it writes into C through moe_gemm_out, which the "
                                  f"Python custom_op fallback does not have")
    flags = {"bias": bias is not None, "B_zp": B_zp is not None, "A_scale": A_scale is not None,
             "use_int8_w8a8": use_int8_w8a8, "use_int8_w8a16": use_int8_w8a16, "use_int4_w4a16": use_int4_w4a16,
             "per_channel_quant": per_channel_quant}
    flags.update({k: bool(v) for k, v in options.items()
                  if k not in ("no_combine", "a_use_tma", "b_use_tma", "filter_expert", "router_topk",
                               "add_output_mask", "lora_preserve_base")})
    for name, on in flags.items():
        if on:
            raise NotImplementedError(f"{who}: {name} is not supported by kdispatch's moe_gemm (bf16/fp16 or "
                                      f"block-fp8 weights, the routed weight in the epilogue)")
    if use_fp8_w8a8 and [int(b) for b in (block_shape or [])] != [128, 128]:
        raise NotImplementedError(f"{who}: use_fp8_w8a8 needs block_shape=[128, 128] (block fp8), got "
                                  f"{block_shape!r}")
    if not use_fp8_w8a8 and B_scale is not None:
        raise ValueError(f"{who}: B_scale comes with use_fp8_w8a8=True")
    rows, k = A.shape[0], int(top_k)
    out = C.view(rows, k, B.shape[1])
    weights = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.to(torch.float32)
    weights = weights.reshape(rows, k)
    torch.ops.kdispatch.moe_gemm_out(out, A, B, weights, sorted_token_ids, expert_ids, num_tokens_post_padded,
                                     B_scale if use_fp8_w8a8 else None, k, int(config["BLOCK_SIZE_M"]),
                                     1 if mul_routed_weight else 0)
    return None
