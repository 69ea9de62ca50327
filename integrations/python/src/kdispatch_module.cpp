// SPDX-License-Identifier: Apache-2.0
// kdispatch._kdispatch — the pybind11 layer of the Python package, over the
// C ABI (dispatch/c_api.h). Same interface as kdispatch/_capi.py (ctypes):
// module functions abi_version/version/status_name/library_path and a
// Handle class; the Python package (kdispatch/_runtime.py) builds the public
// API on either. Errors raise kdispatch._errors.Error(code, message).
//
// Tensors arrive as host buffers (the buffer protocol: numpy arrays of
// float32, float16, float64 and integers, read in ~0.1 us, no export) or as
// objects with __dlpack__ (torch, cupy, jax, numpy bfloat16 types...), each
// exported once per call, its capsule consumed: renamed
// "used_dltensor[_versioned]" (so the producer's capsule destructor leaves
// it alone) and its deleter called when the call returns. Data is never
// copied. The GIL is released around the kdispatch call.
#include <cxxabi.h>
#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/c_api.h"

namespace py = pybind11;

namespace {

// DLPack 1.0's versioned managed tensor (Debian's dlpack.h is 0.6, which
// predates it; the layout is fixed by the DLPack 1.0 ABI).
struct DLPackVersionCompat {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersionedCompat {
  DLPackVersionCompat version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersionedCompat* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kFlagReadOnly = 1;  // DLPACK_FLAG_BITMASK_READ_ONLY
constexpr uint64_t kFlagIsCopied = 2;  // DLPACK_FLAG_BITMASK_IS_COPIED

py::object error_class() {
  // Leaked on purpose: a static py::object would be released after the
  // interpreter has finalised.
  static py::object* cls = new py::object(py::module_::import("kdispatch._errors").attr("Error"));
  return *cls;
}

[[noreturn]] void raise(kdispatch_status code, const std::string& message) {
  py::object e = error_class()(code, message);
  PyErr_SetObject(error_class().ptr(), e.ptr());
  throw py::error_already_set();
}

void check(kdispatch_status s) {
  if (s != KDISPATCH_OK) raise(s, kdispatch_last_error_message());
}

// Runs `f` (C ABI calls only: they never throw) with the GIL released.
// Not py::gil_scoped_release: at interpreter exit, a daemon thread that
// takes the GIL back ends in PyEval_RestoreThread (pthread_exit, a forced
// unwind), which a noexcept frame (that class's destructor) turns into
// std::terminate. Here the unwind passes, and the callers' frames hold
// nothing that touches Python when unwound (Exported::abandon, py::handle
// arguments).
template <class F>
auto without_gil(F&& f) -> decltype(f()) {
  PyThreadState* ts = PyEval_SaveThread();
  auto r = f();
  PyEval_RestoreThread(ts);
  return r;
}

// A C string for the library from a Python str: refused when it holds a NUL
// (the library would read only the part before it), naming the argument.
const char* c_string(const std::string& s, const std::string& name) {
  const size_t nul = s.find('\0');
  if (nul != std::string::npos)
    raise(KDISPATCH_INVALID_ARGUMENT, name + ": contains a NUL character (at index " + std::to_string(nul) +
                                          "); kdispatch strings end at the first NUL");
  return s.c_str();
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// A caller-owned string from the library, as a Python str.
std::string take(char* p) {
  std::string s = p ? p : "";
  kdispatch_free(p);
  return s;
}

// Types whose __dlpack__ takes no max_version (DLPack < 1.0 producers, such
// as numpy < 2): asked without it from then on, so no call pays for a
// TypeError. Touched with the GIL held.
std::unordered_set<PyTypeObject*>& legacy_dlpack_types() {
  static auto* s = new std::unordered_set<PyTypeObject*>();
  return *s;
}

// The DLPack dtype of a buffer-protocol format, or false (left to DLPack).
bool buffer_dtype(const char* fmt, Py_ssize_t itemsize, DLDataType* dt) {
  if (fmt == nullptr) fmt = "B";
  if (*fmt == '@' || *fmt == '=' || *fmt == '<') ++fmt;  // native / little-endian (x86-64, aarch64)
  if (fmt[0] == '\0' || fmt[1] != '\0') return false;
  const uint8_t bits = static_cast<uint8_t>(itemsize * 8);
  switch (fmt[0]) {
    case 'f':
    case 'e':
    case 'd': *dt = DLDataType{kDLFloat, bits, 1}; return true;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q': *dt = DLDataType{kDLInt, bits, 1}; return true;
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q': *dt = DLDataType{kDLUInt, bits, 1}; return true;
    default: return false;
  }
}

// One tensor argument of a call: a host buffer (the buffer protocol) or a
// consumed DLPack export; released (buffer, or the export's deleter) when it
// goes (GIL held).
class Exported {
 public:
  Exported() = default;
  Exported(const Exported&) = delete;
  Exported& operator=(const Exported&) = delete;
  ~Exported() { release(); }

  // `obj` as `name`; None is an absent optional tensor. `output`: the call
  // writes it (refused when the producer marks it read-only or a copy).
  // `stream`: the consumer stream for GPU producers.
  void take_from(py::handle obj, const char* name, bool optional, bool output, std::optional<intptr_t> stream) {
    if (obj.is_none()) {
      if (optional) return;
      raise(KDISPATCH_INVALID_ARGUMENT, std::string(name) + " is None");
    }
    if (PyObject_HasAttrString(obj.ptr(), "_kdispatch_fp8")) {  // kdispatch.fp8(uint8 array, format)
      const int code = obj.attr("dl_code").cast<int>();
      take_from(obj.attr("array"), name, false, output, stream);
      if (tensor_->dtype.bits != 8 || tensor_->dtype.lanes != 1 ||
          (tensor_->dtype.code != kDLUInt && tensor_->dtype.code != kDLInt))
        raise(KDISPATCH_INVALID_ARGUMENT, std::string(name) + ": an fp8 view needs a uint8 array");
      if (tensor_ != &own_) own_ = *tensor_;  // the producer's DLTensor stays as exported
      own_.dtype = DLDataType{static_cast<uint8_t>(code), 8, 1};
      tensor_ = &own_;
      return;
    }
    if (take_buffer(obj, output)) return;
    take_dlpack(obj, name, output, stream);
  }

 private:
  // The buffer protocol (numpy and any host array with a plain format):
  // false leaves the object to DLPack (no buffer, a read-only one to be
  // written, a format DLPack describes better, strides not in elements).
  bool take_buffer(py::handle obj, bool output) {
    if (!PyObject_CheckBuffer(obj.ptr())) return false;
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_STRIDES | PyBUF_FORMAT | (output ? PyBUF_WRITABLE : 0)) != 0) {
      PyErr_Clear();
      return false;
    }
    has_view_ = true;
    DLDataType dt{};
    bool ok = view_.ndim >= 1 && view_.ndim <= kMaxDims && view_.itemsize > 0 && view_.itemsize <= 8 &&
              buffer_dtype(view_.format, view_.itemsize, &dt);
    for (int d = 0; ok && d < view_.ndim; ++d) {
      shape_[d] = view_.shape[d];
      ok = view_.strides[d] % view_.itemsize == 0;
      strides_[d] = view_.strides[d] / view_.itemsize;
    }
    if (!ok) {
      release();
      return false;
    }
    own_.data = view_.buf;
    own_.device = DLDevice{kDLCPU, 0};
    own_.ndim = view_.ndim;
    own_.dtype = dt;
    own_.shape = shape_;
    own_.strides = strides_;
    own_.byte_offset = 0;
    tensor_ = &own_;
    return true;
  }

