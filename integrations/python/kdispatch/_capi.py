# SPDX-License-Identifier: Apache-2.0
"""ctypes over the C ABI of libkdispatch (include/dispatch/c_api.h).

The same interface as the pybind11 module kdispatch._kdispatch (module
functions abi_version/version/status_name/library_path, a Handle class), in
pure Python, so it works in any CPython 3 (torch's 3.12 venv included) with
nothing compiled for it. kdispatch.torch_ops uses the raw entry points
(``lib``, ``DLTensor``) directly on torch tensors' pointers and strides.

Which libkdispatch is loaded: the one the pybind11 module is linked to when
that module is in use (so both share one library and one default runtime);
otherwise the first found of $KDISPATCH_LIBRARY, a libkdispatch.so* inside
the package folder, the build tree's (kdispatch/_build_config.py, written by
CMake), the system's libkdispatch.so.0.
"""

import ctypes
import glob
import os
import sys
from ctypes import (POINTER, PYFUNCTYPE, Structure, byref, c_char, c_char_p, c_double, c_float,
                    c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p, py_object)

from ._errors import Error, StatusCode

ABI_VERSION = 1  # KDISPATCH_ABI_VERSION this binding was written for

# DLPack device types and dtype codes (dlpack.h)
kDLCPU, kDLCUDA, kDLCUDAHost, kDLROCM = 1, 2, 3, 10
kDLInt, kDLUInt, kDLFloat, kDLBfloat = 0, 1, 2, 4

CALL_CAPTURING = 1


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", c_void_p),
                ("flags", c_uint64), ("dl_tensor", DLTensor)]


DLPACK_FLAG_READ_ONLY = 1
DLPACK_FLAG_IS_COPIED = 2


class Options(Structure):
    """kdispatch_options."""
    _fields_ = [
        ("struct_size", c_uint32),
        ("config_dirs", POINTER(c_char_p)), ("config_dirs_count", c_size_t),
        ("load_shipped_configs", c_int32),
        ("shipped_configs_dir", c_char_p),
        ("backend_version", c_char_p),
        ("alias_from", POINTER(c_char_p)), ("alias_to", POINTER(c_char_p)), ("aliases_count", c_size_t),
        ("bounded_nearest", c_int32),
        ("bound_ratio", c_double),
        ("log_level", c_int32),
        ("watch", c_int32),
        ("force", POINTER(c_char_p)), ("force_count", c_size_t),
        ("deterministic", c_int32),
        ("tune_mode", c_int32),
        ("cache_dir", c_char_p),
        ("tune_persist", c_int32),
        ("tune_load_cache", c_int32),
        ("tune_memory_budget_bytes", c_int64),
        ("tune_time_budget_ms", c_double),
        ("tune_duty_cycle", c_double),
        ("tune_reps", c_int32),
        ("tune_max_candidates", c_int32),
        ("tune_queue_capacity", c_int32),
        ("tune_validate", c_int32),
        ("tune_cold_cache", c_int32),
        ("tune_claim_shapes", c_int32),
        ("tune_routing", c_char_p),
    ]


class TuneStats(Structure):
    """kdispatch_tune_stats."""
    _fields_ = [("struct_size", c_uint32)] + [(n, c_int64) for n in (
        "misses", "queued", "dropped", "shapes_tuned", "shapes_skipped", "candidates_run",
        "candidates_rejected", "candidates_failed", "publishes", "pending")] + [
        ("tune_seconds", c_double), ("frozen", c_int32), ("deferred", c_int64), ("capture_waits", c_int64)]


class DispatchInfo(Structure):
    """kdispatch_dispatch_info."""
    _fields_ = [("struct_size", c_uint32), ("source", c_int32), ("variant", c_char_p), ("table_m", c_int64),
                ("source_id", c_uint32), ("tuned_now", c_int32), ("k_source", c_char_p)]


class LookupQuery(Structure):
    """kdispatch_lookup_query."""
    _fields_ = [("struct_size", c_uint32), ("op", c_char_p), ("key", c_char_p), ("device", c_char_p),
                ("arch", c_char_p), ("compute_units", c_int32), ("memory_bytes", c_int64),
                ("backend", c_char_p), ("M", c_int64), ("down", c_int32)]


