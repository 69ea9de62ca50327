// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch report` (issue 32, item 6): one self-contained
// HTML file (inline CSS and SVG; no JavaScript, no external resource) of
// what the tuning measured, per op and shape: time against M for the floor,
// the served plan and, where a benchmark measured one, the peer, with the
// ceilings where they were measured; a heat map of served ÷ floor over
// (shape, M); every row with its margin, A/A spread and why; the rows that
// lost to the floor; a regret histogram where two tunes of a (shape, M)
// exist.
//
// Inputs, each told by its content (never by its name):
//   - a config table (<backend>/<op>/<key>.json, as `tune --emit` writes
//     it): the rows' "kdispatch" metadata gives per M the served time ("us")
//     and the floor's ("default_us", the incumbent the search raced), and
//     where present (store/row_meta.hpp writes them; older files have none)
//     the "margin" (and "margin_by_m"), per M "aa_spread", "timing" and
//     "why", and the "cpu" (and "cpu_by_m"); a dir is walked for such
//     tables (its fragments <key>.json.d/*.json are rows of <key>.json);
//   - `kdispatch tune --json` output: its tuned results, and its "ceilings"
//     where the tuner measured them;
//   - the bench scripts' JSON (bench/gpu/): bench_any_model.py and
//     bench_fp8.py ("rows"), bench_gpu.py ("gemm", "norms") and
//     bench_silu.py ("silu"), whose peer (torch's call, Triton) and measured
//     read ceilings are the charts' peer and ceiling series.
// A file named on the command line that is none of these is a usage error
// naming it (exit 2); inside a dir, foreign JSON is listed and passed over,
// and a file that cannot be read or parsed is listed and makes the exit
// code 1 (the report is still written). Every file goes through the bounded
// reader (store/bounded_read.hpp). Ceilings are only ever measured numbers
// from the inputs: none is built in.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <simdjson.h>

#include "cli/cli.hpp"
#include "cli/op_util.hpp"
#include "core/dtype_table.hpp"
#include "dispatch/runtime.hpp"
#include "store/batch_key.hpp"
#include "store/bounded_read.hpp"

namespace kdispatch_cli {
namespace {

namespace fs = std::filesystem;
namespace dom = simdjson::dom;
namespace store = dispatch::store;

constexpr const char* kCmd = "kdispatch report";
// A config dir is walked as the loader walks one (docs/config-files.md#limits).
constexpr int kMaxDepth = 16;
constexpr size_t kMaxFiles = 100000;

// ---------------------------------------------------------------- the data

/// One input of the command line (a dir, a file).
struct Source {
  std::string name;  ///< as given
  std::string kind;  ///< "config dir", "config table", "tune --json", "bench_any_model.py", ...
  size_t tables = 0, untimed_tables = 0, records = 0, duplicates = 0;
  std::vector<std::string> skipped;  ///< "<file>: why", files of a dir passed over
  bool tune = false;                 ///< its served times are a tune's (for the regret)
};

/// One measurement of one (device, op, shape, M) by one input.
struct Record {
  size_t source = 0;
  std::string device, op, shape;  ///< shape: the key's fields but device_name, canonical order
  int64_t m = 0;
  double served = 0, floor = 0, peer = 0, ceiling = 0;  ///< µs; 0 = not measured
  double aa = -1, margin = -1;                          ///< fractions; < 0 = not recorded
  std::string variant, why, timing, peer_name, cpu;
};

/// The read/compute ceilings a tuner measured on one device.
struct Ceilings {
  size_t source = 0;
  double read_gbps = 0;                            ///< GB/s; 0 = not measured
  double compute_tflops = 0;                       ///< TFLOP/s of every dtype; 0 = not measured
  std::map<std::string, double> compute_by_dtype;  ///< TFLOP/s per input dtype
};

struct Data {
  std::vector<Source> sources;
  std::vector<Record> records;
  std::map<std::string, Ceilings> ceilings;  ///< by device
  bool failed = false;                       ///< a file of a dir could not be read or parsed
};

// ---------------------------------------------------------------- helpers

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string us_text(double v) { return fmt("%.3f", v); }
std::string ratio_text(double v) { return fmt("%.3f", v); }
std::string pct_text(double f) { return fmt("%.1f", 100.0 * f) + "%"; }

void escape_into(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
}

std::string esc(std::string_view s) {
  std::string out;
  escape_into(out, s);
  return out;
}

// SGLang's spelling of a device name (spaces -> '_'), so a bench's
// torch.cuda.get_device_name() meets the tables' device_name.
std::string device_spelling(std::string s) {
  std::replace(s.begin(), s.end(), ' ', '_');
  return s;
}

bool number(dom::element e, double* out) {
  if (e.get(*out) == simdjson::SUCCESS) return true;
  int64_t i = 0;
  if (e.get(i) == simdjson::SUCCESS) return *out = static_cast<double>(i), true;
  uint64_t u = 0;
  if (e.get(u) == simdjson::SUCCESS) return *out = static_cast<double>(u), true;
  return false;
}

double number_at(dom::element e, std::string_view key, double fallback = 0) {
  dom::element v;
  double d = 0;
  if (e.is_object() && e[key].get(v) == simdjson::SUCCESS && number(v, &d)) return d;
  return fallback;
}

std::string string_at(dom::element e, std::string_view key) {
  dom::element v;
  std::string_view s;
  if (e.is_object() && e[key].get(v) == simdjson::SUCCESS && v.get(s) == simdjson::SUCCESS) return std::string(s);
  return {};
}

// The same of a member looked up (absent: the fallback; never an exception).
using Found = simdjson::simdjson_result<dom::element>;
double number_at(Found f, std::string_view key, double fallback = 0) {
  dom::element e;
  return f.get(e) == simdjson::SUCCESS ? number_at(e, key, fallback) : fallback;
}
std::string string_at(Found f, std::string_view key) {
  dom::element e;
  return f.get(e) == simdjson::SUCCESS ? string_at(e, key) : std::string();
}

bool int_at(dom::element e, std::string_view key, int64_t* out) {
  const double d = number_at(e, key, -1);
  if (!(d >= 1) || d != std::floor(d) || d > 9.0e15) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

// A CPU as a table records it ({"vendor", "family", "model", "name"}):
// "AMD EPYC 7763 (AuthenticAMD family 25 model 1)"; "" when not an object.
std::string cpu_text(dom::element c) {
  if (!c.is_object()) return {};
  const auto field = [&](const char* k) {
    dom::element v;
    if (c[k].get(v) != simdjson::SUCCESS || v.is_null()) return std::string();
    return v.is_string() ? std::string(std::string_view(v)) : simdjson::minify(v);
  };
  std::string id = field("vendor");
  for (const char* k : {"family", "model"})
    if (std::string v = field(k); !v.empty()) id += (id.empty() ? "" : " ") + std::string(k) + " " + v;
  const std::string name = field("name");
  if (name.empty()) return id;
  return id.empty() ? name : name + " (" + id + ")";
}
std::string cpu_text(Found f) {
  dom::element c;
  return f.get(c) == simdjson::SUCCESS ? cpu_text(c) : std::string();
}

// A "<M>": value map, M read as the loader reads a batch-size key.
template <class F>
void for_each_m(Found found, F&& f) {
  dom::object obj;
  if (found.get(obj) != simdjson::SUCCESS) return;
  for (auto [k, v] : obj) {
    int64_t m = 0;
    bool plain = false;
    if (store::parse_m_key(k, &m, &plain) != store::KeyInt::value || m < 1) continue;
    f(m, v);
  }
}

// "a=1,b=[1, 2],c=x" -> {a, 1}, {b, [1, 2]}, {c, x}: commas inside brackets
// are a value's (SGLang's block_shape).
std::vector<std::pair<std::string, std::string>> split_fields(std::string_view key) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= key.size(); ++i) {
    if (i < key.size() && key[i] == '[') ++depth;
    if (i < key.size() && key[i] == ']') --depth;
    if (i == key.size() || (key[i] == ',' && depth == 0)) {
      const std::string_view f = key.substr(start, i - start);
      const size_t eq = f.find('=');
      if (!f.empty()) {
        if (eq == std::string_view::npos)
          out.emplace_back(std::string(f), std::string());
        else
          out.emplace_back(std::string(f.substr(0, eq)), std::string(f.substr(eq + 1)));
      }
      start = i + 1;
    }
  }
  return out;
}

// The shape of a key: its fields but device_name, the op's dims first in
// file order (N, K), then the others by name, so a table's file name, a
// tune result's key (fields by name) and a bench point meet.
std::string canonical_shape(const std::string& op, std::vector<std::pair<std::string, std::string>> fields,
                            std::string* device) {
  std::vector<std::pair<std::string, std::string>> dims, rest;
  std::vector<std::string_view> order;
  if (const dispatch::OpInfo* info = find_op(op)) order = dims_in_file_order(*info);
  for (auto& f : fields) {
    if (f.first == "device_name") {
      if (device) *device = f.second;
      continue;
    }
    (std::find(order.begin(), order.end(), f.first) != order.end() ? dims : rest).push_back(std::move(f));
  }
  std::sort(dims.begin(), dims.end(), [&](const auto& a, const auto& b) {
    return std::find(order.begin(), order.end(), a.first) < std::find(order.begin(), order.end(), b.first);
  });
  if (!order.empty()) std::stable_sort(rest.begin(), rest.end());
  std::string s;
  for (const auto* part : {&dims, &rest})
    for (const auto& [k, v] : *part) s += (s.empty() ? "" : ",") + k + (v.empty() ? "" : "=" + v);
  return s;
}

// Compares text with digit runs as numbers ("N=896" before "N=4096").
bool natural_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = a[i] >= '0' && a[i] <= '9', db = b[j] >= '0' && b[j] <= '9';
    if (da && db) {
      size_t ie = i, je = j;
      while (ie < a.size() && a[ie] >= '0' && a[ie] <= '9') ++ie;
      while (je < b.size() && b[je] >= '0' && b[je] <= '9') ++je;
      std::string_view na = a.substr(i, ie - i), nb = b.substr(j, je - j);
      while (na.size() > 1 && na[0] == '0') na.remove_prefix(1);
      while (nb.size() > 1 && nb[0] == '0') nb.remove_prefix(1);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ie, j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i, ++j;
  }
  return a.size() - i < b.size() - j;
}