  void take_dlpack(py::handle obj, const char* name, bool output, std::optional<intptr_t> stream) {
    if (!py::hasattr(obj, "__dlpack__"))
      raise(KDISPATCH_INVALID_ARGUMENT, std::string(name) + ": an object of type " +
                                            std::string(py::str(py::type::handle_of(obj).attr("__name__"))) +
                                            " does not support DLPack (no __dlpack__)");
    py::dict kw;
    if (py::hasattr(obj, "__dlpack_device__")) {
      py::tuple dev = obj.attr("__dlpack_device__")();
      const int type = dev[0].cast<int>();
      if ((type == kDLCUDA || type == kDLROCM) && stream && *stream != 0) kw["stream"] = *stream;
    }
    py::object cap;
    PyTypeObject* type = Py_TYPE(obj.ptr());
    if (legacy_dlpack_types().count(type) != 0) {
      cap = obj.attr("__dlpack__")(**kw);
    } else {
      py::dict kwv;  // a new dict (py::dict kwv = kw would alias kw)
      for (auto item : kw) kwv[item.first] = item.second;
      kwv["max_version"] = py::make_tuple(1, 0);
      try {
        cap = obj.attr("__dlpack__")(**kwv);
      } catch (py::error_already_set& e) {
        if (!e.matches(PyExc_TypeError)) throw;
        cap = obj.attr("__dlpack__")(**kw);  // a producer older than DLPack 1.0
        legacy_dlpack_types().insert(type);
      }
    }
    if (PyCapsule_IsValid(cap.ptr(), "dltensor_versioned")) {
      auto* m = static_cast<DLManagedTensorVersionedCompat*>(PyCapsule_GetPointer(cap.ptr(), "dltensor_versioned"));
      if (m->version.major != 1)
        raise(KDISPATCH_INVALID_ARGUMENT,
              std::string(name) + ": DLPack major version " + std::to_string(m->version.major) + " is not supported");
      PyCapsule_SetName(cap.ptr(), "used_dltensor_versioned");
      versioned_ = m;
      tensor_ = &m->dl_tensor;
      if (output && (m->flags & kFlagReadOnly))
        raise(KDISPATCH_INVALID_ARGUMENT, std::string(name) + " is read-only (DLPack flag) but is written");
      if (output && (m->flags & kFlagIsCopied))
        raise(KDISPATCH_INVALID_ARGUMENT, std::string(name) + " was exported as a copy, but is written");
    } else if (PyCapsule_IsValid(cap.ptr(), "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
      PyCapsule_SetName(cap.ptr(), "used_dltensor");
      legacy_ = m;
      tensor_ = &m->dl_tensor;
    } else {
      raise(KDISPATCH_INVALID_ARGUMENT, std::string(name) + ": __dlpack__() returned no unused DLPack capsule");
    }
  }

 public:
  const DLTensor* get() const { return tensor_; }

  // Forgets the buffer and the export without releasing them (a thread that
  // ends without the GIL at interpreter exit must not touch Python).
  void abandon() {
    has_view_ = false;
    versioned_ = nullptr;
    legacy_ = nullptr;
    tensor_ = nullptr;
  }

 private:
  static constexpr int kMaxDims = 8;
  void release() {
    if (has_view_) PyBuffer_Release(&view_);
    has_view_ = false;
    if (versioned_ && versioned_->deleter) versioned_->deleter(versioned_);
    if (legacy_ && legacy_->deleter) legacy_->deleter(legacy_);
    versioned_ = nullptr;
    legacy_ = nullptr;
    tensor_ = nullptr;
  }
  DLManagedTensorVersionedCompat* versioned_ = nullptr;
  DLManagedTensor* legacy_ = nullptr;
  const DLTensor* tensor_ = nullptr;
  Py_buffer view_{};
  bool has_view_ = false;
  DLTensor own_{};
  int64_t shape_[kMaxDims] = {};
  int64_t strides_[kMaxDims] = {};
};

constexpr size_t kMaxOpTensors = KDISPATCH_MAX_OP_TENSORS;

std::optional<intptr_t> stream_of(py::handle s) {
  if (s.is_none()) return std::nullopt;
  return s.cast<intptr_t>();
}

// ------------------------------------------------------------ options / query

template <class T>
T get(const py::dict& d, const char* k, T dflt) {
  return d.contains(k) && !d[k].is_none() ? d[k].cast<T>() : dflt;
}

struct Options {
  kdispatch_options o{};
  std::vector<std::string> strings;  // owns every string the struct points at
  std::vector<std::string> dirs, force, alias_from, alias_to;
  std::vector<const char*> dirs_p, force_p, from_p, to_p;
  std::string shipped, backend_version, cache_dir, routing;