_STATUS = c_int32
_RT = c_void_p
_T = POINTER(DLTensor)
_STR_OUT = POINTER(POINTER(c_char))

_PROTOTYPES = {
    "kdispatch_status_name": (c_char_p, [c_int32]),
    "kdispatch_last_error_message": (c_char_p, []),
    "kdispatch_abi_version": (c_int32, []),
    "kdispatch_version": (c_char_p, []),
    "kdispatch_free": (None, [c_void_p]),
    "kdispatch_options_init_sized": (None, [POINTER(Options), c_size_t]),
    "kdispatch_lookup_query_init": (None, [POINTER(LookupQuery)]),
    "kdispatch_runtime_create": (_STATUS, [POINTER(Options), POINTER(c_void_p)]),
    "kdispatch_runtime_create_from_env": (_STATUS, [POINTER(Options), POINTER(c_void_p)]),
    "kdispatch_default_runtime": (_STATUS, [POINTER(c_void_p)]),
    "kdispatch_runtime_destroy": (_STATUS, [_RT]),
    "kdispatch_runtime_close": (_STATUS, [_RT, c_double]),
    "kdispatch_park_calls_at_exit": (None, []),
    "kdispatch_runtime_reload": (_STATUS, [_RT]),
    "kdispatch_runtime_freeze": (_STATUS, [_RT, c_int32]),
    "kdispatch_runtime_frozen": (_STATUS, [_RT, POINTER(c_int32)]),
    "kdispatch_runtime_load_report": (_STATUS, [_RT, _STR_OUT]),
    "kdispatch_runtime_cache_dir": (_STATUS, [_RT, _STR_OUT]),
    "kdispatch_runtime_device_info": (_STATUS, [_RT, c_int32, c_int32, _STR_OUT]),
    "kdispatch_runtime_tune_stats": (_STATUS, [_RT, POINTER(TuneStats)]),
    "kdispatch_runtime_wait_tuner_idle": (_STATUS, [_RT, c_double, POINTER(c_int32)]),
    "kdispatch_runtime_export_misses": (_STATUS, [_RT, c_char_p]),
    "kdispatch_runtime_source_path": (_STATUS, [_RT, c_uint32, _STR_OUT, _STR_OUT]),
    "kdispatch_runtime_attach_stream": (_STATUS, [_RT, c_int32, c_int32, c_void_p, c_int64]),
    # Every op through three functions; the per-op kdispatch_<op> are the
    # same calls (kdispatch_op_list names their arguments).
    "kdispatch_op_list": (_STATUS, [_STR_OUT]),
    "kdispatch_op_call": (_STATUS, [_RT, c_char_p, POINTER(_T), c_int32, POINTER(c_float), c_int32, c_void_p, c_int64,
                                    c_void_p, c_uint32, POINTER(DispatchInfo)]),
    "kdispatch_op_pretune": (_STATUS, [_RT, c_char_p, POINTER(_T), c_int32, POINTER(c_float), c_int32, _STR_OUT]),
    "kdispatch_op_workspace_bytes": (_STATUS, [c_char_p, POINTER(_T), c_int32, POINTER(c_float), c_int32,
                                               POINTER(c_int64)]),
    "kdispatch_lookup": (_STATUS, [_RT, POINTER(LookupQuery), _STR_OUT]),
    "kdispatch_lookup_table": (_STATUS, [_RT, POINTER(LookupQuery), _STR_OUT]),
}


def _candidates(prefer=None):
    if prefer:  # the library the pybind11 module is linked to: always that one
        return [prefer]
    env = os.environ.get("KDISPATCH_LIBRARY")
    if env:
        return [env]
    out = []
    here = os.path.dirname(os.path.abspath(__file__))
    out += sorted(glob.glob(os.path.join(here, "libkdispatch.so*")))
    try:
        from . import _build_config
        out.append(_build_config.LIBRARY)
    except ImportError:
        pass
    out.append("libkdispatch.so.0")
    return out