// ---------------------------------------------------------------- reading

enum class Kind { table, tune, bench_rows, bench_impls, none };

// What a parsed document is, by its content.
Kind kind_of(dom::element doc) {
  dom::object obj;
  if (doc.get(obj) != simdjson::SUCCESS) return Kind::none;
  dom::array arr;
  if (doc["results"].get(arr) == simdjson::SUCCESS &&
      (doc["emit"].error() == simdjson::SUCCESS || doc["device_name"].error() == simdjson::SUCCESS))
    return Kind::tune;
  if (doc["rows"].get(arr) == simdjson::SUCCESS) {
    bool ok = true;
    for (dom::element r : arr)
      if (!r.is_object() || r["M"].error() != simdjson::SUCCESS) ok = false;
    if (ok) return Kind::bench_rows;
  }
  for (const char* section : {"gemm", "norms", "silu"})
    if (doc[section].get(arr) == simdjson::SUCCESS && doc["meta"].is_object()) return Kind::bench_impls;
  // A table: batch-size rows (objects or null) and metadata, at least one
  // row or our "kdispatch" object.
  bool any = false;
  for (auto [k, v] : obj) {
    int64_t m = 0;
    bool plain = false;
    if (store::parse_m_key(k, &m, &plain) == store::KeyInt::value) {
      if (!v.is_object() && !v.is_null()) return Kind::none;
      any = true;
    } else if (k == "kdispatch") {
      if (!v.is_object()) return Kind::none;
      any = true;
    } else if (v.is_object() || v.is_array()) {
      return Kind::none;  // a table's other keys are scalar metadata (vLLM's "triton_version")
    }
  }
  return any ? Kind::table : Kind::none;
}

class Reader {
 public:
  explicit Reader(Data* d) : d_(d) {}