  explicit Options(py::handle opts) {
    kdispatch_options_init(&o);
    if (opts.is_none()) return;
    py::dict d = py::reinterpret_borrow<py::object>(opts);
    static const char* const known[] = {"config_dirs",
                                        "load_shipped_configs",
                                        "shipped_configs_dir",
                                        "backend_version",
                                        "device_aliases",
                                        "bounded_nearest",
                                        "bound_ratio",
                                        "log_level",
                                        "watch",
                                        "force",
                                        "deterministic",
                                        "tune_mode",
                                        "cache_dir",
                                        "tune_persist",
                                        "tune_load_cache",
                                        "tune_memory_budget_bytes",
                                        "tune_time_budget_ms",
                                        "tune_duty_cycle",
                                        "tune_reps",
                                        "tune_max_candidates",
                                        "tune_queue_capacity",
                                        "tune_validate",
                                        "tune_cold_cache",
                                        "tune_claim_shapes",
                                        "tune_routing"};
    for (auto item : d) {
      const std::string k = py::str(item.first);
      bool ok = false;
      for (const char* n : known) ok = ok || k == n;
      if (!ok) raise(KDISPATCH_INVALID_ARGUMENT, "unknown runtime option '" + k + "'");
    }
    dirs = get<std::vector<std::string>>(d, "config_dirs", {});
    for (size_t i = 0; i < dirs.size(); ++i)
      dirs_p.push_back(c_string(dirs[i], "config_dirs[" + std::to_string(i) + "]"));
    o.config_dirs = dirs_p.data();
    o.config_dirs_count = dirs_p.size();
    o.load_shipped_configs = get<bool>(d, "load_shipped_configs", true);
    shipped = get<std::string>(d, "shipped_configs_dir", "");
    o.shipped_configs_dir = shipped.empty() ? nullptr : c_string(shipped, "shipped_configs_dir");
    backend_version = get<std::string>(d, "backend_version", "");
    o.backend_version = backend_version.empty() ? nullptr : c_string(backend_version, "backend_version");
    if (d.contains("device_aliases") && !d["device_aliases"].is_none()) {
      for (auto kv : py::dict(d["device_aliases"])) {
        alias_from.push_back(py::str(kv.first));
        alias_to.push_back(py::str(kv.second));
      }
      for (size_t i = 0; i < alias_from.size(); ++i) {
        from_p.push_back(c_string(alias_from[i], "device_aliases (a name)"));
        to_p.push_back(c_string(alias_to[i], "device_aliases (a name)"));
      }
    }
    o.alias_from = from_p.data();
    o.alias_to = to_p.data();
    o.aliases_count = from_p.size();
    o.bounded_nearest = get<bool>(d, "bounded_nearest", false);
    o.bound_ratio = get<double>(d, "bound_ratio", o.bound_ratio);
    o.log_level = get<int32_t>(d, "log_level", o.log_level);
    o.watch = get<bool>(d, "watch", false);
    force = get<std::vector<std::string>>(d, "force", {});
    for (size_t i = 0; i < force.size(); ++i) force_p.push_back(c_string(force[i], "force[" + std::to_string(i) + "]"));
    o.force = force_p.data();
    o.force_count = force_p.size();
    o.deterministic = get<bool>(d, "deterministic", false);
    o.tune_mode = get<int32_t>(d, "tune_mode", o.tune_mode);
    cache_dir = get<std::string>(d, "cache_dir", "");
    o.cache_dir = cache_dir.empty() ? nullptr : c_string(cache_dir, "cache_dir");
    o.tune_persist = get<bool>(d, "tune_persist", o.tune_persist != 0);
    o.tune_load_cache = get<bool>(d, "tune_load_cache", o.tune_load_cache != 0);
    o.tune_memory_budget_bytes = get<int64_t>(d, "tune_memory_budget_bytes", o.tune_memory_budget_bytes);
    o.tune_time_budget_ms = get<double>(d, "tune_time_budget_ms", o.tune_time_budget_ms);
    o.tune_duty_cycle = get<double>(d, "tune_duty_cycle", o.tune_duty_cycle);
    o.tune_reps = get<int32_t>(d, "tune_reps", o.tune_reps);
    o.tune_max_candidates = get<int32_t>(d, "tune_max_candidates", o.tune_max_candidates);
    o.tune_queue_capacity = get<int32_t>(d, "tune_queue_capacity", o.tune_queue_capacity);
    o.tune_validate = get<bool>(d, "tune_validate", o.tune_validate != 0);
    o.tune_cold_cache = get<bool>(d, "tune_cold_cache", o.tune_cold_cache != 0);
    o.tune_claim_shapes = get<bool>(d, "tune_claim_shapes", o.tune_claim_shapes != 0);
    routing = get<std::string>(d, "tune_routing", "");
    o.tune_routing = routing.empty() ? nullptr : c_string(routing, "tune_routing");
  }
};

struct Query {
  kdispatch_lookup_query q{};
  std::string op, key, device, arch, backend;
  explicit Query(const py::dict& d) {
    kdispatch_lookup_query_init(&q);
    op = get<std::string>(d, "op", "");
    key = get<std::string>(d, "key", "");
    device = get<std::string>(d, "device", "");
    arch = get<std::string>(d, "arch", "");
    backend = get<std::string>(d, "backend", "");
    q.op = op.empty() ? nullptr : c_string(op, "op");
    q.key = c_string(key, "key");
    q.device = device.empty() ? nullptr : c_string(device, "device");
    q.arch = arch.empty() ? nullptr : c_string(arch, "arch");
    q.backend = backend.empty() ? nullptr : c_string(backend, "backend");
    q.compute_units = get<int32_t>(d, "compute_units", 0);
    q.memory_bytes = get<int64_t>(d, "memory_bytes", 0);
    q.M = get<int64_t>(d, "M", 1);
    q.down = get<bool>(d, "down", false);
  }
};

py::object info_dict(const kdispatch_dispatch_info& i) {
  static const char* const names[] = {"table", "default", "forced"};
  py::dict d;
  d["source"] = (i.source >= 0 && i.source <= 2) ? names[i.source] : "?";
  d["variant"] = i.variant ? i.variant : "";
  d["M"] = i.table_m >= 0 ? py::object(py::int_(i.table_m)) : py::object(py::none());
  d["source_id"] = i.source_id;
  d["tuned_now"] = i.tuned_now != 0;
  d["k_source"] = i.k_source ? i.k_source : "";
  return d;
}

// ---------------------------------------------------------------- the handle

class Handle {
 public:
  explicit Handle(kdispatch_runtime* rt, bool owned) : rt_(rt), owned_(owned) {}
  // The handle is freed only here, when no Python reference (so no call
  // through this object) is left; close() destroys the runtime before. At
  // interpreter exit the runtime is closed and the handle itself left: the
  // torch ops or another thread may still hold its address.
  ~Handle() {
    if (!rt_ || !owned_) return;
    if (interpreter_finalizing())
      (void)kdispatch_runtime_close(rt_, -1.0);
    else
      (void)kdispatch_runtime_destroy(rt_);
  }

