// SPDX-License-Identifier: Apache-2.0
// kdispatch — the C ABI (include/dispatch/c_api.h) over the C++ API.
//
// Every entry point catches everything (nothing throws across the ABI),
// converts the C arguments, calls the noexcept C++ function and turns its
// Status into a code plus the thread's last error message. The ops add no
// allocation to the C++ path: DLTensor -> TensorRef is a copy of a few
// fields, and clearing the thread-local message keeps its capacity.
#include "dispatch/c_api.h"

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "c_api/in_flight.hpp"
#include "core/json_write.hpp"
#include "core/op_list.hpp"
#include "dispatch/dispatch.hpp"
#include "dispatch/dlpack.hpp"

// A handle: the runtime, and the gate that kdispatch_runtime_close closes.
// The handle outlives its runtime: after a close, `rt` is null and every
// call through the handle gets FAILED_PRECONDITION until
// kdispatch_runtime_destroy frees it.
struct kdispatch_runtime {
  dispatch::Runtime* rt = nullptr;
  std::unique_ptr<dispatch::Runtime> owned;  // null for the default runtime (borrowed)
  bool is_default = false;
  dispatch::capi::Gate gate;
  std::mutex close_mu;     // one close at a time
  bool destroyed = false;  // the runtime is gone (under close_mu)
};

namespace {

using dispatch::Status;
using dispatch::StatusCode;

static_assert(KDISPATCH_OK == static_cast<int>(StatusCode::ok));
static_assert(KDISPATCH_INVALID_ARGUMENT == static_cast<int>(StatusCode::invalid_argument));
static_assert(KDISPATCH_UNSUPPORTED_PROBLEM == static_cast<int>(StatusCode::unsupported_problem));
static_assert(KDISPATCH_UNSUPPORTED_DEVICE == static_cast<int>(StatusCode::unsupported_device));
static_assert(KDISPATCH_NO_VARIANT == static_cast<int>(StatusCode::no_variant));
static_assert(KDISPATCH_CONFIG_ERROR == static_cast<int>(StatusCode::config_error));
static_assert(KDISPATCH_BACKEND_ERROR == static_cast<int>(StatusCode::backend_error));
static_assert(KDISPATCH_OUT_OF_MEMORY == static_cast<int>(StatusCode::out_of_memory));
static_assert(KDISPATCH_NOT_FOUND == static_cast<int>(StatusCode::not_found));
static_assert(KDISPATCH_INTERNAL == static_cast<int>(StatusCode::internal));
static_assert(KDISPATCH_IO_ERROR == static_cast<int>(StatusCode::io_error));
static_assert(KDISPATCH_FAILED_PRECONDITION == static_cast<int>(StatusCode::failed_precondition));
static_assert(KDISPATCH_TUNE_OFF == static_cast<int>(dispatch::TuneMode::off));
static_assert(KDISPATCH_TUNE_SYNC == static_cast<int>(dispatch::TuneMode::sync));
static_assert(KDISPATCH_TUNE_BACKGROUND == static_cast<int>(dispatch::TuneMode::background));
static_assert(KDISPATCH_LOG_DEBUG == static_cast<int>(dispatch::LogLevel::debug));
static_assert(static_cast<int>(dispatch::PlanSource::forced) == 2);

// The calling thread's last error message. Cleared (capacity kept) on
// success, so a successful op allocates nothing here.
thread_local std::string t_last_error;

kdispatch_status ok() noexcept {
  t_last_error.clear();
  return KDISPATCH_OK;
}

kdispatch_status fail(kdispatch_status code, std::string_view message) noexcept {
  try {
    t_last_error.assign(message.data(), message.size());
  } catch (...) {
    t_last_error.clear();
  }
  return code;
}

kdispatch_status finish(const Status& s) noexcept {
  if (s.ok()) return ok();
  return fail(static_cast<kdispatch_status>(s.code()), s.message());
}

// Runs `body` (returning kdispatch_status), mapping any escaping exception.
template <class F>
kdispatch_status guarded(const char* what, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(KDISPATCH_OUT_OF_MEMORY, std::string("out of memory in ") + what);
  } catch (const std::exception& e) {
    return fail(KDISPATCH_INTERNAL, std::string(what) + ": " + e.what());
  } catch (...) {
    return fail(KDISPATCH_INTERNAL, std::string(what) + ": unknown exception");
  }
}

kdispatch_status null_arg(const char* fn, const char* arg) noexcept {
  return fail(KDISPATCH_INVALID_ARGUMENT, std::string(fn) + ": " + arg + " is NULL");
}

[[gnu::cold, gnu::noinline]] kdispatch_status closed_runtime(const char* fn) noexcept {
  return fail(KDISPATCH_FAILED_PRECONDITION,
              std::string(fn) + ": the runtime was closed (kdispatch_runtime_close); no call may use it");
}

constexpr uint32_t kKnownCallFlags = KDISPATCH_CALL_CAPTURING | KDISPATCH_CALL_FAST_ACCUM;

[[gnu::cold, gnu::noinline]] kdispatch_status unknown_flags(uint32_t flags) noexcept {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "flags: unknown bits 0x%x (0x%x given; known: KDISPATCH_CALL_CAPTURING 0x1, "
                "KDISPATCH_CALL_FAST_ACCUM 0x2)",
                static_cast<unsigned>(flags & ~kKnownCallFlags), static_cast<unsigned>(flags));
  return fail(KDISPATCH_INVALID_ARGUMENT, buf);
}

// Runs body(runtime) as a call in flight on handle `h` (see c_api/in_flight.hpp):
// INVALID_ARGUMENT for a null handle, FAILED_PRECONDITION for a closed one.
template <class H, class F>
[[gnu::always_inline]] inline kdispatch_status on_runtime(const char* fn, H* h, F&& body) {
  if (h == nullptr) return null_arg(fn, "rt");
  const dispatch::capi::InFlight call(h, h->gate);
  if (!call.entered()) [[unlikely]]
    return closed_runtime(fn);
  return body(*h->rt);
}

// A caller-owned copy of `s` (released with kdispatch_free).
char* dup(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (!p) throw std::bad_alloc();
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  return p;
}

std::string str(const char* s) { return s ? std::string(s) : std::string(); }

