# SPDX-License-Identifier: Apache-2.0
"""kdispatch.Runtime: the Python face of dispatch::Runtime."""

import inspect
import json
import math
import os
import struct
import sys
import threading
import warnings

from . import _backend
from ._errors import Error, StatusCode

def _warn_skipped_config_dirs():
    """At import: each KDISPATCH_CONFIG_DIRS entry that is not a directory,
    as a RuntimeWarning (an engine's logging and warning filters see it).
    The library skips such a dir and serves from the others
    (dispatch::options_from_env, which also says so once on stderr when it
    builds a runtime from the environment); KDISPATCH_LOG_LEVEL=off or error
    silences both."""
    value = os.environ.get("KDISPATCH_CONFIG_DIRS", "")
    if not value or os.environ.get("KDISPATCH_LOG_LEVEL", "") in ("off", "error"):
        return
    for d in value.split(":"):
        why = _config_dir_problem(d) if d else ""
        if why:
            warnings.warn(f"KDISPATCH_CONFIG_DIRS='{value}': config dir '{d}' {why}; serving without it",
                          RuntimeWarning, stacklevel=2)


def _config_dir_problem(d):
    """The library's rule (src/api/config_dir.hpp): why d cannot be read, or ""."""
    import errno
    import stat
    try:
        st = os.stat(d)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return "does not exist"
        if e.errno == errno.EACCES:
            return "cannot be reached (permission denied on a parent directory)"
        return f"cannot be read ({os.strerror(e.errno)})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not os.access(d, os.R_OK | os.X_OK):
        return "cannot be read (permission denied)"
    return ""


_warn_skipped_config_dirs()

_TUNE_MODES = {"off": 0, "sync": 1, "background": 2}
_LOG_LEVELS = {"off": 0, "error": 1, "warn": 2, "info": 3, "debug": 4}
_TUNE_OPTION_KEYS = ("persist", "load_cache", "memory_budget_bytes", "time_budget_ms", "duty_cycle", "reps",
                     "max_candidates", "queue_capacity", "validate", "cold_cache", "claim_shapes", "routing")
_DEVICE_TYPES = {"cpu": 1, "cuda": 2, "hip": 10, "rocm": 10}


def _int64(name, v):
    """int(v), refused when int64 cannot hold it (ctypes would wrap it
    silently: M = 2**64 + 16 looked up M = 16), naming the argument."""
    try:
        i = int(v)
    except (TypeError, ValueError) as e:
        raise Error(StatusCode.invalid_argument, f"{name}: not an integer ({v!r})") from e
    if not -(1 << 63) <= i < (1 << 63):
        raise Error(StatusCode.invalid_argument, f"{name}: {i} is outside int64")
    return i


def _stream_handle(stream):
    """None, an int (cudaStream_t / hipStream_t as an integer), or an object
    with `.cuda_stream` (torch.cuda.Stream, cupy's Stream.ptr)."""
    if stream is None:
        return None
    for attr in ("cuda_stream", "ptr"):
        v = getattr(stream, attr, None)
        if v is not None:
            return int(v)
    return int(stream)


def _options(config_dirs, tune, cache_dir, backend_version, shipped_configs, shipped_configs_dir, device_aliases,
             bounded_nearest, bound_ratio, log_level, watch, force, deterministic, tune_options):
    if isinstance(config_dirs, (str, bytes, os.PathLike)):
        config_dirs = [config_dirs]
    if tune not in _TUNE_MODES:
        raise Error(StatusCode.invalid_argument, f"tune='{tune}' is not off, sync or background")
    if log_level not in _LOG_LEVELS:
        raise Error(StatusCode.invalid_argument, f"log_level='{log_level}' is not off, error, warn, info or debug")
    if isinstance(force, str):
        force = [force]
    o = {
        "config_dirs": [os.fspath(d) for d in (config_dirs or ())],
        "tune_mode": _TUNE_MODES[tune],
        "cache_dir": os.fspath(cache_dir) if cache_dir is not None else None,
        "backend_version": backend_version,
        "load_shipped_configs": bool(shipped_configs),
        "shipped_configs_dir": os.fspath(shipped_configs_dir) if shipped_configs_dir is not None else None,
        "device_aliases": dict(device_aliases or {}),
        "bounded_nearest": bool(bounded_nearest),
        "bound_ratio": float(bound_ratio),
        "log_level": _LOG_LEVELS[log_level],
        "watch": bool(watch),
        "force": list(force or ()),
        "deterministic": bool(deterministic),
    }
    for k, v in (tune_options or {}).items():
        if k not in _TUNE_OPTION_KEYS:
            raise Error(StatusCode.invalid_argument,
                        f"unknown tune option '{k}' (expected one of {', '.join(_TUNE_OPTION_KEYS)})")
        o["tune_" + k] = v
    return o


