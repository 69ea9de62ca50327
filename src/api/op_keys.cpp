// SPDX-License-Identifier: Apache-2.0
// The op calls from a key or that tune, off the call path (api/ops.cpp):
// describe_key, pretune_key and time_configs (an op's key fields at an M),
// pretune (one per row of core/op_list.hpp, and by name: pretune_op) and
// the search they share (pretune_problem). api/ops_impl.hpp says how the
// op files divide.
#include <algorithm>
#include <string>
#include <vector>

#include "api/ops_impl.hpp"
#include "api/runtime_impl.hpp"
#include "api/validate.hpp"
#include "backends/registry.hpp"
#include "core/op_spec.hpp"
#include "dispatch/ops.hpp"
#include "store/filename.hpp"
#include "store/fingerprint.hpp"
#include "table/key.hpp"
#include "tune/tuner.hpp"

namespace dispatch {
namespace {

Result<PretuneResult> pretune_problem(Runtime& rt, const core::Problem& p, const core::LaunchArgs& la) noexcept {
  try {
    Runtime::Impl& impl = rt.impl();
    const DeviceInfo* dev = nullptr;
    if (Status s = api::refuse_as_the_op(impl, p, &dev); !s.ok()) return s;
    if (impl.forked_child()) return impl.refuse_in_child("pretune");
    if (impl.frozen.load(std::memory_order_acquire))
      return make_status(StatusCode::failed_precondition, "runtime is frozen: no tuning");
    tune::MissEvent ev;
    ev.problem = p;
    std::copy(std::begin(la.ld), std::end(la.ld), std::begin(ev.ld));
    const std::string key = tune::Tuner::key_of(p, *dev);
    auto r = impl.tuner->tune_on_scratch(ev, *dev, key);
    if (!r.ok()) return r.status();
    PretuneResult out;
    out.key = key;
    out.m = p.m;
    out.config = core::plan_to_config(r->plan);
    out.variant = std::string(r->plan.variant->name);
    out.best_us = r->search.best_us;
    out.default_us = r->search.default_us;
    out.candidates = static_cast<int32_t>(r->search.tried.size());
    out.rejected = r->search.rejected;
    out.failed = r->search.failed;
    out.persisted = r->persisted;
    out.margin = impl.options.tune.margin;
    out.aa_spread = r->search.confirmed ? r->search.aa_spread : 0.0;
    out.timing = r->search.timing;
    out.why = r->search.why;
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "pretune");
  }
}

// "<first dim-binding slot>: <its M name> is 0, nothing to tune".
[[gnu::cold]] Status nothing_to_tune(const core::OpSpec& s) {
  const auto& first = s.slots[static_cast<size_t>(s.order[0])];
  return make_status(StatusCode::invalid_argument, std::string(first.name) + ": " +
                                                       std::string(s.dim_names[static_cast<int>(core::Dim::m)]) +
                                                       " is 0, nothing to tune");
}

// The Problem of an own op's key fields at batch size m (m >= 1).
Result<core::Problem> key_problem(std::string_view op, std::string_view key_fields, int64_t m) {
  const core::OpSpec* s = api::spec_named(op);
  if (s == nullptr) return make_status(StatusCode::invalid_argument, "unknown op '" + std::string(op) + "'");
  if (m < 1 || m > core::kMaxDim)
    return make_status(StatusCode::invalid_argument, "M must be in [1, 2^40], got " + std::to_string(m));
  auto fields = store::parse_key_fields(key_fields);
  if (!fields.ok()) return fields.status();
  auto p = store::own_problem_from_fields(s->op, *fields);
  if (!p.ok()) return p.status();
  p->m = m;
  return p;
}

}  // namespace