// DLTensor -> TensorRef; messages name the argument. An absent optional
// tensor (NULL) is an empty TensorRef.
Status to_tensor(const DLTensor* t, const char* name, bool optional, dispatch::TensorRef* out) noexcept {
  if (t == nullptr) {
    if (optional) {
      *out = dispatch::TensorRef{};
      return Status();
    }
    return dispatch::make_status(StatusCode::invalid_argument, std::string(name) + " is NULL");
  }
  auto r = dispatch::from_dlpack(t);
  if (!r.ok()) return dispatch::make_status(r.status().code(), std::string(name) + ": " + r.status().message());
  *out = *r;
  return Status();
}

Status string_array(const char* const* a, size_t n, const char* name, std::vector<std::string>* out) {
  if (n > 0 && a == nullptr)
    return dispatch::make_status(StatusCode::invalid_argument,
                                 std::string("options.") + name + " is NULL with a count of " + std::to_string(n));
  for (size_t i = 0; i < n; ++i) {
    if (a[i] == nullptr)
      return dispatch::make_status(StatusCode::invalid_argument,
                                   std::string("options.") + name + "[" + std::to_string(i) + "] is NULL");
    out->emplace_back(a[i]);
  }
  return Status();
}

Status to_options(const kdispatch_options* o, dispatch::RuntimeOptions* out) {
  dispatch::RuntimeOptions r;
  if (o == nullptr) {
    *out = std::move(r);
    return Status();
  }
  // The size before tune_routing was appended is still known (its default).
  constexpr uint32_t kV1 = offsetof(kdispatch_options, tune_routing);
  if (o->struct_size != sizeof(kdispatch_options) && o->struct_size != kV1)
    return dispatch::make_status(StatusCode::invalid_argument, "options.struct_size is " +
                                                                   std::to_string(o->struct_size) + ", expected " +
                                                                   std::to_string(sizeof(kdispatch_options)) +
                                                                   " (fill the struct with kdispatch_options_init)");
  if (o->struct_size == sizeof(kdispatch_options)) r.tune.routing = str(o->tune_routing);
  if (auto s = string_array(o->config_dirs, o->config_dirs_count, "config_dirs", &r.config_dirs); !s.ok()) return s;
  r.load_shipped_configs = o->load_shipped_configs != 0;
  r.shipped_configs_dir = str(o->shipped_configs_dir);
  r.backend_version = str(o->backend_version);
  {
    std::vector<std::string> from, to;
    if (auto s = string_array(o->alias_from, o->aliases_count, "alias_from", &from); !s.ok()) return s;
    if (auto s = string_array(o->alias_to, o->aliases_count, "alias_to", &to); !s.ok()) return s;
    for (size_t i = 0; i < from.size(); ++i) r.device_aliases.push_back({from[i], to[i]});
  }
  r.bounded_nearest = o->bounded_nearest != 0;
  r.bound_ratio = o->bound_ratio;
  if (o->log_level < KDISPATCH_LOG_OFF || o->log_level > KDISPATCH_LOG_DEBUG)
    return dispatch::make_status(StatusCode::invalid_argument,
                                 "options.log_level " + std::to_string(o->log_level) + " is not 0..4 (off..debug)");
  r.log_level = static_cast<dispatch::LogLevel>(o->log_level);
  r.watch = o->watch != 0;
  if (auto s = string_array(o->force, o->force_count, "force", &r.force); !s.ok()) return s;
  r.deterministic = o->deterministic != 0;
  if (o->tune_mode < KDISPATCH_TUNE_OFF || o->tune_mode > KDISPATCH_TUNE_BACKGROUND)
    return dispatch::make_status(StatusCode::invalid_argument, "options.tune_mode " + std::to_string(o->tune_mode) +
                                                                   " is not 0, 1 or 2 (off, sync, background)");
  r.tune.mode = static_cast<dispatch::TuneMode>(o->tune_mode);
  r.tune.cache_dir = str(o->cache_dir);
  r.tune.persist = o->tune_persist != 0;
  r.tune.load_cache = o->tune_load_cache != 0;
  r.tune.memory_budget_bytes = o->tune_memory_budget_bytes;
  r.tune.time_budget_ms = o->tune_time_budget_ms;
  r.tune.duty_cycle = o->tune_duty_cycle;
  r.tune.reps = o->tune_reps;
  r.tune.max_candidates = o->tune_max_candidates;
  r.tune.queue_capacity = o->tune_queue_capacity;
  r.tune.validate = o->tune_validate != 0;
  r.tune.cold_cache = o->tune_cold_cache != 0;
  r.tune.claim_shapes = o->tune_claim_shapes != 0;
  if (!(r.tune.time_budget_ms > 0))
    return dispatch::make_status(StatusCode::invalid_argument, "options.tune_time_budget_ms must be > 0");
  if (r.tune.max_candidates < 1 || r.tune.queue_capacity < 1 || r.tune.memory_budget_bytes < 0)
    return dispatch::make_status(StatusCode::invalid_argument,
                                 "options.tune_max_candidates and tune_queue_capacity must be >= 1, "
                                 "tune_memory_budget_bytes >= 0");
  *out = std::move(r);
  return Status();
}

kdispatch_status make_handle(dispatch::Result<std::unique_ptr<dispatch::Runtime>> r, kdispatch_runtime** out) {
  if (!r.ok()) return finish(r.status());
  auto h = std::make_unique<kdispatch_runtime>();
  h->owned = std::move(r.value());
  h->rt = h->owned.get();
  *out = h.release();
  return ok();
}

constexpr uint32_t kInfoSizeBeforeKSource = offsetof(kdispatch_dispatch_info, k_source);

Status to_info(kdispatch_dispatch_info* info, dispatch::DispatchInfo* di, dispatch::CallOptions* co) noexcept {
  if (info == nullptr) return Status();
  // The struct's size now, or before k_source was added (not written then).
  if (info->struct_size != sizeof(kdispatch_dispatch_info) && info->struct_size != kInfoSizeBeforeKSource)
    return dispatch::make_status(StatusCode::invalid_argument, "info->struct_size is " +
                                                                   std::to_string(info->struct_size) + ", expected " +
                                                                   std::to_string(sizeof(kdispatch_dispatch_info)));
  co->info = di;
  return Status();
}

void from_info(const dispatch::DispatchInfo& di, kdispatch_dispatch_info* info) noexcept {
  if (info == nullptr) return;
  info->source = static_cast<int32_t>(di.source);
  info->variant = di.variant ? di.variant : "";
  info->table_m = di.table_m;
  info->source_id = di.source_id;
  info->tuned_now = di.tuned_now ? 1 : 0;
  if (info->struct_size == sizeof(kdispatch_dispatch_info)) info->k_source = di.k_source ? di.k_source : "";
}

