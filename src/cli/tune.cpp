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
//
// `tune --devices all|0,1,...` spreads the units over one worker process per
// device, pulling from one queue, largest first (run_devices, below).
//
// `tune --model CONFIG` takes its units from a model's config.json instead
// of a shape list (tune_model.cpp: the unit table; model_shapes, below):
// several ops in one run, each unit (a Job) naming its op. Every run prints
// a progress line per unit: [n/N] ... [elapsed E, ETA T].
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "cli/cli.hpp"
#include "cli/op_util.hpp"
#include "cli/shard.hpp"
#include "core/json_write.hpp"
#include "dispatch/device.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "store/bounded_read.hpp"

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
// a dim of some op (an integer >= 0 when given), a flag field (true/false),
// an accumulation (fast/precise).
struct ColumnRule {
  enum Kind { any, m, count, flag, accum } kind = any;
  std::string name;  // as messages spell it: "M", "N", "hidden", "count", "B", "bias"
};

ColumnRule column_rule(const std::string& lname) {
  if (lname == "m") return {ColumnRule::m, "M"};
  if (lname == "count") return {ColumnRule::count, "count"};
  if (lname == "b") return {ColumnRule::count, "B"};  // aiter's batched GEMM lists
  for (const dsp::OpInfo& op : dsp::op_list())
    for (const dsp::OpKeyFieldInfo& f : op.key_fields)
      if (lower(f.name) == lname && (f.kind == "dim" || f.kind == "flag" || f.kind == "accum"))
        return {f.kind == "dim"    ? ColumnRule::count
                : f.kind == "flag" ? ColumnRule::flag
                                   : ColumnRule::accum,
                std::string(f.name)};
  return {};
}