  static std::unique_ptr<Handle> create(py::handle opts) {
    Options o(opts);
    kdispatch_runtime* rt = nullptr;
    check(without_gil([&] { return kdispatch_runtime_create(&o.o, &rt); }));
    return std::make_unique<Handle>(rt, true);
  }
  static std::unique_ptr<Handle> create_from_env(py::handle opts) {
    Options o(opts);
    kdispatch_runtime* rt = nullptr;
    check(without_gil([&] { return kdispatch_runtime_create_from_env(&o.o, &rt); }));
    return std::make_unique<Handle>(rt, true);
  }
  static std::unique_ptr<Handle> default_runtime() {
    kdispatch_runtime* rt = nullptr;
    check(without_gil([&] { return kdispatch_default_runtime(&rt); }));
    return std::make_unique<Handle>(rt, false);
  }

  // kdispatch_runtime_close: safe while other threads call (they get
  // failed_precondition from then on); waits for their calls in flight, at
  // most timeout_s (negative: the library's default, 10 s). The GIL is
  // released meanwhile.
  void close(double timeout_s) {
    if (!rt_ || !owned_) return;
    closed_ = true;  // closing again: the library's close waits for a close in progress, then is a no-op
    kdispatch_runtime* r = rt_;
    const kdispatch_status s = without_gil([&] { return kdispatch_runtime_close(r, timeout_s); });
    if (s != KDISPATCH_OK) {
      closed_ = false;  // still alive (calls in flight): a later close waits again
      check(s);
    }
  }
  kdispatch_runtime* rt() const {
    if (!rt_ || closed_) raise(KDISPATCH_FAILED_PRECONDITION, "the runtime was closed");
    return rt_;
  }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(rt()); }
  bool owned() const { return owned_; }
  bool closed() const { return closed_; }