// DLTensors in argument order -> TensorRefs, by the op's row of op_list():
// NULL is an absent optional argument, else an error naming the argument; a
// non-NULL optional DLTensor without data is an error for a call (it
// describes the argument for pretune).
Status tensors_of(const dispatch::OpInfo& op, const DLTensor* const* t, int32_t n, bool pretune,
                  std::vector<dispatch::TensorRef>* out) {
  if (n != static_cast<int32_t>(op.args.size()))
    return dispatch::make_status(
        StatusCode::invalid_argument,
        std::string(op.name) + " takes " + std::to_string(op.args.size()) + " tensors, got " + std::to_string(n));
  if (n > 0 && t == nullptr)
    return dispatch::make_status(StatusCode::invalid_argument,
                                 "tensors is NULL (" + std::string(op.name) + " takes " + std::to_string(n) + ")");
  out->resize(op.args.size());
  for (size_t i = 0; i < op.args.size(); ++i) {
    const std::string name(op.args[i].name);
    if (auto s = to_tensor(t[i], name.c_str(), op.args[i].optional, &(*out)[i]); !s.ok()) return s;
    if (!pretune && op.args[i].optional && t[i] != nullptr && (*out)[i].data == nullptr)
      return dispatch::make_status(StatusCode::invalid_argument,
                                   name + ": data is NULL (pass a NULL DLTensor* for no " + name + ")");
  }
  return Status();
}

// The op's scalars: n of them, all, or all but the trailing switches (off:
// what a caller wrote before the op had them). KDISPATCH_CALL_FAST_ACCUM in
// `flags` turns the op's fast_accum switch on (an op without one refuses it).
Status scalars_of(const dispatch::OpInfo& op, const float* s, int32_t n, uint32_t flags, std::vector<float>* out) {
  size_t need = op.scalars.size();
  while (need > 0 && op.scalars[need - 1].kind == "bool") --need;
  if (n < static_cast<int32_t>(need) || n > static_cast<int32_t>(op.scalars.size()))
    return dispatch::make_status(StatusCode::invalid_argument,
                                 std::string(op.name) + " takes " +
                                     (need == op.scalars.size() ? "" : std::to_string(need) + " to ") +
                                     std::to_string(op.scalars.size()) + " scalars, got " + std::to_string(n));
  if (n > 0 && s == nullptr)
    return dispatch::make_status(StatusCode::invalid_argument,
                                 "scalars is NULL (" + std::string(op.name) + " takes " + std::to_string(n) + ")");
  out->assign(s, s + n);
  for (size_t j = out->size(); j < op.scalars.size(); ++j) out->push_back(op.scalars[j].default_value);
  if ((flags & KDISPATCH_CALL_FAST_ACCUM) != 0) {
    size_t j = 0;
    while (j < op.scalars.size() && !(op.scalars[j].kind == "bool" && op.scalars[j].name == "fast_accum")) ++j;
    if (j == op.scalars.size())
      return dispatch::make_status(StatusCode::invalid_argument,
                                   "flags: KDISPATCH_CALL_FAST_ACCUM is for ops with a fast_accum switch (the fp8 "
                                   "GEMMs), " +
                                       std::string(op.name) + " has none");
    (*out)[j] = 1.f;
  }
  return Status();
}

const dispatch::OpInfo* op_named(std::string_view name) noexcept {
  for (const dispatch::OpInfo& o : dispatch::op_list())
    if (o.name == name) return &o;
  return nullptr;
}

// Every op call of the C ABI: translate, call dispatch::call_op, translate back.
kdispatch_status call_by_slots(const char* fn, kdispatch_runtime* rt, std::string_view op, const DLTensor* const* t,
                               int32_t nt, const float* sc, int32_t ns, void* workspace, int64_t workspace_bytes,
                               void* stream, uint32_t flags, kdispatch_dispatch_info* info) {
  return on_runtime(fn, rt, [&](dispatch::Runtime& r) -> kdispatch_status {
    const dispatch::OpInfo* o = op_named(op);
    if (o == nullptr)
      return fail(KDISPATCH_INVALID_ARGUMENT, std::string(fn) + ": unknown op '" + std::string(op) + "'");
    if ((flags & ~kKnownCallFlags) != 0) [[unlikely]]
      return unknown_flags(flags);
    if (workspace_bytes < 0 || (workspace == nullptr && workspace_bytes != 0))
      return fail(KDISPATCH_INVALID_ARGUMENT, "workspace_bytes: must be >= 0, and 0 when workspace is NULL (got " +
                                                  std::to_string(workspace_bytes) + ")");
    std::vector<dispatch::TensorRef> tensors;
    std::vector<float> scalars;
    if (auto s = tensors_of(*o, t, nt, false, &tensors); !s.ok()) return finish(s);
    if (auto s = scalars_of(*o, sc, ns, flags, &scalars); !s.ok()) return finish(s);
    dispatch::DispatchInfo di;
    dispatch::CallOptions co;
    co.capturing = (flags & KDISPATCH_CALL_CAPTURING) != 0;
    co.workspace = workspace;
    co.workspace_bytes = workspace ? workspace_bytes : 0;
    if (auto s = to_info(info, &di, &co); !s.ok()) return finish(s);
    const Status s = dispatch::call_op(r, op, tensors, scalars, dispatch::Stream{stream}, co);
    if (s.ok()) from_info(di, info);
    return finish(s);
  });
}

Status to_query(const kdispatch_lookup_query* q, dispatch::LookupQuery* out) {
  if (q->struct_size != sizeof(kdispatch_lookup_query))
    return dispatch::make_status(StatusCode::invalid_argument,
                                 "q->struct_size is " + std::to_string(q->struct_size) + ", expected " +
                                     std::to_string(sizeof(kdispatch_lookup_query)) +
                                     " (fill the struct with kdispatch_lookup_query_init)");
  if (q->key == nullptr) return dispatch::make_status(StatusCode::invalid_argument, "q->key is NULL");
  out->op = str(q->op);
  out->key = q->key;
  out->device = str(q->device);
  out->arch = str(q->arch);
  out->compute_units = q->compute_units;
  out->memory_bytes = q->memory_bytes;
  out->backend = str(q->backend);
  out->M = q->M;
  out->down = q->down != 0;
  return Status();
}

