# SPDX-License-Identifier: Apache-2.0
"""SGLang's fused-MoE config lookup, served by kdispatch.

Drop-in replacements for
``sglang.srt.layers.moe.fused_moe_triton.fused_moe_triton_config``:

    from kdispatch.sglang import get_moe_configs, try_get_optimal_moe_config

with the same signatures and return values, backed by dispatch::lookup over
a kdispatch runtime's config dirs (SGLang's own ``configs/`` tree, read as
it is). Which runtime: ``configure(...)``, else the ``runtime=`` argument,
else one built on first use from the environment (KDISPATCH_* variables) with
these config dirs: $SGLANG_MOE_CONFIG_DIR/configs when set, else the
installed SGLang package's fused-MoE ``configs/`` folders when SGLang is
installed; and ``backend_version = triton.__version__`` when Triton is
installed (KDISPATCH_BACKEND_VERSION overrides).

The device is ``device_name=`` when given, else
``torch.cuda.get_device_name()`` when torch sees a CUDA/ROCm device; without
either the call raises kdispatch.Error (invalid_argument).

Deliberate differences from SGLang (everything else is the same):

- Nearest M: a tie (M exactly halfway between two keys) goes to the smaller
  key. SGLang's ``min(configs.keys(), key=lambda x: abs(x - M))`` takes the
  one that comes first in the file.
- Triton version folders: the running version's ``triton_X_Y_Z/`` first,
  then the newest older folder, then the newest newer one — any folder that
  exists. SGLang tries the running version, then only 3.4.0, 3.3.1, 3.2.0,
  3.1.0, and otherwise uses its default config.
- Tables for one key merge across config dirs (the first dir given wins on
  the same M); ``null`` rows are dropped and non-integer metadata keys
  (vLLM's "triton_version") ignored instead of failing.
- Device names go through kdispatch's alias table (``NVIDIA H200 NVL`` uses
  the ``NVIDIA_H200`` files).
- SGLang's ``get_config()`` override (its override_config context) is not
  consulted: an engine keeps that check on its side.

Results are cached per (runtime, arguments); ``cache_clear()`` empties the
cache, and ``Runtime.reload()`` through Python invalidates it.
"""

import importlib.util
import os
import threading

from ._errors import Error, StatusCode
from ._runtime import Runtime

_lock = threading.Lock()
_runtime = None
_CACHE_MAX = 65536


def _sglang_config_dirs():
    dirs = []
    env = os.environ.get("SGLANG_MOE_CONFIG_DIR")
    if env:
        d = os.path.join(env, "configs")
        if os.path.isdir(d):
            dirs.append(d)
        return dirs
    try:
        spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        root = list(spec.submodule_search_locations)[0]
        for rel in (("srt", "layers", "moe", "moe_runner", "triton_utils", "configs"),
                    ("srt", "layers", "moe", "fused_moe_triton", "configs")):
            d = os.path.join(root, *rel)
            if os.path.isdir(d):
                dirs.append(d)
    return dirs


def _triton_version():
    try:
        import triton
        return triton.__version__
    except Exception:
        return None


def configure(runtime=None, **runtime_kwargs):
    """Sets the runtime the functions use: a kdispatch.Runtime, or keyword
    arguments for one (``configure(config_dirs=[sglang_configs], backend_version="3.5.1")``).
    Returns it."""
    global _runtime
    if runtime is None:
        runtime = Runtime(**runtime_kwargs)
    elif runtime_kwargs:
        raise TypeError("configure(): pass a runtime or keyword arguments, not both")
    with _lock:
        _runtime = runtime
    return runtime


