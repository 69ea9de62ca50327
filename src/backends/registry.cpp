// SPDX-License-Identifier: Apache-2.0
// The variant registry: the concatenation of every compiled backend's lists.
#include "backends/registry.hpp"

#include <algorithm>
#include <string>

#include "backends/plugin_loader.hpp"
#include "cpu/cpu_backend.hpp"
#include "backends/gpu/gpu_backend.hpp"

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
    for (const VariantDef* v : cpu::variants()) add(v);
    // CPU plugins (OpenBLAS's sgemm): loaded here, on the first registry
    // use, with RTLD_LOCAL; absent or disabled is not an error.
    PluginLoadResult plugins = load_cpu_plugins(plugin_options_from_env());
    for (const VariantDef* v : plugins.variants) add(v);
    plugin_status = std::move(plugins.status);
    // GPU backends compiled into this build (their lists are compiled in
    // whether or not a device is present; supports() declines kernels with
    // no loadable image on the probed device).
    for (DeviceType t : {DeviceType::cuda, DeviceType::hip})
      if (const gpu::BackendOps* b = gpu::backend_ops(t))
        for (const VariantDef* v : b->variants()) add(v);
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

std::string value_text(const ParamDef& p, int64_t v) {
  if (p.kind == ParamKind::boolean) return v ? "true" : "false";
  if (p.kind == ParamKind::enumeration && v >= 0 && static_cast<size_t>(v) < p.labels.size())
    return std::string(p.labels[static_cast<size_t>(v)]);
  return std::to_string(v);
}

}  // namespace

const std::vector<std::string>& registry_errors() noexcept { return registry().errors; }

const std::string& plugin_status() noexcept { return registry().plugin_status; }

bool backend_compiled(DeviceType backend) noexcept {
  return backend == DeviceType::cpu || gpu::backend_ops(backend) != nullptr;
}

tune::DeviceMemory* backend_memory(DeviceType backend) noexcept {
  const gpu::BackendOps* b = gpu::backend_ops(backend);
  return b ? b->memory() : nullptr;
}

const DeviceInfo* local_device_info(DeviceType backend) noexcept {
  if (backend == DeviceType::cpu) return &cpu_device_info();
  const gpu::BackendOps* b = gpu::backend_ops(backend);
  return b ? b->device_info(0) : nullptr;
}

const DeviceInfo* device_info_for(Device d) noexcept {
  if (d.type == DeviceType::cpu) return &cpu_device_info();
  // A GPU tensor gets the probed description of its own ordinal, or
  // nullptr when the backend is not compiled in or has no usable device:
  // the op then answers unsupported_device.
  const gpu::BackendOps* b = gpu::backend_ops(d.type);
  return b ? b->device_info(d.ordinal) : nullptr;
}

const char* no_backend_message(Device d) noexcept {
  return d.type == DeviceType::cpu ? "the CPU backend is unavailable"
                                   : "tensors are on a GPU but this build has no usable GPU backend for it; "
                                     "kdispatch never runs GPU tensors on the CPU";
}

DeviceType backend_of_device_name(std::string_view canonical) noexcept {
  if (canonical.rfind("CPU_", 0) == 0) return DeviceType::cpu;
  if (canonical.rfind("AMD_", 0) == 0 || canonical.find("Radeon") != std::string_view::npos) return DeviceType::hip;
  return DeviceType::cuda;
}

bool is_host(DeviceType t) noexcept { return t == DeviceType::cpu; }