std::string pretune_json(const dispatch::PretuneResult& r) {
  dispatch::core::JsonWriter w;
  w.begin_object().field("key", r.key).field("M", r.m).key("config").json(dispatch::config_to_json(r.config));
  w.field("variant", r.variant).field("best_us", r.best_us).field("default_us", r.default_us);
  w.field("candidates", static_cast<int64_t>(r.candidates)).field("rejected", static_cast<int64_t>(r.rejected));
  w.field("failed", static_cast<int64_t>(r.failed)).field("persisted", r.persisted).end_object();
  return w.take();
}

// Every pretune of the C ABI.
kdispatch_status pretune_by_slots(const char* fn, kdispatch_runtime* rt, std::string_view op, const DLTensor* const* t,
                                  int32_t nt, const float* sc, int32_t ns, char** json_out) {
  if (json_out == nullptr) return null_arg(fn, "json_out");
  *json_out = nullptr;
  return on_runtime(fn, rt, [&](dispatch::Runtime& r) -> kdispatch_status {
    const dispatch::OpInfo* o = op_named(op);
    if (o == nullptr)
      return fail(KDISPATCH_INVALID_ARGUMENT, std::string(fn) + ": unknown op '" + std::string(op) + "'");
    std::vector<dispatch::TensorRef> tensors;
    std::vector<float> scalars;
    if (auto s = tensors_of(*o, t, nt, true, &tensors); !s.ok()) return finish(s);
    if (auto s = scalars_of(*o, sc, ns, 0, &scalars); !s.ok()) return finish(s);
    auto res = dispatch::pretune_op(r, op, tensors, scalars);
    if (!res.ok()) return finish(res.status());
    *json_out = dup(pretune_json(*res));
    return ok();
  });
}

// The op list as JSON: [{"name", "doc", "args": [{"name", "read", "written", "rank",
// "optional", "rows", "cols", "alias_of", "dtype", "col_major_ok"}], "scalars": [{"name", "default", "kind"}],
// "key_fields": [{"name", "kind", "csv_name"}], "m_name", "workspace", "in_dtypes"}]. rows/cols: {"dim", "mul", "div"}
// ("dim" "" for rank 1 rows); a rank-1 argument whose size is a formula (moe_align's
// sorted ids) also has "computed": true, "at_least", and the formula as cols' "dim".
std::string op_list_json() {
  dispatch::core::JsonWriter w;
  auto extent = [&](const char* key, std::string_view dim, int32_t mul, int32_t div) {
    w.key(key).begin_object().field("dim", dim).field("mul", static_cast<int64_t>(mul));
    w.field("div", static_cast<int64_t>(div)).end_object();
  };
  w.begin_array();
  for (const dispatch::OpInfo& o : dispatch::op_list()) {
    w.begin_object().field("name", o.name).field("doc", o.doc).key("args").begin_array();
    for (const dispatch::OpArgInfo& a : o.args) {
      w.begin_object().field("name", a.name).field("read", a.read).field("written", a.written);
      w.field("rank", static_cast<int64_t>(a.rank)).field("optional", a.optional);
      if (a.rank == 3) extent("batch", a.batch_dim, a.batch_mul, a.batch_div);
      extent("rows", a.rows_dim, a.rows_mul, a.rows_div);
      extent("cols", a.cols_dim, a.cols_mul, a.cols_div);
      w.field("alias_of", static_cast<int64_t>(a.alias_of)).field("dtype", a.dtype);
      w.field("col_major_ok", a.col_major_ok);
      if (a.cols_computed) w.field("computed", true).field("at_least", a.at_least);
      w.end_object();
    }
    w.end_array().key("scalars").begin_array();
    for (const dispatch::OpScalarInfo& x : o.scalars) {
      w.begin_object()
          .field("name", x.name)
          .field("default", static_cast<double>(x.default_value))
          .field("kind", x.kind);
      if (x.kind == "int") w.field("dim", x.dim);
      if (x.kind == "choice") {
        w.key("labels").begin_array();
        for (std::string_view l : x.labels) w.value(l);
        w.end_array();
      }
      w.end_object();
    }
    w.end_array().key("key_fields").begin_array();
    for (const dispatch::OpKeyFieldInfo& f : o.key_fields) {
      w.begin_object().field("name", f.name).field("kind", f.kind).field("csv_name", f.csv_name);
      w.field("file_pos", static_cast<int64_t>(f.file_pos)).end_object();
    }
    w.end_array().field("m_name", o.m_name).field("workspace", o.uses_workspace).key("in_dtypes").begin_array();
    for (std::string_view t : o.in_dtypes) w.value(t);
    w.end_array().field("default_out_dtype", o.default_out_dtype).end_object();
  }
  w.end_array();
  return w.take();
}

constexpr double kDefaultCloseTimeoutS = 10.0;

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

// kdispatch_runtime_close's body (the handle is non-null and owned).
kdispatch_status close_handle(const char* fn, kdispatch_runtime* h, double timeout_s) {
  const std::lock_guard<std::mutex> lock(h->close_mu);
  if (h->destroyed) return ok();
  // seq_cst: the flag is ordered before the slot reads below in the single
  // total order, against each call's slot store and flag read (in_flight.hpp).
  h->gate.closed.store(true, std::memory_order_seq_cst);
  const int64_t left = dispatch::capi::wait_calls_done(h, h->gate, timeout_s);
  if (left > 0)
    return fail(KDISPATCH_FAILED_PRECONDITION,
                std::string(fn) + ": " + std::to_string(left) + (left == 1 ? " call is" : " calls are") +
                    " still in flight on this runtime after " + seconds_text(timeout_s) +
                    " s; the runtime is left alive and closed to new calls (close again to wait again)");
  h->owned.reset();  // joins the runtime's own threads (tuner, watcher)
  h->rt = nullptr;
  h->destroyed = true;
  return ok();
}

}  // namespace

