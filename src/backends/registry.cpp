// SPDX-License-Identifier: Apache-2.0
// The variant registry: the concatenation of every compiled backend's lists.
#include "backends/registry.hpp"

#include <algorithm>
#include <string>

#include "backends/backend.hpp"
#include "backends/memory.hpp"
#include "backends/plugin_loader.hpp"

namespace dispatch::core {

Status register_check(const VariantDef& v) noexcept {
  // Arg names of the variant's op, for messages.
  static thread_local OpKind op_for_names = OpKind::gemm;
  op_for_names = v.op;
  return validate_variant(v, arg_count(v.op), [](int slot) { return arg_name(op_for_names, slot); });
}

namespace {

struct Registry {
  std::vector<const VariantDef*> all;
  std::vector<std::string> errors;  ///< variants refused at registration
  std::string plugin_status;        ///< one line per CPU plugin (plugin_loader.hpp)
  Registry() {
    // The host backend's own variants first, then its plugins, then the
    // GPU backends compiled into this build (their lists are compiled in
    // whether or not a device is present; supports() declines kernels with
    // no loadable image on the probed device).
    for (const backends::Backend* b : backends::compiled()) {
      for (const VariantDef* v : b->variants()) add(v);
      if (!b->is_host()) continue;
      // CPU plugins (OpenBLAS's sgemm): loaded here, on the first registry
      // use, with RTLD_LOCAL; absent or disabled is not an error.
      PluginLoadResult plugins = load_cpu_plugins(plugin_options_from_env());
      for (const VariantDef* v : plugins.variants) add(v);
      plugin_status = std::move(plugins.status);
    }
  }
  // Registration checks every declaration (roles, params) and refuses a bad
  // one with the reason, instead of letting it misbehave in a search.
  void add(const VariantDef* v) {
    Status s = register_check(*v);
    if (!s.ok()) {
      errors.push_back(s.message());
      return;
    }
    all.push_back(v);
  }
};

const Registry& registry() {
  static const Registry r;
  return r;
}

}  // namespace

const std::vector<std::string>& registry_errors() noexcept { return registry().errors; }

const std::string& plugin_status() noexcept { return registry().plugin_status; }

bool backend_compiled(DeviceType backend) noexcept { return backends::find(backend) != nullptr; }

backends::DeviceMemory* backend_memory(DeviceType backend) noexcept {
  const backends::Backend* b = backends::find(backend);
  return b ? &b->memory() : nullptr;
}

const DeviceInfo* local_device_info(DeviceType backend) noexcept {
  const backends::Backend* b = backends::find(backend);
  return b ? b->device_info(0) : nullptr;
}

const DeviceInfo* device_info_for(Device d) noexcept {
  // A GPU tensor gets the probed description of its own ordinal, or
  // nullptr when the backend is not compiled in or has no usable device:
  // the op then answers unsupported_device.
  const backends::Backend* b = backends::find(d.type);
  return b ? b->device_info(d.ordinal) : nullptr;
}

const char* no_backend_message(Device d) noexcept {
  const backends::Backend* b = backends::find(d.type);
  return b ? b->no_device_message()
           : "tensors are on a GPU but this build has no usable GPU backend for it; "
             "kdispatch never runs GPU tensors on the CPU";
}

DeviceType backend_of_device_name(std::string_view canonical) noexcept {
  return backends::type_of_device_name(canonical);
}

bool is_host(DeviceType t) noexcept { return backends::is_host(t); }

bool is_hip_device_name(std::string_view canonical) noexcept {
  return backends::type_of_device_name(canonical) == DeviceType::hip;
}

Result<DeviceInfo> device_info_or_why(Device device) noexcept {
  try {
    const backends::Backend* b = backends::find(device.type);
    if (b == nullptr)
      return make_status(StatusCode::unsupported_device,
                         "no " + std::string(device_type_name(device.type)) + " backend in this build");
    // (The host answers any ordinal with its one device: only ordinal 0 is it.)
    if (const DeviceInfo* d = b->device_info(device.ordinal); d && d->device.ordinal == device.ordinal) return *d;
    const DeviceInfo& st = b->status();
    return make_status(StatusCode::unsupported_device, !st.available
                                                           ? st.unavailable_reason
                                                           : std::string(device_type_name(device.type)) + " device " +
                                                                 std::to_string(device.ordinal) + " does not exist");
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "device_info");
  }
}

std::span<const VariantDef* const> all_variants() noexcept {
  const auto& r = registry();
  return {r.all.data(), r.all.size()};
}

const VariantDef* find_variant(std::string_view name) noexcept {
  for (const VariantDef* v : registry().all)
    if (v->name == name) return v;
  return nullptr;
}

std::vector<const VariantDef*> variants_for(OpKind op, DeviceType backend) {
  std::vector<const VariantDef*> out;
  for (const VariantDef* v : registry().all)
    if (v->op == op && v->backend == backend) out.push_back(v);
  return out;
}

int64_t max_workspace_bytes(const Problem& p) noexcept {
  int64_t most = 0;
  for (const VariantDef* v : registry().all) {
    if (v->op != p.op || v->backend != p.device.type || v->in_dtype != p.in_dtype || !v->workspace_bytes) continue;
    int64_t params[kMaxParams] = {};
    for (size_t i = 0; i < v->params.size() && i < static_cast<size_t>(kMaxParams); ++i)
      params[i] = v->params[i].default_value;
    const int64_t b = v->workspace_bytes(p, params);
    if (b > most) most = b;
  }
  return most;
}

const VariantDef* reference_variant(OpKind op, DeviceType backend, DType in_dtype) noexcept {
  for (const VariantDef* v : registry().all)
    if (v->op == op && v->backend == backend && v->in_dtype == in_dtype && (v->flags & kVariantReference)) return v;
  return nullptr;
}

Plan get_default(const Problem& p, const DeviceInfo& dev) noexcept {
  const backends::Backend* b = backends::find(p.device.type);
  return b ? b->get_default(p, dev) : Plan{};
}

Plan floor_plan(const Problem& p, const DeviceInfo& dev) noexcept {
  const backends::Backend* b = backends::find(p.device.type);
  return b ? b->floor(p, dev) : Plan{};
}

Status no_variant_computes(const Problem& p) {
  return make_status(StatusCode::unsupported_problem, "no " + std::string(device_type_name(p.device.type)) +
                                                          " variant computes " + std::string(op_name(p.op)) + " with " +
                                                          std::string(dtype_name(p.in_dtype)) + " inputs and " +
                                                          std::string(dtype_name(p.out_dtype)) + " output");
}

Status dtypes_computed(const Problem& p) noexcept {
  const backends::Backend* b = backends::find(p.device.type);
  if (b == nullptr || !b->dtypes_known_offline()) return Status();
  try {
    Problem q = p;
    q.m = q.m < 1 ? 1 : q.m;
    const DeviceInfo* dev = b->device_info(0);
    return dev != nullptr && b->get_default(q, *dev).valid() ? Status() : no_variant_computes(q);
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "dtypes_computed");
  }
}

}  // namespace dispatch::core