def _load(prefer=None):
    errors = []
    for path in _candidates(prefer):
        if os.sep in path and not os.path.exists(path):
            errors.append(f"{path}: no such file")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(str(e))
            continue
        for name, (res, args) in _PROTOTYPES.items():
            f = getattr(lib, name)
            f.restype = res
            f.argtypes = args
        abi = lib.kdispatch_abi_version()
        if abi != ABI_VERSION:
            raise ImportError(f"kdispatch: {path} implements C ABI version {abi}, this binding needs {ABI_VERSION}")
        return lib, path
    raise ImportError("kdispatch: libkdispatch not found (set KDISPATCH_LIBRARY): " + "; ".join(errors))


lib = None
library = None


def init(prefer=None):
    """Loads the library (once); `prefer` is a path to try first."""
    global lib, library
    if lib is None:
        lib, library = _load(prefer)
    return lib


def op_list_json():
    """The library's op list (kdispatch_op_list) as JSON text."""
    p = POINTER(c_char)()
    check(lib.kdispatch_op_list(byref(p)))
    return take_string(p)


def abi_version():
    return init().kdispatch_abi_version()


def version():
    return init().kdispatch_version().decode()


def status_name(code):
    return init().kdispatch_status_name(int(code)).decode()


def library_path():
    init()
    return library


def check(status):
    if status != 0:
        raise Error(status, lib.kdispatch_last_error_message().decode("utf-8", "replace"))


def take_string(p):
    """A caller-owned string from the library, as str (and freed)."""
    if not p:
        return ""
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        lib.kdispatch_free(p)


def c_bytes(s, name):
    """`s` (str, bytes or a path) as bytes for a C string; refused when it
    holds a NUL (the library would read only the part before it), naming
    the argument."""
    b = os.fsencode(s) if not isinstance(s, bytes) else s
    i = b.find(b"\0")
    if i >= 0:
        raise Error(StatusCode.invalid_argument,
                    f"{name}: contains a NUL character (at index {i}); kdispatch strings end at the first NUL")
    return b


def _bytes(s, name):
    return None if s is None or s == "" else c_bytes(s, name)


def _str_array(items, name):
    items = [c_bytes(x, f"{name}[{i}]") for i, x in enumerate(items)]
    arr = (c_char_p * max(1, len(items)))(*items)
    return arr, len(items)


_OPTION_KEYS = {
    "config_dirs", "load_shipped_configs", "shipped_configs_dir", "backend_version", "device_aliases",
    "bounded_nearest", "bound_ratio", "log_level", "watch", "force", "deterministic", "tune_mode", "cache_dir",
    "tune_persist", "tune_load_cache", "tune_memory_budget_bytes", "tune_time_budget_ms", "tune_duty_cycle",
    "tune_reps", "tune_max_candidates", "tune_queue_capacity", "tune_validate", "tune_cold_cache",
    "tune_claim_shapes", "tune_routing"}


def make_options(opts):
    """kdispatch_options from a dict (keys: the struct's field names;
    config_dirs/force lists, device_aliases a dict). Returns (struct, keep):
    `keep` holds the buffers the struct points at."""
    o = Options()
    init().kdispatch_options_init_sized(byref(o), ctypes.sizeof(o))
    keep = []
    for k, v in (opts or {}).items():
        if k not in _OPTION_KEYS:
            raise Error(StatusCode.invalid_argument, f"unknown runtime option '{k}'")
        if v is None:
            continue
        if k == "config_dirs":
            arr, n = _str_array(v, k)
            keep.append(arr)
            o.config_dirs, o.config_dirs_count = ctypes.cast(arr, POINTER(c_char_p)), n
        elif k == "force":
            arr, n = _str_array(v, k)
            keep.append(arr)
            o.force, o.force_count = ctypes.cast(arr, POINTER(c_char_p)), n
        elif k == "device_aliases":
            fa, n = _str_array(list(v.keys()), "device_aliases (a name)")
            ta, _ = _str_array(list(v.values()), "device_aliases (a name)")
            keep += [fa, ta]
            o.alias_from, o.alias_to, o.aliases_count = (ctypes.cast(fa, POINTER(c_char_p)),
                                                         ctypes.cast(ta, POINTER(c_char_p)), n)
        elif k in ("shipped_configs_dir", "backend_version", "cache_dir", "tune_routing"):
            b = _bytes(v, k)
            keep.append(b)
            setattr(o, k, b)
        elif isinstance(v, bool):
            setattr(o, k, 1 if v else 0)
        else:
            setattr(o, k, v)
    return o, keep


