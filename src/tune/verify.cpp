// SPDX-License-Identifier: Apache-2.0
#include "tune/verify.hpp"

#include <algorithm>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <simdjson.h>

#include "backends/registry.hpp"
#include "core/json_write.hpp"
#include "backends/cpu/cpu_identity.hpp"
#include "store/bounded_read.hpp"
#include "store/fingerprint.hpp"
#include "store/private_fs.hpp"
#include "store/row_meta.hpp"
#include "store/write_all.hpp"

namespace dispatch::tune {
namespace fs = std::filesystem;
namespace {

constexpr const char* kVerifyDir = ".verify";  // hidden: the loader passes it over

double round4(double v) { return std::round(v * 1e4) / 1e4; }

// The identity as the file records it, in the writer's spacing (so a file
// read back compares equal).
std::string canonical(const std::string& json) {
  simdjson::dom::parser p;
  simdjson::dom::element e;
  if (p.parse(json).get(e) != simdjson::SUCCESS) return json;
  return store::row_meta_detail::restyled(e);
}

// Parses a verdict file's text into rows; false when it is not one or its
// identity is not `identity`.
bool parse_verdicts(const std::string& text, const std::string& identity, Verdicts* out) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.parse(text).get(doc) != simdjson::SUCCESS || !doc.is_object()) return false;
  simdjson::dom::element id;
  if (doc["identity"].get(id) != simdjson::SUCCESS || store::row_meta_detail::restyled(id) != canonical(identity))
    return false;
  simdjson::dom::object rows;
  if (doc["rows"].get(rows) != simdjson::SUCCESS) return true;
  for (auto [k, v] : rows) {
    if (!v.is_object()) continue;
    Verdict d;
    simdjson::dom::element e;
    if (v["config"].get(e) == simdjson::SUCCESS) d.config = store::row_meta_detail::restyled(e);
    int64_t i = 0, losses = 0, verifications = 0;
    if (v["losses"].get(losses) != simdjson::SUCCESS || v["verifications"].get(verifications) != simdjson::SUCCESS ||
        verifications < 0 || verifications > 1000000 || losses < 0 || losses > verifications)
      continue;  // not a verdict this library wrote: the row reads as unverified
    d.losses = static_cast<int32_t>(losses);
    d.verifications = static_cast<int32_t>(verifications);
    std::string_view s;
    if (v["last"].get(s) == simdjson::SUCCESS) d.last = std::string(s);
    if (v["source"].get(s) == simdjson::SUCCESS) d.source = std::string(s);
    for (auto [field, dst] :
         {std::pair<const char*, double*>{"ratio", &d.ratio}, {"aa_spread", &d.aa_spread}, {"margin", &d.margin}}) {
      double x = 0;
      if (v[field].get(x) == simdjson::SUCCESS)
        *dst = x;
      else if (v[field].get(i) == simdjson::SUCCESS)
        *dst = static_cast<double>(i);
    }
    out->rows[std::string(k)] = std::move(d);
  }
  return true;
}

std::string render_verdicts(const std::string& identity, const Verdicts& v) {
  std::string s = "{\n    \"identity\": " + canonical(identity) + ",\n    \"rows\": {";
  bool first = true;
  for (const auto& [id, d] : v.rows) {
    core::JsonWriter w;
    w.begin_object();
    w.key("config").json(d.config.empty() ? std::string("{}") : d.config);
    w.field("state", d.state()).field("losses", static_cast<int64_t>(d.losses));
    w.field("verifications", static_cast<int64_t>(d.verifications)).field("last", d.last);
    w.field("ratio", round4(d.ratio)).field("aa_spread", round4(d.aa_spread)).field("margin", d.margin);
    w.field("source", d.source).end_object();
    s += first ? "\n        " : ",\n        ";
    first = false;
    core::json_append_string(s, id);
    s += ": " + w.take();
  }
  return s + (first ? "}\n}\n" : "\n    }\n}\n");
}

}  // namespace

const char* outcome_name(Outcome o) noexcept {
  switch (o) {
    case Outcome::ahead: return "ahead";
    case Outcome::within_margin: return "within margin";
    case Outcome::lost: return "lost";
  }
  return "?";
}

Outcome judge(const SearchResult& r, double margin, double* mean_ratio) noexcept {
  if (mean_ratio) *mean_ratio = 0.0;
  if (r.tried.size() >= 2 && !r.tried[1].status.ok()) return Outcome::lost;  // the row fails here
  if (r.challenger_not_in_graph) return Outcome::lost;                       // ... or cannot run in a graph here
  if (!r.confirmed || r.confirm_ratios.empty()) return Outcome::within_margin;
  // Per timing mode (cold; the graph mode where it ran): the mean of row /
  // floor, and whether the floor won by the margin the way a winner must
  // (faster on every placement and by more than the margin on the mean of
  // floor / row). The row's ratio is its worse mode's.
  bool lost = false;
  double worst = 0;
  for (const std::vector<double>* ratios : {&r.confirm_ratios, &r.graph_ratios}) {
    if (ratios->empty()) continue;
    double mean = 0, inverse = 0;
    bool slower_everywhere = true;
    for (double x : *ratios) {
      mean += x / static_cast<double>(ratios->size());
      inverse += (x > 0 ? 1.0 / x : 0.0) / static_cast<double>(ratios->size());
      slower_everywhere = slower_everywhere && x > 1.0;
    }
    worst = std::max(worst, mean);
    lost = lost || (slower_everywhere && inverse <= 1.0 - margin);
  }
  if (mean_ratio) *mean_ratio = worst;
  if (!r.kept_default)
    return Outcome::ahead;  // the rule that admits a winner: both modes, every placement, by the margin
  return lost ? Outcome::lost : Outcome::within_margin;
}

