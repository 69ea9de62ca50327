// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch merge`: one table (cli/merge_impl.hpp): its
// rows checked as `validate` checks them, its conflicts resolved (--prefer,
// --retime) and its canonical text.
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <unordered_map>

#include <simdjson.h>

#include "cli/merge_impl.hpp"
#include "core/json_write.hpp"
#include "dispatch/config.hpp"
#include "dispatch/ops.hpp"

namespace kdispatch_cli::merge_detail {
namespace {

namespace dom = simdjson::dom;

/// Rounds of time_configs per conflict (the configs in order, then reversed).
constexpr int kRetimeRounds = 2;

/// A minified config object -> a Config, or why not.
std::string config_of(dom::parser& parser, const std::string& text, dispatch::Config* out) {
  dom::object obj;
  if (parser.parse(text).get(obj) != simdjson::SUCCESS) return "not a JSON object";
  for (auto [k, v] : obj) {
    int64_t i = 0;
    bool b = false;
    std::string_view sv;
    if (v.get(i) == simdjson::SUCCESS)
      out->emplace_back(std::string(k), dispatch::ConfigValue::integer(i));
    else if (v.get(b) == simdjson::SUCCESS)
      out->emplace_back(std::string(k), dispatch::ConfigValue::boolean(b));
    else if (v.get(sv) == simdjson::SUCCESS)
      out->emplace_back(std::string(k), dispatch::ConfigValue::string(std::string(sv)));
    else
      return "the value of '" + std::string(k) + "' is not an integer, a boolean or a string";
  }
  return {};
}

std::string minified(dom::parser& parser, const std::string& json) {
  dom::element e;
  return parser.parse(json).get(e) == simdjson::SUCCESS ? std::string(simdjson::minify(e)) : json;
}

/// What --retime needs of a table: its op, key fields and device, from the
/// path <backend>/<op>/<fields>.json.
struct RetimeTable {
  dispatch::DeviceType backend{};
  std::string op, key_fields, device_name;
};

/// The table of `rel`, or why it cannot be retimed.
std::string retime_table_of(const std::string& rel, RetimeTable* t) {
  const fs::path p(rel);
  std::vector<std::string> parts;
  for (const fs::path& c : p) parts.push_back(c.string());
  if (parts.size() != 3 || p.extension() != ".json")
    return "not a table of an own op (<backend>/<op>/<key>.json): the key to time is unknown";
  auto backend = dispatch::parse_device_type(parts[0]);
  if (!backend.ok()) return "'" + parts[0] + "' is not a backend: " + backend.status().message();
  t->backend = *backend;
  bool known = false;
  for (const dispatch::OpInfo& op : dispatch::op_list()) known = known || op.name == parts[1];
  if (!known) return "'" + parts[1] + "' is not an op of this build";
  t->op = parts[1];
  const std::string stem = p.stem().string();
  size_t b = 0;
  while (b <= stem.size()) {
    size_t e = stem.find(',', b);
    if (e == std::string::npos) e = stem.size();
    const std::string_view f(stem.data() + b, e - b);
    if (f.substr(0, 12) == "device_name=")
      t->device_name = std::string(f.substr(12));
    else
      t->key_fields += (t->key_fields.empty() ? "" : ",") + std::string(f);
    b = e + 1;
  }
  if (t->device_name.empty()) return "the file name has no device_name";
  return {};
}

/// The state of one table's merge.
struct TableMerge {
  TableMerge(const std::string& rel_, const Inputs& in_, const MergeOptions& o_, double margin_, RetimeRuntime* retime_,
             const std::string& source_fp_)
      : rel(rel_), in(in_), o(o_), margin(margin_), retime(retime_), source_fp(source_fp_) {}
  const std::string& rel;
  const Inputs& in;
  const MergeOptions& o;
  double margin;
  RetimeRuntime* retime;
  const std::string& source_fp;
  Merged out;
  dispatch::core::JsonWriter conflicts;
  std::vector<std::string> unresolved;  // "M=.." without a rule
  RetimeTable rtab;
  std::string retime_refusal;  // why this table cannot be retimed
  bool retime_checked = false;
  std::string timing_fingerprint;  // this build's, on the table's backend (minified)
  dom::parser parser;