// Checks one value against its column's rule: "" when fine, else the message.
std::string check_value(const ColumnRule& rule, std::string_view v, int64_t* m) {
  if (rule.kind == ColumnRule::flag) {
    const std::string b = lower(v);
    if (b == "true" || b == "1" || b == "false" || b == "0" || b.empty()) return {};
    return rule.name + " '" + std::string(v) + "' is not true or false";
  }
  if (rule.kind == ColumnRule::accum) {
    const std::string a = lower(v);
    if (a == "fast" || a == "precise" || a.empty()) return {};
    return rule.name + " '" + std::string(v) + "' is not fast or precise";
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
  // Through the one bounded reader (store/bounded_read.hpp): a regular file
  // of at most 256 MiB; /dev/zero, a FIFO (never waited on), a directory
  // are refused with what they are, at once.
  std::string text;
  if (dsp::store::read_bounded(path, &text, {}, error) != dsp::store::ReadError::ok) return std::nullopt;
  size_t pos = 0;
  ShapeCsv csv;
  std::vector<std::string> names;  // lower-cased
  std::vector<ColumnRule> rules;
  std::string_view line;
  int line_no = 0;
  const auto fail = [&](const std::string& what) {
    *error = path + ":" + std::to_string(line_no) + ": " + what;
    return std::nullopt;
  };
  while (next_line(text, &pos, &line)) {
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
  if (s == "bfloat16")
    s = "bf16";
  else if (s == "float32" || s == "float")
    s = "fp32";
  else if (s == "float16" || s == "half")
    s = "fp16";
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
  std::string op;     // its op (--op, or the model unit's)
  int64_t bytes = 0;  // its operands' bytes at M (describe_key): a lower bound of its tuning scratch
};

// "12.3s", "4m05s", "2h07m".
std::string duration_text(double s) {
  char b[32];
  if (s < 60)
    std::snprintf(b, sizeof b, "%.1fs", s);
  else if (s < 3600)
    std::snprintf(b, sizeof b, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  else
    std::snprintf(b, sizeof b, "%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
  return b;
}

// The progress display on stderr: one line per unit, "[n/N] <what> [elapsed
// E, ETA T]"; on a terminal, also a bar redrawn in place under those lines.
// The ETA is the elapsed time per unit searched (not skipped) so far times
// the units left ("?" before the first search ends).
class Progress {
 public:
  explicit Progress(size_t total)
      : total_(total), tty_(::isatty(::fileno(stderr)) == 1), t0_(std::chrono::steady_clock::now()) {}

  void start(size_t i, const std::string& what) {
    if (!tty_) return;
    constexpr int kWidth = 24;
    const int done = total_ ? static_cast<int>(kWidth * (i - 1) / total_) : kWidth;  // shapes finished
    std::string bar(static_cast<size_t>(done), '=');
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r\033[K[%s] %zu/%zu %s ...", bar.c_str(), i, total_, what.c_str());
    std::fflush(stderr);
  }
  // Unit i of total_ ended; `searched`: it ran a search (not skipped).
  void done(size_t i, const std::string& text, bool searched = true) {
    if (tty_) std::fprintf(stderr, "\r\033[K");
    searched_ += searched;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const size_t left = total_ > i ? total_ - i : 0;
    const std::string eta = left == 0 ? std::string("0.0s")
                            : searched_ == 0
                                ? std::string("?")
                                : duration_text(elapsed / static_cast<double>(searched_) * static_cast<double>(left));
    const int w = static_cast<int>(std::to_string(total_).size());
    std::fprintf(stderr, "[%*zu/%zu] %s [elapsed %s, ETA %s]\n", w, i, total_, text.c_str(),
                 duration_text(elapsed).c_str(), eta.c_str());
    std::fflush(stderr);
  }
  void finish() {
    if (tty_) std::fprintf(stderr, "\r\033[K");
  }

 private:
  size_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_;
  size_t searched_ = 0;
};

struct Outcome {
  enum class Kind { tuned, done, too_large, unsupported, failed } kind = Kind::failed;
  std::string label;
  std::string op;
  int64_t m = 0;
  std::string variant, key, message;
  dsp::Config config;
  double us = 0, default_us = 0;
  int32_t candidates = 0, rejected = 0;
  bool persisted = false;
  double margin = 0, aa_spread = 0;  // the row's metadata (PretuneResult)
  std::string timing, why;
  // --devices: the config as a worker sent it (JSON), the worker slot and
  // device ordinal that tuned the unit (-1: this process), the attempts (2:
  // retried after its first worker died) and the unit's time in the worker.
  // queue_index: its place in the queue, 0 = the largest (the index
  // KDISPATCH_TEST_WORKER_DIE_AT names).
  std::string config_json;
  int32_t worker = -1, device = -1, attempts = 0;
  int64_t queue_index = -1;
  double seconds = 0;
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

// --devices' value: "all" (*ordinals left empty) or comma-separated device
// ordinals, each once. A message naming the problem, or "".
std::string parse_devices(const std::string& text, std::vector<int32_t>* ordinals) {
  ordinals->clear();
  if (text == "all") return {};
  const std::string what = "--devices " + text + ": ";
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string_view item =
        trim(std::string_view(text).substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    int64_t n = 0;
    if (!parse_int(item, &n) || n < 0 || n > 1023)
      return what + "expected all or device ordinals separated by commas (e.g. 0,1), got '" + std::string(item) + "'";
    if (std::find(ordinals->begin(), ordinals->end(), n) != ordinals->end())
      return what + "device " + std::to_string(n) +
             " is listed twice (for several workers on one device: " + "--workers-per-device N)";
    ordinals->push_back(static_cast<int32_t>(n));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return {};
}

// Checks the options that need no file: a usage error's exit code, or -1.
/// --margin's value; NaN when it is not a number (empty, trailing text).
double margin_of(const TuneCmdOptions& o) {
  char* end = nullptr;
  const double m = std::strtod(o.margin_text.c_str(), &end);
  return o.margin_text.empty() || end == o.margin_text.c_str() || *end != '\0' ? std::nan("") : m;
}

int check_options(const TuneCmdOptions& o, const char* cmd) {
  const auto bad = [&](const std::string& msg) {
    std::fprintf(stderr, "%s: %s\n", cmd, msg.c_str());
    return kExitUsage;
  };
  if (!o.op.empty() && !find_op(o.op)) return bad("--op '" + o.op + "' is not " + op_names_text());
  if (o.model.empty() && (o.tp != 0 || !o.fp8.empty() || !o.ms.empty() || o.no_lm_head))
    return bad("--tp, --fp8, --ms and --no-lm-head go with --model");
  if (o.tp < 0 || o.tp > 1024) return bad("--tp must be in [1, 1024], got " + std::to_string(o.tp));
  if (!o.fp8.empty() && o.fp8 != "tensor" && o.fp8 != "rowwise" && o.fp8 != "block" && o.fp8 != "none")
    return bad("--fp8 '" + o.fp8 + "' is not tensor, rowwise, block or none");
  if (!dtype_from_csv(o.dtype)) return bad("--dtype '" + o.dtype + "' is not a dtype (fp32, bf16, fp16, fp8_e4m3fn)");
  if (!(o.max_flops > 0)) return bad("--max-flops must be > 0, got " + fmt("%g", o.max_flops));
  if (o.mem_gib < 0 || !std::isfinite(o.mem_gib)) return bad("--mem-gib must be > 0, got " + fmt("%g", o.mem_gib));
  if (o.budget_ms < 0 || !std::isfinite(o.budget_ms))
    return bad("--budget-ms must be > 0, got " + fmt("%g", o.budget_ms));
  if (o.margin_given && !(margin_of(o) >= 0.0 && margin_of(o) <= 0.5))
    return bad("--margin must be a fraction in [0, 0.5], got '" + o.margin_text + "'");
  if (o.max_candidates != -1 && o.max_candidates < 1)
    return bad("--max-candidates must be >= 1, got " + std::to_string(o.max_candidates));
  if (o.reps < 0) return bad("--reps must be >= 1, got " + std::to_string(o.reps));
  if (o.backend != "cpu" && o.backend != "cuda" && o.backend != "hip")
    return bad("--backend '" + o.backend + "' is not cpu, cuda or hip");
  if (o.device < -1) return bad("--device must be >= 0, got " + std::to_string(o.device));
  if (!o.devices.empty()) {
    if (o.device >= 0) return bad("--devices and --device: give one (--devices " + o.devices + " tunes on each)");
    std::vector<int32_t> ordinals;
    if (std::string e = parse_devices(o.devices, &ordinals); !e.empty()) return bad(e);
  }
  // Read by the writer at the first persisted row: a bad value would fail
  // every row after its search.
  if (const char* lk = std::getenv("KDISPATCH_CACHE_LOCKING"))
    if (std::string_view v(lk); v != "auto" && v != "flock" && v != "fragments")
      return bad("KDISPATCH_CACHE_LOCKING='" + std::string(v) + "' is not valid (expected auto, flock or fragments)");
  // Ranges checked whether or not --devices is given, so a bad value is
  // named for what it is. Under a second kills units as they are handed out
  // (a value in ms?); over a week is no timeout (1e30 s overflows the
  // deadline's clock).
  if (o.unit_timeout_s && !(*o.unit_timeout_s >= 1 && *o.unit_timeout_s <= kMaxUnitTimeoutS))
    return bad("--unit-timeout-s must be in [1, " + fmt("%.0f", kMaxUnitTimeoutS) + "] seconds (1 s to a week), got " +
               fmt("%g", *o.unit_timeout_s));
  if (o.workers_per_device && (*o.workers_per_device < 1 || *o.workers_per_device > kMaxWorkersPerDevice))
    return bad("--workers-per-device must be in [1, " + std::to_string(kMaxWorkersPerDevice) + "], got " +
               std::to_string(*o.workers_per_device));
  if (o.workers_per_device && o.devices.empty()) return bad("--workers-per-device needs --devices");
  if (o.unit_timeout_s && o.devices.empty()) return bad("--unit-timeout-s needs --devices");
  return -1;
}

// ---- the shapes: a row of a shape list -> a key of --op

// What the reading of the shape lists found for --op.
struct Shapes {
  std::vector<Job> jobs;
  std::vector<Outcome> unsupported;           // rows of --op this host cannot tune
  std::map<std::string, int64_t> other_rows;  // rows left out: another op -> count
  std::vector<std::string> ops;               // the ops of the run: --op, or the model's
  std::optional<ModelPlan> model;             // --model: what it derived
};

// The ops of the run as the summary names them: "gemm", or "gemm/rmsnorm/...".
std::string ops_text(const Shapes& sh) {
  std::string out;
  for (const std::string& op : sh.ops) out += (out.empty() ? "" : "/") + op;
  return out;
}

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
    } else if (f.kind == "accum" && lower(v) == "fast") {
      k.fields += "," + name + "=fast";
      flags += "," + name + "=fast";
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
  bad.op = op.name;
  const std::string where = r.line > 0 ? file + ":" + std::to_string(r.line) : file;
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
    *job = Job{file, r.line, d->key_fields, key.label, r.m, d->flops, std::string(op.name), d->bytes};
  }
  return bad;
}

// A row that names no op (no op column) and has a value for none of any
// op's dims: not another op's row to leave out, but a row of --op that
// lacks its dims — failed, naming the row and each missing column.
Outcome no_op_row(const ShapeRow& r, const std::string& file, const std::vector<std::string>& columns,
                  const dsp::OpInfo& op, const std::vector<std::string_view>& dims) {
  Outcome bad;
  bad.kind = Outcome::Kind::failed;
  bad.m = r.m;
  bad.label = file + ":" + std::to_string(r.line);
  std::string missing;
  for (std::string_view d : dims) {
    bool has_column = false;
    for (const std::string& c : columns) has_column = has_column || lower(c) == lower(d);
    missing +=
        std::string(missing.empty() ? "" : "; ") + (has_column ? "no value in its '" + std::string(d) + "' column"
                                                               : "the file has no '" + std::string(d) + "' column");
  }
  std::string cols;
  for (const std::string& c : columns) cols += (cols.empty() ? "" : ",") + c;
  bad.message = "a " + std::string(op.name) + " row needs " + join_names(dims, "and") +
                " >= 1 and the row names no other op: " + missing + " (columns: " + cols + ")";
  return bad;
}

// Reads the shape lists and keeps --op's rows, without duplicates. A usage
// error's exit code, or -1.
int read_shapes(const TuneCmdOptions& o, const char* cmd, const dsp::OpInfo& op, Shapes* out) {
  const std::vector<std::string_view> dims = dims_in_file_order(op);
  out->ops = {std::string(op.name)};
  std::set<std::pair<std::string, int64_t>> seen;  // (key fields, M)
  for (const std::string& file : o.shapes) {
    std::string err;
    auto csv = read_shape_csv(file, &err);
    if (!csv) {
      std::fprintf(stderr, "%s: --shapes: %s\n", cmd, err.c_str());
      return kExitUsage;
    }
    for (const ShapeRow& r : csv->rows) {
      if (std::string name = row_op(r, op); name == "?") {
        out->unsupported.push_back(no_op_row(r, file, csv->columns, op, dims));
        continue;
      } else if (name != op.name) {
        out->other_rows[name]++;
        continue;
      }
      Job j;
      Outcome bad = add_row(r, file, o, op, dims, &j);
      if (!bad.message.empty())
        out->unsupported.push_back(std::move(bad));
      else if (seen.insert({j.key_fields, j.m}).second)
        out->jobs.push_back(std::move(j));
    }
  }
  return -1;
}

// --model: the units of the model's unit table (tune_model.cpp) at each M
// of --ms, each the job a --shapes row of its key would be (add_row), its
// label "<sites>: <op> <key>"; with --op, that op's units only. A usage
// error's exit code, or -1.
int model_shapes(const TuneCmdOptions& o, const char* cmd, Shapes* out) {
  std::string err;
  std::vector<int64_t> ms;
  if (!parse_ms(o.ms, &ms, &err)) {
    std::fprintf(stderr, "%s: %s\n", cmd, err.c_str());
    return kExitUsage;
  }
  out->model = plan_model(o, &err);
  if (!out->model) {
    std::fprintf(stderr, "%s: --model %s: %s\n", cmd, o.model.c_str(), err.c_str());
    return kExitUsage;
  }
  std::set<std::tuple<std::string, std::string, int64_t>> seen;  // (op, key fields, M)
  for (const ModelUnit& u : out->model->units) {
    if (!o.op.empty() && u.op != o.op) continue;
    const dsp::OpInfo* op = find_op(u.op);
    if (!op) continue;  // the unit table names ops of the op list only
    if (std::find(out->ops.begin(), out->ops.end(), u.op) == out->ops.end()) out->ops.push_back(u.op);
    const std::vector<std::string_view> dims = dims_in_file_order(*op);
    const std::string head = u.sites + ": " + u.op + " ";
    for (int64_t m : ms)
      for (int64_t rows : u.rows_per_token) {
        ShapeRow r;
        r.m = m * rows;
        r.fields.emplace_back("m", std::to_string(r.m));
        for (const auto& [name, v] : u.dims) r.fields.emplace_back(lower(name), std::to_string(v));
        if (u.bias) r.fields.emplace_back("bias", "true");
        r.fields.emplace_back("dtype", u.dtype.empty() ? o.dtype : u.dtype);
        if (!u.out_dtype.empty()) r.fields.emplace_back("out_dtype", u.out_dtype);
        Job j;
        Outcome bad = add_row(r, "--model " + u.sites, o, *op, dims, &j);
        if (!bad.message.empty()) {
          bad.label = head + bad.label;
          out->unsupported.push_back(std::move(bad));
        } else if (seen.insert({u.op, j.key_fields, j.m}).second) {
          j.label = head + j.label;
          out->jobs.push_back(std::move(j));
        }
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
  ro.tune.load_cache = true;                 // its rows (this build's) are the "done" set
  ro.tune.keep_rows_of_other_builds = true;  // an emit dir is committed configs: never drop rows on merge
  if (o.budget_ms > 0) ro.tune.time_budget_ms = o.budget_ms;
  // $KDISPATCH_TUNE_MEM (unless --mem-gib), $KDISPATCH_TUNE_MARGIN (unless
  // --margin), $KDISPATCH_TUNE_GRAPH and $KDISPATCH_LOG_LEVEL (info:
  // every shape's confirmation rounds) apply. The whole KDISPATCH_*
  // environment is checked as a runtime checks it, whichever variables are
  // set: a bad value is refused naming it (it was checked only when one of
  // these four was set).
  const bool env_mem = o.mem_gib <= 0 && std::getenv("KDISPATCH_TUNE_MEM");
  const bool env_margin = !o.margin_given && std::getenv("KDISPATCH_TUNE_MARGIN");
  {
    auto env = dsp::options_from_env();
    if (!env.ok()) {
      std::fprintf(stderr, "%s: %s\n", cmd, env.status().to_string().c_str());
      return nullptr;
    }
    if (env_mem) ro.tune.memory_budget_bytes = env->tune.memory_budget_bytes;
    if (env_margin) ro.tune.margin = env->tune.margin;
    if (std::getenv("KDISPATCH_LOG_LEVEL")) ro.log_level = env->log_level;
    ro.tune.graph_timing = env->tune.graph_timing;
  }
  if (o.mem_gib > 0) ro.tune.memory_budget_bytes = static_cast<int64_t>(o.mem_gib * 1073741824.0);
  if (o.no_cold_cache) ro.tune.cold_cache = false;
  if (o.reps > 0) ro.tune.reps = o.reps;
  if (o.max_candidates >= 1) ro.tune.max_candidates = o.max_candidates;
  if (o.margin_given) ro.tune.margin = margin_of(o);
  auto rt = dsp::Runtime::create(ro);
  if (!rt.ok()) {
    std::fprintf(stderr, "%s: cannot create the runtime over '%s': %s\n", cmd, o.emit.c_str(),
                 rt.status().to_string().c_str());
    *exit_code = kExitFailure;
    return nullptr;
  }
  if ((*rt)->cache_dir().empty()) {  // refused by the cache-dir rules (docs/tuning.md "Safety rules"): nothing persists
    std::string why = "refused";
    for (const std::string& n : (*rt)->load_report().notes)
      if (n.rfind("tuning cache dir '", 0) == 0) why = n;
    std::fprintf(stderr, "%s: --emit '%s': %s\n", cmd, o.emit.c_str(), why.c_str());
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
  const std::string from = sh.model ? "model units" : "shapes from " + std::to_string(o.shapes.size()) + " file(s)";
  std::fprintf(stderr, "%s: %zu %s %s -> %s (budget %.0f ms/shape, %d reps%s%s)\n", cmd, sh.jobs.size(),
               ops_text(sh).c_str(), from.c_str(), o.emit.c_str(), to.time_budget_ms, to.reps,
               to.cold_cache ? ", cold cache" : ", warm cache", o.resume ? ", resuming" : "");
  if (sh.model) {
    std::fprintf(stderr, "  model: %s\n", sh.model->description.c_str());
    for (const std::string& n : sh.model->notes) std::fprintf(stderr, "  note: %s\n", n.c_str());
  }
  for (const auto& [other, n] : sh.other_rows)
    std::fprintf(stderr, "  left out %lld rows of %s\n", (long long)n, other.c_str());
  if (auto cl = dsp::cache_locking(o.emit); cl.ok())
    std::fprintf(stderr, "  writes: %s (%s)\n",
                 cl->fragments ? "per-process fragments <key>.json.d/<host>-<pid>.json (compact them with kdispatch "
                                 "merge)"
                               : "each <key>.json merged under its lock file",
                 cl->reason.c_str());
  else
    std::fprintf(stderr, "  writes: none can be made: %s\n", cl.status().to_string().c_str());
  if (stale)
    std::fprintf(stderr,
                 "  note: %d file(s) in %s were written by another build (their fingerprint differs): their rows "
                 "do not count as done, and writing to such a file replaces them\n",
                 stale, o.emit.c_str());
}

// ---- tune

// Why a unit whose operands need `bytes` is not tuned under `budget`.
std::string over_budget_text(int64_t bytes, int64_t budget) {
  return "its operands need " + fmt("%.2f", static_cast<double>(bytes) / 1073741824.0) +
         " GiB, over the tuning memory budget of " + fmt("%.2f", static_cast<double>(budget) / 1073741824.0) +
         " GiB (--mem-gib)";
}

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
  out.margin = r.margin;
  out.aa_spread = r.aa_spread;
  out.timing = r.timing;
  out.why = r.why;
  *line = head + " -> " + r.variant + " " + fmt("%.1f", r.best_us) + "us (floor " + fmt("%.1f", r.default_us) + "us, " +
          (r.best_us > 0 && r.default_us > 0 ? fmt("%.2f", r.default_us / r.best_us) + "x" : "n/a") + ", " +
          std::to_string(r.candidates) + (r.candidates == 1 ? " candidate)" : " candidates)");
  if (!r.persisted) {
    out.kind = Outcome::Kind::failed;
    out.message = "tuned but not written to " + emit;
    *line += " FAILED: not written to the emit dir";
  }
  return out;
}

// A job skipped before the search: its call costs more than --max-flops,
// its operands alone are over the tuning memory budget (--mem-gib: a
// model's lm_head at large M), or (resuming) the emit dir has its (key, M)
// already (an exact lookup match). Sets the progress line.
std::optional<Outcome> skip(const Target& t, const Job& j, const std::string& head, std::string* line) {
  const TuneCmdOptions& o = t.o;
  Outcome out;
  out.op = j.op;
  const int64_t budget = t.rt.options().tune.memory_budget_bytes;
  if (j.flops > o.max_flops || j.bytes > budget) {
    out.kind = Outcome::Kind::too_large;
    out.message = j.flops > o.max_flops
                      ? fmt("%.3g", j.flops) + " flops per call > --max-flops " + fmt("%.3g", o.max_flops)
                      : over_budget_text(j.bytes, budget);
    *line = head + " skipped: " + out.message;
    return out;
  }
  if (!o.resume) return std::nullopt;
  dsp::LookupQuery q;
  q.op = j.op;
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

// A backend error after which the device context is unusable (CUDA's and
// HIP's sticky errors: every later call fails): only a new process recovers.
bool is_sticky_error(const dsp::Status& s) {
  if (s.code() != dsp::StatusCode::backend_error) return false;
  static const char* const kSticky[] = {"cudaErrorIllegalAddress",     "cudaErrorLaunchFailure",
                                        "cudaErrorHardwareStackError", "cudaErrorIllegalInstruction",
                                        "cudaErrorMisalignedAddress",  "cudaErrorInvalidAddressSpace",
                                        "cudaErrorInvalidPc",          "cudaErrorAssert",
                                        "cudaErrorECCUncorrectable",   "cudaErrorLaunchTimeout",
                                        "cudaErrorContextIsDestroyed", "hipErrorIllegalAddress",
                                        "hipErrorLaunchFailure",       "hipErrorAssert",
                                        "hipErrorECCNotCorrectable",   "hipErrorLaunchTimeOut",
                                        "hipErrorContextIsDestroyed"};
  const std::string text = s.to_string();
  for (const char* name : kSticky)
    if (text.find(name) != std::string::npos) return true;
  return false;
}

// One job: skipped, tuned (dsp::pretune_key, persisted into the emit dir) or
// failed; *line is its progress line. *sticky (optional) says whether it
// failed with a sticky device error. `progress` (optional) shows the job
// as started before the search.
Outcome tune_unit(const Target& t, const Job& j, std::string* line, bool* sticky = nullptr,
                  Progress* progress = nullptr, size_t i = 0) {
  const std::string head = j.label + " M=" + std::to_string(j.m);
  Outcome out;
  if (sticky) *sticky = false;
  if (auto skipped = skip(t, j, head, line)) {
    out = std::move(*skipped);
  } else {
    if (progress) progress->start(i + 1, head);
    auto r = dsp::pretune_key(t.rt, j.op, j.key_fields, j.m, t.dev);
    if (r.ok()) {
      out = tuned_outcome(*r, head, t.o.emit, line);
    } else {
      // Over the scratch-memory budget is "too large here", like --max-flops.
      out.kind = r.status().code() == dsp::StatusCode::out_of_memory ? Outcome::Kind::too_large : Outcome::Kind::failed;
      out.message = r.status().to_string();
      *line = head + (out.kind == Outcome::Kind::failed ? " FAILED: " : " skipped: ") + out.message;
      if (sticky) *sticky = is_sticky_error(r.status());
    }
  }
  out.label = j.label;
  out.op = j.op;
  out.m = j.m;
  return out;
}

// Whether the unit ran a search (the progress line's ETA counts those).
bool searched(const Outcome& out) { return out.kind == Outcome::Kind::tuned || out.kind == Outcome::Kind::failed; }

// One job of this process, with its progress line.
Outcome tune_one(const Target& t, const Job& j, size_t i, Progress& progress) {
  std::string line;
  Outcome out = tune_unit(t, j, &line, nullptr, &progress, i);
  progress.done(i + 1, line, searched(out));
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
  // Rows not tuned: unsupported here, or failed (a row of --op without its
  // dims: no_op_row).
  for (const Outcome& r : sh.unsupported) (r.kind == Outcome::Kind::failed ? s.failed : s.unsupported)++;
  s.shapes = static_cast<int64_t>(sh.jobs.size() + sh.unsupported.size());
  s.geomean = s.with_speedup ? std::exp(log_sum / static_cast<double>(s.with_speedup)) : 0.0;
  s.seconds = seconds;
  for (const std::string& op : sh.ops) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(fs::path(o.emit) / o.backend / op, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec) && it->path().extension() == ".json" && it->path().filename().string()[0] != '.')
        s.files.push_back(fs::relative(it->path(), o.emit, ec).generic_string());
  }
  std::sort(s.files.begin(), s.files.end());
  return s;
}

void write_outcome(JsonWriter& w, const Outcome& r) {
  w.begin_object();
  w.field("shape", r.label).field("M", r.m).field("status", kind_name(r.kind));
  if (!r.op.empty()) w.field("op", r.op);
  if (!r.variant.empty()) {
    w.field("variant", r.variant);
    w.key("config").json(r.config_json.empty() ? dsp::config_to_json(r.config) : r.config_json);
  }
  if (!r.key.empty()) w.field("key", r.key);
  if (r.kind == Outcome::Kind::tuned) {
    w.field("us", round3(r.us)).field("default_us", round3(r.default_us));
    w.field("speedup", r.us > 0 ? round3(r.default_us / r.us) : 0.0);
    w.field("candidates", r.candidates).field("rejected", r.rejected);
    w.field("margin", r.margin).field("aa_spread", std::round(r.aa_spread * 1e4) / 1e4);
    if (!r.timing.empty()) w.field("timing", r.timing);
    if (!r.why.empty()) w.field("why", r.why);
  }
  if (!r.message.empty()) w.field("message", r.message);
  if (r.queue_index >= 0) {
    w.field("worker", r.worker).field("device", r.device).field("queue_index", r.queue_index);
    w.field("attempts", r.attempts);
    w.field("unit_seconds", round3(r.seconds));
  }
  w.end_object();
}

// `workers` (--devices): the JSON array of the worker slots, else "".
void print_json(const TuneCmdOptions& o, const std::string& device, const Summary& s, double budget_ms,
                const std::vector<Outcome>& results, const Shapes& sh, const std::string& workers = {}) {
  const std::vector<Outcome>& unsupported = sh.unsupported;
  JsonWriter w;
  w.begin_object();
  w.field("op", o.op).field("emit", o.emit).field("device_name", device);
  if (sh.model) {  // --model: what it derived, and what it does not tune
    w.field("model", sh.model->description);
    w.key("ops").begin_array();
    for (const std::string& op : sh.ops) w.value(op);
    w.end_array();
    w.key("not_tuned").begin_array();
    for (const std::string& n : sh.model->not_tuned) w.value(n);
    w.end_array();
  }
  w.field("shapes", s.shapes).field("tuned", s.tuned);
  w.field("skipped", s.done + s.too_large + s.unsupported).field("skipped_done", s.done);
  w.field("skipped_too_large", s.too_large).field("skipped_unsupported", s.unsupported);
  w.field("failed", s.failed).field("seconds", round3(s.seconds)).field("geomean_speedup", round3(s.geomean));
  w.field("budget_ms", budget_ms);
  if (!workers.empty()) w.key("workers").json(workers);
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

void print_text(const TuneCmdOptions& o, const Summary& s, const Shapes& sh) {
  for (const Outcome& r : sh.unsupported)
    std::fprintf(stderr, "  %s %s M=%lld: %s\n", r.kind == Outcome::Kind::failed ? "failed" : "skipped",
                 r.label.c_str(), (long long)r.m, r.message.c_str());
  if (sh.model)
    for (const std::string& n : sh.model->not_tuned) std::printf("%s\n", n.c_str());
  const std::string ops = ops_text(sh);
  std::printf(
      "%lld %s shapes: %lld tuned, %lld skipped (%lld already in %s, %lld too large here, %lld not "
      "tunable here), %lld failed; %.1f s\n",
      (long long)s.shapes, ops.c_str(), (long long)s.tuned, (long long)(s.done + s.too_large + s.unsupported),
      (long long)s.done, o.emit.c_str(), (long long)s.too_large, (long long)s.unsupported, (long long)s.failed,
      s.seconds);
  if (s.with_speedup)
    std::printf(
        "geomean speedup vs the floor (what the engine runs without kdispatch): %.2fx over %lld tuned "
        "shapes\n",
        s.geomean, (long long)s.with_speedup);
  // A fragment (<key>.json.d/<host>-<pid>.json, the fragments write scheme)
  // is part of its table <key>.json, not a table of its own: the tables are
  // counted once each, whether written whole, as fragments or both.
  std::set<std::string> tables;
  size_t fragments = 0;
  for (const std::string& f : s.files) {
    const size_t d = f.find(".json.d/");
    fragments += d != std::string::npos;
    tables.insert(d != std::string::npos ? f.substr(0, d + 5) : f);
  }
  const std::string as = fragments ? " (written as " + std::to_string(fragments) +
                                         " fragment(s): compact them with kdispatch merge --compact)"
                                   : std::string();
  const std::string op_dir = sh.ops.size() == 1 ? ops : "{" + ops + "}";
  std::printf("%zu config file(s)%s under %s/%s/%s/%s\n", tables.size(), as.c_str(), o.emit.c_str(), o.backend.c_str(),
              op_dir.c_str(),
              s.files.empty() ? "" : " (the format configs/ holds; check them with `kdispatch validate`)");
}

// ---- --devices: one worker process per device, one queue
//
// The parent reads the shapes, applies --shard and the resume check, and
// orders the remaining units largest first (flops per call). Per device of
// --devices it starts --workers-per-device workers: its own executable
// (/proc/self/exe) as `kdispatch tune --internal-worker --device N` with the
// run's tuning options, each with its own runtime over the emit dir, its own
// scratch and --mem-gib. A worker takes one unit at a time; the parent hands
// the next to whichever worker is free (the first units once every first
// worker is ready or gone: unit i to worker i). Over pipes, one line per
// message, tab-separated:
//   parent -> worker (its stdin):  unit <index> <attempt> <M> <key fields> <label> <op>
//   worker -> parent (its fd 3):   ready <device name>
//                                  result <index> <kind> <persisted> <sticky> <us> <default us>
//                                         <candidates> <rejected> <variant> <key> <config> <message> <line>
// The worker's stdout is its stderr. EOF on its stdin ends it (exit 0). A
// worker whose result pipe ends without its result (killed, crashed) or
// that reports a sticky device error (then it exits) is replaced by a new
// process on the same device; its unit goes back to the front of the queue
// once, and is reported failed when it ends its worker a second time. A
// worker that dies twice in a row before it is ready gives up its slot.
// The emit dir's writes merge under a per-file lock (store/writer.hpp), so
// workers tuning different M of one key keep every row.
//
// Test hook (test-only, read by the workers): KDISPATCH_TEST_WORKER_DIE_AT=
// <index>[:always|:sticky] — the worker handed the unit of queue index
// <index> (0 = the largest) kills itself with SIGKILL before tuning it, on
// the unit's first attempt (":always": on every attempt; ":sticky": reports
// a sticky device error instead, on the first attempt; ":close-hang":
// closes its result pipe, then hangs, on the first attempt; ":hold-hang":
// forks a child that keeps its result pipe open, then both hang, on the
// first attempt).

constexpr int kWorkerResultFd = 3;
constexpr int kExitSticky = 3;  // a worker after a sticky device error

// A message text as one field of the protocol: no tab, no newline.
std::string one_field(std::string v) {
  for (char& c : v)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return v;
}

std::vector<std::string> split_tabs(std::string_view l) {
  std::vector<std::string> f;
  size_t start = 0;
  while (true) {
    const size_t tab = l.find('\t', start);
    f.emplace_back(l.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start));
    if (tab == std::string_view::npos) return f;
    start = tab + 1;
  }
}

bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

double parse_double(const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  return end && *end == '\0' && std::isfinite(d) ? d : 0.0;
}

// KDISPATCH_TEST_WORKER_DIE_AT (see above); index -1 when unset or malformed.
struct DieHook {
  int64_t index = -1;
  bool always = false, sticky = false, hang = false, sticky_hang = false, close_hang = false, hold_hang = false;
};

// Test-only: a hooked hang appends this process's pid to
// $KDISPATCH_TEST_WORKER_HANG_PIDS (so a test can end it), then waits forever.
// Async-signal-safe (no allocation): the child of hold-hang's fork calls it.
[[noreturn]] void test_hang() {
  if (const char* f = std::getenv("KDISPATCH_TEST_WORKER_HANG_PIDS"); f && *f) {
    const int fd = ::open(f, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
      char line[24];
      size_t n = sizeof line;
      line[--n] = '\n';
      for (unsigned long v = static_cast<unsigned long>(::getpid()); n > 0;) {
        line[--n] = static_cast<char>('0' + v % 10);
        if ((v /= 10) == 0) break;
      }
      (void)!::write(fd, line + n, sizeof line - n);
      ::close(fd);
    }
  }
  for (;;) ::pause();
}
DieHook die_hook() {
  DieHook h;
  const char* v = std::getenv("KDISPATCH_TEST_WORKER_DIE_AT");
  if (v == nullptr) return h;
  const std::string_view text(v);
  const size_t colon = text.find(':');
  const std::string_view mode = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  int64_t i = 0;
  if (!parse_int(text.substr(0, colon), &i) || i < 0 ||
      !(mode.empty() || mode == "always" || mode == "sticky" || mode == "hang" || mode == "hang-always" ||
        mode == "sticky-hang" || mode == "close-hang" || mode == "hold-hang"))
    return h;
  h.index = i;
  h.always = mode == "always" || mode == "hang-always";
  h.sticky = mode == "sticky" || mode == "sticky-hang";
  h.sticky_hang = mode == "sticky-hang";
  h.hang = mode == "hang" || mode == "hang-always";
  h.close_hang = mode == "close-hang";
  h.hold_hang = mode == "hold-hang";
  return h;
}

// The worker: a runtime over the emit dir on --device, then the units the
// parent sends, one at a time, until its stdin ends.
int run_worker(const TuneCmdOptions& o, const char* cmd) {
  int exit_code = kExitOk;
  std::unique_ptr<dsp::Runtime> rt = emit_runtime(o, cmd, &exit_code);
  if (!rt) return exit_code;
  Target t{*rt, o, {}, {}};
  if (!tune_device(*rt, o, cmd, &t.dev, &t.device)) return kExitUsage;
  // Test-only (KDISPATCH_TEST_WORKER_HANG_START=<path>): the first worker to
  // create <path> hangs before 'ready' (a driver or context start-up hang).
  if (const char* f = std::getenv("KDISPATCH_TEST_WORKER_HANG_START"); f && *f) {
    const int fd = ::open(f, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      test_hang();
    }
  }
  if (!write_all(kWorkerResultFd, "ready\t" + one_field(t.device) + "\n")) return kExitFailure;
  const DieHook hook = die_hook();
  std::string in;
  while (std::getline(std::cin, in)) {
    const std::vector<std::string> f = split_tabs(in);
    int64_t index = 0, attempt = 0, m = 0;
    if (f.size() != 7 || f[0] != "unit" || !parse_int(f[1], &index) || !parse_int(f[2], &attempt) ||
        !parse_int(f[3], &m) || !find_op(f[6])) {
      std::fprintf(stderr, "%s: worker: a bad command from the parent: '%s'\n", cmd, in.c_str());
      return kExitFailure;
    }
    Job j;
    j.m = m;
    j.key_fields = f[4];
    j.label = f[5];
    j.op = f[6];
    std::string line;
    bool sticky = false;
    Outcome out;
    if (hook.index == index && (attempt == 0 || hook.always)) {
      if (hook.hang) test_hang();  // a hung kernel: only the parent's --unit-timeout-s ends it
      if (hook.close_hang) {       // its pipe ends but the process stays: the parent must not wait forever
        ::close(kWorkerResultFd);
        test_hang();
      }
      if (hook.hold_hang) {  // a child keeps its result pipe open past its SIGKILL (as a thread stuck in D does)
        std::fflush(nullptr);
        if (::fork() == 0) test_hang();
        test_hang();
      }
      if (!hook.sticky) {
        std::fflush(nullptr);
        ::kill(::getpid(), SIGKILL);
      }
      sticky = true;
      out.kind = Outcome::Kind::failed;
      out.message = "backend_error: a simulated sticky device error (KDISPATCH_TEST_WORKER_DIE_AT)";
      line = j.label + " M=" + std::to_string(m) + " FAILED: " + out.message;
    } else {
      out = tune_unit(t, j, &line, &sticky);
    }
    const std::string cfg = out.variant.empty() ? std::string() : dsp::config_to_json(out.config);
    const std::string reply = "result\t" + std::to_string(index) + "\t" + kind_name(out.kind) + "\t" +
                              (out.persisted ? "1" : "0") + "\t" + (sticky ? "1" : "0") + "\t" + fmt("%.17g", out.us) +
                              "\t" + fmt("%.17g", out.default_us) + "\t" + std::to_string(out.candidates) + "\t" +
                              std::to_string(out.rejected) + "\t" + one_field(out.variant) + "\t" + one_field(out.key) +
                              "\t" + one_field(cfg) + "\t" + one_field(out.message) + "\t" + one_field(line) + "\t" +
                              fmt("%.17g", out.margin) + "\t" + fmt("%.17g", out.aa_spread) + "\t" +
                              one_field(out.timing) + "\t" + one_field(out.why) + "\n";
    if (!write_all(kWorkerResultFd, reply)) return kExitFailure;
    // sticky-hang: the exit after a sticky error hangs (a context teardown).
    if (sticky && hook.sticky_hang && hook.index == index) test_hang();
    if (sticky) return kExitSticky;  // the device context is unusable: the parent starts a new worker
  }
  return kExitOk;
}

// A worker result's kind.
Outcome::Kind kind_from_name(std::string_view n) {
  for (Outcome::Kind k : {Outcome::Kind::tuned, Outcome::Kind::done, Outcome::Kind::too_large,
                          Outcome::Kind::unsupported, Outcome::Kind::failed})
    if (n == kind_name(k)) return k;
  return Outcome::Kind::failed;
}

// How a child process ended, in words.
std::string exit_text(int status) {
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return "killed by signal " + std::to_string(WTERMSIG(status)) + (name ? std::string(" (") + name + ")" : "");
  }
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  return "ended (status " + std::to_string(status) + ")";
}

// One worker slot of --devices: the process serving it now (pid -1: none)
// and the totals of every process it had.
struct WorkerSlot {
  int32_t index = 0, ordinal = 0;
  std::string name;  // "worker 1 (cuda:1)"
  pid_t pid = -1;
  int cmd_fd = -1, res_fd = -1;
  std::string buf;  // a result line read in part
  bool ready = false, retiring = false, abandoned = false;
  bool timed_out = false;       // killed for running its unit past --unit-timeout-s
  Clock::time_point killed_at;  // when (timed_out)
  int64_t unit = -1;            // the queue index in flight, or -1
  Clock::time_point started;
  int32_t startup_failures = 0, processes = 0;
  int64_t units = 0;
  double busy_seconds = 0;
};

// The devices of --devices: their ordinals and the one device name they
// share. A usage error's exit code, or -1.
int resolve_devices(const TuneCmdOptions& o, const char* cmd, dsp::Runtime& rt, std::vector<int32_t>* ordinals,
                    std::string* device_name) {
  auto type = dsp::parse_device_type(o.backend);
  if (!type.ok()) {
    std::fprintf(stderr, "%s: --backend %s: %s\n", cmd, o.backend.c_str(), type.status().to_string().c_str());
    return kExitUsage;
  }
  const std::string what = "--devices " + o.devices + " (--backend " + o.backend + ")";
  if (std::string e = parse_devices(o.devices, ordinals); !e.empty()) {  // checked before: cannot fail
    std::fprintf(stderr, "%s: %s\n", cmd, e.c_str());
    return kExitUsage;
  }
  std::vector<std::string> names;
  if (o.devices == "all") {
    for (int32_t n = 0; n < 1024; ++n) {
      auto di = rt.device_info(dsp::Device{*type, n});
      if (!di.ok() || !di->available) {
        if (n == 0) {
          std::fprintf(stderr, "%s: %s: no device: %s\n", cmd, what.c_str(),
                       di.ok() ? di->unavailable_reason.c_str() : di.status().to_string().c_str());
          return kExitUsage;
        }
        break;
      }
      ordinals->push_back(n);
      names.push_back(di->device_name);
    }
  } else {
    for (int32_t n : *ordinals) {
      auto di = rt.device_info(dsp::Device{*type, n});
      if (!di.ok() || !di->available) {
        std::fprintf(stderr, "%s: %s: device %d is not present: %s\n", cmd, what.c_str(), n,
                     di.ok() ? di->unavailable_reason.c_str() : di.status().to_string().c_str());
        return kExitUsage;
      }
      names.push_back(di->device_name);
    }
  }
  // The units are pulled by any worker, so every device must tune for the
  // same config files (and resume from the same rows).
  for (size_t i = 1; i < names.size(); ++i)
    if (names[i] != names[0]) {
      std::fprintf(stderr,
                   "%s: %s: device %d is %s but device %d is %s: the devices of one run must be of one kind "
                   "(tune each kind with its own --devices list)\n",
                   cmd, what.c_str(), (*ordinals)[0], names[0].c_str(), (*ordinals)[i], names[i].c_str());
      return kExitUsage;
    }
  *device_name = names.at(0);
  return -1;
}

// The worker's command line: the run's tuning options on one device.
std::vector<std::string> worker_argv(const TuneCmdOptions& o, const std::string& exe, int32_t ordinal) {
  // No --shapes, --op nor --model: a worker reads no shape list; each unit names its op.
  std::vector<std::string> a = {exe, "tune", "--internal-worker"};
  a.insert(a.end(), {"--emit", o.emit, "--dtype", o.dtype, "--backend", o.backend, "--device", std::to_string(ordinal),
                     "--max-flops", fmt("%.17g", o.max_flops)});
  if (o.budget_ms > 0) a.insert(a.end(), {"--budget-ms", fmt("%.17g", o.budget_ms)});
  if (o.mem_gib > 0) a.insert(a.end(), {"--mem-gib", fmt("%.17g", o.mem_gib)});
  if (o.reps > 0) a.insert(a.end(), {"--reps", std::to_string(o.reps)});
  if (o.max_candidates >= 1) a.insert(a.end(), {"--max-candidates", std::to_string(o.max_candidates)});
  if (o.margin_given) a.insert(a.end(), {"--margin", o.margin_text});
  if (o.no_cold_cache) a.push_back("--no-cold-cache");
  if (!o.resume) a.push_back("--no-resume");
  return a;
}

// Starts the process of `w`: pipes, fork, exec. False (message printed) when
// no process could be started.
bool spawn_worker(WorkerSlot& w, const std::vector<std::string>& args, const char* cmd) {
  int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "%s: %s: cannot create a pipe: %s\n", cmd, w.name.c_str(), std::strerror(errno));
    for (int fd : {to_child[0], to_child[1]})
      if (fd >= 0) ::close(fd);
    return false;
  }
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {  // the child: async-signal-safe calls only, until exec
    ::signal(SIGPIPE, SIG_DFL);
    if (::dup2(to_child[0], 0) < 0) ::_exit(127);
    if (from_child[1] == kWorkerResultFd)
      ::fcntl(kWorkerResultFd, F_SETFD, 0);  // keep it over exec
    else if (::dup2(from_child[1], kWorkerResultFd) < 0)
      ::_exit(127);
    ::dup2(2, 1);  // the worker's stdout is not the summary's
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (pid < 0) {
    std::fprintf(stderr, "%s: %s: fork: %s\n", cmd, w.name.c_str(), std::strerror(errno));
    ::close(to_child[1]);
    ::close(from_child[0]);
    return false;
  }
  w.pid = pid;
  w.cmd_fd = to_child[1];
  w.res_fd = from_child[0];
  w.buf.clear();
  w.ready = w.retiring = false;
  w.unit = -1;
  w.started = Clock::now();  // --unit-timeout-s bounds the start-up too
  ++w.processes;
  return true;
}

// --unit-timeout-s, or its default: 300 s + 30 x the search budget (the
// library's 2000 ms when --budget-ms is not given).
double unit_timeout_s(const TuneCmdOptions& o) {
  if (o.unit_timeout_s) return *o.unit_timeout_s;
  return 300.0 + 30.0 * (o.budget_ms > 0 ? o.budget_ms : 2000.0) / 1000.0;
}

// The parent of --devices: the queue, the workers, their results.
class DeviceRun {
 public:
  // `done`: the progress lines printed before (the skipped units).
  DeviceRun(const TuneCmdOptions& o, const char* cmd, const std::vector<Job>& jobs, std::vector<Outcome>* results,
            Progress& progress, size_t done)
      : o_(o),
        cmd_(cmd),
        jobs_(jobs),
        results_(*results),
        progress_(progress),
        done_(done),
        timeout_s_(unit_timeout_s(o)) {}

  // Tunes `units` (indices into jobs, largest first) on the slots' devices.
  void run(const std::vector<size_t>& units, const std::vector<int32_t>& ordinals, int32_t per_device,
           const std::string& exe) {
    units_ = units;
    attempts_.assign(units.size(), 0);
    for (size_t i = 0; i < units.size(); ++i) queue_.push_back(static_cast<int64_t>(i));
    // Slot order spreads the first workers over the devices.
    for (int32_t k = 0; k < per_device; ++k)
      for (int32_t ordinal : ordinals) {
        WorkerSlot w;
        w.index = static_cast<int32_t>(slots_.size());
        w.ordinal = ordinal;
        w.name = "worker " + std::to_string(w.index) + " (" + o_.backend + ":" + std::to_string(ordinal) + ")";
        slots_.push_back(std::move(w));
      }
    exe_ = exe;
    loop();
    for (WorkerSlot& w : slots_) stop(w);
  }

  const std::vector<WorkerSlot>& slots() const { return slots_; }

 private:
  const Job& job_of(int64_t unit) const { return jobs_[units_[static_cast<size_t>(unit)]]; }
  std::string head_of(int64_t unit) const { return job_of(unit).label + " M=" + std::to_string(job_of(unit).m); }

  void loop() {
    while (true) {
      // Start workers while units wait for more than the free ones; replace
      // a worker that ended while the run has work (queued or in flight).
      const auto busy = [](const WorkerSlot& w) { return w.unit >= 0; };
      const bool work = !queue_.empty() || std::any_of(slots_.begin(), slots_.end(), busy);
      size_t free_workers = 0;
      for (const WorkerSlot& w : slots_) free_workers += w.pid > 0 && !w.retiring && w.unit < 0;
      for (WorkerSlot& w : slots_)
        if (w.pid < 0 && !w.abandoned && (queue_.size() > free_workers || (w.processes > 0 && work))) {
          if (spawn_worker(w, worker_argv(o_, exe_, w.ordinal), cmd_))
            ++free_workers;
          else
            w.abandoned = true;
        }
      // The first units wait until every first worker is ready (or gone):
      // unit i goes to worker i, the largest units start together.
      const auto live = [](const WorkerSlot& w) { return w.pid > 0; };
      const auto starting = [](const WorkerSlot& w) { return w.pid > 0 && !w.ready; };
      if (!started_)
        started_ =
            std::any_of(slots_.begin(), slots_.end(), live) && std::none_of(slots_.begin(), slots_.end(), starting);
      for (WorkerSlot& w : slots_)
        if (started_ && w.pid > 0 && w.ready && !w.retiring && w.unit < 0 && !queue_.empty()) hand_out(w);
      if (queue_.empty() && std::none_of(slots_.begin(), slots_.end(), busy)) return;
      if (std::none_of(slots_.begin(), slots_.end(), live)) {  // every slot gave up: the queued units cannot be tuned
        while (!queue_.empty()) {
          fail(queue_.front(), "no worker could be started on any device of --devices");
          queue_.pop_front();
        }
        return;
      }
      wait_and_read();
    }
  }

  void hand_out(WorkerSlot& w) {
    const int64_t unit = queue_.front();
    queue_.pop_front();
    const Job& j = job_of(unit);
    w.unit = unit;
    w.started = Clock::now();
    const std::string msg = "unit\t" + std::to_string(unit) + "\t" + std::to_string(attempts_[size_t(unit)]) + "\t" +
                            std::to_string(j.m) + "\t" + j.key_fields + "\t" + one_field(j.label) + "\t" + j.op + "\n";
    // A worker that died meanwhile: its pipe's end says so (EPIPE here,
    // EOF on its result pipe), and its unit is handled there.
    (void)write_all(w.cmd_fd, msg);
  }

  void wait_and_read() {
    // Wake up for the first unit deadline (--unit-timeout-s); a worker past
    // it is killed, and its result pipe's EOF retries or fails the unit.
    // The same deadline bounds a worker's start-up (a hung driver or context
    // creation: the first units wait for every first worker) and the exit
    // of one retiring after a sticky error (stop() waits for it).
    // A killed worker's pipe ends with it; one whose pipe is still open
    // grace() after the SIGKILL (a thread stuck in the GPU driver keeps every
    // fd of the process open; a child may hold the pipe) is ended here.
    int wait_ms = -1;
    bool gone = false;
    const auto now = Clock::now();
    for (WorkerSlot& w : slots_) {
      if (w.pid > 0 && w.timed_out) {
        const double left = grace() - std::chrono::duration<double>(now - w.killed_at).count();
        if (left <= 0) {
          ended(w, /*pipe_open=*/true);
          gone = true;
          continue;
        }
        const int ms = static_cast<int>(left * 1000.0 + 1.0);
        wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
        continue;
      }
      if (w.pid <= 0 || (w.unit < 0 && w.ready && !w.retiring)) continue;
      const double left = timeout_s_ - std::chrono::duration<double>(now - w.started).count();
      if (left <= 0) {
        w.timed_out = true;
        const std::string what = w.unit >= 0 ? "ran " + head_of(w.unit)
                                 : !w.ready  ? std::string("was not ready")
                                             : std::string("had not exited after its sticky device error");
        std::fprintf(stderr, "%s: %s (pid %d) %s past --unit-timeout-s %g: killed\n", cmd_, w.name.c_str(),
                     static_cast<int>(w.pid), what.c_str(), timeout_s_);
        // Never handed another unit: a result read before its EOF (it
        // finished as it was killed) must not make it look free.
        w.retiring = true;
        ::kill(w.pid, SIGKILL);
        w.killed_at = Clock::now();
        const int ms = static_cast<int>(grace() * 1000.0 + 1.0);
        wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
        continue;
      }
      const int ms = static_cast<int>(std::min(left * 1000.0 + 1.0, 3.6e6));
      wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
    }
    // A unit retried or a slot freed: the loop hands it out (or starts a
    // worker) before anything waits.
    if (gone) return;
    std::vector<pollfd> fds;
    std::vector<WorkerSlot*> who;
    for (WorkerSlot& w : slots_)
      if (w.pid > 0) {
        fds.push_back(pollfd{w.res_fd, POLLIN, 0});
        who.push_back(&w);
      }
    if (fds.empty()) return;                                  // the loop starts workers (or gives up)
    if (::poll(fds.data(), fds.size(), wait_ms) < 0) return;  // EINTR: the loop polls again
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      WorkerSlot& w = *who[i];
      char buf[4096];
      const ssize_t n = ::read(w.res_fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ended(w);
        continue;
      }
      w.buf.append(buf, static_cast<size_t>(n));
      for (size_t nl; (nl = w.buf.find('\n')) != std::string::npos;) {
        const std::string line = w.buf.substr(0, nl);
        w.buf.erase(0, nl + 1);
        message(w, line);
      }
    }
  }

  void message(WorkerSlot& w, const std::string& line) {
    const std::vector<std::string> f = split_tabs(line);
    if (f.size() == 2 && f[0] == "ready") {
      w.ready = true;
      w.startup_failures = 0;
      return;
    }
    int64_t unit = -1, cand = 0, rej = 0;
    if (f.size() != 18 || f[0] != "result" || !parse_int(f[1], &unit) || unit != w.unit || !parse_int(f[7], &cand) ||
        !parse_int(f[8], &rej)) {
      std::fprintf(stderr, "%s: %s: an unexpected message: '%s'\n", cmd_, w.name.c_str(), line.c_str());
      return;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - w.started).count();
    w.unit = -1;
    w.busy_seconds += seconds;
    const bool sticky = f[4] == "1";
    const std::string where = w.name + ": ";
    const std::string took = fmt(" [%.2f s]", seconds);
    if (sticky) {  // the worker exits; a new one takes the unit once
      w.retiring = true;
      w.started = Clock::now();  // its exit's deadline (--unit-timeout-s)
      ++attempts_[size_t(unit)];
      const bool again = attempts_[size_t(unit)] < 2;
      progress_line(where + f[13] + took + (again ? " (a sticky device error: retried on a new worker)" : ""), !again);
      if (again) {
        queue_.push_front(unit);
      } else {
        ++w.units;
        fail(unit, f[12] + " (a sticky device error, twice)", &w, seconds);
      }
      return;
    }
    ++w.units;
    Outcome out;
    out.kind = kind_from_name(f[2]);
    out.persisted = f[3] == "1";
    out.us = parse_double(f[5]);
    out.default_us = parse_double(f[6]);
    out.candidates = static_cast<int32_t>(cand);
    out.rejected = static_cast<int32_t>(rej);
    out.variant = f[9];
    out.key = f[10];
    out.config_json = f[11];
    out.message = f[12];
    out.margin = parse_double(f[14]);
    out.aa_spread = parse_double(f[15]);
    out.timing = f[16];
    out.why = f[17];
    out.attempts = attempts_[size_t(unit)] + 1;
    const bool ran = searched(out);
    record(unit, std::move(out), &w, seconds);
    progress_line(where + f[13] + took, true, ran);
  }

  // How long a worker whose pipe ended is given to exit before SIGKILL, and
  // then to end on it: min(10 s, --unit-timeout-s).
  double grace() const { return std::min(10.0, timeout_s_); }

  // The result pipe of `w` ended: its process is gone (or going). Or, with
  // `pipe_open`, `w` was killed past --unit-timeout-s and its pipe did not
  // end within grace() of that.
  void ended(WorkerSlot& w, bool pipe_open = false) {
    ::close(w.res_fd);
    ::close(w.cmd_fd);
    // Its pipe ended, so it is exiting: reaped within g = min(10 s,
    // --unit-timeout-s), else SIGKILLed and given g more; a process that
    // outlives SIGKILL (stuck in the GPU driver, state D) is left behind,
    // never waited on: the run goes on with a new worker in its slot. One
    // killed past --unit-timeout-s counts from that SIGKILL.
    int status = 0;
    bool reaped = false, left_behind = false, killed_now = w.timed_out;
    {
      const auto t0 = w.timed_out ? w.killed_at : Clock::now();
      for (;;) {
        const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
        if (r == w.pid || (r < 0 && errno != EINTR)) {
          reaped = r == w.pid;
          break;
        }
        const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
        const double grace = this->grace();
        if (!killed_now && waited > grace) {
          ::kill(w.pid, SIGKILL);
          killed_now = true;
        } else if (killed_now && waited > 2 * grace) {
          left_behind = true;
          break;
        }
        ::usleep(r == 0 && waited < 0.05 ? 1000 : 10000);
      }
    }
    const bool timed_out = w.timed_out;
    const std::string death = timed_out ? fmt("killed past --unit-timeout-s %g", timeout_s_) +
                                              (left_behind ? std::string(", did not end on SIGKILL: left behind")
                                               : pipe_open ? std::string(" (its result pipe stayed open)")
                                                           : std::string())
                              : left_behind ? std::string("closed its pipe and did not end on SIGKILL: left behind")
                              : killed_now  ? std::string("closed its pipe and did not exit: killed")
                              : reaped      ? exit_text(status)
                                            : std::string("ended (its exit status could not be read)");
    const std::string how = w.name + " (pid " + std::to_string(w.pid) + ") " + death;
    const int64_t unit = w.unit;
    const bool was_ready = w.ready, retiring = w.retiring;
    w.timed_out = false;
    w.pid = -1;
    w.cmd_fd = w.res_fd = -1;
    w.unit = -1;
    w.ready = w.retiring = false;
    if (unit >= 0) {
      const double seconds = std::chrono::duration<double>(Clock::now() - w.started).count();
      w.busy_seconds += seconds;
      ++attempts_[size_t(unit)];
      if (attempts_[size_t(unit)] < 2) {
        std::fprintf(stderr, "%s: %s while tuning %s: the unit is retried on a new worker\n", cmd_, how.c_str(),
                     head_of(unit).c_str());
        queue_.push_front(unit);
      } else {
        std::fprintf(stderr, "%s: %s while tuning %s, its second attempt: the unit failed\n", cmd_, how.c_str(),
                     head_of(unit).c_str());
        ++w.units;
        fail(unit, "its worker died on both attempts (the last " + death + ")", &w, seconds);
        progress_line(w.name + ": " + head_of(unit) + " FAILED: its worker died on both attempts", true);
      }
    } else if (!was_ready) {
      ++w.startup_failures;
      std::fprintf(stderr, "%s: %s before it was ready%s\n", cmd_, how.c_str(),
                   w.startup_failures >= 2 ? ", twice in a row: no more workers on this slot" : "");
      w.abandoned = w.startup_failures >= 2;
    } else if (!retiring) {
      std::fprintf(stderr, "%s: %s between units\n", cmd_, how.c_str());
    }
  }

  // Ends the process of `w` at the end of the run: EOF on its stdin.
  // A worker still there after --unit-timeout-s (an exit that hangs) is
  // killed; one that SIGKILL does not end within 10 s more is left behind.
  void stop(WorkerSlot& w) {
    if (w.pid < 0) return;
    ::close(w.cmd_fd);
    ::close(w.res_fd);
    const auto t0 = Clock::now();
    bool killed = false;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r == w.pid || (r < 0 && errno != EINTR)) break;
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!killed && waited > timeout_s_) {
        std::fprintf(stderr, "%s: %s (pid %d) had not exited %g s after the run's end (--unit-timeout-s): killed\n",
                     cmd_, w.name.c_str(), static_cast<int>(w.pid), timeout_s_);
        ::kill(w.pid, SIGKILL);
        killed = true;
      } else if (killed && waited > timeout_s_ + 10) {
        std::fprintf(stderr, "%s: %s (pid %d) did not end on SIGKILL: left behind\n", cmd_, w.name.c_str(),
                     static_cast<int>(w.pid));
        break;
      }
      ::usleep(10000);
    }
    w.pid = -1;
  }

  void record(int64_t unit, Outcome out, const WorkerSlot* w, double seconds) {
    const Job& j = job_of(unit);
    out.label = j.label;
    out.op = j.op;
    out.m = j.m;
    out.queue_index = unit;
    out.worker = w ? w->index : -1;
    out.device = w ? w->ordinal : -1;
    out.seconds = seconds;
    results_[units_[size_t(unit)]] = std::move(out);
  }

  void fail(int64_t unit, const std::string& message, const WorkerSlot* w = nullptr, double seconds = 0) {
    Outcome out;
    out.kind = Outcome::Kind::failed;
    out.message = message;
    out.attempts = attempts_[size_t(unit)];
    record(unit, std::move(out), w, seconds);
  }

  // A line of a unit's end (`counts`: numbered as the units' progress), or of a retry.
  void progress_line(const std::string& text, bool counts, bool ran = true) {
    if (counts)
      progress_.done(++done_, text, ran);
    else
      std::fprintf(stderr, "%s\n", text.c_str());
  }

  const TuneCmdOptions& o_;
  const char* cmd_;
  const std::vector<Job>& jobs_;
  std::vector<Outcome>& results_;
  Progress& progress_;
  std::string exe_;
  std::vector<size_t> units_;      // queue index -> job index
  std::vector<int32_t> attempts_;  // queue index -> attempts that ended its worker
  std::deque<int64_t> queue_;
  std::vector<WorkerSlot> slots_;
  size_t done_ = 0;       // progress lines numbered so far (the skipped units first)
  bool started_ = false;  // the first workers were all ready (or gone) once
  double timeout_s_;      // --unit-timeout-s, resolved
};