std::string Verdict::state() const {
  if (demoted()) return "demoted";
  if (losses == 1) return "lost once";
  if (last == "ahead") return "ahead";
  return "within margin";
}

std::string row_id(const std::string& key, int64_t m) { return key + " M=" + std::to_string(m); }

std::string verdict_identity(DeviceType backend) {
  const store::Fingerprint* fp = store::backend_fingerprint(backend);
  if (!fp) return {};
  core::JsonWriter w;
  w.begin_object().key("fingerprint").json(fp->to_json());
  if (core::is_host(backend)) w.key("cpu").json(host_cpu_identity().to_json());
  w.end_object();
  return w.take();
}

std::string verdict_path(const std::string& cache_dir, DeviceType backend, const std::string& identity) {
  const std::string id = canonical(identity);
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(id.data(), id.size())));
  return (fs::path(cache_dir) / kVerifyDir / (std::string(device_type_name(backend)) + "-" + hex + ".json")).string();
}

const Verdict* Verdicts::find(const std::string& id, const std::string& config) const {
  const auto it = rows.find(id);
  return it == rows.end() || it->second.config != config ? nullptr : &it->second;
}

Verdicts load_verdicts(const std::string& path, const std::string& identity) noexcept {
  Verdicts out;
  try {
    if (identity.empty()) return out;
    // Not through a symlinked .verify dir, as record_verdict never writes
    // through one (open_dir_below): a verdict read is one this library wrote.
    std::error_code ec;
    if (fs::symlink_status(fs::path(path).parent_path(), ec).type() == fs::file_type::symlink) return out;
    store::BoundedRead opt;
    opt.nofollow = true;
    std::string text, why;
    if (store::read_bounded(path, &text, opt, &why) != store::ReadError::ok) return out;
    if (!parse_verdicts(text, identity, &out)) out.rows.clear();
  } catch (...) {
    out.rows.clear();
  }
  return out;
}

void apply_outcome(Verdict* v, const std::string& config, Outcome o, double ratio, double aa_spread, double margin,
                   const std::string& source) {
  if (v->config != config) *v = Verdict{};  // another config's verdict: this row starts afresh
  v->config = config;
  ++v->verifications;
  if (o == Outcome::lost) ++v->losses;
  if (o == Outcome::ahead) v->losses = 0;  // a win resets the count
  v->last = outcome_name(o);
  v->ratio = ratio;
  v->aa_spread = aa_spread;
  v->margin = margin;
  v->source = source;
}

Verdict MemoryVerdicts::record(DeviceType backend, const std::string& id, const std::string& config, Outcome o,
                               double ratio, double aa_spread, double margin, const std::string& source) {
  std::lock_guard<std::mutex> lock(mu_);
  Verdict& d = rows_[{backend, id}];
  apply_outcome(&d, config, o, ratio, aa_spread, margin, source);
  return d;
}

Verdicts MemoryVerdicts::of(DeviceType backend) const {
  Verdicts out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [k, v] : rows_)
    if (k.first == backend) out.rows.emplace(k.second, v);
  return out;
}

Result<Verdict> record_verdict(const std::string& cache_dir, DeviceType backend, const std::string& identity,
                               const std::string& id, const std::string& config, Outcome o, double ratio,
                               double aa_spread, double margin, const std::string& source) noexcept {
  try {
    if (identity.empty())
      return make_status(StatusCode::unsupported_device,
                         "no fingerprint for the " + std::string(device_type_name(backend)) + " backend");
    const std::string path = verdict_path(cache_dir, backend, identity);
    const std::string name = fs::path(path).filename().string();
    store::DirFd dir;
    if (Status s = store::open_dir_below(cache_dir, kVerifyDir, &dir); !s.ok()) return s;
    store::FileLock lock;
    if (Status s = store::FileLock::acquire(dir.get(), "." + name + ".lock",
                                            (fs::path(path).parent_path() / ("." + name + ".lock")).string(), &lock);
        !s.ok())
      return s;
    Verdicts v;
    {
      store::BoundedRead opt;
      opt.nofollow = true;
      opt.shown = path;
      std::string text, why;
      const store::ReadError e = store::read_bounded_at(dir.get(), name, &text, opt, &why);
      if (e == store::ReadError::symlink || e == store::ReadError::not_regular)
        return make_status(StatusCode::io_error,
                           "'" + path + "' is not a regular file: verdicts are not written over it");
      if (e == store::ReadError::ok && !parse_verdicts(text, identity, &v))
        v.rows.clear();  // another identity's: replaced
    }
    Verdict& d = v.rows[id];
    apply_outcome(&d, config, o, ratio, aa_spread, margin, source);
    const Verdict out = d;
    const std::string text = render_verdicts(identity, v);
    const std::string tmp = store::temp_name_for(name);
    const int fd = ::openat(dir.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return make_status(StatusCode::io_error, "cannot create a temp file beside '" + path + "'");
    if (!store::write_all(fd, text) || ::fsync(fd) != 0) {
      ::close(fd);
      ::unlinkat(dir.get(), tmp.c_str(), 0);
      return make_status(StatusCode::io_error, "cannot write a temp file beside '" + path + "'");
    }
    ::close(fd);
    if (::renameat(dir.get(), tmp.c_str(), dir.get(), name.c_str()) != 0) {
      ::unlinkat(dir.get(), tmp.c_str(), 0);
      return make_status(StatusCode::io_error, "cannot rename into '" + path + "'");
    }
    ::fsync(dir.get());
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "recording a verdict");
  } catch (const std::exception& e) {
    return make_status(StatusCode::io_error, std::string("recording a verdict: ") + e.what());
  }
}

}  // namespace dispatch::tune