Result<KeyProblem> describe_key(std::string_view op, std::string_view key_fields, int64_t m) noexcept {
  try {
    auto p = key_problem(op, key_fields, m);
    if (!p.ok()) return p.status();
    const core::OpSpec& s = core::spec_of(p->op);
    KeyProblem out;
    table::KeyBuffer kb;
    table::append_own_fields(*p, &kb);
    out.key_fields = store::file_order_fields(p->op, kb.view(), "");  // file-name order, no device name
    out.flops = s.flops ? s.flops(*p) : 0.0;
    for (int i = 0; i < s.slot_count(); ++i) {
      const core::SlotExtent e = core::slot_extent(s, i, *p);
      int64_t b = 0;  // saturates: dims up to 2^40 can multiply past int64; a computed extent is -1 past 2^40
      if (e.present && (e.rows < 0 || e.cols < 0 || __builtin_mul_overflow(e.rows, e.cols, &b) ||
                        __builtin_mul_overflow(b, static_cast<int64_t>(dtype_size(e.dtype)), &b) ||
                        __builtin_add_overflow(out.bytes, b, &out.bytes)))
        out.bytes = INT64_MAX;
    }
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "describe_key");
  }
}

Result<int64_t> workspace_bytes(std::string_view op, std::string_view key_fields, int64_t max_m,
                                DeviceType backend) noexcept {
  try {
    auto p = key_problem(op, key_fields, max_m);
    if (!p.ok()) return p.status();
    p->device = Device{backend, 0};
    return core::max_workspace_bytes(*p);
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "workspace_bytes");
  }
}

// The workspace of one call: its tensors validated as the op validates them
// (data may be absent), then the most any of the backend's variants asks.
Result<int64_t> workspace_bytes(std::string_view op, std::span<const TensorRef> tensors,
                                std::span<const float> scalars) noexcept {
  try {
    const core::OpSpec* s = nullptr;
    float full[core::kMaxScalars] = {};
    if (Status st = api::named_op_args(op, tensors.size(), scalars, &s, full); !st.ok()) return st;
    core::Problem p;
    core::LaunchArgs la;
    bool empty = false;
    Status st = make_status(StatusCode::internal, "workspace_bytes: op without a validator");
    switch (s->op) {
#define KD_WS_OF_CALL(op, Args, tensors_, scalars_)                         \
  case core::OpKind::op: {                                                  \
    KD_ARGS_FROM_SPANS(Args, tensors_, scalars_)                            \
    st = api::validate_##op(args, &p, &la, &empty, /*require_data=*/false); \
    break;                                                                  \
  }
      KDISPATCH_OP_LIST(KD_WS_OF_CALL)
#undef KD_WS_OF_CALL
    }
    if (!st.ok()) return st;
    return empty ? int64_t{0} : core::max_workspace_bytes(p);
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "workspace_bytes");
  }
}

Result<PretuneResult> pretune_key(Runtime& rt, std::string_view op, std::string_view key_fields, int64_t m,
                                  Device device) noexcept {
  try {
    auto p = key_problem(op, key_fields, m);
    if (!p.ok()) return p.status();
    p->device = device;
    core::LaunchArgs la;  // contiguous rows: the scratch layout's default
    return pretune_problem(rt, *p, la);
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "pretune_key");
  }
}