class Runtime:
    """A loaded, immutable dispatch table plus its options (dispatch::Runtime).

    Runtime(config_dirs=(), *, tune="off", cache_dir=None, backend_version=None,
            shipped_configs=True, shipped_configs_dir=None, device_aliases=None,
            bounded_nearest=False, bound_ratio=2.0, log_level="warn", watch=False,
            force=(), deterministic=False, tune_options=None)

    - config_dirs: the engine's config dirs, highest precedence first; SGLang
      and vLLM trees are read as they are (point it at SGLang's
      ``.../fused_moe_triton/configs`` folder).
    - tune: "off" | "sync" | "background"; cache_dir: where tuning results are
      persisted (None: $KDISPATCH_CACHE_DIR, $XDG_CACHE_HOME/kdispatch, ~/.cache/kdispatch).
    - backend_version: the engine's Triton version (``triton.__version__``);
      it picks the ``triton_X_Y_Z/`` folders.
    - shipped_configs: also load the configs shipped with kdispatch.
    - device_aliases: {"reported or file name": "canonical name"}.
    - tune_options: {"time_budget_ms", "reps", "cold_cache", "validate",
      "persist", "load_cache", "memory_budget_bytes", "duty_cycle",
      "max_candidates", "queue_capacity", "claim_shapes", "routing"} (routing:
      the expert ids MoE ops are tuned on, "uniform", "skewed" or the path
      of an .npy of int32 [tokens, top_k] ids dumped from a server).

    Errors raise kdispatch.Error (a config dir that does not exist:
    invalid_argument naming it). Thread-safe as the C++ runtime: ops, lookups
    and stats from any thread (the GIL is released during calls with the
    pybind11 layer). ``close()`` (or a ``with`` block) destroys it, safely
    while other threads still call it: from then on their calls raise
    Error(failed_precondition, "... the runtime was closed ..."), and close
    waits for the calls already in flight (at most 10 s) before the runtime
    goes.
    """

    def __init__(self, config_dirs=(), *, tune="off", cache_dir=None, backend_version=None, shipped_configs=True,
                 shipped_configs_dir=None, device_aliases=None, bounded_nearest=False, bound_ratio=2.0,
                 log_level="warn", watch=False, force=(), deterministic=False, tune_options=None):
        opts = _options(config_dirs, tune, cache_dir, backend_version, shipped_configs, shipped_configs_dir,
                        device_aliases, bounded_nearest, bound_ratio, log_level, watch, force, deterministic,
                        tune_options)
        self._init(_backend.impl.Handle.create(opts), watching=bool(watch))

    def _init(self, handle, watching=False):
        self._h = handle
        self._generation = 0
        self._lock = threading.Lock()
        # True when the library's file watcher may publish a new table behind
        # this object's back (watch=True or KDISPATCH_WATCH): `generation`
        # does not see those reloads, so caches keyed on it must not cache.
        self._watching = watching

    @classmethod
    def _wrap(cls, handle, watching=False):
        rt = cls.__new__(cls)
        rt._init(handle, watching)
        return rt

    @classmethod
    def from_env(cls, config_dirs=(), **kwargs):
        """A runtime configured from the KDISPATCH_* environment on top of the
        given options (the same keywords as Runtime()); the environment's
        config dirs come after `config_dirs`, its other variables override."""
        defaults = dict(tune="off", cache_dir=None, backend_version=None, shipped_configs=True,
                        shipped_configs_dir=None, device_aliases=None, bounded_nearest=False, bound_ratio=2.0,
                        log_level="warn", watch=False, force=(), deterministic=False, tune_options=None)
        unknown = set(kwargs) - set(defaults)
        if unknown:
            raise TypeError(f"from_env() got unexpected keyword arguments {sorted(unknown)}")
        defaults.update(kwargs)
        opts = _options(config_dirs, **defaults)
        env_watch = os.environ.get("KDISPATCH_WATCH", "").strip() not in ("", "0")
        return cls._wrap(_backend.impl.Handle.create_from_env(opts), watching=bool(defaults["watch"]) or env_watch)

    # ---- lifetime
    def close(self, timeout_s=None):
        """Destroys the runtime (a no-op for the default runtime, and for a
        closed one). Safe while other threads call it (the C library's
        kdispatch_runtime_close): their new calls raise
        Error(failed_precondition), the calls in flight are waited for, at
        most `timeout_s` seconds (None: 10 s); when some are still running
        then, close raises Error(failed_precondition) naming how many and
        leaves the runtime alive (closed to new calls: close again to wait
        again). When the torch ops are served from it
        (kdispatch.torch_ops.set_runtime), they go back to the default
        runtime first."""
        h = getattr(self, "_h", None)
        if h is not None and h.owned:
            ops = sys.modules.get("kdispatch.torch_ops")
            if ops is not None and hasattr(ops, "get_runtime") and ops.get_runtime() is self:
                ops.set_runtime(None)
            h.close(-1.0 if timeout_s is None else float(timeout_s))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def handle(self):
        """The kdispatch_runtime* as an integer (for the C ABI, ctypes)."""
        return self._h.address

    @property
    def generation(self):
        """Bumped by every reload() through this object (caches key on it;
        a watched runtime's file-watcher reloads do not bump it: a cache must
        not cache over a runtime made with watch=True / KDISPATCH_WATCH=1).
        Raises kdispatch.Error (failed_precondition) once the runtime was
        closed, as every other method does."""
        self._h.frozen()  # refused by the library once closed
        return self._generation

    # ---- ops: one method per op of the library's op list (see _install_ops)

    # ---- tuning
    def pretune(self, op, *tensors, **kwargs):
        """Tunes one problem ahead of traffic (on scratch buffers shaped like
        the arrays; their data are not touched), persists and publishes the
        winner. `op` is an op name ("gemm", "rmsnorm", ...), then its arrays
        as the op method takes them (optional ones and scalars by keyword:
        pretune("gemm", a, b, d, bias=bias), pretune("rmsnorm", y, x, w,
        eps=1e-6)). Returns {"key", "M", "config", "variant", "best_us",
        "default_us", "candidates", "rejected", "failed", "persisted"}.
        Errors: failed_precondition when frozen."""
        o = _OPS_BY_NAME.get(op)
        if o is None:
            raise Error(StatusCode.invalid_argument, f"unknown op '{op}' ({', '.join(_OPS_BY_NAME)})")
        try:
            b = o["pretune_signature"].bind(*tensors, **kwargs)
        except TypeError as e:
            raise TypeError(f"pretune('{op}', {o['pretune_text']}): {e}") from None
        b.apply_defaults()
        text = self._h.pretune_op(op, [b.arguments[a["name"]] for a in o["args"]], o["meta"],
                                  [_scalar(b.arguments[x["name"]], x["kind"], x["name"]) for x in o["scalars"]])
        return json.loads(text)

    def tune_stats(self):
        """Tuning counters: misses, queued, dropped, shapes_tuned,
        shapes_skipped, candidates_run/rejected/failed, publishes, pending,
        tune_seconds, frozen, deferred (sync-mode misses seen during a graph
        capture, waiting), capture_waits (background waits for a capture)."""
        return self._h.tune_stats()

    def wait_tuner_idle(self, timeout_s=60.0):
        return self._h.wait_tuner_idle(float(timeout_s))

    def export_misses(self, path):
        """Writes the shapes that missed the table as an untuned-shapes CSV."""
        self._h.export_misses(os.fspath(path))

    # ---- table
    def reload(self):
        """Re-reads the config dirs and publishes a new table atomically.
        Errors: failed_precondition when frozen."""
        self._h.reload()
        with self._lock:
            self._generation += 1

    def freeze(self, frozen=True):
        """Stops (or resumes) all tuning and table changes."""
        self._h.freeze(bool(frozen))

    @property
    def frozen(self):
        return self._h.frozen()

    @property
    def cache_dir(self):
        return self._h.cache_dir()

    def load_report(self):
        """What loading found: {"files": [{"path", "dir", "status", "rows",
        "unknown_device", "problems"}...], "notes", "keys", "rows"}."""
        return json.loads(self._h.load_report())

    def device_info(self, device="cpu", ordinal=0):
        """{"device_name", "reported_name", "arch", "compute_units", ...} of
        "cpu", "cuda" or "hip" device `ordinal`. Errors: unsupported_device."""
        if device not in _DEVICE_TYPES:
            raise Error(StatusCode.invalid_argument, f"device '{device}' is not cpu, cuda or hip")
        return json.loads(self._h.device_info(_DEVICE_TYPES[device], int(ordinal)))

    def source_path(self, source_id):
        """(file relative to its config dir, the dir) of a source id (info["source_id"])."""
        return self._h.source_path(int(source_id))

    @staticmethod
    def _query(op, key, device, M, down, arch, compute_units, memory_bytes, backend):
        """The query dict both layers take (they refuse a string with a NUL
        in it, naming the argument: the C library would read only the part
        before the NUL)."""
        if key is None:
            raise Error(StatusCode.invalid_argument, "key is required (e.g. 'E=257,N=256,dtype=fp8_w8a8')")
        return {"op": op, "key": key, "device": device, "M": _int64("M", M), "down": bool(down), "arch": arch,
                "compute_units": _int64("compute_units", compute_units),
                "memory_bytes": _int64("memory_bytes", memory_bytes), "backend": backend}

    def lookup(self, op=None, key=None, device=None, M=1, down=False, *, arch=None, compute_units=0,
               memory_bytes=0, backend=None):
        """Which config serves this kernel at this M (dispatch::lookup).

        op: an engine table ("triton_fused_moe", "triton_gemm"), one of kdispatch's
        own ops ("gemm", "rmsnorm", "fused_moe", "moe_align", ...: the library's op list)
        or None (inferred from the key); key: the config file name's fields
        other than device_name ("E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]");
        device: as torch reports it ("NVIDIA H200") or as files spell it
        (None: the host CPU). Returns {"config": {...}, "source": file or
        "default", "source_dir", "match": "exact"|"nearest"|"default"|"forced",
        "M": the table key that served or None, "variant", "key", "why"}.
        Nearest-M ties go to the smaller key.
        """
        q = self._query(op, key, device, M, down, arch, compute_units, memory_bytes, backend)
        return json.loads(self._h.lookup(q))

    def lookup_table(self, op=None, key=None, device=None, down=False, *, arch=None, compute_units=0,
                     memory_bytes=0, backend=None):
        """The whole table serving a key (rows as in the files, merged across
        config dirs): {"key", "rows": {M: config}, "sources": {M: file},
        "source_dirs": {M: dir}} with int M keys, ascending. Errors:
        not_found when no table serves the key."""
        q = self._query(op, key, device, 1, down, arch, compute_units, memory_bytes, backend)
        t = json.loads(self._h.lookup_table(q))
        for k in ("rows", "sources", "source_dirs"):
            t[k] = {int(m): v for m, v in t[k].items()}
        return t

    def __repr__(self):
        if self._h.closed:
            return f"<kdispatch.Runtime closed backend={_backend.name}>"
        return f"<kdispatch.Runtime handle=0x{self._h.address:x} backend={_backend.name}>"