  /// One command-line input; -1 when read, else the exit code of a usage error.
  int input(const std::string& path) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st)) {
      std::fprintf(stderr, "%s: '%s' does not exist\n", kCmd, path.c_str());
      return kExitUsage;
    }
    Source src;
    src.name = path;
    d_->sources.push_back(src);
    const size_t si = d_->sources.size() - 1;
    if (fs::is_directory(st)) {
      d_->sources[si].kind = "config dir";
      walk(si, path);
      return -1;
    }
    std::string why;
    const Kind k = read_file(si, path, fs::path(path), /*in_dir=*/false, &why);
    if (k == Kind::none) {
      std::fprintf(stderr, "%s: '%s': %s\n", kCmd, path.c_str(), why.c_str());
      return kExitUsage;
    }
    return -1;
  }

 private:
  Data* d_;
  dom::parser parser_;
  // (device, op, shape, m) -> records, for duplicates across inputs.
  std::map<std::tuple<std::string, std::string, std::string, int64_t>, std::vector<size_t>> seen_;

  void walk(size_t si, const std::string& dir) {
    std::vector<fs::path> files;
    std::error_code ec;
    fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
    if (ec) {
      d_->sources[si].skipped.push_back(dir + ": cannot be read: " + ec.message());
      d_->failed = true;
      return;
    }
    for (; it != end; it.increment(ec)) {
      if (ec) {
        d_->sources[si].skipped.push_back(dir + ": the walk stopped: " + ec.message());
        d_->failed = true;
        break;
      }
      const std::string name = it->path().filename().string();
      std::error_code e2;
      if (!name.empty() && name[0] == '.') {  // editor and writer temp files, .claims
        if (it->is_directory(e2)) it.disable_recursion_pending();
        continue;
      }
      if (it->is_directory(e2)) {
        if (it.depth() >= kMaxDepth) {
          it.disable_recursion_pending();
          d_->sources[si].skipped.push_back(it->path().string() + ": deeper than " + std::to_string(kMaxDepth) +
                                            " levels: not read");
        }
        continue;
      }
      if (it->path().extension() != ".json") continue;
      if (files.size() == kMaxFiles) {
        d_->sources[si].skipped.push_back(dir + ": more than " + std::to_string(kMaxFiles) +
                                          " *.json files: the first " + std::to_string(kMaxFiles) + " are read");
        break;
      }
      files.push_back(it->path());
    }
    // A table before its fragments (<key>.json < <key>.json.d/...): within
    // one input the row read first is kept, as the loader serves it.
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      std::string why;
      const fs::path rel = f.lexically_relative(dir);
      if (read_file(si, f.string(), rel, /*in_dir=*/true, &why) == Kind::none)
        d_->sources[si].skipped.push_back(rel.generic_string() + ": " + why);
    }
  }

  // Reads one file; Kind::none with *why when it is none of the kinds (or
  // cannot be read). `rel`: its path below the input (backend/op/key.json).
  Kind read_file(size_t si, const std::string& path, const fs::path& rel, bool in_dir, std::string* why) {
    std::string data;
    store::BoundedRead opt;
    opt.padding = simdjson::SIMDJSON_PADDING;
    std::string err;
    if (store::read_bounded(path, &data, opt, &err) != store::ReadError::ok) {
      *why = err;
      d_->failed |= in_dir;
      return Kind::none;
    }
    dom::element doc;
    if (auto e = parser_.parse(data.data(), data.size() - simdjson::SIMDJSON_PADDING, false).get(doc);
        e != simdjson::SUCCESS) {
      *why = std::string("not JSON: ") + simdjson::error_message(e);
      d_->failed |= in_dir;
      return Kind::none;
    }
    const Kind k = kind_of(doc);
    Source& src = d_->sources[si];
    const auto set_kind = [&](const char* kind) {
      if (!in_dir) src.kind = kind;
    };
    switch (k) {
      case Kind::table:
        set_kind("config table");
        read_table(si, doc, rel);
        break;
      case Kind::tune:
        set_kind("tune --json");
        read_tune(si, doc);
        break;
      case Kind::bench_rows:
        set_kind("bench rows");
        read_bench_rows(si, doc);
        break;
      case Kind::bench_impls:
        set_kind("bench impls");
        read_bench_impls(si, doc);
        break;
      case Kind::none:
        *why =
            "not a kdispatch config table (batch-size rows with the \"kdispatch\" metadata), "
            "`kdispatch tune --json` output, nor a bench JSON (bench/gpu/: bench_any_model.py, bench_fp8.py, "
            "bench_gpu.py, bench_silu.py)";
        break;
    }
    return k;
  }

  void add(Record r) {
    Source& src = d_->sources[r.source];
    if (r.served <= 0 && r.floor <= 0 && r.peer <= 0) return;
    auto& same = seen_[{r.device, r.op, r.shape, r.m}];
    for (size_t i : same) {
      Record& o = d_->records[i];
      if (o.source == r.source) return;  // within one input the first row read stands
      // `tune --json` and the emit dir it wrote hold one measurement twice.
      if (o.served == r.served && o.floor == r.floor && o.peer == r.peer) {
        if (o.aa < 0) o.aa = r.aa;
        if (o.margin < 0) o.margin = r.margin;
        if (o.why.empty()) o.why = r.why;
        if (o.timing.empty()) o.timing = r.timing;
        ++src.duplicates;
        return;
      }
    }
    same.push_back(d_->records.size());
    ++src.records;
    d_->records.push_back(std::move(r));
  }

  void read_ceilings(size_t si, const std::string& device, simdjson::simdjson_result<dom::element> found) {
    dom::element c;
    if (found.get(c) != simdjson::SUCCESS || !c.is_object() || device.empty()) return;
    Ceilings ce;
    ce.source = si;
    ce.read_gbps = number_at(c, "read_gbps", number_at(c, "read_bytes_per_s") / 1e9);
    dom::element comp;
    if (c["compute_tflops"].get(comp) == simdjson::SUCCESS) {
      dom::object per_dtype;
      if (!number(comp, &ce.compute_tflops) && comp.get(per_dtype) == simdjson::SUCCESS)
        for (auto [k, v] : per_dtype) {
          double t = 0;
          if (number(v, &t) && t > 0) ce.compute_by_dtype[std::string(k)] = t;
        }
    } else {
      ce.compute_tflops = number_at(c, "compute_flops_per_s") / 1e12;
    }
    if (ce.read_gbps > 0 || ce.compute_tflops > 0 || !ce.compute_by_dtype.empty())
      d_->ceilings.emplace(device_spelling(device), ce);  // the first input that measured a device's stands
  }

  // <backend>/<op>/<key>.json, or a fragment <backend>/<op>/<key>.json.d/<name>.json.
  void read_table(size_t si, dom::element doc, const fs::path& rel) {
    Source& src = d_->sources[si];
    std::vector<std::string> parts;
    for (const auto& p : rel) parts.push_back(p.string());
    std::string key = parts.empty() ? std::string() : parts.back();
    size_t up = parts.size() - 1;  // the index of the table's own name
    if (parts.size() >= 2 && parts[parts.size() - 2].size() > 7 &&
        parts[parts.size() - 2].compare(parts[parts.size() - 2].size() - 7, 7, ".json.d") == 0) {
      key = parts[parts.size() - 2].substr(0, parts[parts.size() - 2].size() - 2);  // <key>.json
      up = parts.size() - 2;
    }
    if (key.size() > 5 && key.compare(key.size() - 5, 5, ".json") == 0) key.resize(key.size() - 5);
    std::string op = up >= 1 ? parts[up - 1] : std::string();
    if (!find_op(op)) {
      // A file named alone: its folder says its op when it is one.
      const fs::path parent = fs::absolute(rel).parent_path();
      op = find_op(parent.filename().string()) ? parent.filename().string() : std::string();
    }
    ++src.tables;
    dom::element kd;
    if (doc["kdispatch"].get(kd) != simdjson::SUCCESS || !kd.is_object() || !kd["us"].is_object()) {
      ++src.untimed_tables;
      return;
    }
    std::string device;
    const std::string shape = canonical_shape(op, split_fields(key), &device);
    std::map<int64_t, Record> rows;
    const auto row = [&](int64_t m) -> Record& {
      Record& r = rows[m];
      r.source = si, r.m = m, r.op = op, r.shape = shape, r.device = device;
      return r;
    };
    for_each_m(kd["us"], [&](int64_t m, dom::element v) { number(v, &row(m).served); });
    for_each_m(kd["default_us"], [&](int64_t m, dom::element v) {
      if (rows.count(m)) number(v, &rows[m].floor);
    });
    for_each_m(kd["aa_spread"], [&](int64_t m, dom::element v) {
      if (rows.count(m) && !number(v, &rows[m].aa)) rows[m].aa = -1;
    });
    // "timing" per M (the writer's), or one string for the file.
    const std::string timing = string_at(kd, "timing");
    for_each_m(kd["timing"], [&](int64_t m, dom::element v) {
      std::string_view s;
      if (rows.count(m) && v.get(s) == simdjson::SUCCESS) rows[m].timing = std::string(s);
    });
    for_each_m(kd["why"], [&](int64_t m, dom::element v) {
      std::string_view s;
      if (rows.count(m) && v.get(s) == simdjson::SUCCESS) rows[m].why = std::string(s);
    });
    // "margin" for the file, "margin_by_m" for rows tuned with another (null: not recorded).
    const double margin = number_at(kd, "margin", -1);
    std::map<int64_t, double> margin_by_m;
    for_each_m(kd["margin_by_m"], [&](int64_t m, dom::element v) {
      double x = -1;
      margin_by_m[m] = number(v, &x) ? x : -1;
    });
    // "cpu" for the file, "cpu_by_m" for rows tuned on another (null: not recorded).
    const std::string cpu = cpu_text(kd["cpu"]);
    std::map<int64_t, std::string> cpu_by_m;
    for_each_m(kd["cpu_by_m"], [&](int64_t m, dom::element v) { cpu_by_m[m] = cpu_text(v); });
    read_ceilings(si, device, kd["ceilings"]);
    for (auto& [m, r] : rows) {
      r.margin = margin_by_m.count(m) ? margin_by_m[m] : margin;
      if (r.timing.empty()) r.timing = timing;
      r.cpu = cpu_by_m.count(m) ? cpu_by_m[m] : cpu;
      dom::element cfg;
      if (doc[std::to_string(m)].get(cfg) == simdjson::SUCCESS) r.variant = string_at(cfg, "variant");
      add(std::move(r));
    }
  }

  void read_tune(size_t si, dom::element doc) {
    d_->sources[si].tune = true;
    const std::string device = string_at(doc, "device_name");
    read_ceilings(si, device, doc["ceilings"]);
    const double margin = number_at(doc, "margin", -1);
    const std::string timing = string_at(doc, "timing");
    dom::array results;
    if (doc["results"].get(results) != simdjson::SUCCESS) return;
    for (dom::element res : results) {
      if (string_at(res, "status") != "tuned") continue;
      Record r;
      r.source = si;
      if (!int_at(res, "M", &r.m)) continue;
      r.op = string_at(res, "op");
      // "<backend>/<op>|<device>|<fields by name>"
      const std::string key = string_at(res, "key");
      const size_t a = key.find('|'), b = a == std::string::npos ? a : key.find('|', a + 1);
      std::string fields = key;
      r.device = device;
      if (b != std::string::npos) {
        if (r.op.empty()) r.op = key.substr(key.find('/') + 1, a - key.find('/') - 1);
        r.device = key.substr(a + 1, b - a - 1);
        fields = key.substr(b + 1);
      } else if (key.empty()) {
        fields = string_at(res, "shape");
      }
      r.shape = canonical_shape(r.op, split_fields(fields), nullptr);
      r.device = device_spelling(r.device);
      r.served = number_at(res, "us");
      r.floor = number_at(res, "default_us");
      r.aa = number_at(res, "aa_spread", -1);
      r.margin = number_at(res, "margin", margin);
      r.why = string_at(res, "why");
      r.timing = string_at(res, "timing");
      if (r.timing.empty()) r.timing = timing;
      r.variant = string_at(res, "variant");
      add(std::move(r));
    }
  }

  // bench_any_model.py (kind, cold_kd_us, cold_floor_us, cold_torch_us,
  // cold_aa) and bench_fp8.py (layout, kdispatch_us, torch_scaled_mm_us,
  // triton_sglang_us, ceiling_us): {"rows": [...]}.
  void read_bench_rows(size_t si, dom::element doc) {
    const std::string device = device_spelling(string_at(doc, "device"));
    bool any_model = false, fp8 = false;
    dom::array rows;
    if (doc["rows"].get(rows) != simdjson::SUCCESS) return;
    for (dom::element row : rows) {
      if (row["error"].error() == simdjson::SUCCESS) continue;
      Record r;
      r.source = si;
      r.device = device;
      int64_t n = 0, k = 0;
      if (!int_at(row, "M", &r.m) || !int_at(row, "N", &n) || !int_at(row, "K", &k)) continue;
      const std::string kind = string_at(row, "kind"), layout = string_at(row, "layout");
      const std::string nk = "N=" + std::to_string(n) + ",K=" + std::to_string(k);
      const std::string lay = kind.empty() ? layout : kind;
      if (lay == "bf16" || lay == "fp16" || lay == "fp32") {
        r.op = "gemm";
        r.shape = nk + ",dtype=" + lay;
      } else if (!lay.empty()) {
        r.op = "gemm_fp8_" + lay;
        r.shape = nk + ",dtype=fp8_e4m3fn,out_dtype=bf16";
      } else {
        continue;
      }
      if (!kind.empty()) {
        any_model = true;
        const char* mode = number_at(row, "cold_kd_us") > 0 ? "cold" : "graph";
        const std::string p = mode;
        r.served = number_at(row, p + "_kd_us");
        r.floor = number_at(row, p + "_floor_us");
        r.peer = number_at(row, p + "_torch_us");
        r.peer_name = "torch";
        r.aa = number_at(row, p + "_aa", -1);
        r.timing = mode;
      } else {
        fp8 = true;
        r.served = number_at(row, "kdispatch_us");
        r.floor = number_at(row, "torch_scaled_mm_us");
        r.peer = number_at(row, "triton_sglang_us");
        r.peer_name = "triton_sglang";
        r.ceiling = number_at(row, "ceiling_us");
        r.timing = "cold";
      }
      r.variant = string_at(row, "kd_variant");
      add(std::move(r));
    }
    Source& src = d_->sources[si];
    if (src.kind == "bench rows") src.kind = any_model ? "bench_any_model.py" : fp8 ? "bench_fp8.py" : "bench rows";
  }

  // bench_gpu.py ("gemm", "norms") and bench_silu.py ("silu"): per point
  // "impls" {name: {"ok", "cold": {"us"}}}. Served: kdispatch (ours); the
  // floor: what torch calls; the peer: the fastest other implementation.
  void read_bench_impls(size_t si, dom::element doc) {
    const std::string device = device_spelling(string_at(doc["meta"], "device"));
    static const char* const kFloors[] = {"torch", "torch_F_rms_norm", "torch_2op", "eager"};
    bool silu = false;
    for (const char* section : {"gemm", "norms", "silu"}) {
      dom::array arr;
      if (doc[section].get(arr) != simdjson::SUCCESS) continue;
      silu |= std::string_view(section) == "silu" && arr.size() > 0;
      for (dom::element row : arr) {
        dom::element impls;
        if (row["impls"].get(impls) != simdjson::SUCCESS || !impls.is_object()) continue;
        Record r;
        r.source = si;
        r.device = device;
        r.timing = "cold";
        const std::string dtype = string_at(row, "dtype");
        int64_t a = 0, b = 0;
        if (std::string_view(section) == "gemm") {
          if (!int_at(row, "M", &r.m) || !int_at(row, "N", &a) || !int_at(row, "K", &b)) continue;
          r.op = "gemm";
          r.shape = "N=" + std::to_string(a) + ",K=" + std::to_string(b) + ",dtype=" + (dtype.empty() ? "bf16" : dtype);
          r.ceiling = number_at(row["ceiling"], "us");
        } else if (std::string_view(section) == "norms") {
          if (!int_at(row, "tokens", &r.m) || !int_at(row, "hidden", &a)) continue;
          r.op = string_at(row, "op");
          r.shape = "hidden=" + std::to_string(a) + ",dtype=" + dtype;
        } else {
          if (!int_at(row, "tokens", &r.m) || !int_at(row, "d", &a)) continue;
          r.op = "silu_and_mul";
          r.shape = "d=" + std::to_string(a) + ",dtype=" + dtype;
        }
        const auto cold = [&](std::string_view name) {
          dom::element e;
          if (impls[name].get(e) != simdjson::SUCCESS || !e.is_object()) return 0.0;
          bool ok = true;
          if (e["ok"].error() == simdjson::SUCCESS && e["ok"].get(ok) == simdjson::SUCCESS && !ok) return 0.0;
          return number_at(e["cold"], "us");
        };
        r.served = cold("kdispatch");
        if (r.served <= 0) r.served = cold("ours");
        std::string floor_name;
        for (const char* f : kFloors)
          if (double t = cold(f); t > 0) {
            r.floor = t, floor_name = f;
            break;
          }
        if (double c = cold("copy_same_bytes"); c > 0) r.ceiling = c;
        dom::object named;
        if (impls.get(named) != simdjson::SUCCESS) continue;
        for (auto [name, e] : named) {
          if (name.substr(0, 9) == "kdispatch" || name == "ours" || name == floor_name || name == "copy_same_bytes")
            continue;
          const double t = cold(name);
          if (t > 0 && (r.peer <= 0 || t < r.peer)) r.peer = t, r.peer_name = std::string(name);
          (void)e;
        }
        dom::element served;
        if (impls["kdispatch"].get(served) == simdjson::SUCCESS) r.variant = string_at(served["served"], "variant");
        if (r.variant.empty()) r.variant = string_at(row, "served");
        add(std::move(r));
      }
    }
    Source& src = d_->sources[si];
    if (src.kind == "bench impls") src.kind = silu ? "bench_silu.py" : "bench_gpu.py";
  }
};

