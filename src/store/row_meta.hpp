// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — what a tuned row records of how it was chosen, in
// its file's "kdispatch" metadata object beside "us" and "default_us"
// (docs/config-files.md#kdispatchs-own-config-files):
//
//   "margin": 0.02                the confirmation's margin the rows were tuned with
//   "margin_by_m": {"8": 0.05}    rows tuned with another one (null: not recorded)
//   "aa_spread": {"1": 0.0123}    the floor's A/A spread over the confirmation's placements
//   "timing": {"1": "cold"}       how the confirmation timed ("cold", "cold+graph")
//   "why": {"1": "beat the floor by 7.3% (margin 2%)"}
//   "cpu": {"vendor": "AuthenticAMD", "family": 25, "model": 1, "name": "AMD EPYC ..."}
//   "cpu_by_m": {"4": {...}}      CPU rows tuned on another CPU (null: not recorded)
//
// Every field is optional: a file written before them (or by hand) loads as
// it always did, and its rows simply record nothing. The loader serves rows
// without reading these fields; the writer's merge and `kdispatch merge`
// carry them over row by row. Header-only: the writer (libkdispatch) and
// `kdispatch merge` (the CLI, which links only the exported API) share it.
#pragma once

#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/json_write.hpp"

namespace dispatch::store {

/// One row's record.
struct RowMeta {
  double margin = -1.0;     ///< the confirmation's margin; < 0: not recorded
  double aa_spread = -1.0;  ///< the floor's A/A spread in the confirmation; < 0: not recorded
  std::string timing;       ///< "cold" | "cold+graph"; "": not recorded
  std::string why;          ///< why the row holds this plan (one line); "": not recorded
  std::string cpu;          ///< the CPU it was tuned on, a JSON object's text as JsonWriter writes it; "": not recorded

  friend bool operator==(const RowMeta&, const RowMeta&) = default;
};

/// Calls f(key, value) (value: simdjson::simdjson_result<ondemand::value>)
/// for each member of the object `field` of a file's metadata object
/// `meta` (its JSON text: "fingerprint", "schema", "us", "default_us"), in
/// order, until f returns false or a member's key cannot be read; nothing
/// when `meta` does not parse or holds no such object.
template <class F>
void for_each_meta_member(std::string_view meta, const char* field, F&& f) {
  simdjson::padded_string json(meta);
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document doc;
  if (parser.iterate(json).get(doc)) return;
  simdjson::ondemand::object obj;
  if (doc[field].get_object().get(obj)) return;
  for (auto member : obj) {
    std::string_view k;
    if (member.unescaped_key().get(k) || !f(k, member.value())) return;
  }
}

namespace row_meta_detail {

inline double round4(double v) { return std::round(v * 1e4) / 1e4; }

/// The value most rows share (ties: the smallest), over rows that record one.
template <class T, class Known, class Get>
bool majority(const std::vector<std::pair<int64_t, const RowMeta*>>& rows, Known known, Get get, T* out) {
  std::map<T, int64_t> count;
  for (const auto& [m, r] : rows)
    if (known(*r)) ++count[get(*r)];
  if (count.empty()) return false;
  int64_t best = -1;
  for (const auto& [v, n] : count)
    if (n > best) best = n, *out = v;
  return true;
}

inline void append_key(std::string& s, int64_t m) {
  s += s.size() > 1 ? ", \"" : "\"";
  core::json_append_int(s, m);
  s += "\": ";
}

/// A JSON value as the library's JsonWriter spaces it (", ", ": "), so a
/// value read back and written again is the same text.
inline void restyle(core::JsonWriter& w, simdjson::dom::element e) {
  namespace dom = simdjson::dom;
  switch (e.type()) {
    case dom::element_type::OBJECT:
      w.begin_object();
      for (auto [k, v] : dom::object(e)) {
        w.key(k);
        restyle(w, v);
      }
      w.end_object();
      return;
    case dom::element_type::ARRAY:
      w.begin_array();
      for (dom::element v : dom::array(e)) restyle(w, v);
      w.end_array();
      return;
    case dom::element_type::STRING: w.value(std::string_view(e)); return;
    case dom::element_type::INT64: w.value(int64_t(e)); return;
    case dom::element_type::UINT64: w.json(std::to_string(uint64_t(e))); return;
    case dom::element_type::DOUBLE: w.value(double(e)); return;
    case dom::element_type::BOOL: w.value(bool(e)); return;
    case dom::element_type::NULL_VALUE: w.null(); return;
  }
}
inline std::string restyled(simdjson::dom::element e) {
  core::JsonWriter w;
  restyle(w, e);
  return w.take();
}

inline bool parse_m(std::string_view k, int64_t* m) {
  const auto r = std::from_chars(k.data(), k.data() + k.size(), *m);
  return r.ec == std::errc() && r.ptr == k.data() + k.size() && *m >= 1;
}

}  // namespace row_meta_detail

/// Writes the members above into the open object of `w` (the "kdispatch"
/// object), for `rows` in ascending M. Deterministic: the same rows give the
/// same text. Members with nothing to say are left out.
inline void write_row_meta(core::JsonWriter& w, const std::vector<std::pair<int64_t, const RowMeta*>>& rows) {
  using namespace row_meta_detail;
  double margin = 0;
  if (majority<double>(
          rows, [](const RowMeta& r) { return r.margin >= 0; }, [](const RowMeta& r) { return r.margin; }, &margin)) {
    w.field("margin", margin);
    std::string by = "{";
    for (const auto& [m, r] : rows)
      if (r->margin != margin) {
        append_key(by, m);
        if (r->margin >= 0)
          core::json_append_double(by, r->margin);
        else
          by += "null";
      }
    if (by.size() > 1) w.key("margin_by_m").json(by + "}");
  }
  std::string aa = "{", timing = "{", why = "{";
  for (const auto& [m, r] : rows) {
    if (r->aa_spread >= 0) {
      append_key(aa, m);
      core::json_append_double(aa, round4(r->aa_spread));
    }
    if (!r->timing.empty()) {
      append_key(timing, m);
      core::json_append_string(timing, r->timing);
    }
    if (!r->why.empty()) {
      append_key(why, m);
      core::json_append_string(why, r->why);
    }
  }
  if (aa.size() > 1) w.key("aa_spread").json(aa + "}");
  if (timing.size() > 1) w.key("timing").json(timing + "}");
  if (why.size() > 1) w.key("why").json(why + "}");
  std::string cpu;
  if (majority<std::string>(
          rows, [](const RowMeta& r) { return !r.cpu.empty(); }, [](const RowMeta& r) { return r.cpu; }, &cpu)) {
    w.key("cpu").json(cpu);
    std::string by = "{";
    for (const auto& [m, r] : rows)
      if (r->cpu != cpu) {
        append_key(by, m);
        by += r->cpu.empty() ? std::string("null") : r->cpu;
      }
    if (by.size() > 1) w.key("cpu_by_m").json(by + "}");
  }
}

/// The members above as read from a file's "kdispatch" object; at(m) is
/// row m's record.
struct RowMetaIndex {
  double margin = -1.0;
  std::unordered_map<int64_t, double> margin_by_m;  ///< -1: null (not recorded)
  std::unordered_map<int64_t, double> aa_spread;
  std::unordered_map<int64_t, std::string> timing, why;
  std::string cpu;
  std::unordered_map<int64_t, std::string> cpu_by_m;  ///< "": null (not recorded)