  const std::string& label(const Candidate* c) const {
    static const std::string kFloor = "floor";
    return c->file == kFloorFile ? kFloor : in.files[c->file].label;
  }
  // The floor as timed with M's conflict (time_conflict): its config
  // (minified) and retimed µs; empty config: not timed.
  std::string floor_config;
  double floor_us = 0;

  // The smallest time, then the smallest default time, then the source
  // name: the same pick for any order of the sources.
  bool better(const Candidate* c, const Candidate* b) const {
    const double cu = c->us > 0 ? c->us : 1e300, bu = b->us > 0 ? b->us : 1e300;
    if (cu != bu) return cu < bu;
    const double cd = c->default_us > 0 ? c->default_us : 1e300, bd = b->default_us > 0 ? b->default_us : 1e300;
    if (cd != bd) return cd < bd;
    return label(c) < label(b);
  }

  using ByConfig = std::map<std::string_view, std::vector<const Candidate*>>;

  std::string sources_of(const ByConfig& by_config, std::string_view config) const {
    std::set<std::string> names;  // sorted: the same text for any order of the sources
    for (const Candidate* c : by_config.at(config)) names.insert(label(c));
    std::string text;
    for (const std::string& n : names) text += (text.empty() ? "" : ", ") + n;
    return text;
  }

  // --retime's first conflict: can this table be timed here?
  void check_retime() {
    retime_checked = true;
    retime_refusal = retime_table_of(rel, &rtab);
    dispatch::Runtime* rt = retime_refusal.empty() ? retime->get() : nullptr;
    if (retime_refusal.empty() && !rt) retime_refusal = "cannot create a runtime to time on: " + retime->error;
    if (!rt) return;
    auto di = rt->device_info(dispatch::Device{rtab.backend, 0});
    const std::string bname(dispatch::device_type_name(rtab.backend));
    if (!di.ok() || !di->available)
      retime_refusal = "--retime times this " + bname + " table's conflicting rows on a " + bname +
                       " device, and this machine has none (" +
                       (di.ok() ? di->unavailable_reason : di.status().message()) + ")";
    else if (di->device_name != rtab.device_name)
      retime_refusal = "the table is for the device " + rtab.device_name + ", this machine's " + bname +
                       " device 0 is " + di->device_name +
                       ": timing here would not measure the device the table serves";
  }

  // Times the distinct configs of M; "" with *retimed filled, or why not.
  std::string time_conflict(int64_t m, const ByConfig& by_config, std::map<std::string_view, double>* retimed) {
    std::vector<dispatch::Config> configs;
    for (const auto& [config, srcs] : by_config) {
      dispatch::Config c;
      if (std::string bad = config_of(parser, std::string(config), &c); !bad.empty())
        return "cannot time M=" + std::to_string(m) + "'s config " + std::string(config) + " (from " +
               sources_of(by_config, config) + "): " + bad;
      configs.push_back(std::move(c));
    }
    auto r = dispatch::time_configs(*retime->rt, rtab.op, rtab.key_fields, m, configs,
                                    dispatch::Device{rtab.backend, 0}, kRetimeRounds);
    if (!r.ok()) return "cannot time M=" + std::to_string(m) + ": " + r.status().to_string();
    if (timing_fingerprint.empty() && !r->fingerprint.empty()) timing_fingerprint = minified(parser, r->fingerprint);
    floor_config.clear();
    floor_us = 0;
    if (r->floor.status.ok() && r->floor.us > 0 && r->floor_index < 0) {  // a source's config is raced already
      floor_config = minified(parser, dispatch::config_to_json(r->floor_config));
      floor_us = r->floor.us;
    }
    std::string why;
    size_t i = 0;
    for (const auto& [config, srcs] : by_config) {
      const dispatch::ConfigTiming& ct = r->configs[i++];
      if (!ct.status.ok() && why.empty())
        why = "cannot time M=" + std::to_string(m) + "'s config " + std::string(config) + " (from " +
              sources_of(by_config, config) + ") with this build: " + ct.status.to_string() +
              (timing_fingerprint != source_fp
                   ? " (the sources were tuned by another build or environment: this build's fingerprint is " +
                         (timing_fingerprint.empty() ? std::string("unknown") : timing_fingerprint) + ")"
                   : "");
      (*retimed)[config] = ct.us;
    }
    return why;
  }

