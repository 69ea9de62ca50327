// SPDX-License-Identifier: Apache-2.0
// The op entry points: validate -> key -> table -> plan -> launch.
// Hot path rules: no lock, no allocation, no syscall, no logging on a hit;
// the table is read inside an epoch guard and the plan is copied out, so
// the guard is released before the kernel runs.
#include "dispatch/ops.hpp"

#include "api/runtime_impl.hpp"
#include "api/validate.hpp"
#include "core/registry.hpp"
#include "table/epoch.hpp"
#include "table/key.hpp"

namespace dispatch {
namespace {

Status run(Runtime& rt, const core::Problem& p, core::LaunchArgs& la, Stream stream,
           const CallOptions& opts) noexcept {
  Runtime::Impl& impl = rt.impl();
  const DeviceInfo* dev = impl.device_for(p.device);
  if (dev == nullptr) {
    return make_status(StatusCode::unsupported_device,
                       p.device.type == DeviceType::cpu
                           ? "the CPU backend is unavailable"
                           : "tensors are on a GPU but this build has no usable GPU backend for it; "
                             "kdispatch never runs GPU tensors on the CPU");
  }
  table::KeyBuffer key;
  table::build_own_key(p, device_type_name(p.device.type), dev->device_name, &key);
  const uint64_t hash = table::key_hash(key.view());

  core::Plan plan;
  PlanSource source = PlanSource::fallback;
  int64_t table_m = -1;
  uint32_t source_id = 0;
  {
    table::EpochDomain::Guard guard(table::EpochDomain::global());
    const table::Snapshot* snap = impl.current.load(std::memory_order_seq_cst);
    if (const table::Bucket* b = snap->find(key.view(), hash)) {
      size_t idx = 0;
      if (const table::Row* r = table::Snapshot::nearest(*b, p.m, impl.policy, &idx); r && r->plan.valid()) {
        plan = r->plan;
        source = PlanSource::table;
        table_m = b->ms[idx];
        source_id = r->source_id;
      }
    }
  }
  if (!plan.valid()) {
    plan = core::get_default(p, *dev);
    if (!plan.valid())
      return make_status(StatusCode::unsupported_problem,
                         std::string("no ") + std::string(device_type_name(p.device.type)) + " variant computes " +
                             std::string(core::op_name(p.op)) + " with " + std::string(dtype_name(p.in_dtype)) +
                             " inputs and " + std::string(dtype_name(p.out_dtype)) + " output");
  }
  if (opts.info) {
    opts.info->source = source;
    opts.info->variant = plan.variant->name.data();
    opts.info->table_m = table_m;
    opts.info->source_id = source_id;
  }
  la.stream = stream.handle;
  return plan.variant->launch(la, p, plan.params);
}

}  // namespace

const char* plan_source_name(PlanSource s) noexcept {
  switch (s) {
    case PlanSource::table: return "table";
    case PlanSource::fallback: return "default";
    case PlanSource::forced: return "forced";
  }
  return "?";
}

Status gemm(Runtime& rt, const GemmArgs& args, Stream stream, const CallOptions& opts) noexcept {
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  if (Status s = api::validate_gemm(args, &p, &la, &empty); !s.ok()) return s;
  if (empty) return Status();
  return run(rt, p, la, stream, opts);
}

Status rmsnorm(Runtime& rt, const RmsNormArgs& args, Stream stream, const CallOptions& opts) noexcept {
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  if (Status s = api::validate_rmsnorm(args, &p, &la, &empty); !s.ok()) return s;
  if (empty) return Status();
  return run(rt, p, la, stream, opts);
}

Status fused_add_rmsnorm(Runtime& rt, const FusedAddRmsNormArgs& args, Stream stream,
                         const CallOptions& opts) noexcept {
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  if (Status s = api::validate_fused_add_rmsnorm(args, &p, &la, &empty); !s.ok()) return s;
  if (empty) return Status();
  return run(rt, p, la, stream, opts);
}

}  // namespace dispatch