_default = None
_default_lock = threading.Lock()



# ---- the op methods, generated from the library's op list -------------------

def _parameters(o, keyword_tail):
    """inspect.Parameters of an op: its arrays in argument order (trailing
    optional ones default to None), its scalars with their defaults, then
    (keyword_tail) stream, capturing and info."""
    P = inspect.Parameter
    params, required_seen = [], False
    trailing = len(o["args"])
    while trailing > 0 and o["args"][trailing - 1]["optional"]:
        trailing -= 1
    for i, a in enumerate(o["args"]):
        params.append(P(a["name"], P.POSITIONAL_OR_KEYWORD, default=None if i >= trailing else P.empty))
    for x in o["scalars"]:
        params.append(P(x["name"], P.POSITIONAL_OR_KEYWORD, default=_scalar_default(x)))
    if keyword_tail:
        params += [P("stream", P.KEYWORD_ONLY, default=None), P("capturing", P.KEYWORD_ONLY, default=False),
                   P("info", P.KEYWORD_ONLY, default=False)]
    return params


def _int_scalar(v, name="value"):
    """An integer scalar (a size, a choice's index: kinds "int" and "choice")
    as the C ABI's float. A whole number (int, numpy, Decimal, Fraction,
    compared exactly, never through a rounding float()): exact up to 2^24;
    past it, -1.0, which the library refuses by name (never rounded to a
    neighbouring size). Not a whole number: as given where a float32 holds it
    exactly (0.5, nan, inf: the library refuses it with the value), else
    refused here, naming it (0.999999999 would round to the label 1 and run),
    as is a value float() would round (Decimal, Fraction) or one that is not
    a number (None, a string: _float)."""
    if type(v) is int:  # the common case
        return float(v) if -16777216 <= v <= 16777216 else -1.0
    if not isinstance(v, (str, bytes)) and not _time_like(v):
        try:
            i = int(v)
            whole = bool(i == v)
        except Exception:  # None, complex, nan, inf; a tensor past int64 (RuntimeError)
            whole = False
        if whole:
            return float(i) if abs(i) <= 16777216 else -1.0
    f = _float(v, name)
    if f != f:
        return f  # NaN: the library names it
    try:
        exact = bool(v == f)  # Decimal, Fraction, longdouble: float() may round them
    except Exception:
        exact = False
    if exact and _f32(f) == f:
        return f
    raise Error(StatusCode.invalid_argument, f"{name}: must be a whole number, got {v!r}")


