// SPDX-License-Identifier: Apache-2.0
// Plans and config rows: a variant's config space, a config row resolved
// into a Plan and back, a plan's one-line description.
#include <algorithm>
#include <string>

#include "backends/registry.hpp"

namespace dispatch::core {
namespace {

std::string value_text(const ParamDef& p, int64_t v) {
  if (p.kind == ParamKind::boolean) return v ? "true" : "false";
  if (p.kind == ParamKind::enumeration && v >= 0 && static_cast<size_t>(v) < p.labels.size())
    return std::string(p.labels[static_cast<size_t>(v)]);
  return std::to_string(v);
}

}  // namespace

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