def get_runtime():
    """The runtime in use (built from the environment on first use)."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = Runtime.from_env(config_dirs=_sglang_config_dirs(), backend_version=_triton_version())
        return _runtime


def cache_clear():
    """Forgets every cached answer (of every runtime)."""
    global _clears
    with _lock:
        _clears += 1


def _device(device_name):
    if device_name:
        return device_name
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except ImportError:
        pass
    raise Error(StatusCode.invalid_argument,
                "device_name is required: torch with a CUDA/ROCm device is not available to name the device")


def _key(E, N, dtype, block_n, block_k, per_channel_quant):
    key = f"E={int(E)},N={int(N)}"
    if dtype:
        key += f",dtype={dtype}"
    if block_n and block_k:  # SGLang: no block_shape unless all(block_shape)
        key += f",block_shape=[{int(block_n)},{int(block_k)}]"
    if per_channel_quant:
        key += ",per_channel_quant=True"
    return key


_MISSING = object()
_clears = 0  # bumped by cache_clear(): every runtime's cache starts over


def _cached(rt, key, compute):
    """Per-runtime cache (kept on the Runtime object, so it dies with it),
    invalidated by Runtime.reload() and cache_clear()."""
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


def get_config_file_name(E, N, dtype, block_shape=None, per_channel_quant=False, *, device_name=None):
    """SGLang's config file name for this key (for messages and tools)."""
    dev = _device(device_name).replace(" ", "_")
    dtype_selector = "" if not dtype else f",dtype={dtype}"
    block_selector = "" if not block_shape or not all(block_shape) else f",block_shape={list(block_shape)}"
    pcq = ",per_channel_quant=True" if per_channel_quant else ""
    return f"E={E},N={N},device_name={dev}{dtype_selector}{block_selector}{pcq}.json"


def get_moe_configs(E, N, dtype, block_n=0, block_k=0, per_channel_quant=False, *, down=False,
                    device_name=None, runtime=None):
    """The whole tuned table for the fused-MoE kernel as SGLang returns it:
    ``{M: config_dict}`` (int keys, rows as written in the files), or None
    when no table exists for (E, N, dtype, block_shape, device).

    `down=True` selects the ``_down`` table (falling back to the up table, as
    SGLang does). See the module docstring for the deliberate differences
    (version folders, merging)."""
    rt = runtime or get_runtime()
    dev = _device(device_name)
    key = _key(E, N, dtype, block_n, block_k, per_channel_quant)

    def compute():
        try:
            t = rt.lookup_table(op="fused_moe", key=key, device=dev, down=down)
        except Error as e:
            if e.code == StatusCode.not_found:
                return None
            raise
        return t["rows"]

    rows = _cached(rt, ("table", key, dev, bool(down)), compute)
    return None if rows is None else {m: dict(c) for m, c in rows.items()}


def try_get_optimal_moe_config(w1_shape, w2_shape, top_k, dtype, M, is_marlin=False, block_shape=None,
                               per_channel_quant=False, *, down=False, device_name=None, runtime=None):
    """The config SGLang's fused-MoE kernel launches with at batch size M:
    the nearest-M row of the table (``E, _, N = w2_shape``), or SGLang's
    get_default_config when there is no table.

    Nearest-M ties go to the smaller key (SGLang: the first in file order);
    see the module docstring for the other deliberate differences."""
    rt = runtime or get_runtime()
    dev = _device(device_name)
    E, _, N = w2_shape
    block_n = block_shape[0] if block_shape else 0
    block_k = block_shape[1] if block_shape else 0
    key = _key(E, N, dtype, block_n, block_k, per_channel_quant)
    M = int(M)

    def compute():
        r = rt.lookup(op="fused_moe", key=key, device=dev, M=M, down=down)
        if r["match"] in ("exact", "nearest"):
            rows = get_moe_configs(E, N, dtype, block_n, block_k, per_channel_quant, down=down, device_name=dev,
                                   runtime=rt)
            if rows is not None and r["M"] in rows:
                return rows[r["M"]]  # the row as written (no launch defaults filled in)
            return r["config"]
        # No table: SGLang's get_default_config (kdispatch's lookup computes
        # it, including ROCm's num_stages); its fused-Marlin small-M tweak:
        config = dict(r["config"])
        if dtype != "fp8_w8a8" and is_marlin and M <= 32:
            config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
        return config

    return dict(_cached(rt, ("config", key, dev, bool(down), M, bool(is_marlin)), compute))