Result<DeviceInfo> device_info_or_why(Device device) noexcept {
  try {
    const DeviceInfo* d = device_info_for(device);
    if (d == nullptr && device.type != DeviceType::cpu) {
      const gpu::BackendOps* b = gpu::backend_ops(device.type);
      if (b == nullptr)
        return make_status(StatusCode::unsupported_device,
                           "no " + std::string(device_type_name(device.type)) + " backend in this build");
      const DeviceInfo& st = b->status();
      return make_status(StatusCode::unsupported_device, !st.available
                                                             ? st.unavailable_reason
                                                             : std::string(device_type_name(device.type)) + " device " +
                                                                   std::to_string(device.ordinal) + " does not exist");
    }
    if (d == nullptr)
      return make_status(StatusCode::unsupported_device,
                         "no " + std::string(device_type_name(device.type)) + " backend in this build");
    if (device.type == DeviceType::cpu && device.ordinal != 0)
      return make_status(StatusCode::unsupported_device, std::string(device_type_name(device.type)) + " device " +
                                                             std::to_string(device.ordinal) + " does not exist");
    return *d;
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

const VariantDef* reference_variant(OpKind op, DeviceType backend, DType in_dtype) noexcept {
  for (const VariantDef* v : registry().all)
    if (v->op == op && v->backend == backend && v->in_dtype == in_dtype && (v->flags & kVariantReference)) return v;
  return nullptr;
}

Plan get_default(const Problem& p, const DeviceInfo& dev) noexcept {
  switch (p.device.type) {
    case DeviceType::cpu: return cpu::get_default(p, dev);
    case DeviceType::cuda:
    case DeviceType::hip: {
      const gpu::BackendOps* b = gpu::backend_ops(p.device.type);
      return b ? b->get_default(p, dev) : Plan{};
    }
  }
  return Plan{};
}

Plan floor_plan(const Problem& p, const DeviceInfo& dev) noexcept {
  if (p.device.type == DeviceType::cuda || p.device.type == DeviceType::hip) {
    const gpu::BackendOps* b = gpu::backend_ops(p.device.type);
    if (b && b->floor) return b->floor(p, dev);
  }
  return get_default(p, dev);
}

Status no_variant_computes(const Problem& p) {
  return make_status(StatusCode::unsupported_problem, "no " + std::string(device_type_name(p.device.type)) +
                                                          " variant computes " + std::string(op_name(p.op)) + " with " +
                                                          std::string(dtype_name(p.in_dtype)) + " inputs and " +
                                                          std::string(dtype_name(p.out_dtype)) + " output");
}

Status dtypes_computed(const Problem& p) noexcept {
  if (p.device.type != DeviceType::cpu) return Status();
  try {
    Problem q = p;
    q.m = q.m < 1 ? 1 : q.m;
    return cpu::get_default(q, cpu_device_info()).valid() ? Status() : no_variant_computes(q);
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "dtypes_computed");
  }
}

std::vector<Plan> config_space(const VariantDef& v, const Problem& p, const DeviceInfo& dev) {
  std::vector<Plan> out;
  if (v.flags & kVariantDynamicSpace) {
    // Discovered per problem (cuBLASLt's heuristic), then checked like any row.
    if (v.enumerate == nullptr) return out;
    constexpr int kCap = 16;
    std::vector<int64_t> rows(static_cast<size_t>(kCap * kMaxParams), 0);
    const int n = v.enumerate(p, dev, rows.data(), kCap);
    for (int i = 0; i < n && i < kCap; ++i) {
      Plan plan;
      plan.variant = &v;
      std::copy(rows.begin() + i * kMaxParams, rows.begin() + (i + 1) * kMaxParams, plan.params);
      if (v.supports == nullptr || v.supports(p, plan.params, dev).ok()) out.push_back(plan);
    }
    return out;
  }
  const size_t n = v.params.size();
  std::vector<size_t> idx(n, 0);
  for (size_t i = 0; i < n; ++i)
    if (v.params[i].values.empty()) return out;
  while (true) {
    Plan plan;
    plan.variant = &v;
    for (size_t i = 0; i < n; ++i) plan.params[i] = v.params[i].values[idx[i]];
    if (v.supports == nullptr || v.supports(p, plan.params, dev).ok()) out.push_back(plan);
    size_t i = 0;
    while (i < n && ++idx[i] == v.params[i].values.size()) idx[i++] = 0;
    if (i == n) break;
  }
  return out;
}

Result<Plan> plan_from_config(const Config& row, OpKind op, DeviceType backend) noexcept {
  try {
    const ConfigValue* vn = config_find(row, "variant");
    if (vn == nullptr || vn->kind != ConfigValue::Kind::string)
      return make_status(StatusCode::config_error, "row has no \"variant\" string");
    const VariantDef* v = find_variant(vn->s);
    if (v == nullptr) return make_status(StatusCode::config_error, "unknown variant '" + vn->s + "'");
    if (v->op != op || v->backend != backend)
      return make_status(StatusCode::config_error,
                         "variant '" + vn->s + "' is a " + std::string(device_type_name(v->backend)) + " " +
                             std::string(op_name(v->op)) + " variant, not " + std::string(device_type_name(backend)) +
                             " " + std::string(op_name(op)));
    Plan plan;
    plan.variant = v;
    for (size_t i = 0; i < v->params.size(); ++i) plan.params[i] = v->params[i].default_value;
    const bool dynamic = (v->flags & kVariantDynamicSpace) != 0;
    // A dynamic family's first param -1 or -2 names a pick made at the call
    // (cuBLASLt's algo_id: get_default's pick, the floor's): the other
    // params are unused, may be left out. Any other negative value is no
    // algorithm: the row must be whole (and the family refuses it).
    const ConfigValue* first =
        dynamic && !v->params.empty() ? config_find(row, std::string(v->params[0].name)) : nullptr;
    const bool pick =
        first != nullptr && first->kind == ConfigValue::Kind::integer && (first->i == -1 || first->i == -2);
    if (dynamic && !pick) {
      // A dynamic family's row is a whole algorithm: every param must be
      // there (a default would silently describe another algorithm).
      for (const ParamDef& pd : v->params)
        if (config_find(row, std::string(pd.name)) == nullptr)
          return make_status(StatusCode::config_error, "'" + std::string(pd.name) + "' missing: a " +
                                                           std::string(v->name) +
                                                           " row must give every parameter of its algorithm");
    }
    for (const auto& [name, value] : row) {
      if (name == "variant") continue;
      size_t i = 0;
      while (i < v->params.size() && v->params[i].name != name) ++i;
      if (i == v->params.size())
        return make_status(StatusCode::config_error,
                           "'" + name + "' is not a parameter of variant " + std::string(v->name));
      const ParamDef& pd = v->params[i];
      int64_t stored = 0;
      switch (pd.kind) {
        case ParamKind::integer:
          if (value.kind != ConfigValue::Kind::integer)
            return make_status(StatusCode::config_error, "'" + name + "' must be an integer");
          stored = value.i;
          break;
        case ParamKind::boolean:
          if (value.kind != ConfigValue::Kind::boolean)
            return make_status(StatusCode::config_error, "'" + name + "' must be true or false");
          stored = value.i;
          break;
        case ParamKind::enumeration: {
          if (value.kind != ConfigValue::Kind::string)
            return make_status(StatusCode::config_error, "'" + name + "' must be a string");
          auto it = std::find(pd.labels.begin(), pd.labels.end(), value.s);
          if (it == pd.labels.end())
            return make_status(StatusCode::config_error, "'" + name + "'=\"" + value.s + "\" is not one of its labels");
          stored = it - pd.labels.begin();
          break;
        }
      }
      if (!dynamic && std::find(pd.values.begin(), pd.values.end(), stored) == pd.values.end())
        return make_status(StatusCode::config_error, "'" + name + "'=" + value_text(pd, stored) +
                                                         " is not a point of " + std::string(v->name) + "'s space");
      plan.params[i] = stored;
    }
    return plan;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "resolving a config row");
  }
}

Config plan_to_config(const Plan& plan) {
  Config c;
  if (!plan.variant) return c;
  c.emplace_back("variant", ConfigValue::string(std::string(plan.variant->name)));
  for (size_t i = 0; i < plan.variant->params.size(); ++i) {
    const ParamDef& pd = plan.variant->params[i];
    const int64_t v = plan.params[i];
    switch (pd.kind) {
      case ParamKind::integer: c.emplace_back(std::string(pd.name), ConfigValue::integer(v)); break;
      case ParamKind::boolean: c.emplace_back(std::string(pd.name), ConfigValue::boolean(v != 0)); break;
      case ParamKind::enumeration: c.emplace_back(std::string(pd.name), ConfigValue::string(value_text(pd, v))); break;
    }
  }
  return c;
}

std::string plan_to_string(const Plan& plan) {
  if (!plan.variant) return "<none>";
  std::string s(plan.variant->name);
  s += '{';
  for (size_t i = 0; i < plan.variant->params.size(); ++i) {
    if (i) s += ',';
    s += plan.variant->params[i].name;
    s += '=';
    s += value_text(plan.variant->params[i], plan.params[i]);
  }
  s += '}';
  return s;
}

}  // namespace dispatch::core