  // --retime of one conflict: the kept candidate, or null (refused).
  const Candidate* retime_pick(int64_t m, const ByConfig& by_config, std::map<std::string_view, double>* retimed) {
    floor_config.clear();  // set by time_conflict for this M
    if (!retime_checked) check_retime();
    std::string why = retime_refusal;
    if (why.empty()) why = time_conflict(m, by_config, retimed);
    if (!why.empty()) {
      if (retime_refusal.empty()) retime_refusal = why;
      return nullptr;
    }
    // The fastest; a config within the margin of it ties, and the smallest
    // config text among the tied is kept (by_config's order).
    double best = 1e300;
    for (const auto& [config, us] : *retimed) best = std::min(best, us);
    std::string_view chosen;
    for (const auto& [config, us] : *retimed)
      if (us <= best * (1.0 + margin)) {
        chosen = config;
        break;
      }
    const Candidate* pick = nullptr;
    for (const Candidate* c : by_config.at(chosen))
      if (!pick || better(c, pick)) pick = c;
    // The floor (no source's config): kept unless the chosen config beats it
    // by more than the margin, as the tuner holds every candidate to it.
    const bool keep_floor = !floor_config.empty() && !(best < floor_us * (1.0 - margin));
    if (keep_floor) {
      auto c = std::make_unique<Candidate>();
      c->m = m;
      c->file = kFloorFile;
      c->config = floor_config;
      c->us = c->default_us = floor_us;
      pick = c.get();
      out.floors.push_back(std::move(c));
    }
    std::string line = rel + ": M=" + std::to_string(m) + " retimed:";
    for (const auto& [config, us] : *retimed) {
      char num[32];
      std::snprintf(num, sizeof num, "%.3f", us);
      line += " " + std::string(config) + " " + num + " us" + (!keep_floor && config == chosen ? " (kept)" : "") + ";";
    }
    if (!floor_config.empty()) {
      char num[32];
      std::snprintf(num, sizeof num, "%.3f", floor_us);
      line += " floor " + floor_config + " " + num + " us" +
              (keep_floor ? " (kept: no config beat it by the margin)" : "") + ";";
    }
    line.pop_back();
    out.report.push_back(line);
    return pick;
  }

  // Records a conflict's candidates (sorted by config, then source name).
  void record_conflict(int64_t m, const Candidate* const* cands, size_t n, const Candidate* pick,
                       const std::map<std::string_view, double>& retimed) {
    std::vector<const Candidate*> all(cands, cands + n);
    std::sort(all.begin(), all.end(), [&](const Candidate* a, const Candidate* b) {
      return a->config != b->config ? a->config < b->config : label(a) < label(b);
    });
    conflicts.key(std::to_string(m)).begin_object();
    if (pick) conflicts.field("kept", label(pick)).field("by", o.prefer ? "prefer" : "retime");
    conflicts.key("candidates").begin_array();
    for (const Candidate* c : all) {
      conflicts.begin_object().field("source", label(c)).key("config").json(c->config);
      if (c->us > 0) conflicts.field("us", std::round(c->us * 1000.0) / 1000.0);
      if (pick && o.retime) conflicts.field("retimed_us", std::round(retimed.at(c->config) * 1000.0) / 1000.0);
      conflicts.end_object();
    }
    // --retime's floor, a candidate no source had (its config when kept).
    if (pick && o.retime && !floor_config.empty())
      conflicts.begin_object()
          .field("source", "floor")
          .key("config")
          .json(floor_config)
          .field("retimed_us", std::round(floor_us * 1000.0) / 1000.0)
          .end_object();
    conflicts.end_array().end_object();
  }

  // The rows of one M (n >= 1 candidates).
  void merge_m(int64_t m, const Candidate* const* cands, size_t n) {
    const Candidate* pick = cands[0];
    if (n == 1) {  // the common case: no map, no allocation
      out.kept.emplace_back(m, pick);
      return;
    }
    ByConfig by_config;  // equal configs: one row, the smallest time of its sources
    for (size_t i = 0; i < n; ++i) by_config[cands[i]->config].push_back(cands[i]);
    std::map<std::string_view, double> retimed;
    if (by_config.size() == 1) {
      for (size_t i = 1; i < n; ++i)
        if (better(cands[i], pick)) pick = cands[i];
      out.kept.emplace_back(m, pick);
      return;
    }
    ++out.conflicts;
    pick = nullptr;
    if (o.prefer) {
      for (size_t i = 0; i < n; ++i) {
        const Candidate* c = cands[i];
        const size_t cs = in.files[c->file].source;
        if (!pick || cs < in.files[pick->file].source || (cs == in.files[pick->file].source && label(c) < label(pick)))
          pick = c;
      }
    } else if (o.retime) {
      pick = retime_pick(m, by_config, &retimed);
    } else {
      unresolved.push_back("M=" + std::to_string(m));
    }
    record_conflict(m, cands, n, pick, retimed);
    if (pick) out.kept.emplace_back(m, pick);
  }