def make_query(q):
    lq = LookupQuery()
    init().kdispatch_lookup_query_init(byref(lq))
    keep = []
    for k in ("op", "key", "device", "arch", "backend"):
        v = q.get(k)
        b = c_bytes(v.encode() if isinstance(v, str) else v, k) if v not in (None, "") else None
        if k == "key" and b is None:
            b = b""
        keep.append(b)
        setattr(lq, k, b)
    lq.compute_units = int(q.get("compute_units") or 0)
    lq.memory_bytes = int(q.get("memory_bytes") or 0)
    lq.M = int(q.get("M", 1))
    lq.down = 1 if q.get("down") else 0
    return lq, keep


# ----------------------------------------------------------------- DLPack

_pyapi = ctypes.pythonapi
_pyapi.PyCapsule_IsValid.restype = ctypes.c_int
_pyapi.PyCapsule_IsValid.argtypes = [py_object, c_char_p]
_pyapi.PyCapsule_GetPointer.restype = c_void_p
_pyapi.PyCapsule_GetPointer.argtypes = [py_object, c_char_p]
_pyapi.PyCapsule_SetName.restype = ctypes.c_int
_pyapi.PyCapsule_SetName.argtypes = [py_object, c_char_p]
# PyCapsule_SetName keeps the pointer: these bytes live as long as the module.
_USED = b"used_dltensor"
_USED_VERSIONED = b"used_dltensor_versioned"
# Deleters are called with the GIL held (numpy's takes it again itself).
_DELETER = PYFUNCTYPE(None, c_void_p)


class Exported:
    """One consumed DLPack export of `obj`; `release()` runs the producer's
    deleter (exactly once). `ptr` is the DLTensor* (None for an absent
    optional tensor)."""

    __slots__ = ("ptr", "_managed", "_deleter")

    def __init__(self, obj, name, optional=False, output=False, stream=None):
        self.ptr = None
        self._managed = None
        self._deleter = None
        if obj is None:
            if optional:
                return
            raise Error(StatusCode.invalid_argument, f"{name} is None")
        fp8_code = None
        if getattr(obj, "_kdispatch_fp8", False):  # kdispatch.fp8(uint8 array, format)
            fp8_code, obj = obj.dl_code, obj.array
        dl = getattr(obj, "__dlpack__", None)
        if dl is None:
            raise Error(StatusCode.invalid_argument,
                        f"{name}: an object of type {type(obj).__name__} does not support DLPack (no __dlpack__)")
        kw = {}
        dev = getattr(obj, "__dlpack_device__", None)
        if dev is not None and stream:
            if int(dev()[0]) in (kDLCUDA, kDLROCM):
                kw["stream"] = int(stream)
        try:
            cap = dl(max_version=(1, 0), **kw)
        except TypeError:
            cap = dl(**kw)  # a producer older than DLPack 1.0
        if _pyapi.PyCapsule_IsValid(cap, b"dltensor_versioned"):
            addr = _pyapi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
            m = DLManagedTensorVersioned.from_address(addr)
            if m.version.major != 1:
                raise Error(StatusCode.invalid_argument,
                            f"{name}: DLPack major version {m.version.major} is not supported")
            _pyapi.PyCapsule_SetName(cap, _USED_VERSIONED)
            self._managed, self._deleter = addr, m.deleter
            self.ptr = ctypes.cast(addr + DLManagedTensorVersioned.dl_tensor.offset, _T)
            if output and (m.flags & DLPACK_FLAG_READ_ONLY):
                self.release()
                raise Error(StatusCode.invalid_argument, f"{name} is read-only (DLPack flag) but is written")
            if output and (m.flags & DLPACK_FLAG_IS_COPIED):
                self.release()
                raise Error(StatusCode.invalid_argument, f"{name} was exported as a copy, but is written")
        elif _pyapi.PyCapsule_IsValid(cap, b"dltensor"):
            addr = _pyapi.PyCapsule_GetPointer(cap, b"dltensor")
            m = DLManagedTensor.from_address(addr)
            _pyapi.PyCapsule_SetName(cap, _USED)
            self._managed, self._deleter = addr, m.deleter
            self.ptr = ctypes.cast(addr, _T)
        else:
            raise Error(StatusCode.invalid_argument, f"{name}: __dlpack__() returned no unused DLPack capsule")
        if fp8_code is not None:
            dt = self.ptr.contents.dtype
            if dt.bits != 8 or dt.lanes != 1 or dt.code not in (kDLInt, kDLUInt):
                self.release()
                raise Error(StatusCode.invalid_argument, f"{name}: an fp8 view needs a uint8 array")
            dt.code = fp8_code  # the consumed export's own DLTensor (freed by its deleter)

    def release(self):
        if self._managed is not None:
            managed, deleter = self._managed, self._deleter
            self._managed = self._deleter = None
            self.ptr = None
            if deleter:
                _DELETER(deleter)(managed)

    def __del__(self):
        self.release()