// ---------------------------------------------------------------- the model of a page

struct Group {
  std::string device, op, shape, cpu;
  std::vector<size_t> recs;  ///< by M, then input order
};

std::string group_label(const Group& g) {
  return (g.op.empty() ? std::string("(op unknown)") : g.op) + " " + g.shape +
         (g.device.empty() ? std::string() : " · " + g.device);
}

// Bytes per element of a key's dtype: the dtype table's, by canonical name;
// 1 for another fp8 spelling (an engine's "fp8_w8a8"); 0 when unknown.
double elem_bytes(const std::string& dtype) {
  for (const dispatch::core::DTypeInfo& d : dispatch::core::kDTypes)
    if (d.name == dtype) return d.bytes;
  return dtype.rfind("fp8", 0) == 0 ? 1 : 0;
}

// The roofline of one call: max(bytes / read, flops / compute), µs; 0 when
// the device has no ceilings or the op no byte count here.
double roofline_us(const Group& g, int64_t m, const std::map<std::string, Ceilings>& all) {
  const auto it = all.find(g.device);
  if (it == all.end()) return 0;
  const Ceilings& c = it->second;
  std::map<std::string, std::string> f;
  for (auto& [k, v] : split_fields(g.shape)) f[k] = v;
  const auto dim = [&](const char* k) { return f.count(k) ? std::atof(f[k].c_str()) : 0.0; };
  const std::string dtype = f["dtype"];
  const double e = elem_bytes(dtype);
  const double eo = f.count("out_dtype") ? elem_bytes(f["out_dtype"]) : g.op.rfind("gemm_fp8", 0) == 0 ? 2 : e;
  const double M = static_cast<double>(m);
  double bytes = 0, flops = 0;
  if (e <= 0 || eo <= 0) return 0;
  if (g.op == "gemm" || g.op.rfind("gemm_fp8", 0) == 0) {
    const double N = dim("N"), K = dim("K");
    bytes = (M * K + N * K) * e + M * N * eo + (f["bias"] == "true" ? N * eo : 0);
    flops = 2 * M * N * K;
  } else if (g.op == "rmsnorm") {
    bytes = (2 * M + 1) * dim("hidden") * e;
  } else if (g.op == "fused_add_rmsnorm") {
    bytes = (4 * M + 1) * dim("hidden") * e;
  } else if (g.op == "silu_and_mul") {
    bytes = M * dim("d") * (2 * e + eo);
  }
  if (bytes <= 0) return 0;
  double t = c.read_gbps > 0 ? bytes / (c.read_gbps * 1e3) : 0;  // GB/s -> bytes/µs
  double tflops = c.compute_tflops;
  if (const auto d = c.compute_by_dtype.find(dtype); d != c.compute_by_dtype.end()) tflops = d->second;
  if (flops > 0 && tflops > 0) t = std::max(t, flops / (tflops * 1e6));  // TFLOP/s -> flop/µs
  return t;
}