  RowMeta at(int64_t m) const {
    RowMeta r;
    r.margin = margin;
    if (auto it = margin_by_m.find(m); it != margin_by_m.end()) r.margin = it->second;
    if (auto it = aa_spread.find(m); it != aa_spread.end()) r.aa_spread = it->second;
    if (auto it = timing.find(m); it != timing.end()) r.timing = it->second;
    if (auto it = why.find(m); it != why.end()) r.why = it->second;
    r.cpu = cpu;
    if (auto it = cpu_by_m.find(m); it != cpu_by_m.end()) r.cpu = it->second;
    return r;
  }
};

/// Reads the members above from the "kdispatch" object `kd` (a value of the
/// wrong type is passed over, as if absent).
inline RowMetaIndex read_row_meta(simdjson::dom::element kd) {
  using namespace row_meta_detail;
  namespace dom = simdjson::dom;
  RowMetaIndex x;
  auto number = [](dom::element e, double* v) {
    if (e.get(*v) == simdjson::SUCCESS) return true;
    int64_t i = 0;
    if (e.get(i) != simdjson::SUCCESS) return false;
    *v = static_cast<double>(i);
    return true;
  };
  dom::element e;
  if (kd["margin"].get(e) == simdjson::SUCCESS && number(e, &x.margin) && x.margin < 0) x.margin = -1.0;
  dom::object obj;
  if (kd["margin_by_m"].get(obj) == simdjson::SUCCESS)
    for (auto [k, v] : obj) {
      int64_t m = 0;
      double d = -1.0;
      if (!parse_m(k, &m)) continue;
      if (!v.is_null() && (!number(v, &d) || d < 0)) continue;
      x.margin_by_m[m] = v.is_null() ? -1.0 : d;
    }
  if (kd["aa_spread"].get(obj) == simdjson::SUCCESS)
    for (auto [k, v] : obj) {
      int64_t m = 0;
      double d = 0;
      if (parse_m(k, &m) && number(v, &d) && d >= 0) x.aa_spread[m] = d;
    }
  for (auto [field, map] :
       {std::pair<const char*, std::unordered_map<int64_t, std::string>*>{"timing", &x.timing}, {"why", &x.why}})
    if (kd[field].get(obj) == simdjson::SUCCESS)
      for (auto [k, v] : obj) {
        int64_t m = 0;
        std::string_view s;
        if (parse_m(k, &m) && v.get(s) == simdjson::SUCCESS) (*map)[m] = std::string(s);
      }
  if (kd["cpu"].get(e) == simdjson::SUCCESS && e.is_object()) x.cpu = restyled(e);
  if (kd["cpu_by_m"].get(obj) == simdjson::SUCCESS)
    for (auto [k, v] : obj) {
      int64_t m = 0;
      if (!parse_m(k, &m)) continue;
      if (v.is_null())
        x.cpu_by_m[m] = "";
      else if (v.is_object())
        x.cpu_by_m[m] = restyled(v);
    }
  return x;
}

}  // namespace dispatch::store