  // {"<M>": <us rounded to 3 decimals>, ...} of the kept rows with a time
  // (as JsonWriter writes it; by hand: a million rows make it hot).
  std::string times_map(bool us) const {
    std::string text = "{";
    text.reserve(out.kept.size() * 20 + 2);
    char num[48];
    for (const auto& [m, c] : out.kept) {
      const double v = us ? c->us : c->default_us;
      if (!(v > 0)) continue;
      if (text.size() > 1) text += ", ";
      text += '"';
      text.append(num, std::to_chars(num, num + sizeof num, m).ptr);
      text += "\": ";
      dispatch::core::json_append_double(text, std::round(v * 1000.0) / 1000.0);
    }
    return text + "}";
  }

  // The canonical table: the metadata first, then the rows by ascending M.
  void render(const Table& t) {
    dispatch::core::JsonWriter w;
    w.begin_object().field("tool", std::string("kdispatch ") + dispatch::version()).key("schema").begin_object();
    for (const auto& [variant, ver] : t.schema) w.field(variant, ver);
    w.end_object().key("fingerprint").json(source_fp);
    for (const bool us : {true, false}) w.key(us ? "us" : "default_us").json(times_map(us));
    {  // each kept row's record (store/row_meta.hpp), as the tuner wrote it
      static const dispatch::store::RowMeta kNone;
      std::vector<std::pair<int64_t, const dispatch::store::RowMeta*>> metas;
      bool any = false;
      for (const auto& [m, c] : out.kept) {
        metas.emplace_back(m, c->meta ? c->meta.get() : &kNone);
        any = any || c->meta;
      }
      if (any) dispatch::store::write_row_meta(w, metas);
    }
    w.key("merged").begin_object().field("sources", static_cast<int64_t>(o.sources.size()));
    if (o.retime && out.conflicts) {
      // Who timed the "retimed_us" of the conflicts: this host, device and build.
      w.key("retimed").begin_object();
      w.field("host", host_name())
          .field("device", std::string(dispatch::device_type_name(rtab.backend)) + ":0")
          .field("device_name", rtab.device_name)
          .field("tool", std::string("kdispatch ") + dispatch::version());
      w.key("fingerprint").json(timing_fingerprint.empty() ? std::string("null") : timing_fingerprint);
      w.field("same_fingerprint", timing_fingerprint == source_fp)
          .field("rounds", static_cast<int64_t>(kRetimeRounds))
          .field("reps", static_cast<int64_t>(retime->rt->options().tune.reps))
          .field("cold_cache", retime->rt->options().tune.cold_cache)
          .field("margin", margin);
      w.end_object();
    }
    if (out.conflicts) w.key("conflicts").json(conflicts.take());
    w.end_object().end_object();
    const std::string meta = w.take();
    size_t size = meta.size() + 32;
    for (const auto& [m, c] : out.kept) size += c->config.size() + 32;
    std::string& text = out.text;
    text.reserve(size);
    text += "{\n    \"kdispatch\": ";
    text += meta;
    char num[24];
    for (const auto& [m, c] : out.kept) {
      const auto r = std::to_chars(num, num + sizeof num, m);
      text += ",\n    \"";
      text.append(num, r.ptr);
      text += "\": ";
      text += c->config;
    }
    text += "\n}\n";
  }
};

}  // namespace

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  std::string h = ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("?");
  std::replace(h.begin(), h.end(), '/', '_');
  return h;
}

dispatch::Runtime* RetimeRuntime::get() {
  if (rt || !error.empty()) return rt.get();
  dispatch::RuntimeOptions ro;
  ro.load_shipped_configs = false;
  ro.tune.mode = dispatch::TuneMode::off;
  ro.tune.persist = false;
  ro.tune.load_cache = false;
  if (options->reps > 0) ro.tune.reps = options->reps;
  if (options->no_cold_cache) ro.tune.cold_cache = false;
  auto r = dispatch::Runtime::create(ro);
  if (!r.ok())
    error = r.status().to_string();
  else
    rt = std::move(*r);
  return rt.get();
}