  void reload() {
    kdispatch_runtime* r = rt();
    check(without_gil([&] { return kdispatch_runtime_reload(r); }));
  }
  void freeze(bool f) { check(kdispatch_runtime_freeze(rt(), f ? 1 : 0)); }
  bool frozen() const {
    int32_t f = 0;
    check(kdispatch_runtime_frozen(rt(), &f));
    return f != 0;
  }
  std::string load_report() const {
    char* j = nullptr;
    check(kdispatch_runtime_load_report(rt(), &j));
    return take(j);
  }
  std::string cache_dir() const {
    char* j = nullptr;
    check(kdispatch_runtime_cache_dir(rt(), &j));
    return take(j);
  }
  std::string device_info(int32_t type, int32_t ordinal) const {
    char* j = nullptr;
    check(kdispatch_runtime_device_info(rt(), type, ordinal, &j));
    return take(j);
  }
  py::dict tune_stats() const {
    kdispatch_tune_stats t{};
    t.struct_size = sizeof t;
    check(kdispatch_runtime_tune_stats(rt(), &t));
    py::dict d;
    d["misses"] = t.misses;
    d["queued"] = t.queued;
    d["dropped"] = t.dropped;
    d["shapes_tuned"] = t.shapes_tuned;
    d["shapes_skipped"] = t.shapes_skipped;
    d["candidates_run"] = t.candidates_run;
    d["candidates_rejected"] = t.candidates_rejected;
    d["candidates_failed"] = t.candidates_failed;
    d["publishes"] = t.publishes;
    d["pending"] = t.pending;
    d["tune_seconds"] = t.tune_seconds;
    d["frozen"] = t.frozen != 0;
    d["deferred"] = t.deferred;
    d["capture_waits"] = t.capture_waits;
    return d;
  }
  bool wait_tuner_idle(double timeout_s) {
    kdispatch_runtime* r = rt();
    int32_t idle = 0;
    check(without_gil([&] { return kdispatch_runtime_wait_tuner_idle(r, timeout_s, &idle); }));
    return idle != 0;
  }
  void export_misses(const std::string& path) const {
    check(kdispatch_runtime_export_misses(rt(), c_string(path, "path")));
  }
  py::tuple source_path(uint32_t id) const {
    char* p = nullptr;
    char* d = nullptr;
    check(kdispatch_runtime_source_path(rt(), id, &p, &d));
    std::string ps = take(p), ds = take(d);
    return py::make_tuple(ps, ds);
  }