// ---------------------------------------------------------------- SVG

constexpr int kW = 300, kH = 170, kX0 = 46, kX1 = 292, kY0 = 8, kY1 = 144;
// Served lines take the colour of their input (the inputs table shows it).
constexpr const char* kPalette[] = {"#1565c0", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457", "#4e342e"};

std::string num_label(double v) {
  if (v >= 1e6) return fmt("%.0fM", v / 1e6);
  if (v >= 10000) return fmt("%.0fk", v / 1e3);
  if (v >= 1) return fmt("%.4g", v);
  return fmt("%.2g", v);
}

struct Axis {
  double lo = 0, hi = 1;  // log10 of the bounds
  double at(double v, int p0, int p1) const { return p0 + (std::log10(v) - lo) / (hi - lo) * (p1 - p0); }
};

Axis axis_of(double mn, double mx, double pad) {
  Axis a;
  a.lo = std::log10(mn), a.hi = std::log10(mx);
  if (a.hi - a.lo < 1e-9) a.lo -= 0.15, a.hi += 0.15;
  const double span = a.hi - a.lo;
  a.lo -= span * pad, a.hi += span * pad;
  return a;
}

// One series: a polyline and a dot per point (a lone point shows too).
void series(std::string& out, const char* cls, const char* colour, const std::vector<std::pair<double, double>>& pts,
            const Axis& ax, const Axis& ay) {
  if (pts.empty()) return;
  std::string pl, dots;
  for (const auto& [m, t] : pts) {
    const int x = static_cast<int>(std::lround(ax.at(m, kX0, kX1)));
    const int y = static_cast<int>(std::lround(ay.at(t, kY1, kY0)));
    pl += (pl.empty() ? "" : " ") + std::to_string(x) + "," + std::to_string(y);
    dots += "M" + std::to_string(x) + " " + std::to_string(y) + "h0";
  }
  const std::string style = colour ? std::string(" style=\"stroke:") + colour + "\"" : std::string();
  if (pts.size() > 1) out += "<polyline class=\"" + std::string(cls) + "\"" + style + " points=\"" + pl + "\"/>";
  out += "<path class=\"d " + std::string(cls) + "\"" + style + " d=\"" + dots + "\"/>";
}

std::string chart(const Group& g, const Data& d) {
  // The series, per input: served, floor, peer, and the measured ceilings.
  struct Lines {
    std::vector<std::pair<double, double>> served, floor, peer, ceiling;
  };
  std::map<size_t, Lines> by_source;
  std::set<int64_t> ms;
  double tmin = 0, tmax = 0;
  // A time outside [1e-6, 1e9] µs (or not finite) is not drawn: one such
  // value would stretch the axis over hundreds of decades.
  const auto ok = [](double t) { return std::isfinite(t) && t >= 1e-6 && t <= 1e9; };
  const auto see = [&](double t) {
    if (!ok(t)) return;
    tmin = tmin <= 0 ? t : std::min(tmin, t);
    tmax = std::max(tmax, t);
  };
  for (size_t i : g.recs) {
    const Record& r = d.records[i];
    Lines& l = by_source[r.source];
    const double m = static_cast<double>(r.m);
    ms.insert(r.m);
    if (ok(r.served)) l.served.emplace_back(m, r.served);
    if (ok(r.floor)) l.floor.emplace_back(m, r.floor);
    if (ok(r.peer)) l.peer.emplace_back(m, r.peer);
    if (ok(r.ceiling)) l.ceiling.emplace_back(m, r.ceiling);
    for (double t : {r.served, r.floor, r.peer, r.ceiling}) see(t);
  }
  std::vector<std::pair<double, double>> roof;
  for (int64_t m : ms)
    if (double t = roofline_us(g, m, d.ceilings); ok(t)) roof.emplace_back(static_cast<double>(m), t), see(t);
  if (ms.empty() || tmax <= 0) return {};
  const Axis ax = axis_of(static_cast<double>(*ms.begin()), static_cast<double>(*ms.rbegin()), 0.04);
  const Axis ay = axis_of(tmin, tmax, 0.08);

  std::string s = "<svg viewBox=\"0 0 " + std::to_string(kW) + " " + std::to_string(kH) + "\" width=\"" +
                  std::to_string(kW) + "\" height=\"" + std::to_string(kH) + "\" role=\"img\"><title>" +
                  esc(group_label(g)) + ": µs against M</title>";
  // Grid and tick labels: powers of 2 on M (at most 7 labelled), 1-2-5 on µs.
  std::string grid, labels;
  const int m_lo = static_cast<int>(std::floor(std::log2(static_cast<double>(*ms.begin())) + 1e-9));
  const int m_hi = static_cast<int>(std::ceil(std::log2(static_cast<double>(*ms.rbegin())) - 1e-9));
  const int step = std::max(1, (m_hi - m_lo + 6) / 7);
  for (int e = m_lo; e <= m_hi; e += step) {
    const double v = std::ldexp(1.0, e);
    const int x = static_cast<int>(std::lround(ax.at(v, kX0, kX1)));
    if (x < kX0 || x > kX1) continue;
    grid += "M" + std::to_string(x) + " " + std::to_string(kY0) + "V" + std::to_string(kY1);
    labels +=
        "<text x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(kY1 + 12) + "\">" + num_label(v) + "</text>";
  }
  std::vector<double> yt;
  for (int e = static_cast<int>(std::floor(ay.lo)) - 1; e <= static_cast<int>(std::ceil(ay.hi)); ++e)
    for (double k : {1.0, 2.0, 5.0}) {
      const double v = k * std::pow(10.0, e);
      if (std::log10(v) >= ay.lo && std::log10(v) <= ay.hi) yt.push_back(v);
    }
  if (yt.size() > 6) {
    std::vector<double> ones;
    for (double v : yt)
      if (std::fabs(v / std::pow(10.0, std::floor(std::log10(v) + 1e-9)) - 1.0) < 1e-6) ones.push_back(v);
    yt = ones.size() >= 2 ? ones : std::vector<double>{yt.front(), yt.back()};
  }
  if (yt.empty()) yt = {tmin, tmax};
  for (double v : yt) {
    const int y = static_cast<int>(std::lround(ay.at(v, kY1, kY0)));
    grid += "M" + std::to_string(kX0) + " " + std::to_string(y) + "H" + std::to_string(kX1);
    labels += "<text class=\"y\" x=\"" + std::to_string(kX0 - 3) + "\" y=\"" + std::to_string(y + 3) + "\">" +
              num_label(v) + "</text>";
  }
  s += "<path class=\"g\" d=\"" + grid + "\"/><path class=\"ax\" d=\"M" + std::to_string(kX0) + " " +
       std::to_string(kY0) + "V" + std::to_string(kY1) + "H" + std::to_string(kX1) + "\"/>" + labels;
  s += "<text x=\"" + std::to_string(kX1) + "\" y=\"" + std::to_string(kH - 2) + "\" class=\"u\">M</text>";
  s += "<text x=\"2\" y=\"" + std::to_string(kY0 + 4) + "\" class=\"u l\">µs</text>";
  series(s, "ce", nullptr, roof, ax, ay);
  for (const auto& [src, l] : by_source) {
    series(s, "ce", nullptr, l.ceiling, ax, ay);
    series(s, "fl", nullptr, l.floor, ax, ay);
    series(s, "pe", nullptr, l.peer, ax, ay);
    series(s, "sv", kPalette[src % std::size(kPalette)], l.served, ax, ay);
  }
  return s + "</svg>";
}

// White -> green below 1 (darkest at <= 0.8), white -> red above (darkest at >= 1.25).
std::string heat_colour(double ratio) {
  double t = std::log(ratio) / std::log(ratio < 1 ? 0.8 : 1.25);
  t = std::clamp(t, 0.0, 1.0);
  const int g[3] = {46, 125, 50}, r[3] = {198, 40, 40};
  const int* to = ratio < 1 ? g : r;
  char b[8];
  int c[3];
  for (int i = 0; i < 3; ++i) c[i] = static_cast<int>(std::lround(255 + (to[i] - 255) * t * 0.75));
  std::snprintf(b, sizeof b, "#%02x%02x%02x", c[0], c[1], c[2]);
  return b;
}

const char* kStyle =
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}"
    "h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}"
    "table{border-collapse:collapse;font-size:12px}td,th{padding:1px 6px;border:1px solid #ddd;text-align:right}"
    "th{background:#f4f4f4}td.t,th.t{text-align:left}tr.lost td{color:#b71c1c}.na{background:#fafafa}"
    ".cs{display:flex;flex-wrap:wrap;gap:10px}figure{margin:0;border:1px solid #eee;padding:4px}"
    "figcaption{font-size:11px;max-width:300px;word-break:break-all}"
    "svg text{font-size:9px;text-anchor:middle;fill:#444}svg text.y{text-anchor:end}svg text.u{text-anchor:end}"
    "svg text.l{text-anchor:start}"
    ".g{stroke:#eee;fill:none}.ax{stroke:#999;fill:none}polyline,path.d{fill:none}"
    ".sv{stroke-width:1.6}.fl{stroke:#555;stroke-dasharray:4 3}.pe{stroke:#ef6c00;stroke-dasharray:1 2}"
    ".ce{stroke:#999;stroke-width:1;stroke-dasharray:6 2 1 2}path.d{stroke-width:4;stroke-linecap:round;"
    "stroke-dasharray:none}path.ce{stroke-width:2}"
    ".k{display:inline-block;width:22px;height:0;border-top:2px solid;vertical-align:middle;margin:0 4px}"
    ".bar{fill:#5c6bc0}.note{color:#666}";