std::string check_rows(const std::string& rel, Table* t, Inputs* in, bool* unchecked) {
  *unchecked = false;
  std::map<uint32_t, std::vector<size_t>> by_file;  // file -> its candidates
  for (size_t i = 0; i < t->cands.size(); ++i) by_file[t->cands[i].file].push_back(i);
  // Per distinct config text (rows share them): the Config, or why not one.
  std::unordered_map<std::string_view, std::pair<dispatch::Config, std::string>> configs;
  dom::parser parser;
  std::vector<std::string> why(t->cands.size());
  for (const auto& [fi, idx] : by_file) {
    std::vector<dispatch::TableRow> rows;
    std::vector<size_t> which, unconverted;
    rows.reserve(idx.size());
    which.reserve(idx.size());
    for (size_t i : idx) {
      const Candidate& c = t->cands[i];
      auto [it, fresh] = configs.try_emplace(c.config);
      if (fresh) it->second.second = config_of(parser, c.config, &it->second.first);
      if (!it->second.second.empty()) {
        unconverted.push_back(i);
        continue;
      }
      rows.push_back(dispatch::TableRow{c.m, &it->second.first});
      which.push_back(i);
    }
    auto r = dispatch::check_table_rows(rel, in->files[fi].schema, rows);
    if (!r.ok()) return "kdispatch validate skips it: " + r.status().message();
    *unchecked = !r->checked;
    for (const auto& [k, reason] : r->dropped) why[which[k]] = reason;
    for (const auto& [k, note] : r->defaulted)  // kept: served with the variant's defaults, as validate says
      in->notes.push_back(in->files[fi].path + ": M=" + std::to_string(t->cands[which[k]].m) + ": " + note +
                          "; row kept (as kdispatch validate reports it)");
    if (r->checked)
      for (size_t i : unconverted) why[i] = configs.at(t->cands[i].config).second;
  }
  if (std::all_of(why.begin(), why.end(), [](const std::string& w) { return w.empty(); })) return {};
  size_t kept = 0;
  for (size_t i = 0; i < t->cands.size(); ++i) {
    if (why[i].empty()) {
      if (kept != i) t->cands[kept] = std::move(t->cands[i]);
      ++kept;
      continue;
    }
    const Candidate& c = t->cands[i];
    in->dropped.push_back(in->files[c.file].path + ": M=" + std::to_string(c.m) + ": " + why[i] +
                          "; row dropped (as kdispatch validate drops it)");
    ++t->dropped;
  }
  t->cands.resize(kept);
  return {};
}

Merged merge_table(const std::string& rel, Table& t, const Inputs& in, const MergeOptions& o, double margin,
                   RetimeRuntime* retime) {
  TableMerge tm(rel, in, o, margin, retime, t.fingerprints.begin()->first);
  // By M; within an M, in reading order (sources in order, a main file
  // before its fragments): the picks below depend on neither.
  const auto by_m = [](const Candidate& a, const Candidate& b) { return a.m < b.m; };
  if (!std::is_sorted(t.cands.begin(), t.cands.end(), by_m))  // one file's rows are (the tuner writes them so)
    std::stable_sort(t.cands.begin(), t.cands.end(), by_m);
  tm.conflicts.begin_object();
  std::vector<const Candidate*> group;
  for (size_t i = 0; i < t.cands.size();) {
    size_t j = i;
    group.clear();
    while (j < t.cands.size() && t.cands[j].m == t.cands[i].m) group.push_back(&t.cands[j++]);
    tm.merge_m(t.cands[i].m, group.data(), group.size());
    i = j;
  }
  tm.conflicts.end_object();
  if (!tm.retime_refusal.empty()) {
    tm.out.refusal = tm.retime_refusal;
  } else if (!tm.unresolved.empty()) {
    std::string why = "different configs for the same M (";
    for (size_t i = 0; i < tm.unresolved.size(); ++i) why += (i ? ", " : "") + tm.unresolved[i];
    tm.out.refusal = why + "): pass --prefer to keep the first source's, or --retime to time them here";
  } else {
    tm.render(t);
  }
  return std::move(tm.out);
}

}  // namespace kdispatch_cli::merge_detail