// tune --devices: the resume and --max-flops checks here, the rest in the
// workers. Returns the exit code.
int run_devices(const TuneCmdOptions& o, const char* cmd, const Shapes& shapes, dsp::Runtime& rt) {
  std::vector<int32_t> ordinals;
  std::string device_name;
  if (int e = resolve_devices(o, cmd, rt, &ordinals, &device_name); e >= 0) return e;
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    std::fprintf(stderr, "%s: --devices: cannot find this executable (/proc/self/exe): %s\n", cmd,
                 std::strerror(errno));
    return kExitFailure;
  }
  exe[n] = '\0';
  auto type = dsp::parse_device_type(o.backend);
  Target target{rt, o, dsp::Device{*type, ordinals[0]}, device_name};
  const int32_t per_device = o.workers_per_device.value_or(1);

  const auto t0 = Clock::now();
  Progress progress(shapes.jobs.size());
  std::vector<Outcome> results(shapes.jobs.size());
  std::vector<size_t> units;
  size_t done = 0;
  for (size_t i = 0; i < shapes.jobs.size(); ++i) {
    const Job& j = shapes.jobs[i];
    std::string line;
    if (auto skipped = skip(target, j, j.label + " M=" + std::to_string(j.m), &line)) {
      results[i] = std::move(*skipped);
      results[i].label = j.label;
      results[i].m = j.m;
      progress.done(++done, line, false);
    } else {
      units.push_back(i);
    }
  }
  std::stable_sort(units.begin(), units.end(),
                   [&](size_t a, size_t b) { return shapes.jobs[a].flops > shapes.jobs[b].flops; });
  std::string devs;
  for (int32_t d : ordinals) devs += (devs.empty() ? "" : ",") + std::to_string(d);
  if (!o.json)
    std::fprintf(stderr, "%s: %zu units to tune on %s device(s) %s (%s), %d worker(s) each, largest first\n", cmd,
                 units.size(), o.backend.c_str(), devs.c_str(), device_name.c_str(), per_device);

  // A worker's pipe closing under a write must not end this process.
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  ::sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &old);
  DeviceRun dr(o, cmd, shapes.jobs, &results, progress, done);
  dr.run(units, ordinals, per_device, exe);
  ::sigaction(SIGPIPE, &old, nullptr);
  progress.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  const Summary s = summarize(o, shapes, results, seconds);
  if (o.json) {
    std::string out;
    {
      JsonWriter w;
      w.begin_array();
      for (const WorkerSlot& ws : dr.slots()) {
        w.begin_object();
        w.field("worker", ws.index).field("device", ws.ordinal).field("units", ws.units);
        w.field("seconds", round3(ws.busy_seconds)).field("processes", ws.processes);
        w.field("restarts", std::max(0, ws.processes - 1));
        w.end_object();
      }
      w.end_array();
      out = w.take();
    }
    print_json(o, device_name, s, rt.options().tune.time_budget_ms, results, shapes, out);
  } else {
    print_text(o, s, shapes);
    for (const WorkerSlot& ws : dr.slots())
      std::printf("%s: %lld units, %.2f s tuning%s\n", ws.name.c_str(), (long long)ws.units, ws.busy_seconds,
                  ws.processes > 1    ? (", " + std::to_string(ws.processes - 1) + " restart(s)").c_str()
                  : ws.processes == 0 ? ", not started (no unit waited for it)"
                                      : "");
    std::printf("wall time %.1f s with %zu worker(s) on %zu device(s)\n", seconds, dr.slots().size(), ordinals.size());
  }
  return s.failed > 0 ? kExitFailure : kExitOk;
}

}  // namespace