def _time_like(v):
    """numpy's timedelta64 / datetime64 (a scalar or an array): int() and
    float() take np.timedelta64(1) as 1, but a time is not a size or a scale."""
    return getattr(getattr(v, "dtype", None), "kind", None) in ("m", "M")


def _float(v, name):
    """float(v), or an Error naming the argument where v is not a number
    (None, a string, even "4": never parsed; a numpy time) or float()
    refuses it (an int past a double's range)."""
    try:
        if isinstance(v, (str, bytes)):
            raise TypeError("a string")
        if _time_like(v):
            raise TypeError("a time, not a number")
        return float(v)
    except (TypeError, ValueError, OverflowError) as e:
        raise Error(StatusCode.invalid_argument, f"{name}: must be a number, got {v!r} ({e})") from None


def _f32(f):
    """f rounded to a float32 (inf where it is past a float32's range)."""
    try:
        return struct.unpack("f", struct.pack("f", f))[0]
    except OverflowError:
        return math.copysign(math.inf, f)


def _real(v, name):
    """A "float" scalar (eps, routed_scaling_factor) as the C ABI's float:
    any number a float32 holds, to its precision (1e-6); one a float32
    would make inf or 0 (1e300, Decimal('1e400'), 1e-50) refused naming
    it, as the torch binding does. inf, nan and 0 as given (the op names
    what it refuses)."""
    if type(v) is float and 1.1754943508222875e-38 <= abs(v) <= 3.4028234663852886e+38:
        return v  # the common case: a normal float32 magnitude
    f = _float(v, name)
    g = _f32(f)
    try:
        changed = (math.isinf(g) or g == 0) and not bool(v == g)
    except Exception:
        changed = True
    if changed:
        raise Error(StatusCode.invalid_argument, f"{name}: {v!r} is not representable as a float32")
    return f