std::string legend_key(const char* style) { return "<span class=\"k\" style=\"" + std::string(style) + "\"></span>"; }

// ---------------------------------------------------------------- the page

// What the sections share: the heat map's cells, the counts, the regrets.
struct Page {
  const Data& d;
  const std::vector<Group>& groups;
  std::string h;
  std::set<int64_t> all_ms;
  /// Per group and M, the first input's measurement with both times.
  std::vector<std::map<int64_t, const Record*>> cells;
  double log_sum = 0;
  size_t n_ratio = 0, n_lost = 0, n_beyond = 0, n_floor_kept = 0;
  struct Regret {
    const Group* g;
    int64_t m;
    const Record *fast, *slow;
    double value;
  };
  std::vector<Regret> regrets;

  Page(const Data& data, const std::vector<Group>& gs) : d(data), groups(gs), cells(gs.size()) {
    h.reserve(1 << 20);
    for (size_t gi = 0; gi < groups.size(); ++gi)
      for (size_t i : groups[gi].recs) {
        const Record& r = d.records[i];
        all_ms.insert(r.m);
        if (!(r.served > 0 && r.floor > 0)) continue;
        if (!cells[gi].count(r.m)) {
          cells[gi][r.m] = &r;
          log_sum += std::log(r.served / r.floor), ++n_ratio;
          n_floor_kept += r.served == r.floor;
        }
        if (r.served > r.floor) ++n_lost, n_beyond += r.aa >= 0 && r.served / r.floor - 1 > r.aa;
      }
    // Regret: a (shape, M) two inputs tuned (tables, tune --json; a
    // benchmark tunes nothing), each with its own served time.
    for (const Group& g : groups) {
      std::map<int64_t, std::vector<const Record*>> by_m;
      for (size_t i : g.recs) {
        const Record& r = d.records[i];
        const Source& s = d.sources[r.source];
        if ((s.tune || s.kind == "config dir" || s.kind == "config table") && r.served > 0) by_m[r.m].push_back(&r);
      }
      for (auto& [m, rs] : by_m) {
        if (rs.size() < 2) continue;
        const auto [lo, hi] = std::minmax_element(
            rs.begin(), rs.end(), [](const Record* a, const Record* b) { return a->served < b->served; });
        regrets.push_back({&g, m, *lo, *hi, (*hi)->served / (*lo)->served - 1});
      }
    }
  }

  void head(const std::string& title) {
    h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + esc(title) + "</title>\n<style>" +
         kStyle + "</style></head><body>\n<h1>" + esc(title) + "</h1>\n";
    h += "<p class=\"note\">Written by kdispatch " + esc(dispatch::version()) +
         " (<code>kdispatch report</code>). Times in µs; served ÷ floor below 1: the served plan is faster than the "
         "floor (the plan the engine runs without kdispatch, which every search races).</p>\n";
    h += "<p><a href=\"#summary\">Summary</a> · <a href=\"#inputs\">Inputs</a> · <a href=\"#charts\">Time against "
         "M</a> · <a href=\"#heat\">Served ÷ floor</a> · <a href=\"#lost\">Lost to the floor</a> · <a "
         "href=\"#regret\">Regret</a> · <a href=\"#rows\">Every row</a></p>\n";
  }

  void summary() {
    size_t tables = 0, untimed = 0, dups = 0, skipped = 0;
    for (const Source& s : d.sources)
      tables += s.tables, untimed += s.untimed_tables, dups += s.duplicates, skipped += s.skipped.size();
    h += "<h2 id=\"summary\">Summary</h2>\n<table>";
    const auto kv = [&](const std::string& k, const std::string& v) {
      h += "<tr><th class=\"t\">" + k + "</th><td class=\"t\">" + v + "</td></tr>";
    };
    kv("inputs", std::to_string(d.sources.size()));
    kv("config tables", std::to_string(tables) + (untimed ? " (" + std::to_string(untimed) + " without timings)" : ""));
    kv("shapes (device, op, key)", std::to_string(groups.size()));
    kv("measured rows",
       std::to_string(d.records.size()) + (dups ? " (" + std::to_string(dups) + " read twice, counted once)" : ""));
    kv("(shape, M) with served and floor", std::to_string(n_ratio));
    kv("geomean served ÷ floor", n_ratio ? ratio_text(std::exp(log_sum / static_cast<double>(n_ratio))) : "—");
    kv("floor kept (served = floor)", std::to_string(n_floor_kept));
    kv("lost to the floor",
       std::to_string(n_lost) + (n_lost ? " (" + std::to_string(n_beyond) + " beyond their A/A spread)" : ""));
    kv("(shape, M) tuned twice", std::to_string(regrets.size()));
    if (skipped) kv("files passed over", std::to_string(skipped));
    h += "</table>\n";
  }