  // Any op of kdispatch_op_list: `tensors` in argument order (None for an
  // absent optional one), `arg_meta` the op's rows of the list (name,
  // optional, written: the Python layer passes them from the parsed list),
  // `scalars` in order. Returns None, or the info dict. The sequences are
  // py::handle (borrowed: nothing to release if the thread ends in the call).
  py::object op(const std::string& name, py::handle tensors, py::handle arg_meta, std::vector<float> scalars,
                py::handle stream, uint32_t flags, bool want_info, intptr_t workspace, int64_t workspace_bytes) {
    kdispatch_runtime* r = rt();
    const auto st = stream_of(stream);
    const size_t n = py::len(tensors);
    if (n > kMaxOpTensors)
      raise(KDISPATCH_INVALID_ARGUMENT, name + ": more than " + std::to_string(kMaxOpTensors) + " tensors");
    Exported ex[kMaxOpTensors];
    const DLTensor* ptrs[kMaxOpTensors] = {};
    for (size_t i = 0; i < n; ++i) {
      py::tuple m = arg_meta[py::int_(i)];  // (name, optional, written)
      ex[i].take_from(tensors[py::int_(i)], PyUnicode_AsUTF8(m[0].ptr()), m[1].ptr() == Py_True, m[2].ptr() == Py_True,
                      st);
      ptrs[i] = ex[i].get();
    }
    kdispatch_dispatch_info info{};
    info.struct_size = sizeof info;
    kdispatch_status s;
    try {
      s = without_gil([&] {
        return kdispatch_op_call(r, name.c_str(), ptrs, static_cast<int32_t>(n), scalars.data(),
                                 static_cast<int32_t>(scalars.size()), reinterpret_cast<void*>(workspace),
                                 workspace_bytes, reinterpret_cast<void*>(st.value_or(0)), flags,
                                 want_info ? &info : nullptr);
      });
    } catch (abi::__forced_unwind&) {  // the thread ends at interpreter exit, without the GIL
      for (Exported& e : ex) e.abandon();
      throw;
    }
    check(s);
    return want_info ? info_dict(info) : py::none();
  }