def _switch(v, name):
    """A switch (kind "bool", fp8's fast_accum) as the C ABI's 0.0 or 1.0:
    False/True or a number exactly 0 or 1; anything else (0.99999999, "1",
    None) refused naming it, never rounded to a side."""
    if not isinstance(v, (str, bytes, complex)) and not _time_like(v):
        try:
            if v == 0 or v == 1:
                return 1.0 if v == 1 else 0.0
        except Exception:  # an array of several values
            pass
    raise Error(StatusCode.invalid_argument, f"{name}: must be 0 or 1 (false or true), got {v!r}")


def _scalar(v, kind, name):
    """One scalar of a call as the C ABI's float, by its kind ("int",
    "choice", "bool" or "float"; see _int_scalar, _switch, _real)."""
    if kind in ("int", "choice"):
        return _int_scalar(v, name)
    return _switch(v, name) if kind == "bool" else _real(v, name)


def _scalar_default(x):
    """A scalar's default as Python writes it: a switch (kind "bool", e.g.
    the fp8 GEMMs' fast_accum) as False/True, a float as itself."""
    kind = x.get("kind")
    return bool(x["default"]) if kind == "bool" else int(x["default"]) if kind == "int" else x["default"]


def _doc(o):
    def role(a):
        return "in place" if a["read"] and a["written"] else ("written" if a["written"] else "read")
    lines = [o.get("doc", ""), "", "Arguments (any objects with __dlpack__: numpy, torch, cupy; nothing is copied):"]
    for a in o["args"]:
        dims = ", ".join(d for d in (_dim_text(a.get("batch", {"dim": ""})), _dim_text(a["rows"]),
                                     _dim_text(a["cols"])) if d)
        lines.append(f"  {a['name']}: [{dims}], {role(a)}{', optional' if a['optional'] else ''}")
    for x in o["scalars"]:
        if x.get("kind") == "bool":
            lines.append(f"  {x['name']}: bool (default {_scalar_default(x)})")
        elif x.get("kind") == "choice":
            labels = ", ".join(f"{i} {n}" for i, n in enumerate(x.get("labels", [])))
            lines.append(f"  {x['name']}: int, one of {labels} (default {int(x['default'])})")
        elif x.get("kind") == "int":
            lines.append(f"  {x['name']}: int, the size {x.get('dim', '')} (default {int(x['default'])})")
        else:
            lines.append(f"  {x['name']}: float (default {x['default']:g})")
    lines += ["stream: a CUDA/HIP stream (int or an object with .cuda_stream) for GPU arrays; capturing: the "
              "stream is being captured into a graph. Returns None, or with info=True a dict: {\"source\": "
              "\"table\"|\"default\"|\"forced\", \"variant\", \"M\", \"source_id\", \"tuned_now\", \"k_source\" "
              "(non-empty where an engine's row shaped the default: fused_moe with SGLang's files)}."]
    return "\n".join(lines)


