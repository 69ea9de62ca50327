// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — the offline tuning loop, as aiter's: `kdispatch misses`
// writes the shapes a workload missed (replay.cpp), `kdispatch tune` reads a
// shape list (that CSV, or aiter's untuned CSVs) and tunes each shape with
// dispatch::pretune into an emit dir, in the config-file format the loader
// reads (<dir>/<backend>/<op>/<key fields>.json, fit to commit to configs/).
//
// `tune` resumes: a shape whose (key, M) already has a row in the emit dir
// (an exact lookup match) is skipped, so an interrupted run picks up where it
// stopped (every winner is persisted as soon as it is found).
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/cli.hpp"
#include "cli/op_util.hpp"
#include "cli/shard.hpp"
#include "core/json_write.hpp"
#include "dispatch/device.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"

namespace kdispatch_cli {

namespace dsp = dispatch;
namespace fs = std::filesystem;

// ---------------------------------------------------------------- shape CSVs

namespace {

std::string_view trim(std::string_view v) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!v.empty() && ws(v.front())) v.remove_prefix(1);
  while (!v.empty() && ws(v.back())) v.remove_suffix(1);
  return v;
}

std::string lower(std::string_view v) {
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool parse_int(std::string_view v, int64_t* out) {
  if (v.empty()) return false;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), *out);
  return r.ec == std::errc() && r.ptr == v.data() + v.size();
}

}  // namespace