  std::string pretune_op(const std::string& name, py::handle tensors, py::handle arg_meta, std::vector<float> scalars) {
    kdispatch_runtime* r = rt();
    const size_t n = py::len(tensors);
    if (n > kMaxOpTensors)
      raise(KDISPATCH_INVALID_ARGUMENT, name + ": more than " + std::to_string(kMaxOpTensors) + " tensors");
    Exported ex[kMaxOpTensors];
    const DLTensor* ptrs[kMaxOpTensors] = {};
    for (size_t i = 0; i < n; ++i) {
      py::tuple m = arg_meta[py::int_(i)];
      ex[i].take_from(tensors[py::int_(i)], PyUnicode_AsUTF8(m[0].ptr()), m[1].ptr() == Py_True, false, std::nullopt);
      ptrs[i] = ex[i].get();
    }
    char* j = nullptr;
    kdispatch_status s;
    try {
      s = without_gil([&] {
        return kdispatch_op_pretune(r, name.c_str(), ptrs, static_cast<int32_t>(n), scalars.data(),
                                    static_cast<int32_t>(scalars.size()), &j);
      });
    } catch (abi::__forced_unwind&) {
      for (Exported& e : ex) e.abandon();
      throw;
    }
    check(s);
    return take(j);
  }

  std::string lookup(const py::dict& q) const {
    Query query(q);
    char* j = nullptr;
    check(kdispatch_lookup(rt(), &query.q, &j));
    return take(j);
  }
  std::string lookup_table(const py::dict& q) const {
    Query query(q);
    char* j = nullptr;
    check(kdispatch_lookup_table(rt(), &query.q, &j));
    return take(j);
  }

 private:
  kdispatch_runtime* rt_ = nullptr;
  bool owned_ = false;
  bool closed_ = false;
};

std::string library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&kdispatch_abi_version), &info) && info.dli_fname) return info.dli_fname;
  return "";
}

}  // namespace

PYBIND11_MODULE(_kdispatch, m) {
  m.doc() = "kdispatch's pybind11 layer over the C ABI (use the kdispatch package, not this module)";
  m.def("abi_version", &kdispatch_abi_version);
  m.attr("HEADER_ABI_VERSION") = KDISPATCH_ABI_VERSION;
  m.def("version", []() { return std::string(kdispatch_version()); });
  m.def("op_list_json", []() {
    char* j = nullptr;
    check(kdispatch_op_list(&j));
    return take(j);
  });
  m.def("status_name", [](int32_t c) { return std::string(kdispatch_status_name(c)); });
  m.def("library_path", &library_path, "Path of the libkdispatch this module uses");
  py::class_<Handle>(m, "Handle")
      .def_static("create", &Handle::create, py::arg("options") = py::none())
      .def_static("create_from_env", &Handle::create_from_env, py::arg("options") = py::none())
      .def_static("default_runtime", &Handle::default_runtime)
      .def("close", &Handle::close, py::arg("timeout_s") = -1.0)
      .def_property_readonly("closed", &Handle::closed)
      .def_property_readonly("address", &Handle::address)
      .def_property_readonly("owned", &Handle::owned)
      .def("reload", &Handle::reload)
      .def("freeze", &Handle::freeze)
      .def("frozen", &Handle::frozen)
      .def("load_report", &Handle::load_report)
      .def("cache_dir", &Handle::cache_dir)
      .def("device_info", &Handle::device_info)
      .def("tune_stats", &Handle::tune_stats)
      .def("wait_tuner_idle", &Handle::wait_tuner_idle)
      .def("export_misses", &Handle::export_misses)
      .def("source_path", &Handle::source_path)
      .def("op", &Handle::op)
      .def("pretune_op", &Handle::pretune_op)
      .def("lookup", &Handle::lookup)
      .def("lookup_table", &Handle::lookup_table);
}
