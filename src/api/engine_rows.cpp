// SPDX-License-Identifier: Apache-2.0
// An engine's rows shaping an own op's default (api/engine_rows.hpp).
#include "api/engine_rows.hpp"

#include <cstring>

#include "table/key.hpp"

namespace dispatch::api {
namespace {

// buf[at..] = s; false when it does not fit.
bool put(char* buf, size_t cap, size_t* at, std::string_view s) noexcept {
  if (*at + s.size() > cap) return false;
  std::memcpy(buf + *at, s.data(), s.size());
  *at += s.size();
  return true;
}

// The allowed value of `d` nearest to v (ties: the smaller); v itself for
// a param without a value list.
int64_t nearest_allowed(const core::ParamDef& d, int64_t v) noexcept {
  if (d.values.empty()) return v;
  using Wide = __int128;  // |a - v| of any two int64 values (a row may hold INT64_MIN)
  auto dist = [v](int64_t a) { return a > v ? Wide{a} - v : Wide{v} - a; };
  int64_t best = d.values[0];
  for (const int64_t a : d.values)
    if (dist(a) < dist(best) || (dist(a) == dist(best) && a < best)) best = a;
  return best;
}

}  // namespace

size_t engine_key(const core::OpSpec& spec, const core::Problem& p, std::string_view device_name, char* buf,
                  size_t cap) noexcept {
  const core::EngineRows& er = spec.engine_rows;
  if (er.fields == nullptr || er.table.empty()) return 0;
  // table::make_key's layout: <backend>/<op>|<device_name>|<fields>
  size_t at = 0;
  if (!put(buf, cap, &at, table::kForeignBackend) || !put(buf, cap, &at, "/") || !put(buf, cap, &at, er.table) ||
      !put(buf, cap, &at, "|") || !put(buf, cap, &at, device_name) || !put(buf, cap, &at, "|"))
    return 0;
  const size_t n = er.fields(p, buf + at, cap - at);
  return n == 0 ? 0 : at + n;
}

bool find_engine_row(const table::Snapshot& snap, const table::NearestPolicy& policy, const core::OpSpec& spec,
                     const core::Problem& p, std::string_view device_name, EngineRowHit* hit) noexcept {
  char buf[kEngineKeyBytes];
  const size_t n = engine_key(spec, p, device_name, buf, sizeof buf);
  if (n == 0) return false;
  const std::string_view key(buf, n);
  const table::Bucket* b = snap.find(key, table::key_hash(key));
  if (b == nullptr) return false;
  size_t idx = 0;
  const table::Row* r = table::Snapshot::nearest(*b, p.m, policy, &idx);
  if (r == nullptr) return false;
  *hit = EngineRowHit{b, r, idx};
  return true;
}

core::Plan shape_by_engine_row(const core::OpSpec& spec, const core::Plan& dflt, const Config& row,
                               const core::Problem& p, const DeviceInfo& dev, std::string* why) noexcept {
  if (!dflt.valid()) return dflt;
  core::Plan plan = dflt;
  bool changed = false;
  try {
    for (const core::EngineParam& ep : spec.engine_rows.params) {
      const ConfigValue* v = config_find(row, ep.field);
      const auto& params = plan.variant->params;
      size_t i = 0;
      while (i < params.size() && params[i].name != ep.param) ++i;
      if (v == nullptr || v->kind != ConfigValue::Kind::integer) {
        if (why) *why += "; the row has no integer " + std::string(ep.field) + ": " + std::string(ep.param) + " stays";
        continue;
      }
      if (i == params.size()) {
        if (why)
          *why += "; " + std::string(ep.field) + " = " + std::to_string(v->i) + " maps to " + std::string(ep.param) +
                  ", which " + std::string(plan.variant->name) + " does not have: not used";
        continue;
      }
      const int64_t to = nearest_allowed(params[i], v->i);
      if (why)
        *why += "; " + std::string(ep.field) + " = " + std::to_string(v->i) + " -> " + std::string(ep.param) + " = " +
                std::to_string(to) + (to == v->i ? "" : " (the nearest compiled value)");
      changed = changed || plan.params[i] != to;
      plan.params[i] = to;
    }
    if (!changed) return dflt;
    if (Status s = plan.variant->supports(p, plan.params, dev); !s.ok()) {
      if (why)
        *why +=
            "; " + std::string(plan.variant->name) + " declines that: " + s.message() + "; the default's plan serves";
      return dflt;
    }
  } catch (...) {  // a `why` that could not grow (bad_alloc): the default's plan, as before
    return dflt;
  }
  return plan;
}

}  // namespace dispatch::api