Result<ConfigTimings> time_configs(Runtime& rt, std::string_view op, std::string_view key_fields, int64_t m,
                                   std::span<const Config> configs, Device device, int32_t rounds) noexcept {
  try {
    if (rounds < 1 || rounds > 16)
      return make_status(StatusCode::invalid_argument, "rounds must be in [1, 16], got " + std::to_string(rounds));
    auto p = key_problem(op, key_fields, m);
    if (!p.ok()) return p.status();
    p->device = device;
    Runtime::Impl& impl = rt.impl();
    if (impl.forked_child()) return impl.refuse_in_child("time_configs");
    const DeviceInfo* dev = impl.device_for(device);
    if (!dev) return make_status(StatusCode::unsupported_device, core::no_backend_message(device));
    ConfigTimings out;
    tune::MissEvent ev;
    ev.problem = *p;  // contiguous rows: pretune_key's scratch layout
    out.key = tune::Tuner::key_of(*p, *dev);
    out.device_name = dev->device_name;
    if (const store::Fingerprint* f = store::backend_fingerprint(device.type)) out.fingerprint = f->to_json();
    out.configs.resize(configs.size());
    std::vector<core::Plan> plans;
    std::vector<size_t> index;  // plans[j] is configs[index[j]]
    for (size_t i = 0; i < configs.size(); ++i) {
      auto plan = core::plan_from_config(configs[i], p->op, device.type);
      if (!plan.ok()) {
        out.configs[i].status = plan.status();
        continue;
      }
      const core::VariantDef* v = plan->variant;
      if (v->in_dtype != p->in_dtype) {
        out.configs[i].status = make_status(StatusCode::unsupported_problem,
                                            std::string(v->name) + " computes " + std::string(dtype_name(v->in_dtype)) +
                                                ", the key is " + std::string(dtype_name(p->in_dtype)));
        continue;
      }
      if (Status s = v->supports(*p, plan->params, *dev); !s.ok()) {
        out.configs[i].status =
            make_status(StatusCode::unsupported_problem, std::string(v->name) + " declines this key: " + s.message());
        continue;
      }
      plans.push_back(*plan);
      index.push_back(i);
    }
    // The floor, in the same rounds (merge --retime holds the sources'
    // configs against it).
    out.floor.status = make_status(StatusCode::unsupported_problem, "no floor for this key here");
    size_t floor_at = plans.size();  // plans[floor_at] is the floor (== plans.size(): not timed)
    if (const core::Plan fp = core::floor_plan(*p, *dev);
        fp.valid() && fp.variant->supports(*p, fp.params, *dev).ok()) {
      out.floor_config = core::plan_to_config(fp);
      floor_at = static_cast<size_t>(std::find(plans.begin(), plans.end(), fp) - plans.begin());
      if (floor_at == plans.size()) plans.push_back(fp);
    }
    if (plans.empty()) return out;
    auto t = impl.tuner->time_on_scratch(ev, *dev, out.key, plans, rounds);
    if (!t.ok()) return t.status();
    for (size_t j = 0; j < plans.size(); ++j) {
      ConfigTiming& c = j < index.size() ? out.configs[index[j]] : out.floor;
      c.status = (*t)[j].status;
      if (!c.status.ok()) continue;
      c.round_us = (*t)[j].round_us;
      double sum = 0;
      for (double u : c.round_us) sum += u;
      c.us = c.round_us.empty() ? 0.0 : sum / static_cast<double>(c.round_us.size());
    }
    if (floor_at < index.size()) {
      out.floor = out.configs[index[floor_at]];
      out.floor_index = static_cast<int32_t>(index[floor_at]);
    }
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "time_configs");
  }
}

Result<PretuneResult> pretune_op(Runtime& rt, std::string_view op, std::span<const TensorRef> tensors,
                                 std::span<const float> scalars) noexcept {
  const core::OpSpec* s = nullptr;
  float full[core::kMaxScalars] = {};
  if (Status st = api::named_op_args(op, tensors.size(), scalars, &s, full); !st.ok()) return st;
  switch (s->op) {
#define KD_GENERIC_PRETUNE(op, Args, tensors_, scalars_) \
  case core::OpKind::op: {                               \
    KD_ARGS_FROM_SPANS(Args, tensors_, scalars_)         \
    return dispatch::pretune(rt, args);                  \
  }
    KDISPATCH_OP_LIST(KD_GENERIC_PRETUNE)
#undef KD_GENERIC_PRETUNE
  }
  return make_status(StatusCode::internal, "pretune_op: op without an entry point");
}

// One pretune per row of core/op_list.hpp (its op: ops.cpp).
#define KD_OP_PRETUNE(op, Args, tensors, scalars)                                                        \
  Result<PretuneResult> pretune(Runtime& rt, const Args& args) noexcept {                                \
    core::Problem p;                                                                                     \
    core::LaunchArgs la;                                                                                 \
    bool empty = false;                                                                                  \
    if (Status s = api::validate_##op(args, &p, &la, &empty, /*require_data=*/false); !s.ok()) return s; \
    if (empty) return nothing_to_tune(core::spec_of(core::OpKind::op));                                  \
    return pretune_problem(rt, p, la);                                                                   \
  }
KDISPATCH_OP_LIST(KD_OP_PRETUNE)
#undef KD_OP_PRETUNE

}  // namespace dispatch