namespace {

// The fields of one CSV line (RFC 4180: a field in double quotes may hold
// commas, as the misses CSV's key column does).
std::vector<std::string_view> split_csv_line(std::string_view l) {
  std::vector<std::string_view> f;
  size_t start = 0;
  while (true) {
    size_t from = start;
    while (from < l.size() && l[from] == ' ') ++from;
    if (from < l.size() && l[from] == '"') {
      const size_t close = l.find('"', from + 1);
      if (close != std::string_view::npos) {
        f.push_back(l.substr(from + 1, close - from - 1));
        const size_t comma = l.find(',', close);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
        continue;
      }
    }
    const size_t comma = l.find(',', start);
    f.push_back(trim(l.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return f;
}

// How the reader checks a column's values: M (an integer >= 1), a count or
// a dim of some op (an integer >= 0 when given), a flag field (true/false).
struct ColumnRule {
  enum Kind { any, m, count, flag } kind = any;
  std::string name;  // as messages spell it: "M", "N", "hidden", "count", "B", "bias"
};

ColumnRule column_rule(const std::string& lname) {
  if (lname == "m") return {ColumnRule::m, "M"};
  if (lname == "count") return {ColumnRule::count, "count"};
  if (lname == "b") return {ColumnRule::count, "B"};  // aiter's batched GEMM lists
  for (const dsp::OpInfo& op : dsp::op_list())
    for (const dsp::OpKeyFieldInfo& f : op.key_fields)
      if (lower(f.name) == lname && (f.kind == "dim" || f.kind == "flag"))
        return {f.kind == "dim" ? ColumnRule::count : ColumnRule::flag, std::string(f.name)};
  return {};
}

// Checks one value against its column's rule: "" when fine, else the message.
std::string check_value(const ColumnRule& rule, std::string_view v, int64_t* m) {
  if (rule.kind == ColumnRule::flag) {
    const std::string b = lower(v);
    if (b == "true" || b == "1" || b == "false" || b == "0" || b.empty()) return {};
    return rule.name + " '" + std::string(v) + "' is not true or false";
  }
  if (rule.kind == ColumnRule::any || (v.empty() && rule.kind != ColumnRule::m)) return {};
  int64_t n = 0;
  const bool is_m = rule.kind == ColumnRule::m;
  if (!parse_int(v, &n) || n < 0 || (is_m && n < 1))
    return rule.name + " '" + std::string(v) + "' is not an integer >= " + (is_m ? "1" : "0");
  if (is_m) *m = n;
  return {};
}

}  // namespace

std::optional<ShapeCsv> read_shape_csv(const std::string& path, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = path + ": cannot open the shape file";
    return std::nullopt;
  }
  ShapeCsv csv;
  std::vector<std::string> names;  // lower-cased
  std::vector<ColumnRule> rules;
  std::string line;
  int line_no = 0;
  const auto fail = [&](const std::string& what) {
    *error = path + ":" + std::to_string(line_no) + ": " + what;
    return std::nullopt;
  };
  while (std::getline(in, line)) {
    ++line_no;
    const std::string_view l = trim(line);
    if (l.empty() || l.front() == '#') continue;
    std::vector<std::string_view> f = split_csv_line(l);
    if (names.empty()) {  // the header
      for (std::string_view name : f) {
        csv.columns.emplace_back(name);
        names.push_back(lower(name));
        rules.push_back(column_rule(names.back()));
      }
      if (std::find(names.begin(), names.end(), "m") == names.end())
        return fail("the header names no M column (expected e.g. 'M,N,K' or 'M,hidden')");
      continue;
    }
    // Fields past the header's last column belong to it (an unquoted
    // last column holding commas, as older misses CSVs wrote the key).
    std::string last_joined;
    if (f.size() > names.size()) {
      const size_t lastc = names.size() - 1;
      last_joined.assign(f[lastc].data(), static_cast<size_t>(f.back().data() + f.back().size() - f[lastc].data()));
      f.resize(names.size());
      f[lastc] = last_joined;
    }
    ShapeRow r;
    r.line = line_no;
    for (size_t i = 0; i < names.size() && i < f.size(); ++i) {
      if (std::string bad = check_value(rules[i], f[i], &r.m); !bad.empty()) return fail(bad);
      r.fields.emplace_back(names[i], std::string(f[i]));
    }
    if (r.m < 1) return fail("no M value");
    csv.rows.push_back(std::move(r));
  }
  if (in.bad()) {
    *error = path + ": read error";
    return std::nullopt;
  }
  if (names.empty()) {
    *error = path + ": empty file (no header)";
    return std::nullopt;
  }
  return csv;
}

// ---------------------------------------------------------------- kdispatch tune

namespace {

using Clock = std::chrono::steady_clock;
using dsp::core::JsonWriter;

// "bf16", "torch.bfloat16", "float32", ... -> a DType.
std::optional<dsp::DType> dtype_from_csv(std::string_view v) {
  std::string s = lower(trim(v));
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "bfloat16") s = "bf16";
  else if (s == "float32" || s == "float") s = "fp32";
  else if (s == "float16" || s == "half") s = "fp16";
  auto r = dsp::parse_dtype(s);
  if (!r.ok()) return std::nullopt;
  return *r;
}

// One shape to tune: a key of --op (its file name's fields) at one M.
struct Job {
  std::string file;
  int line = 0;
  std::string key_fields;  // canonical, file-name order (describe_key)
  std::string label;       // the progress line's and the summary's name: "N=896,K=896,bf16", "hidden=896,bf16"
  int64_t m = 0;
  double flops = 0;
};

// The progress display on stderr: one line per shape; on a terminal, also
// a bar redrawn in place under those lines.
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(::isatty(::fileno(stderr)) == 1) {}

  void start(size_t i, const std::string& what) {
    if (!tty_) return;
    constexpr int kWidth = 24;
    const int done = total_ ? static_cast<int>(kWidth * (i - 1) / total_) : kWidth;  // shapes finished
    std::string bar(static_cast<size_t>(done), '=');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r\033[K[%s] %zu/%zu %s ...", bar.c_str(), i, total_, what.c_str());
    std::fflush(stderr);
  }
  void done(size_t i, const std::string& text) {
    if (tty_) std::fprintf(stderr, "\r\033[K");
    const int w = static_cast<int>(std::to_string(total_).size());
    std::fprintf(stderr, "[%*zu/%zu] %s\n", w, i, total_, text.c_str());
    std::fflush(stderr);
  }
  void finish() {
    if (tty_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  size_t total_;
  bool tty_;
};

struct Outcome {
  enum class Kind { tuned, done, too_large, unsupported, failed } kind = Kind::failed;
  std::string label;
  int64_t m = 0;
  std::string variant, key, message;
  dsp::Config config;
  double us = 0, default_us = 0;
  int32_t candidates = 0, rejected = 0;
  bool persisted = false;
};

const char* kind_name(Outcome::Kind k) {
  switch (k) {
    case Outcome::Kind::tuned: return "tuned";
    case Outcome::Kind::done: return "done";
    case Outcome::Kind::too_large: return "too_large";
    case Outcome::Kind::unsupported: return "unsupported";
    case Outcome::Kind::failed: return "failed";
  }
  return "?";
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

double round3(double v) { return std::round(v * 1000) / 1000; }

// ---- the options

// Checks the options that need no file: a usage error's exit code, or -1.
int check_options(const TuneCmdOptions& o, const char* cmd) {
  const auto bad = [&](const std::string& msg) {
    std::fprintf(stderr, "%s: %s\n", cmd, msg.c_str());
    return kExitUsage;
  };
  if (!find_op(o.op)) return bad("--op '" + o.op + "' is not " + op_names_text());
  if (!dtype_from_csv(o.dtype)) return bad("--dtype '" + o.dtype + "' is not a dtype (fp32, bf16, fp16, fp8_e4m3fn)");
  if (!(o.max_flops > 0)) return bad("--max-flops must be > 0, got " + fmt("%g", o.max_flops));
  if (o.mem_gib < 0 || !std::isfinite(o.mem_gib)) return bad("--mem-gib must be > 0, got " + fmt("%g", o.mem_gib));
  if (o.budget_ms < 0 || !std::isfinite(o.budget_ms))
    return bad("--budget-ms must be > 0, got " + fmt("%g", o.budget_ms));
  if (o.max_candidates != -1 && o.max_candidates < 1)
    return bad("--max-candidates must be >= 1, got " + std::to_string(o.max_candidates));
  if (o.reps < 0) return bad("--reps must be >= 1, got " + std::to_string(o.reps));
  if (o.backend != "cpu" && o.backend != "cuda" && o.backend != "hip")
    return bad("--backend '" + o.backend + "' is not cpu, cuda or hip");
  if (o.device < -1) return bad("--device must be >= 0, got " + std::to_string(o.device));
  return -1;
}

// ---- the shapes: a row of a shape list -> a key of --op

// What the reading of the shape lists found for --op.
struct Shapes {
  std::vector<Job> jobs;
  std::vector<Outcome> unsupported;           // rows of --op this host cannot tune
  std::map<std::string, int64_t> other_rows;  // rows left out: another op -> count
};

// How many of `op`'s dim key fields the row gives a value >= 1 for, of how many.
std::pair<size_t, size_t> dims_given(const ShapeRow& r, const dsp::OpInfo& op) {
  const auto dims = fields_of_kind(op, "dim");
  size_t n = 0;
  for (const dsp::OpKeyFieldInfo* f : dims) {
    int64_t v = 0;
    n += parse_int(r.get(lower(f->name)), &v) && v >= 1;
  }
  return {n, dims.size()};
}

// The op a row belongs to: its op column; else --op when the row has a
// value for each of --op's dims; else the ops whose dims it has all of
// ("gemm", or "rmsnorm/fused_add_rmsnorm (M,hidden)" when the dims fit
// several); else --op when it has some of --op's dims (the row then lacks
// the others); else "?".
std::string row_op(const ShapeRow& r, const dsp::OpInfo& op) {
  if (std::string_view col = r.get("op"); !col.empty()) return std::string(col);
  const auto [given, dims] = dims_given(r, op);
  if (given == dims) return std::string(op.name);
  std::vector<std::string_view> fits;
  const dsp::OpInfo* first = nullptr;
  for (const dsp::OpInfo& o : dsp::op_list())
    if (const auto [g, n] = dims_given(r, o); n > 0 && g == n) {
      fits.push_back(o.name);
      if (!first) first = &o;
    }
  if (fits.empty()) return given > 0 ? std::string(op.name) : "?";
  std::string name;
  for (std::string_view f : fits) name += (name.empty() ? "" : "/") + std::string(f);
  if (fits.size() == 1) return name;
  name += " (M";
  for (std::string_view d : dims_in_file_order(*first)) name += "," + std::string(d);
  return name + ")";
}

// The row's value of key field `f` (its name, else its CSV name).
std::string_view field_value(const ShapeRow& r, const dsp::OpKeyFieldInfo& f) {
  std::string_view v = r.get(lower(f.name));
  return v.empty() ? r.get(lower(f.csv_name)) : v;
}

// A row of --op -> its key fields and label. The dims come first, in
// file-name order; a message naming what is missing when a dim is.
struct RowKey {
  std::string fields, label, missing;
};
RowKey row_key(const ShapeRow& r, const dsp::OpInfo& op, const std::vector<std::string_view>& dims, dsp::DType dt,
               dsp::DType out) {
  RowKey k;
  std::string label_dims;
  bool missing = false;
  for (std::string_view name : dims) {
    int64_t v = 0;
    if (!parse_int(r.get(lower(name)), &v) || v < 1) missing = true;
    label_dims += (label_dims.empty() ? "" : ",") + std::string(name) + "=" + std::to_string(v < 0 ? 0 : v);
  }
  if (missing) k.missing = "a " + std::string(op.name) + " row needs " + join_names(dims, "and") + " >= 1";
  k.fields = label_dims;
  k.label = label_dims + "," + std::string(dsp::dtype_name(dt));
  std::string flags, stride;
  for (const dsp::OpKeyFieldInfo& f : op.key_fields) {
    const std::string name(f.name);
    const std::string_view v = field_value(r, f);
    if (f.kind == "dtype") {
      k.fields += "," + name + "=" + std::string(dsp::dtype_name(dt));
    } else if (f.kind == "out_dtype" && out != dt) {
      k.fields += "," + name + "=" + std::string(dsp::dtype_name(out));
      k.label += "->" + std::string(dsp::dtype_name(out));
    } else if (f.kind == "flag" && (lower(v) == "true" || v == "1")) {
      k.fields += "," + name + "=true";
      flags += "," + name;
    } else if (f.kind == "stride" && !v.empty()) {
      k.fields += "," + name + "=" + std::string(v);
      stride += "," + name + "=" + std::string(v);
    }
  }
  k.label += flags + stride;
  return k;
}

// One row of --op: a job, or an outcome saying why it cannot be tuned here
// (returned; .message empty when the row became a job).
Outcome add_row(const ShapeRow& r, const std::string& file, const TuneCmdOptions& o, const dsp::OpInfo& op,
                const std::vector<std::string_view>& dims, Job* job) {
  Outcome bad;
  bad.kind = Outcome::Kind::unsupported;
  bad.m = r.m;
  const std::string where = file + ":" + std::to_string(r.line);
  const std::string_view dtype_text = r.get("dtype");
  std::string_view out_text;
  for (const dsp::OpKeyFieldInfo* f : fields_of_kind(op, "out_dtype")) out_text = field_value(r, *f);
  const auto dt = dtype_text.empty() ? dtype_from_csv(o.dtype) : dtype_from_csv(dtype_text);
  // No out dtype in the row: the op's default (bf16 for the fp8 GEMMs, fp8
  // for the quantisation ops), else the input dtype.
  if (out_text.empty()) out_text = op.default_out_dtype;
  const auto out = out_text.empty() ? dt : dtype_from_csv(out_text);
  if (!dt || !out) {
    bad.label = where;
    bad.message = "dtype '" + std::string(dt ? out_text : dtype_text) + "' has no kernel here";
    return bad;
  }
  const RowKey key = row_key(r, op, dims, *dt, *out);
  bad.label = key.label;
  const std::string_view backend = r.get("backend");
  int64_t batch = 0;
  if (!backend.empty() && backend != o.backend) {
    bad.message = "backend '" + std::string(backend) + "': this run tunes on " + o.backend + " (--backend)";
  } else if (parse_int(r.get("b"), &batch) && batch > 1) {
    bad.message = "batched GEMM (B=" + std::to_string(batch) + ") is not a kdispatch op";
  } else if (!key.missing.empty()) {
    bad.message = where + ": " + key.missing;
  } else if (auto d = dsp::describe_key(op.name, key.fields, r.m); !d.ok()) {
    bad.message = where + ": " + d.status().to_string();
  } else {
    *job = Job{file, r.line, d->key_fields, key.label, r.m, d->flops};
  }
  return bad;
}

// Reads the shape lists and keeps --op's rows, without duplicates. A usage
// error's exit code, or -1.
int read_shapes(const TuneCmdOptions& o, const char* cmd, const dsp::OpInfo& op, Shapes* out) {
  const std::vector<std::string_view> dims = dims_in_file_order(op);
  std::set<std::pair<std::string, int64_t>> seen;  // (key fields, M)
  for (const std::string& file : o.shapes) {
    std::string err;
    auto csv = read_shape_csv(file, &err);
    if (!csv) {
      std::fprintf(stderr, "%s: --shapes: %s\n", cmd, err.c_str());
      return kExitUsage;
    }
    for (const ShapeRow& r : csv->rows) {
      if (std::string name = row_op(r, op); name != op.name) {
        out->other_rows[name]++;
        continue;
      }
      Job j;
      Outcome bad = add_row(r, file, o, op, dims, &j);
      if (!bad.message.empty()) out->unsupported.push_back(std::move(bad));
      else if (seen.insert({j.key_fields, j.m}).second) out->jobs.push_back(std::move(j));
    }
  }
  return -1;
}

// ---- the runtime over the emit dir

// A runtime over the emit dir (no shipped configs, no other dir); null with
// *exit_code set on failure.
std::unique_ptr<dsp::Runtime> emit_runtime(const TuneCmdOptions& o, const char* cmd, int* exit_code) {
  std::error_code ec;
  *exit_code = kExitUsage;
  if (fs::exists(o.emit, ec) && !fs::is_directory(o.emit, ec)) {
    std::fprintf(stderr, "%s: --emit '%s' is not a directory\n", cmd, o.emit.c_str());
    return nullptr;
  }
  fs::create_directories(o.emit, ec);
  if (ec) {
    std::fprintf(stderr, "%s: cannot create --emit dir '%s': %s\n", cmd, o.emit.c_str(), ec.message().c_str());
    *exit_code = kExitFailure;
    return nullptr;
  }
  dsp::RuntimeOptions ro;
  ro.load_shipped_configs = false;
  ro.tune.mode = dsp::TuneMode::off;  // pretune works in every mode
  ro.tune.cache_dir = o.emit;         // winners persist straight into the emit dir
  ro.tune.persist = true;
  ro.tune.load_cache = true;          // its rows (this build's) are the "done" set
  ro.tune.keep_rows_of_other_builds = true;  // an emit dir is committed configs: never drop rows on merge
  if (o.budget_ms > 0) ro.tune.time_budget_ms = o.budget_ms;
  // $KDISPATCH_TUNE_MEM (unless --mem-gib) and $KDISPATCH_LOG_LEVEL (info:
  // every shape's confirmation rounds) apply.
  const bool env_mem = o.mem_gib <= 0 && std::getenv("KDISPATCH_TUNE_MEM");
  if (env_mem || std::getenv("KDISPATCH_LOG_LEVEL")) {
    auto env = dsp::options_from_env();
    if (!env.ok()) {
      std::fprintf(stderr, "%s: %s\n", cmd, env.status().to_string().c_str());
      return nullptr;
    }
    if (env_mem) ro.tune.memory_budget_bytes = env->tune.memory_budget_bytes;
    if (std::getenv("KDISPATCH_LOG_LEVEL")) ro.log_level = env->log_level;
  }
  if (o.mem_gib > 0) ro.tune.memory_budget_bytes = static_cast<int64_t>(o.mem_gib * 1073741824.0);
  if (o.no_cold_cache) ro.tune.cold_cache = false;
  if (o.reps > 0) ro.tune.reps = o.reps;
  if (o.max_candidates >= 1) ro.tune.max_candidates = o.max_candidates;
  auto rt = dsp::Runtime::create(ro);
  if (!rt.ok()) {
    std::fprintf(stderr, "%s: cannot create the runtime over '%s': %s\n", cmd, o.emit.c_str(),
                 rt.status().to_string().c_str());
    *exit_code = kExitFailure;
    return nullptr;
  }
  return std::move(*rt);
}

// The device the shapes are tuned on: its tensors' device selects the
// backend, and its device_name goes into the emitted file names. False
// (message printed) when --backend's device is not there.
bool tune_device(dsp::Runtime& rt, const TuneCmdOptions& o, const char* cmd, dsp::Device* dev, std::string* name) {
  auto type = dsp::parse_device_type(o.backend);  // --backend's choices are the device type names
  if (!type.ok()) {
    std::fprintf(stderr, "%s: --backend %s: %s\n", cmd, o.backend.c_str(), type.status().to_string().c_str());
    return false;
  }
  *dev = dsp::Device{*type, o.device < 0 ? 0 : o.device};
  auto di = rt.device_info(*dev);
  if (!di.ok() || !di->available) {
    std::fprintf(stderr, "%s: --backend %s: %s\n", cmd, o.backend.c_str(),
                 di.ok() ? di->unavailable_reason.c_str() : di.status().to_string().c_str());
    return false;
  }
  *name = di->device_name;
  return true;
}

void print_plan(const TuneCmdOptions& o, const char* cmd, const Shapes& sh, dsp::Runtime& rt) {
  int stale = 0;
  for (const auto& f : rt.load_report().files) stale += f.stale;
  const dsp::TuneOptions& to = rt.options().tune;
  std::fprintf(stderr, "%s: %zu %s shapes from %zu file(s) -> %s (budget %.0f ms/shape, %d reps%s%s)\n", cmd,
               sh.jobs.size(), o.op.c_str(), o.shapes.size(), o.emit.c_str(), to.time_budget_ms, to.reps,
               to.cold_cache ? ", cold cache" : ", warm cache", o.resume ? ", resuming" : "");
  for (const auto& [other, n] : sh.other_rows)
    std::fprintf(stderr, "  left out %lld rows of %s\n", (long long)n, other.c_str());
  if (stale)
    std::fprintf(stderr,
                 "  note: %d file(s) in %s were written by another build (their fingerprint differs): their rows "
                 "do not count as done, and writing to such a file replaces them\n",
                 stale, o.emit.c_str());
}

// ---- tune

struct Target {
  dsp::Runtime& rt;
  const TuneCmdOptions& o;
  dsp::Device dev;
  std::string device;  // its device_name
};

// The tuner's result of one job -> its outcome and progress line.
Outcome tuned_outcome(const dsp::PretuneResult& r, const std::string& head, const std::string& emit,
                      std::string* line) {
  Outcome out;
  out.kind = Outcome::Kind::tuned;
  out.variant = r.variant;
  out.key = r.key;
  out.config = r.config;
  out.us = r.best_us;
  out.default_us = r.default_us;
  out.candidates = r.candidates;
  out.rejected = r.rejected;
  out.persisted = r.persisted;
  *line = head + " -> " + r.variant + " " + fmt("%.1f", r.best_us) + "us (default " + fmt("%.1f", r.default_us) +
          "us, " + (r.best_us > 0 && r.default_us > 0 ? fmt("%.2f", r.default_us / r.best_us) + "x" : "n/a") + ", " +
          std::to_string(r.candidates) + (r.candidates == 1 ? " candidate)" : " candidates)");
  if (!r.persisted) {
    out.kind = Outcome::Kind::failed;
    out.message = "tuned but not written to " + emit;
    *line += " FAILED: not written to the emit dir";
  }
  return out;
}

// A job skipped before the search: its call costs more than --max-flops,
// or (resuming) the emit dir has its (key, M) already (an exact lookup
// match). Sets the progress line.
std::optional<Outcome> skip(const Target& t, const Job& j, const std::string& head, std::string* line) {
  const TuneCmdOptions& o = t.o;
  Outcome out;
  if (j.flops > o.max_flops) {
    out.kind = Outcome::Kind::too_large;
    out.message = fmt("%.3g", j.flops) + " flops per call > --max-flops " + fmt("%.3g", o.max_flops);
    *line = head + " skipped: " + out.message;
    return out;
  }
  if (!o.resume) return std::nullopt;
  dsp::LookupQuery q;
  q.op = o.op;
  q.key = j.key_fields;
  q.backend = o.backend;
  q.device = t.device;
  q.M = j.m;
  auto lr = dsp::lookup(t.rt, q);
  if (!lr.ok() || lr->match != dsp::LookupResult::Match::exact) return std::nullopt;
  out.kind = Outcome::Kind::done;
  out.variant = lr->variant;
  out.key = lr->key;
  out.config = lr->config;
  out.message = "already in " + o.emit;
  *line = head + " skipped: already in the emit dir (" + lr->variant + ")";
  return out;
}

// One job: skipped, tuned (dsp::pretune_key, persisted into the emit dir) or failed.
Outcome tune_one(const Target& t, const Job& j, size_t i, Progress& progress) {
  const std::string head = j.label + " M=" + std::to_string(j.m);
  std::string line;
  Outcome out;
  if (auto skipped = skip(t, j, head, &line)) {
    out = std::move(*skipped);
  } else {
    progress.start(i + 1, head);
    auto r = dsp::pretune_key(t.rt, t.o.op, j.key_fields, j.m, t.dev);
    if (r.ok()) {
      out = tuned_outcome(*r, head, t.o.emit, &line);
    } else {
      // Over the scratch-memory budget is "too large here", like --max-flops.
      out.kind = r.status().code() == dsp::StatusCode::out_of_memory ? Outcome::Kind::too_large
                                                                      : Outcome::Kind::failed;
      out.message = r.status().to_string();
      line = head + (out.kind == Outcome::Kind::failed ? " FAILED: " : " skipped: ") + out.message;
    }
  }
  progress.done(i + 1, line);
  out.label = j.label;
  out.m = j.m;
  return out;
}

// ---- the summary

struct Summary {
  int64_t shapes = 0, tuned = 0, done = 0, too_large = 0, unsupported = 0, failed = 0, with_speedup = 0;
  double geomean = 0.0, seconds = 0.0;
  std::vector<std::string> files;  // under <emit>/<backend>/<op>/ (what a commit would add)
};

Summary summarize(const TuneCmdOptions& o, const Shapes& sh, const std::vector<Outcome>& results, double seconds) {
  Summary s;
  double log_sum = 0;
  for (const Outcome& r : results) {
    switch (r.kind) {
      case Outcome::Kind::tuned:
        ++s.tuned;
        if (r.us > 0 && r.default_us > 0) {
          log_sum += std::log(r.default_us / r.us);
          ++s.with_speedup;
        }
        break;
      case Outcome::Kind::done: ++s.done; break;
      case Outcome::Kind::too_large: ++s.too_large; break;
      case Outcome::Kind::unsupported: break;
      case Outcome::Kind::failed: ++s.failed; break;
    }
  }
  s.unsupported = static_cast<int64_t>(sh.unsupported.size());
  s.shapes = static_cast<int64_t>(sh.jobs.size()) + s.unsupported;
  s.geomean = s.with_speedup ? std::exp(log_sum / static_cast<double>(s.with_speedup)) : 0.0;
  s.seconds = seconds;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(fs::path(o.emit) / o.backend / o.op, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec) && it->path().extension() == ".json" && it->path().filename().string()[0] != '.')
      s.files.push_back(fs::relative(it->path(), o.emit, ec).generic_string());
  std::sort(s.files.begin(), s.files.end());
  return s;
}

void write_outcome(JsonWriter& w, const Outcome& r) {
  w.begin_object();
  w.field("shape", r.label).field("M", r.m).field("status", kind_name(r.kind));
  if (!r.variant.empty()) {
    w.field("variant", r.variant);
    w.key("config").json(dsp::config_to_json(r.config));
  }
  if (!r.key.empty()) w.field("key", r.key);
  if (r.kind == Outcome::Kind::tuned) {
    w.field("us", round3(r.us)).field("default_us", round3(r.default_us));
    w.field("speedup", r.us > 0 ? round3(r.default_us / r.us) : 0.0);
    w.field("candidates", r.candidates).field("rejected", r.rejected);
  }
  if (!r.message.empty()) w.field("message", r.message);
  w.end_object();
}

void print_json(const TuneCmdOptions& o, const std::string& device, const Summary& s, double budget_ms,
                const std::vector<Outcome>& results, const std::vector<Outcome>& unsupported) {
  JsonWriter w;
  w.begin_object();
  w.field("op", o.op).field("emit", o.emit).field("device_name", device);
  w.field("shapes", s.shapes).field("tuned", s.tuned);
  w.field("skipped", s.done + s.too_large + s.unsupported).field("skipped_done", s.done);
  w.field("skipped_too_large", s.too_large).field("skipped_unsupported", s.unsupported);
  w.field("failed", s.failed).field("seconds", round3(s.seconds)).field("geomean_speedup", round3(s.geomean));
  w.field("budget_ms", budget_ms);
  w.key("files").begin_array();
  for (const std::string& f : s.files) w.value(f);
  w.end_array();
  w.key("results").begin_array();
  for (const Outcome& r : results) write_outcome(w, r);
  for (const Outcome& r : unsupported) write_outcome(w, r);
  w.end_array();
  w.end_object();
  std::fputs((w.take() + "\n").c_str(), stdout);
}

void print_text(const TuneCmdOptions& o, const Summary& s, const std::vector<Outcome>& unsupported) {
  for (const Outcome& r : unsupported)
    std::fprintf(stderr, "  skipped %s M=%lld: %s\n", r.label.c_str(), (long long)r.m, r.message.c_str());
  std::printf("%lld %s shapes: %lld tuned, %lld skipped (%lld already in %s, %lld too large here, %lld not "
              "tunable here), %lld failed; %.1f s\n",
              (long long)s.shapes, o.op.c_str(), (long long)s.tuned, (long long)(s.done + s.too_large + s.unsupported),
              (long long)s.done, o.emit.c_str(), (long long)s.too_large, (long long)s.unsupported, (long long)s.failed,
              s.seconds);
  if (s.with_speedup)
    std::printf("geomean speedup vs get_default: %.2fx over %lld tuned shapes\n", s.geomean,
                (long long)s.with_speedup);
  std::printf("%zu config file(s) under %s/%s/%s/%s\n", s.files.size(), o.emit.c_str(), o.backend.c_str(),
              o.op.c_str(), s.files.empty() ? "" : " (the format configs/ holds; check them with `kdispatch validate`)");
}

}  // namespace

// Keeps the units of --shard (cli/shard.hpp) in shapes->jobs; the device
// ordinal torchrun names goes to *o. A usage error's exit code, or -1.
int select_shard(TuneCmdOptions* o, const char* cmd, const dsp::OpInfo& op, Shapes* shapes) {
  if (o->shard.empty()) return -1;
  std::string err;
  const auto s = parse_shard(o->shard, [](const char* n) { return std::getenv(n); }, &err);
  if (!s) {
    std::fprintf(stderr, "%s: %s\n", cmd, err.c_str());
    return kExitUsage;
  }
  // The GPU of a torchrun process is its LOCAL_RANK (the CPU backend has one device, 0).
  if (s->from_torchrun && o->backend != "cpu") {
    if (o->device >= 0 && o->device != s->local_rank) {
      std::fprintf(stderr, "%s: --device %d under torchrun: each process tunes on its LOCAL_RANK (%d)\n", cmd,
                   o->device, s->local_rank);
      return kExitUsage;
    }
    o->device = s->local_rank;
  }
  const size_t all = shapes->jobs.size();
  std::vector<Job> kept;
  for (Job& j : shapes->jobs)
    if (in_shard(*s, unit_hash(op.name, j.key_fields, j.m))) kept.push_back(std::move(j));
  shapes->jobs = std::move(kept);
  std::fprintf(stderr, "%s: shard %lld/%lld from %s: %zu of %zu units\n", cmd, (long long)s->index,
               (long long)s->count, s->source.c_str(), shapes->jobs.size(), all);
  return -1;
}

// --list: the units, one per line (label, M, unit hash; units over
// --max-flops marked), and an estimate for the others: per unit the search
// budget plus ~0.5 s of confirmation and reference. The emit dir is not
// read: units it already holds are listed and counted too.
int list_units(const TuneCmdOptions& o, const dsp::OpInfo& op, const Shapes& shapes) {
  const double budget_s = (o.budget_ms > 0 ? o.budget_ms : dsp::TuneOptions{}.time_budget_ms) / 1000.0;
  size_t tunable = 0;
  for (const Job& j : shapes.jobs) {
    const bool large = j.flops > o.max_flops;
    tunable += !large;
    std::printf("%s M=%lld unit=%016llx%s\n", j.label.c_str(), (long long)j.m,
                (unsigned long long)unit_hash(op.name, j.key_fields, j.m), large ? " (over --max-flops: skipped)" : "");
  }
  std::printf("%zu units, estimated %.0f s (%.1f s search + ~0.5 s confirmation each", shapes.jobs.size(),
              static_cast<double>(tunable) * (budget_s + 0.5), budget_s);
  if (tunable != shapes.jobs.size()) std::printf("; %zu over --max-flops", shapes.jobs.size() - tunable);
  std::printf("; units the emit dir holds are counted too)\n");
  return kExitOk;
}

int run_tune(const TuneCmdOptions& opts) {
  const char* cmd = "kdispatch tune";
  TuneCmdOptions o = opts;
  if (int e = check_options(o, cmd); e >= 0) return e;
  const dsp::OpInfo& op = *find_op(o.op);

  // ---- the shapes: read, keep --op's rows, drop duplicates; the shard's units
  Shapes shapes;
  if (int e = read_shapes(o, cmd, op, &shapes); e >= 0) return e;
  if (int e = select_shard(&o, cmd, op, &shapes); e >= 0) return e;
  if (o.list) return list_units(o, op, shapes);

  // ---- the emit dir and a runtime over it, the device
  int exit_code = kExitOk;
  std::unique_ptr<dsp::Runtime> rt = emit_runtime(o, cmd, &exit_code);
  if (!rt) return exit_code;
  if (!o.json) print_plan(o, cmd, shapes, *rt);
  Target target{*rt, o, {}, {}};
  if (!tune_device(*rt, o, cmd, &target.dev, &target.device)) return kExitUsage;

  // ---- tune
  std::vector<Outcome> results;
  Progress progress(shapes.jobs.size());
  const auto t0 = Clock::now();
  for (size_t i = 0; i < shapes.jobs.size(); ++i) results.push_back(tune_one(target, shapes.jobs[i], i, progress));
  progress.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  // ---- summary
  const Summary s = summarize(o, shapes, results, seconds);
  if (o.json)
    print_json(o, target.device, s, rt->options().tune.time_budget_ms, results, shapes.unsupported);
  else
    print_text(o, s, shapes.unsupported);
  return s.failed > 0 ? kExitFailure : kExitOk;
}

}  // namespace kdispatch_cli