extern "C" {

const char* kdispatch_status_name(kdispatch_status code) {
  if (code < KDISPATCH_OK || code > KDISPATCH_FAILED_PRECONDITION) return "unknown";
  return dispatch::status_code_name(static_cast<StatusCode>(code)).data();
}

const char* kdispatch_last_error_message(void) { return t_last_error.c_str(); }

int32_t kdispatch_abi_version(void) { return KDISPATCH_ABI_VERSION; }

const char* kdispatch_version(void) { return dispatch::version(); }

void kdispatch_free(void* p) { std::free(p); }

// Every field of the current struct, at its default.
namespace {
void fill_default_options(kdispatch_options* o) {
  std::memset(o, 0, sizeof *o);
  const dispatch::RuntimeOptions d;
  o->struct_size = sizeof *o;
  o->load_shipped_configs = d.load_shipped_configs ? 1 : 0;
  o->bounded_nearest = d.bounded_nearest ? 1 : 0;
  o->bound_ratio = d.bound_ratio;
  o->log_level = static_cast<int32_t>(d.log_level);
  o->watch = d.watch ? 1 : 0;
  o->deterministic = d.deterministic ? 1 : 0;
  o->tune_mode = static_cast<int32_t>(d.tune.mode);
  o->tune_persist = d.tune.persist ? 1 : 0;
  o->tune_load_cache = d.tune.load_cache ? 1 : 0;
  o->tune_memory_budget_bytes = d.tune.memory_budget_bytes;
  o->tune_time_budget_ms = d.tune.time_budget_ms;
  o->tune_duty_cycle = d.tune.duty_cycle;
  o->tune_reps = d.tune.reps;
  o->tune_max_candidates = d.tune.max_candidates;
  o->tune_queue_capacity = d.tune.queue_capacity;
  o->tune_validate = d.tune.validate ? 1 : 0;
  o->tune_cold_cache = d.tune.cold_cache ? 1 : 0;
  o->tune_claim_shapes = d.tune.claim_shapes ? 1 : 0;
}
}  // namespace

void kdispatch_options_init_sized(kdispatch_options* o, size_t size) {
  if (o == nullptr) return;
  // The defaults in a full struct, then as many bytes as the caller's holds.
  kdispatch_options f;
  fill_default_options(&f);
  const size_t n = size < sizeof f ? size : sizeof f;
  std::memcpy(o, &f, n);
  if (n >= sizeof o->struct_size) o->struct_size = static_cast<uint32_t>(size);
}

// The symbol of callers built before tune_routing: their struct ends there.
void(kdispatch_options_init)(kdispatch_options* o) {
  kdispatch_options_init_sized(o, offsetof(kdispatch_options, tune_routing));
}

void kdispatch_lookup_query_init(kdispatch_lookup_query* q) {
  if (q == nullptr) return;
  std::memset(q, 0, sizeof *q);
  q->struct_size = sizeof *q;
  q->M = 1;
}

// ------------------------------------------------------------------ runtime

kdispatch_status kdispatch_runtime_create(const kdispatch_options* options, kdispatch_runtime** out) {
  return guarded("kdispatch_runtime_create", [&]() -> kdispatch_status {
    if (out == nullptr) return null_arg("kdispatch_runtime_create", "out");
    *out = nullptr;
    dispatch::RuntimeOptions o;
    if (auto s = to_options(options, &o); !s.ok()) return finish(s);
    return make_handle(dispatch::Runtime::create(std::move(o)), out);
  });
}

kdispatch_status kdispatch_runtime_create_from_env(const kdispatch_options* base, kdispatch_runtime** out) {
  return guarded("kdispatch_runtime_create_from_env", [&]() -> kdispatch_status {
    if (out == nullptr) return null_arg("kdispatch_runtime_create_from_env", "out");
    *out = nullptr;
    dispatch::RuntimeOptions o;
    if (auto s = to_options(base, &o); !s.ok()) return finish(s);
    auto env = dispatch::options_from_env(std::move(o));
    if (!env.ok()) return finish(env.status());
    return make_handle(dispatch::Runtime::create(std::move(env.value())), out);
  });
}

kdispatch_status kdispatch_default_runtime(kdispatch_runtime** out) {
  return guarded("kdispatch_default_runtime", [&]() -> kdispatch_status {
    if (out == nullptr) return null_arg("kdispatch_default_runtime", "out");
    *out = nullptr;
    auto r = dispatch::default_runtime();
    if (!r.ok()) return finish(r.status());
    // One borrowed handle per process, never freed (as the runtime itself).
    static kdispatch_runtime* handle = [&] {
      auto* h = new kdispatch_runtime();
      h->rt = r.value();
      h->is_default = true;
      return h;
    }();
    *out = handle;
    return ok();
  });
}

kdispatch_status kdispatch_runtime_close(kdispatch_runtime* rt, double timeout_s) {
  return guarded("kdispatch_runtime_close", [&]() -> kdispatch_status {
    if (rt == nullptr) return null_arg("kdispatch_runtime_close", "rt");
    if (std::isnan(timeout_s)) return fail(KDISPATCH_INVALID_ARGUMENT, "kdispatch_runtime_close: timeout_s is NaN");
    if (rt->is_default)
      return fail(KDISPATCH_FAILED_PRECONDITION,
                  "kdispatch_runtime_close: the default runtime lives until exit and cannot be closed");
    return close_handle("kdispatch_runtime_close", rt, timeout_s < 0 ? kDefaultCloseTimeoutS : timeout_s);
  });
}

kdispatch_status kdispatch_runtime_destroy(kdispatch_runtime* rt) {
  return guarded("kdispatch_runtime_destroy", [&]() -> kdispatch_status {
    if (rt == nullptr) return ok();
    if (rt->is_default)
      return fail(KDISPATCH_FAILED_PRECONDITION,
                  "kdispatch_runtime_destroy: the default runtime lives until exit and cannot be destroyed");
    if (kdispatch_status s = close_handle("kdispatch_runtime_destroy", rt, kDefaultCloseTimeoutS); s != KDISPATCH_OK)
      return s;  // calls still in flight: nothing freed
    delete rt;
    return ok();
  });
}

void kdispatch_park_calls_at_exit(void) { (void)dispatch::capi::park_calls_at_exit(2.0); }

kdispatch_status kdispatch_runtime_reload(kdispatch_runtime* rt) {
  return guarded("kdispatch_runtime_reload", [&]() -> kdispatch_status {
    return on_runtime("kdispatch_runtime_reload", rt, [&](dispatch::Runtime& r) { return finish(r.reload()); });
  });
}

kdispatch_status kdispatch_runtime_attach_stream(kdispatch_runtime* rt, int32_t device_type, int32_t ordinal,
                                                 void* stream, int64_t workspace_bytes) {
  return guarded("kdispatch_runtime_attach_stream", [&]() -> kdispatch_status {
    return on_runtime("kdispatch_runtime_attach_stream", rt, [&](dispatch::Runtime& r) -> kdispatch_status {
      dispatch::Device dev;
      switch (device_type) {
        case kDLCUDA: dev.type = dispatch::DeviceType::cuda; break;
        case kDLROCM: dev.type = dispatch::DeviceType::hip; break;
        default:
          return fail(KDISPATCH_INVALID_ARGUMENT,
                      "device_type: " + std::to_string(device_type) + " is not a GPU (kDLCUDA = 2 or kDLROCM = 10)");
      }
      dev.ordinal = ordinal;
      return finish(r.attach_stream(dev, dispatch::Stream{stream}, workspace_bytes));
    });
  });
}

kdispatch_status kdispatch_runtime_freeze(kdispatch_runtime* rt, int32_t frozen) {
  return guarded("kdispatch_runtime_freeze", [&]() -> kdispatch_status {
    return on_runtime("kdispatch_runtime_freeze", rt, [&](dispatch::Runtime& r) {
      r.freeze(frozen != 0);
      return ok();
    });
  });
}

kdispatch_status kdispatch_runtime_frozen(const kdispatch_runtime* rt, int32_t* out) {
  return guarded("kdispatch_runtime_frozen", [&]() -> kdispatch_status {
    if (rt == nullptr) return null_arg("kdispatch_runtime_frozen", "rt");
    if (out == nullptr) return null_arg("kdispatch_runtime_frozen", "out");
    return on_runtime("kdispatch_runtime_frozen", rt, [&](dispatch::Runtime& r) {
      *out = r.frozen() ? 1 : 0;
      return ok();
    });
  });
}

kdispatch_status kdispatch_runtime_load_report(const kdispatch_runtime* rt, char** json_out) {
  return guarded("kdispatch_runtime_load_report", [&]() -> kdispatch_status {
    if (json_out == nullptr) return null_arg("kdispatch_runtime_load_report", "json_out");
    *json_out = nullptr;
    return on_runtime("kdispatch_runtime_load_report", rt, [&](dispatch::Runtime& r) {
      *json_out = dup(r.load_report().to_json());
      return ok();
    });
  });
}

kdispatch_status kdispatch_runtime_cache_dir(const kdispatch_runtime* rt, char** out) {
  return guarded("kdispatch_runtime_cache_dir", [&]() -> kdispatch_status {
    if (out == nullptr) return null_arg("kdispatch_runtime_cache_dir", "out");
    *out = nullptr;
    return on_runtime("kdispatch_runtime_cache_dir", rt, [&](dispatch::Runtime& r) {
      *out = dup(r.cache_dir());
      return ok();
    });
  });
}

kdispatch_status kdispatch_runtime_device_info(const kdispatch_runtime* rt, int32_t device_type, int32_t ordinal,
                                               char** json_out) {
  return guarded("kdispatch_runtime_device_info", [&]() -> kdispatch_status {
    if (json_out == nullptr) return null_arg("kdispatch_runtime_device_info", "json_out");
    *json_out = nullptr;
    return on_runtime("kdispatch_runtime_device_info", rt, [&](dispatch::Runtime& rtm) -> kdispatch_status {
      auto mapped = dispatch::device_from_dlpack(DLDevice{static_cast<DLDeviceType>(device_type), ordinal});
      if (!mapped.ok())
        return fail(KDISPATCH_UNSUPPORTED_DEVICE,
                    "DLPack device type " + std::to_string(device_type) + " has no kdispatch backend");
      dispatch::Device dev = *mapped;
      dev.ordinal = ordinal;  // as asked: a host ordinal other than 0 does not exist
      auto r = rtm.device_info(dev);
      if (!r.ok()) return finish(r.status());
      const dispatch::DeviceInfo& d = *r;
      dispatch::core::JsonWriter w;
      w.begin_object().field("device_type", static_cast<int64_t>(device_type));
      w.field("backend", dispatch::device_type_name(d.device.type))
          .field("ordinal", static_cast<int64_t>(d.device.ordinal));
      w.field("device_name", d.device_name).field("reported_name", d.reported_name).field("arch", d.arch);
      w.field("compute_units", static_cast<int64_t>(d.compute_units)).field("memory_bytes", d.memory_bytes);
      w.field("l2_bytes", d.l2_bytes).field("smem_per_block_bytes", static_cast<int64_t>(d.smem_per_block_bytes));
      w.field("warp_size", static_cast<int64_t>(d.warp_size)).field("uuid", d.uuid).field("pci_bus_id", d.pci_bus_id);
      w.field("partition", d.partition).field("available", d.available);
      w.field("unavailable_reason", d.unavailable_reason).end_object();
      *json_out = dup(w.take());
      return ok();
    });
  });
}

kdispatch_status kdispatch_runtime_tune_stats(const kdispatch_runtime* rt, kdispatch_tune_stats* out) {
  return guarded("kdispatch_runtime_tune_stats", [&]() -> kdispatch_status {
    if (rt == nullptr) return null_arg("kdispatch_runtime_tune_stats", "rt");
    if (out == nullptr) return null_arg("kdispatch_runtime_tune_stats", "out");
    // Known sizes: this header's, and the first one's (up to `frozen`).
    constexpr uint32_t kV1 = offsetof(kdispatch_tune_stats, deferred);
    if (out->struct_size != sizeof(kdispatch_tune_stats) && out->struct_size != kV1)
      return fail(KDISPATCH_INVALID_ARGUMENT, "out->struct_size is " + std::to_string(out->struct_size) +
                                                  ", expected " + std::to_string(sizeof(kdispatch_tune_stats)) +
                                                  " (or " + std::to_string(kV1) + ", an older header's)");
    return on_runtime("kdispatch_runtime_tune_stats", rt, [&](dispatch::Runtime& r) {
      const dispatch::TuneStats t = r.tune_stats();
      out->misses = t.misses;
      out->queued = t.queued;
      out->dropped = t.dropped;
      out->shapes_tuned = t.shapes_tuned;
      out->shapes_skipped = t.shapes_skipped;
      out->candidates_run = t.candidates_run;
      out->candidates_rejected = t.candidates_rejected;
      out->candidates_failed = t.candidates_failed;
      out->publishes = t.publishes;
      out->pending = t.pending;
      out->tune_seconds = t.tune_seconds;
      out->frozen = t.frozen ? 1 : 0;
      if (out->struct_size == sizeof(kdispatch_tune_stats)) {
        out->deferred = t.deferred;
        out->capture_waits = t.capture_waits;
      }
      return ok();
    });
  });
}

kdispatch_status kdispatch_runtime_wait_tuner_idle(kdispatch_runtime* rt, double timeout_s, int32_t* idle) {
  return guarded("kdispatch_runtime_wait_tuner_idle", [&]() -> kdispatch_status {
    if (rt == nullptr) return null_arg("kdispatch_runtime_wait_tuner_idle", "rt");
    if (idle == nullptr) return null_arg("kdispatch_runtime_wait_tuner_idle", "idle");
    if (!(timeout_s >= 0)) return fail(KDISPATCH_INVALID_ARGUMENT, "timeout_s must be >= 0");
    return on_runtime("kdispatch_runtime_wait_tuner_idle", rt, [&](dispatch::Runtime& r) {
      *idle = r.wait_tuner_idle(timeout_s) ? 1 : 0;
      return ok();
    });
  });
}

kdispatch_status kdispatch_runtime_export_misses(const kdispatch_runtime* rt, const char* path) {
  return guarded("kdispatch_runtime_export_misses", [&]() -> kdispatch_status {
    if (rt == nullptr) return null_arg("kdispatch_runtime_export_misses", "rt");
    if (path == nullptr || *path == '\0')
      return fail(KDISPATCH_INVALID_ARGUMENT, "kdispatch_runtime_export_misses: path is NULL or empty");
    return on_runtime("kdispatch_runtime_export_misses", rt,
                      [&](dispatch::Runtime& r) { return finish(r.export_misses(path)); });
  });
}

kdispatch_status kdispatch_runtime_source_path(const kdispatch_runtime* rt, uint32_t source_id, char** path_out,
                                               char** dir_out) {
  return guarded("kdispatch_runtime_source_path", [&]() -> kdispatch_status {
    if (path_out) *path_out = nullptr;
    if (dir_out) *dir_out = nullptr;
    if (rt == nullptr) return null_arg("kdispatch_runtime_source_path", "rt");
    if (path_out == nullptr && dir_out == nullptr)
      return fail(KDISPATCH_INVALID_ARGUMENT, "kdispatch_runtime_source_path: path_out and dir_out are both NULL");
    return on_runtime("kdispatch_runtime_source_path", rt, [&](dispatch::Runtime& r) -> kdispatch_status {
      const std::string path = r.source_path(source_id);
      const std::string dir = r.source_dir(source_id);
      if (path.empty()) return fail(KDISPATCH_NOT_FOUND, "no config source with id " + std::to_string(source_id));
      std::unique_ptr<char, decltype(&std::free)> p(path_out ? dup(path) : nullptr, &std::free);
      std::unique_ptr<char, decltype(&std::free)> d(dir_out ? dup(dir) : nullptr, &std::free);
      if (path_out) *path_out = p.release();
      if (dir_out) *dir_out = d.release();
      return ok();
    });
  });
}

// ---------------------------------------------------------------------- ops

kdispatch_status kdispatch_op_list(char** json_out) {
  return guarded("kdispatch_op_list", [&]() -> kdispatch_status {
    if (json_out == nullptr) return null_arg("kdispatch_op_list", "json_out");
    *json_out = dup(op_list_json());
    return ok();
  });
}

kdispatch_status kdispatch_op_call(kdispatch_runtime* rt, const char* op, const DLTensor* const* tensors,
                                   int32_t n_tensors, const float* scalars, int32_t n_scalars, void* workspace,
                                   int64_t workspace_bytes, void* stream, uint32_t flags,
                                   kdispatch_dispatch_info* info) {
  return guarded("kdispatch_op_call", [&]() -> kdispatch_status {
    if (op == nullptr) return null_arg("kdispatch_op_call", "op");
    return call_by_slots("kdispatch_op_call", rt, op, tensors, n_tensors, scalars, n_scalars, workspace,
                         workspace_bytes, stream, flags, info);
  });
}

kdispatch_status kdispatch_op_pretune(kdispatch_runtime* rt, const char* op, const DLTensor* const* tensors,
                                      int32_t n_tensors, const float* scalars, int32_t n_scalars, char** json_out) {
  return guarded("kdispatch_op_pretune", [&]() -> kdispatch_status {
    if (op == nullptr) return null_arg("kdispatch_op_pretune", "op");
    return pretune_by_slots("kdispatch_op_pretune", rt, op, tensors, n_tensors, scalars, n_scalars, json_out);
  });
}

kdispatch_status kdispatch_op_workspace_bytes(const char* op, const DLTensor* const* tensors, int32_t n_tensors,
                                              const float* scalars, int32_t n_scalars, int64_t* bytes_out) {
  return guarded("kdispatch_op_workspace_bytes", [&]() -> kdispatch_status {
    if (op == nullptr) return null_arg("kdispatch_op_workspace_bytes", "op");
    if (bytes_out == nullptr) return null_arg("kdispatch_op_workspace_bytes", "bytes_out");
    *bytes_out = 0;
    const dispatch::OpInfo* o = op_named(op);
    if (o == nullptr)
      return fail(KDISPATCH_INVALID_ARGUMENT, std::string("kdispatch_op_workspace_bytes: unknown op '") + op + "'");
    std::vector<dispatch::TensorRef> t;
    std::vector<float> sc;
    if (auto s = tensors_of(*o, tensors, n_tensors, true, &t); !s.ok()) return finish(s);
    if (auto s = scalars_of(*o, scalars, n_scalars, 0, &sc); !s.ok()) return finish(s);
    auto r = dispatch::workspace_bytes(op, t, sc);
    if (!r.ok()) return finish(r.status());
    *bytes_out = *r;
    return ok();
  });
}

// kdispatch_<op> and kdispatch_pretune_<op>, one pair per row of the op list
// (core/op_list.hpp): the DLTensors and floats in argument order, then the
// generic translation above. Switch scalars (KD_PP_IS_SWITCH: fast_accum)
// are no parameters (ABI 1's signatures stay as they were): the call's
// flags carry them (scalars_of), a pretune of a switched-on problem goes
// through kdispatch_op_pretune.
#define KD_C_TPARAM(x) const DLTensor *x,
#define KD_C_SPARAM_0(x) float x,
#define KD_C_SPARAM_1(x)
#define KD_C_SPARAM(x) KD_PP_CAT(KD_C_SPARAM_, KD_PP_IS_SWITCH(x))(x)
#define KD_C_SNAME_0(x) x,
#define KD_C_SNAME_1(x)
#define KD_C_SNAME(x) KD_PP_CAT(KD_C_SNAME_, KD_PP_IS_SWITCH(x))(x)
#define KD_C_NAME(x) x,
#define KD_C_OP(op, Args, tensors, scalars)                                                                            \
  kdispatch_status kdispatch_##op(kdispatch_runtime* rt,                                                               \
                                  KD_PP_FOR_EACH(KD_C_TPARAM, KD_PP_NOTHING, tensors)                                  \
                                      KD_PP_FOR_EACH(KD_C_SPARAM, KD_PP_NOTHING, scalars) void* stream,                \
                                  uint32_t flags, kdispatch_dispatch_info* info) {                                     \
    const DLTensor* t[] = {KD_PP_FOR_EACH(KD_C_NAME, KD_PP_NOTHING, tensors)};                                         \
    const float s[] = {KD_PP_FOR_EACH(KD_C_SNAME, KD_PP_NOTHING, scalars) 0.f};                                        \
    constexpr int32_t ns = static_cast<int32_t>(sizeof s / sizeof s[0]) - 1;                                           \
    return guarded("kdispatch_" #op, [&]() -> kdispatch_status {                                                       \
      return call_by_slots("kdispatch_" #op, rt, #op, t, KD_PP_SIZE(tensors), s, ns, nullptr, 0, stream, flags, info); \
    });                                                                                                                \
  }                                                                                                                    \
  kdispatch_status kdispatch_pretune_##op(kdispatch_runtime* rt,                                                       \
                                          KD_PP_FOR_EACH(KD_C_TPARAM, KD_PP_NOTHING, tensors)                          \
                                              KD_PP_FOR_EACH(KD_C_SPARAM, KD_PP_NOTHING, scalars) char** json_out) {   \
    const DLTensor* t[] = {KD_PP_FOR_EACH(KD_C_NAME, KD_PP_NOTHING, tensors)};                                         \
    const float s[] = {KD_PP_FOR_EACH(KD_C_SNAME, KD_PP_NOTHING, scalars) 0.f};                                        \
    constexpr int32_t ns = static_cast<int32_t>(sizeof s / sizeof s[0]) - 1;                                           \
    return guarded("kdispatch_pretune_" #op, [&]() -> kdispatch_status {                                               \
      return pretune_by_slots("kdispatch_pretune_" #op, rt, #op, t, KD_PP_SIZE(tensors), s, ns, json_out);             \
    });                                                                                                                \
  }