  void inputs() {
    h += "<h2 id=\"inputs\">Inputs</h2>\n<table><tr><th>#</th><th class=\"t\">input</th><th class=\"t\">kind</th>"
         "<th>tables</th><th>rows</th><th class=\"t\">served line</th></tr>";
    for (size_t i = 0; i < d.sources.size(); ++i) {
      const Source& s = d.sources[i];
      h += "<tr><td>" + std::to_string(i + 1) + "</td><td class=\"t\">" + esc(s.name) + "</td><td class=\"t\">" +
           esc(s.kind) + "</td><td>" + std::to_string(s.tables) + "</td><td>" + std::to_string(s.records) +
           "</td><td class=\"t\">" + legend_key((std::string("color:") + kPalette[i % std::size(kPalette)]).c_str()) +
           "</td></tr>";
    }
    h += "</table>\n";
    for (const Source& s : d.sources)
      if (!s.skipped.empty()) {
        h += "<p>Passed over in " + esc(s.name) + ":</p><ul>";
        for (const std::string& why : s.skipped) h += "<li>" + esc(why) + "</li>";
        h += "</ul>\n";
      }
    if (d.ceilings.empty()) return;
    h += "<h3 id=\"ceilings\">Ceilings measured by the tuner</h3>\n<table><tr><th class=\"t\">device</th>"
         "<th>read GB/s</th><th class=\"t\">compute TFLOP/s</th><th class=\"t\">input</th></tr>";
    for (const auto& [dev, c] : d.ceilings) {
      std::string comp = c.compute_tflops > 0 ? fmt("%.4g", c.compute_tflops) : std::string();
      for (const auto& [dt, t] : c.compute_by_dtype)
        comp += (comp.empty() ? "" : ", ") + esc(dt) + " " + fmt("%.4g", t);
      h += "<tr><td class=\"t\">" + esc(dev) + "</td><td>" + (c.read_gbps > 0 ? fmt("%.4g", c.read_gbps) : "—") +
           "</td><td class=\"t\">" + (comp.empty() ? "—" : comp) + "</td><td class=\"t\">" +
           esc(d.sources[c.source].name) + "</td></tr>";
    }
    h += "</table>\n<p class=\"note\">The ceiling line of a chart is max(bytes ÷ read, flops ÷ compute) of one call "
         "(the operands read and the output written once), where the op's byte count is known.</p>\n";
  }

  void charts() {
    h += "<h2 id=\"charts\">Time against M</h2>\n<p>" + legend_key("border-color:#1565c0") +
         "served (colour of its "
         "input) " +
         legend_key("border-top-style:dashed;border-color:#555") + "floor " +
         legend_key("border-top-style:dotted;border-color:#ef6c00") + "peer (a benchmark's: torch's call, Triton) " +
         legend_key("border-top-style:dashed;border-color:#999") +
         "ceiling (measured: the tuner's read/compute ceilings, or a benchmark's read of the same bytes). "
         "Log-log.</p>\n<div class=\"cs\">";
    for (const Group& g : groups) {
      const std::string svg = chart(g, d);
      if (svg.empty()) continue;
      h += "<figure>" + svg + "<figcaption>" + esc(group_label(g)) + (g.cpu.empty() ? "" : " (" + esc(g.cpu) + ")") +
           "</figcaption></figure>\n";
    }
    h += "</div>\n";
  }

  void heat() {
    h += "<h2 id=\"heat\">Served ÷ floor</h2>\n<p class=\"note\">Per shape and M, the first input's row with both "
         "times. Green: faster than the floor (darkest at 0.8 or less); red: slower (darkest at 1.25 or more).</p>\n"
         "<table class=\"hm\"><tr><th class=\"t\">shape \\ M</th>";
    for (int64_t m : all_ms) h += "<th>" + std::to_string(m) + "</th>";
    h += "</tr>\n";
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      if (cells[gi].empty()) continue;
      h += "<tr><th class=\"t\">" + esc(group_label(groups[gi])) + "</th>";
      for (int64_t m : all_ms) {
        const auto it = cells[gi].find(m);
        if (it == cells[gi].end()) {
          h += "<td class=\"na\"></td>";
          continue;
        }
        const double r = it->second->served / it->second->floor;
        h += "<td class=\"h\" style=\"background:" + heat_colour(r) + "\">" + ratio_text(r) + "</td>";
      }
      h += "</tr>\n";
    }
    h += "</table>\n";
  }

  void lost() {
    h += "<h2 id=\"lost\">Lost to the floor</h2>\n";
    if (!n_lost) {
      h += "<p>No row is served slower than its floor.</p>\n";
      return;
    }
    h += "<table><tr><th class=\"t\">shape</th><th>M</th><th>input</th><th class=\"t\">variant</th><th>served</th>"
         "<th>floor</th><th>served ÷ floor</th><th>A/A spread</th><th class=\"t\">beyond A/A</th></tr>\n";
    for (const Group& g : groups)
      for (size_t i : g.recs) {
        const Record& r = d.records[i];
        if (!(r.served > 0 && r.floor > 0 && r.served > r.floor)) continue;
        const double x = r.served / r.floor;
        h += "<tr class=\"lost\"><td class=\"t\">" + esc(group_label(g)) + "</td><td>" + std::to_string(r.m) +
             "</td><td>" + std::to_string(r.source + 1) + "</td><td class=\"t\">" + esc(r.variant) + "</td><td>" +
             us_text(r.served) + "</td><td>" + us_text(r.floor) + "</td><td>" + ratio_text(x) + "</td><td>" +
             (r.aa >= 0 ? pct_text(r.aa) : "—") + "</td><td class=\"t\">" +
             (r.aa >= 0 ? (x - 1 > r.aa ? "yes" : "no") : "—") + "</td></tr>\n";
      }
    h += "</table>\n";
  }

  void regret() {
    h += "<h2 id=\"regret\">Regret between tunes</h2>\n";
    if (regrets.empty()) {
      h += "<p>No (shape, M) was tuned by two inputs: no regret to show.</p>\n";
      return;
    }
    static const double kEdges[] = {0.0, 0.01, 0.02, 0.05, 0.10, 0.20, 0.50};
    static const char* const kNames[] = {"&lt;1%", "1–2%", "2–5%", "5–10%", "10–20%", "20–50%", "≥50%"};
    size_t counts[7] = {};
    for (const Regret& r : regrets) {
      size_t b = 0;
      while (b + 1 < 7 && r.value >= kEdges[b + 1]) ++b;
      ++counts[b];
    }
    const double top = static_cast<double>(*std::max_element(std::begin(counts), std::end(counts)));
    h += "<p class=\"note\">Regret of a (shape, M) two inputs tuned: slower served ÷ faster served − 1 (what "
         "keeping the other tune's pick would cost).</p>\n<svg viewBox=\"0 0 380 150\" width=\"380\" height=\"150\" "
         "role=\"img\"><title>regret histogram</title><path class=\"ax\" d=\"M30 8V120H372\"/>";
    for (size_t b = 0; b < 7; ++b) {
      const int x = 34 + static_cast<int>(b) * 48;
      const int hgt = static_cast<int>(std::lround(106.0 * static_cast<double>(counts[b]) / top));
      h += "<rect class=\"bar\" x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(120 - hgt) +
           "\" width=\"40\" height=\"" + std::to_string(hgt) + "\"/><text x=\"" + std::to_string(x + 20) + "\" y=\"" +
           std::to_string(116 - hgt) + "\">" + std::to_string(counts[b]) + "</text><text x=\"" +
           std::to_string(x + 20) + "\" y=\"134\">" + kNames[b] + "</text>";
    }
    h += "<text x=\"200\" y=\"148\">regret</text></svg>\n";
    std::vector<Regret> sorted = regrets;
    std::sort(sorted.begin(), sorted.end(), [](const Regret& a, const Regret& b) { return a.value > b.value; });
    h += "<table><tr><th class=\"t\">shape</th><th>M</th><th class=\"t\">faster: input, variant, µs</th>"
         "<th class=\"t\">slower: input, variant, µs</th><th>regret</th></tr>\n";
    for (size_t i = 0; i < sorted.size() && i < 50; ++i) {
      const Regret& r = sorted[i];
      h += "<tr><td class=\"t\">" + esc(group_label(*r.g)) + "</td><td>" + std::to_string(r.m) +
           "</td><td class=\"t\">" + std::to_string(r.fast->source + 1) + ", " + esc(r.fast->variant) + ", " +
           us_text(r.fast->served) + "</td><td class=\"t\">" + std::to_string(r.slow->source + 1) + ", " +
           esc(r.slow->variant) + ", " + us_text(r.slow->served) + "</td><td>" + pct_text(r.value) + "</td></tr>\n";
    }
    h += "</table>\n";
    if (sorted.size() > 50) h += "<p class=\"note\">The 50 largest of " + std::to_string(sorted.size()) + ".</p>\n";
  }

  void rows() {
    h += "<h2 id=\"rows\">Every row</h2>\n<table><tr><th>M</th><th>input</th><th class=\"t\">variant</th>"
         "<th>served</th><th>floor</th><th>served ÷ floor</th><th class=\"t\">peer</th><th>margin</th>"
         "<th>A/A spread</th><th class=\"t\">timing</th><th class=\"t\">why</th></tr>\n";
    for (const Group& g : groups) {
      h += "<tr><th class=\"t\" colspan=\"11\">" + esc(group_label(g)) +
           (g.cpu.empty() ? "" : " (" + esc(g.cpu) + ")") + "</th></tr>\n";
      for (size_t i : g.recs) {
        const Record& r = d.records[i];
        const bool both = r.served > 0 && r.floor > 0;
        h += std::string(both && r.served > r.floor ? "<tr class=\"lost\">" : "<tr>") + "<td>" + std::to_string(r.m) +
             "</td><td>" + std::to_string(r.source + 1) + "</td><td class=\"t\">" + esc(r.variant) + "</td><td>" +
             (r.served > 0 ? us_text(r.served) : "—") + "</td><td>" + (r.floor > 0 ? us_text(r.floor) : "—") +
             "</td><td>" + (both ? ratio_text(r.served / r.floor) : "—") + "</td><td class=\"t\">" +
             (r.peer > 0 ? esc(r.peer_name) + " " + us_text(r.peer) : "—") + "</td><td>" +
             (r.margin >= 0 ? pct_text(r.margin) : "—") + "</td><td>" + (r.aa >= 0 ? pct_text(r.aa) : "—") +
             "</td><td class=\"t\">" + esc(r.timing) + "</td><td class=\"t\">" + esc(r.why) + "</td></tr>\n";
      }
    }
    h += "</table>\n";
  }
};