def _dim_text(e):
    if not e["dim"]:
        return ""
    t = e["dim"] if e["mul"] == 1 else f"{e['mul']}*{e['dim']}"
    return t if e["div"] == 1 else f"ceil({t}/{e['div']})"


def _make_method(o):
    """Runtime.<op>: a generated function with the op's parameters (no
    per-call signature binding: ~1 us of Python around the native call)."""
    sig = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] +
                            _parameters(o, True))
    name = o["name"]
    params = [str(p) for p in sig.parameters.values()]
    # KEYWORD_ONLY parameters need a bare * before them.
    first_kw = next(i for i, p in enumerate(sig.parameters.values()) if p.kind == p.KEYWORD_ONLY)
    params.insert(first_kw, "*")
    tensors = ", ".join(a["name"] for a in o["args"])
    scalars = ", ".join(f"_scalar({x['name']}, {x['kind']!r}, {x['name']!r})" for x in o["scalars"])
    src = (f"def {name}({', '.join(params)}):\n"
           f"    return self._h.op(_NAME, [{tensors}], _META, [{scalars}],\n"
           f"                      None if stream is None else _stream_handle(stream),\n"
           f"                      1 if capturing else 0, bool(info), 0, 0)\n")
    scope = {"_NAME": name, "_META": o["meta"], "_stream_handle": _stream_handle, "_scalar": _scalar}
    exec(compile(src, f"<kdispatch.Runtime.{name}>", "exec"), scope)
    method = scope[name]
    method.__qualname__ = "Runtime." + name
    method.__signature__ = sig
    method.__doc__ = _doc(o)
    return method


def _install_ops():
    for o in json.loads(_backend.impl.op_list_json()):
        o["meta"] = [(a["name"], a["optional"], a["written"]) for a in o["args"]]
        o["pretune_signature"] = inspect.Signature(_parameters(o, False))
        o["pretune_text"] = ", ".join(str(p) for p in o["pretune_signature"].parameters.values())
        _OPS_BY_NAME[o["name"]] = o
        setattr(Runtime, o["name"], _make_method(o))


_OPS_BY_NAME = {}
_install_ops()


def ops():
    """The library's ops: {name: {"args": [...], "scalars": [...], ...}} (kdispatch_op_list)."""
    return {k: {kk: vv for kk, vv in v.items() if kk not in ("meta", "pretune_signature", "pretune_text")}
            for k, v in _OPS_BY_NAME.items()}


def default_runtime():
    """The process-wide runtime configured from the KDISPATCH_* environment
    (built on first use, shared with every other user of libkdispatch in the
    process; close() on it does nothing). Errors: the error building it
    failed with, every time."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Runtime._wrap(_backend.impl.Handle.default_runtime(),
                                     watching=os.environ.get("KDISPATCH_WATCH", "").strip() not in ("", "0"))
        return _default