KDISPATCH_OP_LIST(KD_C_OP)
#undef KD_C_OP
#undef KD_C_NAME
#undef KD_C_SNAME
#undef KD_C_SNAME_1
#undef KD_C_SNAME_0
#undef KD_C_SPARAM
#undef KD_C_SPARAM_1
#undef KD_C_SPARAM_0
#undef KD_C_TPARAM

// kdispatch_gemm with a workspace for this call.
kdispatch_status kdispatch_gemm_ws(kdispatch_runtime* rt, const DLTensor* a, const DLTensor* b, const DLTensor* d,
                                   const DLTensor* bias, void* workspace, int64_t workspace_bytes, void* stream,
                                   uint32_t flags, kdispatch_dispatch_info* info) {
  const DLTensor* t[] = {a, b, d, bias};
  return guarded("kdispatch_gemm", [&]() -> kdispatch_status {
    return call_by_slots("kdispatch_gemm", rt, "gemm", t, 4, nullptr, 0, workspace, workspace_bytes, stream, flags,
                         info);
  });
}

// ------------------------------------------------------------------- lookup

kdispatch_status kdispatch_lookup(const kdispatch_runtime* rt, const kdispatch_lookup_query* q, char** json_out) {
  return guarded("kdispatch_lookup", [&]() -> kdispatch_status {
    if (json_out == nullptr) return null_arg("kdispatch_lookup", "json_out");
    *json_out = nullptr;
    if (rt == nullptr) return null_arg("kdispatch_lookup", "rt");
    if (q == nullptr) return null_arg("kdispatch_lookup", "q");
    dispatch::LookupQuery query;
    if (auto s = to_query(q, &query); !s.ok()) return finish(s);
    return on_runtime("kdispatch_lookup", rt, [&](dispatch::Runtime& rtm) -> kdispatch_status {
      auto r = dispatch::lookup(rtm, query);
      if (!r.ok()) return finish(r.status());
      std::string s = dispatch::lookup_result_to_json(*r);
      // + the config dir of the source, which the C++ JSON leaves out.
      s.pop_back();
      dispatch::core::JsonWriter w;
      w.begin_object().field("source_dir", r->source_dir).end_object();
      const std::string dir = w.take();  // {"source_dir": ...}
      *json_out = dup(s + ", " + dir.substr(1));
      return ok();
    });
  });
}