std::string render(const Data& d, const std::string& title, const std::vector<Group>& groups) {
  Page p(d, groups);
  p.head(title);
  p.summary();
  p.inputs();
  p.charts();
  p.heat();
  p.lost();
  p.regret();
  p.rows();
  return p.h + "</body></html>\n";
}

// Writes `text` to `path` through a temp file in its dir and a rename, so a
// reader never sees half a report. "" or why it failed.
std::string write_atomically(const std::string& path, const std::string& text) {
  const fs::path p(path);
  const fs::path tmp = p.parent_path() / ("." + p.filename().string() + ".tmp." + std::to_string(::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create '" + tmp.string() + "': " + std::strerror(errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string why = "cannot write '" + tmp.string() + "': " + std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return why;
    }
    done += static_cast<size_t>(w);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = "cannot rename '" + tmp.string() + "' to '" + path + "': " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return why;
  }
  return {};
}

}  // namespace

int run_report(const ReportOptions& o) {
  if (o.inputs.empty()) {
    std::fprintf(stderr, "%s: give one or more inputs: config dirs or files, tune --json output, bench JSON\n", kCmd);
    return kExitUsage;
  }
  std::error_code ec;
  if (o.out.empty() || fs::is_directory(o.out, ec)) {
    std::fprintf(stderr, "%s: --out '%s' must name a file to write (not a directory)\n", kCmd, o.out.c_str());
    return kExitUsage;
  }
  const fs::path parent = fs::path(o.out).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    std::fprintf(stderr, "%s: --out '%s': its directory '%s' does not exist\n", kCmd, o.out.c_str(), parent.c_str());
    return kExitUsage;
  }
  Data d;
  {
    Reader reader(&d);
    for (const std::string& in : o.inputs)
      if (int rc = reader.input(in); rc >= 0) return rc;
  }
  for (const Source& s : d.sources)
    for (const std::string& why : s.skipped)
      std::fprintf(stderr, "%s: %s: passed over %s\n", kCmd, s.name.c_str(), why.c_str());
  if (d.records.empty()) {
    std::fprintf(stderr,
                 "%s: no timings in the inputs (a config table's timings are its \"kdispatch\" metadata's "
                 "\"us\" map, which tables written by `kdispatch tune` carry): nothing written\n",
                 kCmd);
    return kExitFailure;
  }

  // A benchmark that names no device joins the one device whose tables hold its shape.
  std::map<std::pair<std::string, std::string>, std::set<std::string>> devices_of;
  for (const Record& r : d.records)
    if (!r.device.empty()) devices_of[{r.op, r.shape}].insert(r.device);
  for (Record& r : d.records)
    if (r.device.empty())
      if (const auto it = devices_of.find({r.op, r.shape}); it != devices_of.end() && it->second.size() == 1)
        r.device = *it->second.begin();

  std::map<std::tuple<std::string, std::string, std::string>, size_t> index;
  std::vector<Group> groups;
  for (size_t i = 0; i < d.records.size(); ++i) {
    const Record& r = d.records[i];
    const auto [it, fresh] = index.emplace(std::make_tuple(r.device, r.op, r.shape), groups.size());
    if (fresh) groups.push_back(Group{r.device, r.op, r.shape, {}, {}});
    Group& g = groups[it->second];
    g.recs.push_back(i);
    if (!r.cpu.empty() && g.cpu.find(r.cpu) == std::string::npos) g.cpu += (g.cpu.empty() ? "" : "; ") + r.cpu;
  }
  std::sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) {
    if (a.op != b.op) return a.op < b.op;
    if (a.device != b.device) return a.device < b.device;
    return natural_less(a.shape, b.shape);
  });
  for (Group& g : groups)
    std::stable_sort(g.recs.begin(), g.recs.end(), [&](size_t a, size_t b) {
      return std::make_pair(d.records[a].m, d.records[a].source) < std::make_pair(d.records[b].m, d.records[b].source);
    });

  const std::string html = render(d, o.title.empty() ? std::string("kdispatch report") : o.title, groups);
  if (std::string why = write_atomically(o.out, html); !why.empty()) {
    std::fprintf(stderr, "%s: %s\n", kCmd, why.c_str());
    return kExitFailure;
  }
  std::printf("%s: %zu rows of %zu shapes from %zu inputs (%zu bytes)\n", o.out.c_str(), d.records.size(),
              groups.size(), d.sources.size(), html.size());
  return d.failed ? kExitFailure : kExitOk;
}

}  // namespace kdispatch_cli