// Keeps the units of --shard (cli/shard.hpp) in shapes->jobs; the device
// ordinal torchrun names goes to *o. A usage error's exit code, or -1.
int select_shard(TuneCmdOptions* o, const char* cmd, Shapes* shapes) {
  if (o->shard.empty()) return -1;
  std::string err;
  const auto s = parse_shard(
      o->shard, [](const char* n) { return std::getenv(n); }, &err);
  if (!s) {
    std::fprintf(stderr, "%s: %s\n", cmd, err.c_str());
    return kExitUsage;
  }
  if (s->from_torchrun && !o->devices.empty()) {
    std::fprintf(stderr,
                 "%s: --devices under torchrun (%s): torchrun already runs one process per GPU, each tuning its "
                 "shard on its LOCAL_RANK; drop --devices (or run --devices without torchrun)\n",
                 cmd, s->source.c_str());
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
    if (in_shard(*s, unit_hash(j.op, j.key_fields, j.m))) kept.push_back(std::move(j));
  shapes->jobs = std::move(kept);
  std::fprintf(stderr, "%s: shard %lld/%lld from %s: %zu of %zu units\n", cmd, (long long)s->index, (long long)s->count,
               s->source.c_str(), shapes->jobs.size(), all);
  return -1;
}

// The tuning memory budget the run's runtime will have (emit_runtime):
// --mem-gib, else $KDISPATCH_TUNE_MEM, else the library's default.
int64_t mem_budget(const TuneCmdOptions& o) {
  if (o.mem_gib > 0) return static_cast<int64_t>(o.mem_gib * 1073741824.0);
  if (std::getenv("KDISPATCH_TUNE_MEM"))
    if (auto env = dsp::options_from_env(); env.ok()) return env->tune.memory_budget_bytes;
  return dsp::TuneOptions{}.memory_budget_bytes;
}

// --list: the units, one per line (label, M, unit hash; units over
// --max-flops or whose operands are over the memory budget marked), and an
// estimate for the others: per unit the search budget plus ~0.5 s of
// confirmation and reference. The emit dir is not read: units it already
// holds are listed and counted too. --model: the model first, its units,
// then what it does not tune.
int list_units(const TuneCmdOptions& o, const Shapes& shapes) {
  const double budget_s = (o.budget_ms > 0 ? o.budget_ms : dsp::TuneOptions{}.time_budget_ms) / 1000.0;
  const int64_t mem = mem_budget(o);
  if (shapes.model) {
    std::printf("model %s\n", shapes.model->description.c_str());
    for (const std::string& n : shapes.model->notes) std::printf("note: %s\n", n.c_str());
  }
  size_t tunable = 0;
  for (const Job& j : shapes.jobs) {
    const bool large = j.flops > o.max_flops, big = !large && j.bytes > mem;
    tunable += !large && !big;
    std::printf("%s M=%lld unit=%016llx%s\n", j.label.c_str(), (long long)j.m,
                (unsigned long long)unit_hash(j.op, j.key_fields, j.m),
                large ? " (over --max-flops: skipped)"
                : big ? (" (too large here: " + over_budget_text(j.bytes, mem) + ")").c_str()
                      : "");
  }
  for (const Outcome& r : shapes.unsupported)
    std::printf("%s M=%lld (not tunable here: %s)\n", r.label.c_str(), (long long)r.m, r.message.c_str());
  if (shapes.model)
    for (const std::string& n : shapes.model->not_tuned) std::printf("%s\n", n.c_str());
  std::printf("%zu unit%s, estimated %.0f s (%.1f s search + ~0.5 s confirmation each", shapes.jobs.size(),
              shapes.jobs.size() == 1 ? "" : "s", static_cast<double>(tunable) * (budget_s + 0.5), budget_s);
  if (tunable != shapes.jobs.size()) std::printf("; %zu over --max-flops or --mem-gib", shapes.jobs.size() - tunable);
  std::printf(o.emit.empty() ? ")\n" : "; units the emit dir holds are counted too)\n");
  return kExitOk;
}

// The --max-flops of a GPU backend when none is given.
constexpr double kNoFlopsLimit = 1e18;

// --model on a GPU without --mem-gib or $KDISPATCH_TUNE_MEM: the budget is
// a quarter of the device's memory, split over --workers-per-device (the
// lm_head of a 150k vocabulary at M = 8192 needs ~4 GiB of operands, over
// the library's 1 GiB default), never below that default. Left as it is
// when the device cannot be asked (the budget then says "too large here").
void size_model_budget(TuneCmdOptions* o) {
  if (o->mem_gib > 0 || std::getenv("KDISPATCH_TUNE_MEM") || o->model.empty() || o->backend == "cpu") return;
  auto type = dsp::parse_device_type(o->backend);
  if (!type.ok()) return;
  dsp::RuntimeOptions ro;
  ro.load_shipped_configs = false;
  ro.log_level = dsp::LogLevel::off;
  ro.tune.mode = dsp::TuneMode::off;
  auto rt = dsp::Runtime::create(ro);
  if (!rt.ok()) return;
  auto di = (*rt)->device_info(dsp::Device{*type, o->device < 0 ? 0 : o->device});
  if (!di.ok() || !di->available || di->memory_bytes <= 0) return;
  const double per_worker = static_cast<double>(di->memory_bytes) / 4.0 / o->workers_per_device.value_or(1);
  o->mem_gib = std::max(static_cast<double>(dsp::TuneOptions{}.memory_budget_bytes), per_worker) / 1073741824.0;
}

int run_tune(const TuneCmdOptions& opts) {
  const char* cmd = "kdispatch tune";
  TuneCmdOptions o = opts;
  if (o.dtype.empty()) {  // no --dtype: bf16, else the op's only input dtype (the fp8 GEMMs: fp8_e4m3fn)
    o.dtype = "bf16";
    if (const dsp::OpInfo* info = find_op(o.op); info && info->in_dtypes.size() == 1 && info->in_dtypes[0] != "bf16")
      o.dtype = std::string(info->in_dtypes[0]);
  }
  if (o.emit.empty() && !o.list) {  // --list tunes nothing: no dir needed
    std::fprintf(stderr, "%s: --emit DIR is required (the dir the config files are written to)\n", cmd);
    return kExitUsage;
  }
  if (int e = check_options(o, cmd); e >= 0) return e;
  if (o.internal_worker) return run_worker(o, cmd);
  if (!o.max_flops_given && o.backend != "cpu") o.max_flops = kNoFlopsLimit;
  size_model_budget(&o);
  if (o.model.empty() == o.shapes.empty() || (o.model.empty() && o.op.empty())) {
    std::fprintf(stderr, "%s: give --shapes FILE... with --op OP, or --model CONFIG.json|DIR|NAME%s\n", cmd,
                 o.model.empty() ? "" : " (not both)");
    return kExitUsage;
  }
  // Under torchrun each process is one GPU's: --devices would start workers
  // on every GPU from every process (--shard auto says so below too).
  const bool torchrun = std::getenv("TORCHELASTIC_RUN_ID") || (std::getenv("LOCAL_RANK") && std::getenv("WORLD_SIZE"));
  if (!o.devices.empty() && o.shard != "auto" && torchrun) {
    std::fprintf(stderr,
                 "%s: --devices under torchrun (TORCHELASTIC_RUN_ID or LOCAL_RANK and WORLD_SIZE are set): torchrun "
                 "already runs one process per GPU; use --shard auto without --devices\n",
                 cmd);
    return kExitUsage;
  }

  // ---- the shapes: read, keep --op's rows, drop duplicates (or the
  // model's units, --op's only when given); the shard's units
  Shapes shapes;
  if (int e = o.model.empty() ? read_shapes(o, cmd, *find_op(o.op), &shapes) : model_shapes(o, cmd, &shapes); e >= 0)
    return e;
  if (int e = select_shard(&o, cmd, &shapes); e >= 0) return e;
  if (o.list) return list_units(o, shapes);

  // ---- the emit dir and a runtime over it, the device
  int exit_code = kExitOk;
  std::unique_ptr<dsp::Runtime> rt = emit_runtime(o, cmd, &exit_code);
  if (!rt) return exit_code;
  if (!o.json) print_plan(o, cmd, shapes, *rt);
  if (!o.devices.empty()) return run_devices(o, cmd, shapes, *rt);
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
    print_json(o, target.device, s, rt->options().tune.time_budget_ms, results, shapes);
  else
    print_text(o, s, shapes);
  return s.failed > 0 ? kExitFailure : kExitOk;
}

}  // namespace kdispatch_cli