kdispatch_status kdispatch_lookup_table(const kdispatch_runtime* rt, const kdispatch_lookup_query* q, char** json_out) {
  return guarded("kdispatch_lookup_table", [&]() -> kdispatch_status {
    if (json_out == nullptr) return null_arg("kdispatch_lookup_table", "json_out");
    *json_out = nullptr;
    if (rt == nullptr) return null_arg("kdispatch_lookup_table", "rt");
    if (q == nullptr) return null_arg("kdispatch_lookup_table", "q");
    dispatch::LookupQuery query;
    if (auto s = to_query(q, &query); !s.ok()) return finish(s);
    return on_runtime("kdispatch_lookup_table", rt, [&](dispatch::Runtime& rtm) -> kdispatch_status {
      auto t = dispatch::lookup_table(rtm, query);
      if (!t.ok()) return finish(t.status());
      dispatch::core::JsonWriter w;
      w.begin_object().field("key", t->key).key("rows").begin_object();
      for (const auto& row : t->rows) w.key(std::to_string(row.m)).json(dispatch::config_to_json(row.config));
      w.end_object().key("sources").begin_object();
      for (const auto& row : t->rows) w.field(std::to_string(row.m), row.source);
      w.end_object().key("source_dirs").begin_object();
      for (const auto& row : t->rows) w.field(std::to_string(row.m), row.source_dir);
      w.end_object().end_object();
      const std::string s = w.take();
      *json_out = dup(s);
      return ok();
    });
  });
}

}  // extern "C"