def _release(*exported):
    for e in exported:
        e.release()


_SOURCES = ("table", "default", "forced")


def info_dict(i):
    return {"source": _SOURCES[i.source] if 0 <= i.source <= 2 else "?",
            "variant": (i.variant or b"").decode(), "M": i.table_m if i.table_m >= 0 else None,
            "source_id": i.source_id, "tuned_now": bool(i.tuned_now), "k_source": (i.k_source or b"").decode()}


class Handle:
    """A kdispatch_runtime* (owned, or the borrowed default runtime).

    close() is kdispatch_runtime_close: safe while other threads call (their
    later calls get failed_precondition), it waits for the calls in flight
    and destroys the runtime; the handle itself is freed (kdispatch_runtime_
    destroy) only when this object goes, when no call through it is left."""

    def __init__(self, address, owned):
        self._rt = c_void_p(address)
        self._owned = owned
        self._closed = False
        self._lib = lib  # kept: module globals are cleared at interpreter exit

    @staticmethod
    def _create(fn, opts):
        o, keep = make_options(opts)
        out = c_void_p()
        check(fn(byref(o), byref(out)))
        del keep
        return Handle(out.value, True)

    @staticmethod
    def create(options=None):
        return Handle._create(init().kdispatch_runtime_create, options)

    @staticmethod
    def create_from_env(options=None):
        return Handle._create(init().kdispatch_runtime_create_from_env, options)

    @staticmethod
    def default_runtime():
        out = c_void_p()
        check(init().kdispatch_default_runtime(byref(out)))
        return Handle(out.value, False)

    def close(self, timeout_s=-1.0):
        """kdispatch_runtime_close (timeout_s < 0: the library's 10 s)."""
        if not self._owned or not self._rt.value:
            return
        self._closed = True  # closing again: the library waits for a close in progress, then it is a no-op
        s = self._lib.kdispatch_runtime_close(self._rt, float(timeout_s))
        if s != 0:
            self._closed = False  # calls still in flight: alive, closed to new calls
            check(s)

    @property
    def closed(self):
        return self._closed

    def __del__(self, _finalizing=sys.is_finalizing):
        # At interpreter exit the runtime is closed and the handle itself
        # left: the torch ops or another thread may still hold its address.
        try:
            if self._owned and self._rt.value and self._lib is not None:
                if _finalizing():
                    self._lib.kdispatch_runtime_close(self._rt, -1.0)
                else:
                    self._lib.kdispatch_runtime_destroy(self._rt)
                    self._rt = c_void_p()
        except Exception:
            pass

    @property
    def rt(self):
        if self._closed or not self._rt.value:
            raise Error(StatusCode.failed_precondition, "the runtime was closed")
        return self._rt

    @property
    def address(self):
        return self.rt.value

    @property
    def owned(self):
        return self._owned

    def reload(self):
        check(lib.kdispatch_runtime_reload(self.rt))

    def freeze(self, frozen):
        check(lib.kdispatch_runtime_freeze(self.rt, 1 if frozen else 0))

    def frozen(self):
        f = c_int32()
        check(lib.kdispatch_runtime_frozen(self.rt, byref(f)))
        return bool(f.value)

    def _string(self, fn, *args):
        p = POINTER(c_char)()
        check(fn(self.rt, *args, byref(p)))
        return take_string(p)

    def load_report(self):
        return self._string(lib.kdispatch_runtime_load_report)

    def cache_dir(self):
        return self._string(lib.kdispatch_runtime_cache_dir)

    def device_info(self, device_type, ordinal):
        return self._string(lib.kdispatch_runtime_device_info, int(device_type), int(ordinal))

    def tune_stats(self):
        t = TuneStats()
        t.struct_size = ctypes.sizeof(TuneStats)
        check(lib.kdispatch_runtime_tune_stats(self.rt, byref(t)))
        d = {n: getattr(t, n) for n, _ in TuneStats._fields_[1:]}
        d["frozen"] = bool(d["frozen"])
        return d

    def wait_tuner_idle(self, timeout_s):
        idle = c_int32()
        check(lib.kdispatch_runtime_wait_tuner_idle(self.rt, float(timeout_s), byref(idle)))
        return bool(idle.value)

    def export_misses(self, path):
        check(lib.kdispatch_runtime_export_misses(self.rt, c_bytes(path, "path")))

    def source_path(self, source_id):
        p, d = POINTER(c_char)(), POINTER(c_char)()
        check(lib.kdispatch_runtime_source_path(self.rt, int(source_id), byref(p), byref(d)))
        return take_string(p), take_string(d)

    # ---- ops over DLPack objects (any op of kdispatch_op_list)
    def op(self, name, tensors, arg_meta, scalars, stream, flags, want_info, workspace=0, workspace_bytes=0):
        """`tensors` in argument order (None: an absent optional one),
        `arg_meta` their (name, optional, written) rows, `scalars` in order."""
        rt = self.rt
        exported = []
        try:
            for obj, (arg, optional, written) in zip(tensors, arg_meta):
                exported.append(Exported(obj, arg, optional, written, stream))
            n = len(exported)
            ptrs = (_T * max(1, n))(*[e.ptr for e in exported])
            sc = (c_float * max(1, len(scalars)))(*[float(v) for v in scalars])
            info = DispatchInfo()
            info.struct_size = ctypes.sizeof(DispatchInfo)
            check(lib.kdispatch_op_call(rt, name.encode(), ptrs, n, sc, len(scalars), c_void_p(int(workspace or 0)),
                                        int(workspace_bytes), c_void_p(int(stream or 0)), int(flags),
                                        byref(info) if want_info else None))
            return info_dict(info) if want_info else None
        finally:
            _release(*exported)

    def pretune_op(self, name, tensors, arg_meta, scalars):
        rt = self.rt
        exported = []
        try:
            for obj, (arg, optional, _written) in zip(tensors, arg_meta):
                exported.append(Exported(obj, arg, optional))
            n = len(exported)
            ptrs = (_T * max(1, n))(*[e.ptr for e in exported])
            sc = (c_float * max(1, len(scalars)))(*[float(v) for v in scalars])
            p = POINTER(c_char)()
            check(lib.kdispatch_op_pretune(rt, name.encode(), ptrs, n, sc, len(scalars), byref(p)))
            return take_string(p)
        finally:
            _release(*exported)

    def lookup(self, q):
        lq, keep = make_query(q)
        return self._string(lib.kdispatch_lookup, byref(lq))

    def lookup_table(self, q):
        lq, keep = make_query(q)
        return self._string(lib.kdispatch_lookup_table, byref(lq))
