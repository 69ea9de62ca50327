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
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "cli/cli.hpp"
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

std::optional<std::vector<ShapeRow>> read_shape_csv(const std::string& path, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = path + ": cannot open the shape file";
    return std::nullopt;
  }
  enum Col { kOp, kBackend, kDevice, kDtype, kOutDtype, kM, kN, kK, kHidden, kBias, kStride, kCount, kKey, kBatch, kOther };
  const std::map<std::string, Col> names = {
      {"op", kOp},         {"backend", kBackend},     {"device_name", kDevice}, {"dtype", kDtype},
      {"out_dtype", kOutDtype}, {"outdtype", kOutDtype}, {"m", kM},           {"n", kN},
      {"k", kK},           {"hidden", kHidden},       {"bias", kBias},          {"stride", kStride},
      {"count", kCount},   {"key", kKey},             {"b", kBatch}};
  std::vector<Col> cols;
  std::vector<ShapeRow> rows;
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
    // RFC 4180 fields: a field in double quotes may hold commas (the misses
    // CSV quotes its key column).
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
    if (cols.empty()) {  // the header
      bool has_m = false;
      for (std::string_view name : f) {
        auto it = names.find(lower(name));
        cols.push_back(it == names.end() ? kOther : it->second);
        has_m = has_m || cols.back() == kM;
      }
      if (!has_m) return fail("the header names no M column (expected e.g. 'M,N,K' or 'M,hidden')");
      continue;
    }
    // Fields past the header's last column belong to it (an unquoted
    // last column holding commas, as older misses CSVs wrote the key).
    std::string last_joined;
    if (f.size() > cols.size()) {
      const size_t lastc = cols.size() - 1;
      const char* b = f[lastc].data();
      const char* e = f.back().data() + f.back().size();
      last_joined.assign(b, static_cast<size_t>(e - b));
      f.resize(cols.size());
      f[lastc] = last_joined;
    }
    ShapeRow r;
    r.line = line_no;
    bool has_m = false;
    for (size_t i = 0; i < cols.size() && i < f.size(); ++i) {
      const std::string_view v = f[i];
      int64_t* num = nullptr;
      switch (cols[i]) {
        case kOp: r.op = std::string(v); break;
        case kBackend: r.backend = std::string(v); break;
        case kDevice: r.device_name = std::string(v); break;
        case kDtype: r.dtype = std::string(v); break;
        case kOutDtype: r.out_dtype = std::string(v); break;
        case kStride: r.stride = std::string(v); break;
        case kKey:
        case kOther: break;
        case kBias: {
          const std::string b = lower(v);
          if (b == "true" || b == "1") r.bias = true;
          else if (b == "false" || b == "0" || b.empty()) r.bias = false;
          else return fail("bias '" + std::string(v) + "' is not true or false");
          break;
        }
        case kM: num = &r.m; has_m = true; break;
        case kN: num = &r.n; break;
        case kK: num = &r.k; break;
        case kHidden: num = &r.hidden; break;
        case kCount: num = &r.count; break;
        case kBatch: num = &r.batch; break;
      }
      if (num && !(v.empty() && cols[i] != kM)) {
        const char* what = cols[i] == kM ? "M" : cols[i] == kN ? "N" : cols[i] == kK ? "K"
                           : cols[i] == kHidden ? "hidden" : cols[i] == kCount ? "count" : "B";
        if (!parse_int(v, num) || *num < 0 || (cols[i] == kM && *num < 1))
          return fail(std::string(what) + " '" + std::string(v) + "' is not an integer >= " +
                      (cols[i] == kM ? "1" : "0"));
      }
    }
    if (!has_m) return fail("no M value");
    rows.push_back(std::move(r));
  }
  if (in.bad()) {
    *error = path + ": read error";
    return std::nullopt;
  }
  if (cols.empty()) {
    *error = path + ": empty file (no header)";
    return std::nullopt;
  }
  return rows;
}

// ---------------------------------------------------------------- kdispatch tune

namespace {

using Clock = std::chrono::steady_clock;

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

// One shape to tune.
struct Job {
  std::string file;
  int line = 0;
  dsp::DType dtype = dsp::DType::bf16, out_dtype = dsp::DType::bf16;
  int64_t m = 0, n = 0, k = 0, hidden = 0;
  bool bias = false;
  std::string stride;
  double flops = 0;

  // What the progress line and the summary call it: "N=896,K=896,bf16", "hidden=896,bf16".
  std::string label(bool gemm) const {
    std::string s = gemm ? "N=" + std::to_string(n) + ",K=" + std::to_string(k) : "hidden=" + std::to_string(hidden);
    s += ",";
    s += dsp::dtype_name(dtype);
    if (gemm && out_dtype != dtype) s += "->" + std::string(dsp::dtype_name(out_dtype));
    if (bias) s += ",bias";
    if (!stride.empty()) s += ",stride=" + stride;
    return s;
  }
  // The lookup key fields (the file name's fields other than device_name).
  std::string key_fields(bool gemm) const {
    std::string s = gemm ? "N=" + std::to_string(n) + ",K=" + std::to_string(k) : "hidden=" + std::to_string(hidden);
    s += ",dtype=" + std::string(dsp::dtype_name(dtype));
    if (gemm && bias) s += ",bias=true";
    if (gemm && out_dtype != dtype) s += ",out_dtype=" + std::string(dsp::dtype_name(out_dtype));
    if (!stride.empty()) s += ",stride=" + stride;
    return s;
  }
  auto id() const { return std::make_tuple(dtype, out_dtype, n, k, hidden, bias, stride, m); }
};

// A stride field ("o1_o1_o1") applied to the operands' strides, so the
// scratch problem has the key the misses CSV recorded: per operand, per
// dim, '0' = broadcast, '1' = unit, 'o' = another stride (rows: the row
// length; the last dim: the row count). False when the field is malformed.
bool apply_stride(const std::string& field, dsp::TensorRef* const* ops, int n) {
  if (field.empty()) return true;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t u = field.find('_', start);
    parts.push_back(field.substr(start, u == std::string::npos ? std::string::npos : u - start));
    if (u == std::string::npos) break;
    start = u + 1;
  }
  if (static_cast<int>(parts.size()) != n) return false;
  for (int i = 0; i < n; ++i) {
    dsp::TensorRef& t = *ops[i];
    const std::string& p = parts[i];
    if (static_cast<int>(p.size()) != t.rank) return false;
    for (int d = 0; d < t.rank; ++d) {
      const int64_t other = std::max<int64_t>(2, d == 0 && t.rank == 2 ? t.shape[1] : t.shape[0]);
      switch (p[d]) {
        case '0': t.strides[d] = 0; break;
        case '1': t.strides[d] = 1; break;
        case 'o': t.strides[d] = other; break;
        default: return false;
      }
    }
  }
  return true;
}

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

}  // namespace

int run_tune(const TuneCmdOptions& o) {
  const char* cmd = "kdispatch tune";
  const std::string& op = o.op;
  if (op != "gemm" && op != "rmsnorm" && op != "fused_add_rmsnorm") {
    std::fprintf(stderr, "%s: --op '%s' is not gemm, rmsnorm or fused_add_rmsnorm\n", cmd, op.c_str());
    return kExitUsage;
  }
  const bool gemm = op == "gemm";
  const auto default_dtype = dtype_from_csv(o.dtype);
  if (!default_dtype) {
    std::fprintf(stderr, "%s: --dtype '%s' is not a dtype (fp32, bf16, fp16)\n", cmd, o.dtype.c_str());
    return kExitUsage;
  }
  if (!(o.max_flops > 0)) {
    std::fprintf(stderr, "%s: --max-flops must be > 0, got %g\n", cmd, o.max_flops);
    return kExitUsage;
  }
  if (o.mem_gib < 0 || !std::isfinite(o.mem_gib)) {
    std::fprintf(stderr, "%s: --mem-gib must be > 0, got %g\n", cmd, o.mem_gib);
    return kExitUsage;
  }
  if (o.budget_ms < 0 || !std::isfinite(o.budget_ms)) {
    std::fprintf(stderr, "%s: --budget-ms must be > 0, got %g\n", cmd, o.budget_ms);
    return kExitUsage;
  }
  if (o.max_candidates != -1 && o.max_candidates < 1) {
    std::fprintf(stderr, "%s: --max-candidates must be >= 1, got %d\n", cmd, o.max_candidates);
    return kExitUsage;
  }
  if (o.reps < 0) {
    std::fprintf(stderr, "%s: --reps must be >= 1, got %d\n", cmd, o.reps);
    return kExitUsage;
  }
  if (o.backend != "cpu" && o.backend != "cuda" && o.backend != "hip") {
    std::fprintf(stderr, "%s: --backend '%s' is not cpu, cuda or hip\n", cmd, o.backend.c_str());
    return kExitUsage;
  }

  // ---- the shapes: read, keep --op's rows, drop duplicates
  std::vector<Job> jobs;
  std::vector<Outcome> unsupported;  // rows of --op this host cannot tune
  std::map<std::string, int64_t> other_rows;  // rows left out: another op -> count
  {
    std::set<decltype(Job{}.id())> seen;
    for (const std::string& file : o.shapes) {
      std::string err;
      auto rows = read_shape_csv(file, &err);
      if (!rows) {
        std::fprintf(stderr, "%s: --shapes: %s\n", cmd, err.c_str());
        return kExitUsage;
      }
      for (const ShapeRow& r : *rows) {
        // The row's op: its own column, else what its columns describe
        // (N,K: a GEMM; hidden: a norm, which one --op says).
        std::string row_op = r.op;
        if (row_op.empty()) row_op = r.n > 0 || r.k > 0 ? "gemm" : r.hidden > 0 ? (gemm ? "norm" : op) : "?";
        if (row_op != op) {
          other_rows[row_op == "norm" ? "rmsnorm/fused_add_rmsnorm (M,hidden)" : row_op]++;
          continue;
        }
        Job j;
        j.file = file;
        j.line = r.line;
        j.m = r.m;
        j.n = r.n;
        j.k = r.k;
        j.hidden = r.hidden;
        j.bias = r.bias;
        j.stride = r.stride;
        Outcome bad;
        bad.kind = Outcome::Kind::unsupported;
        bad.m = r.m;
        const std::string where = file + ":" + std::to_string(r.line);
        const auto dt = r.dtype.empty() ? default_dtype : dtype_from_csv(r.dtype);
        const auto out = r.out_dtype.empty() ? dt : dtype_from_csv(r.out_dtype);
        if (!dt || !out) {
          bad.label = where;
          bad.message = "dtype '" + (dt ? r.out_dtype : r.dtype) + "' has no kernel here";
          unsupported.push_back(bad);
          continue;
        }
        j.dtype = *dt;
        j.out_dtype = gemm ? *out : *dt;
        bad.label = j.label(gemm);
        if (!r.backend.empty() && r.backend != o.backend) {
          bad.message = "backend '" + r.backend + "': this run tunes on " + o.backend + " (--backend)";
        } else if (r.batch > 1) {
          bad.message = "batched GEMM (B=" + std::to_string(r.batch) + ") is not a kdispatch op";
        } else if (gemm && (j.n < 1 || j.k < 1)) {
          bad.message = where + ": a gemm row needs N and K >= 1";
        } else if (!gemm && j.hidden < 1) {
          bad.message = where + ": a " + op + " row needs hidden >= 1";
        }
        if (!bad.message.empty()) {
          unsupported.push_back(bad);
          continue;
        }
        j.flops = gemm ? 2.0 * j.m * j.n * j.k : 4.0 * j.m * j.hidden;
        if (seen.insert(j.id()).second) jobs.push_back(std::move(j));
      }
    }
  }

  // ---- the emit dir and a runtime over it (no shipped configs, no other dir)
  std::error_code ec;
  if (fs::exists(o.emit, ec) && !fs::is_directory(o.emit, ec)) {
    std::fprintf(stderr, "%s: --emit '%s' is not a directory\n", cmd, o.emit.c_str());
    return kExitUsage;
  }
  fs::create_directories(o.emit, ec);
  if (ec) {
    std::fprintf(stderr, "%s: cannot create --emit dir '%s': %s\n", cmd, o.emit.c_str(), ec.message().c_str());
    return kExitFailure;
  }
  dsp::RuntimeOptions ro;
  ro.load_shipped_configs = false;
  ro.tune.mode = dsp::TuneMode::off;  // pretune works in every mode
  ro.tune.cache_dir = o.emit;         // winners persist straight into the emit dir
  ro.tune.persist = true;
  ro.tune.load_cache = true;          // its rows (this build's) are the "done" set
  ro.tune.keep_rows_of_other_builds = true;  // an emit dir is committed configs: never drop rows on merge
  if (o.budget_ms > 0) ro.tune.time_budget_ms = o.budget_ms;
  if (o.mem_gib > 0) {
    ro.tune.memory_budget_bytes = static_cast<int64_t>(o.mem_gib * 1073741824.0);
  } else if (std::getenv("KDISPATCH_TUNE_MEM")) {
    auto env = dsp::options_from_env();
    if (!env.ok()) {
      std::fprintf(stderr, "%s: %s\n", cmd, env.status().to_string().c_str());
      return kExitUsage;
    }
    ro.tune.memory_budget_bytes = env->tune.memory_budget_bytes;
  }
  if (std::getenv("KDISPATCH_LOG_LEVEL")) {  // info: every shape's confirmation rounds
    auto env = dsp::options_from_env();
    if (!env.ok()) {
      std::fprintf(stderr, "%s: %s\n", cmd, env.status().to_string().c_str());
      return kExitUsage;
    }
    ro.log_level = env->log_level;
  }
  if (o.no_cold_cache) ro.tune.cold_cache = false;
  if (o.reps > 0) ro.tune.reps = o.reps;
  if (o.max_candidates >= 1) ro.tune.max_candidates = o.max_candidates;
  auto rt_r = dsp::Runtime::create(ro);
  if (!rt_r.ok()) {
    std::fprintf(stderr, "%s: cannot create the runtime over '%s': %s\n", cmd, o.emit.c_str(),
                 rt_r.status().to_string().c_str());
    return kExitFailure;
  }
  dsp::Runtime& rt = **rt_r;
  const dsp::LoadReport report = rt.load_report();
  int stale = 0;
  for (const auto& f : report.files) stale += f.stale;
  const dsp::TuneOptions& to = rt.options().tune;

  if (!o.json) {
    std::fprintf(stderr, "%s: %zu %s shapes from %zu file(s) -> %s (budget %.0f ms/shape, %d reps%s%s)\n", cmd,
                 jobs.size(), op.c_str(), o.shapes.size(), o.emit.c_str(), to.time_budget_ms, to.reps,
                 to.cold_cache ? ", cold cache" : ", warm cache", o.resume ? ", resuming" : "");
    for (const auto& [other, n] : other_rows)
      std::fprintf(stderr, "  left out %lld rows of %s\n", (long long)n, other.c_str());
    if (stale)
      std::fprintf(stderr,
                   "  note: %d file(s) in %s were written by another build (their fingerprint differs): their rows "
                   "do not count as done, and writing to such a file replaces them\n",
                   stale, o.emit.c_str());
  }

  // ---- tune
  std::vector<Outcome> results;
  Progress progress(jobs.size());
  const auto t0 = Clock::now();
  // The device the shapes are tuned on: its tensors' device selects the
  // backend, and its device_name goes into the emitted file names.
  const dsp::Device dev{o.backend == "cuda" ? dsp::DeviceType::cuda
                        : o.backend == "hip" ? dsp::DeviceType::hip
                                             : dsp::DeviceType::cpu,
                        0};
  std::string device = dsp::cpu_device_info().device_name;
  if (dev.type != dsp::DeviceType::cpu) {
    auto di = rt.device_info(dev);
    if (!di.ok() || !di->available) {
      std::fprintf(stderr, "%s: --backend %s: %s\n", cmd, o.backend.c_str(),
                   di.ok() ? di->unavailable_reason.c_str() : di.status().to_string().c_str());
      return kExitUsage;
    }
    device = di->device_name;
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    Outcome out;
    out.label = j.label(gemm);
    out.m = j.m;
    const std::string head = out.label + " M=" + std::to_string(j.m);
    if (j.flops > o.max_flops) {
      out.kind = Outcome::Kind::too_large;
      out.message = fmt("%.3g", j.flops) + " flops per call > --max-flops " + fmt("%.3g", o.max_flops);
      progress.done(i + 1, head + " skipped: " + out.message);
      results.push_back(std::move(out));
      continue;
    }
    if (o.resume) {
      dsp::LookupQuery q;
      q.op = op;
      q.key = j.key_fields(gemm);
      q.backend = o.backend;
      q.device = device;
      q.M = j.m;
      auto lr = dsp::lookup(rt, q);
      if (lr.ok() && lr->match == dsp::LookupResult::Match::exact) {
        out.kind = Outcome::Kind::done;
        out.variant = lr->variant;
        out.key = lr->key;
        out.config = lr->config;
        out.message = "already in " + o.emit;
        progress.done(i + 1, head + " skipped: already in the emit dir (" + lr->variant + ")");
        results.push_back(std::move(out));
        continue;
      }
    }
    progress.start(i + 1, head);
    dsp::Result<dsp::PretuneResult> r = dsp::make_status(dsp::StatusCode::internal, "not run");
    if (gemm) {
      dsp::GemmArgs a;
      a.a = dsp::make_tensor_2d(nullptr, j.dtype, j.m, j.k, j.k, dev);
      a.b = dsp::make_tensor_2d(nullptr, j.dtype, j.n, j.k, j.k, dev);
      a.d = dsp::make_tensor_2d(nullptr, j.out_dtype, j.m, j.n, j.n, dev);
      if (j.bias) a.bias = dsp::make_tensor_1d(nullptr, j.out_dtype, j.n, dev);  // rank 1, no data: "has a bias"
      dsp::TensorRef* ops[3] = {&a.a, &a.b, &a.d};
      if (!apply_stride(j.stride, ops, 3)) r = dsp::make_status(dsp::StatusCode::invalid_argument, "bad stride field '" + j.stride + "'");
      else r = dsp::pretune(rt, a);
    } else if (op == "rmsnorm") {
      dsp::RmsNormArgs a;
      a.x = dsp::make_tensor_2d(nullptr, j.dtype, j.m, j.hidden, j.hidden, dev);
      a.y = dsp::make_tensor_2d(nullptr, j.dtype, j.m, j.hidden, j.hidden, dev);
      a.w = dsp::make_tensor_1d(nullptr, j.dtype, j.hidden, dev);
      dsp::TensorRef* ops[3] = {&a.x, &a.y, &a.w};
      if (!apply_stride(j.stride, ops, 3)) r = dsp::make_status(dsp::StatusCode::invalid_argument, "bad stride field '" + j.stride + "'");
      else r = dsp::pretune(rt, a);
    } else {
      dsp::FusedAddRmsNormArgs a;
      a.x = dsp::make_tensor_2d(nullptr, j.dtype, j.m, j.hidden, j.hidden, dev);
      a.residual = dsp::make_tensor_2d(nullptr, j.dtype, j.m, j.hidden, j.hidden, dev);
      a.w = dsp::make_tensor_1d(nullptr, j.dtype, j.hidden, dev);
      dsp::TensorRef* ops[3] = {&a.x, &a.residual, &a.w};
      if (!apply_stride(j.stride, ops, 3)) r = dsp::make_status(dsp::StatusCode::invalid_argument, "bad stride field '" + j.stride + "'");
      else r = dsp::pretune(rt, a);
    }
    if (!r.ok()) {
      // Over the scratch-memory budget is "too large here", like --max-flops.
      out.kind = r.status().code() == dsp::StatusCode::out_of_memory ? Outcome::Kind::too_large
                                                                      : Outcome::Kind::failed;
      out.message = r.status().to_string();
      progress.done(i + 1, head + (out.kind == Outcome::Kind::failed ? " FAILED: " : " skipped: ") + out.message);
      results.push_back(std::move(out));
      continue;
    }
    out.kind = Outcome::Kind::tuned;
    out.variant = r->variant;
    out.key = r->key;
    out.config = r->config;
    out.us = r->best_us;
    out.default_us = r->default_us;
    out.candidates = r->candidates;
    out.rejected = r->rejected;
    out.persisted = r->persisted;
    std::string line = head + " -> " + r->variant + " " + fmt("%.1f", r->best_us) + "us (default " +
                       fmt("%.1f", r->default_us) + "us, " +
                       (r->best_us > 0 && r->default_us > 0 ? fmt("%.2f", r->default_us / r->best_us) + "x" : "n/a") +
                       ", " + std::to_string(r->candidates) + (r->candidates == 1 ? " candidate)" : " candidates)");
    if (!r->persisted) {
      out.kind = Outcome::Kind::failed;
      out.message = "tuned but not written to " + o.emit;
      line += " FAILED: not written to the emit dir";
    }
    progress.done(i + 1, line);
    results.push_back(std::move(out));
  }
  progress.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  // ---- summary
  int64_t n_tuned = 0, n_done = 0, n_large = 0, n_failed = 0;
  double log_sum = 0;
  int64_t n_speed = 0;
  for (const Outcome& r : results) {
    switch (r.kind) {
      case Outcome::Kind::tuned:
        ++n_tuned;
        if (r.us > 0 && r.default_us > 0) {
          log_sum += std::log(r.default_us / r.us);
          ++n_speed;
        }
        break;
      case Outcome::Kind::done: ++n_done; break;
      case Outcome::Kind::too_large: ++n_large; break;
      case Outcome::Kind::unsupported: break;
      case Outcome::Kind::failed: ++n_failed; break;
    }
  }
  const auto n_unsupported = static_cast<int64_t>(unsupported.size());
  const double geomean = n_speed ? std::exp(log_sum / static_cast<double>(n_speed)) : 0.0;
  // The files under <emit>/cpu/<op>/ (what a commit would add).
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(fs::path(o.emit) / o.backend / op, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec) && it->path().extension() == ".json" && it->path().filename().string()[0] != '.')
      files.push_back(fs::relative(it->path(), o.emit, ec).generic_string());
  std::sort(files.begin(), files.end());

  if (o.json) {
    using dsp::core::json_append_double;
    using dsp::core::json_append_int;
    using dsp::core::json_append_string;
    std::string j = "{\"op\": ";
    json_append_string(j, op);
    j += ", \"emit\": ";
    json_append_string(j, o.emit);
    j += ", \"device_name\": ";
    json_append_string(j, device);
    j += ", \"shapes\": ";
    json_append_int(j, static_cast<int64_t>(jobs.size()) + n_unsupported);
    j += ", \"tuned\": ";
    json_append_int(j, n_tuned);
    j += ", \"skipped\": ";
    json_append_int(j, n_done + n_large + n_unsupported);
    j += ", \"skipped_done\": ";
    json_append_int(j, n_done);
    j += ", \"skipped_too_large\": ";
    json_append_int(j, n_large);
    j += ", \"skipped_unsupported\": ";
    json_append_int(j, n_unsupported);
    j += ", \"failed\": ";
    json_append_int(j, n_failed);
    j += ", \"seconds\": ";
    json_append_double(j, std::round(seconds * 1000) / 1000);
    j += ", \"geomean_speedup\": ";
    json_append_double(j, std::round(geomean * 1000) / 1000);
    j += ", \"budget_ms\": ";
    json_append_double(j, to.time_budget_ms);
    j += ", \"files\": [";
    for (size_t i = 0; i < files.size(); ++i) {
      if (i) j += ", ";
      json_append_string(j, files[i]);
    }
    j += "], \"results\": [";
    bool first = true;
    auto add = [&](const Outcome& r) {
      j += first ? "{\"shape\": " : ", {\"shape\": ";
      first = false;
      json_append_string(j, r.label);
      j += ", \"M\": ";
      json_append_int(j, r.m);
      j += ", \"status\": ";
      json_append_string(j, kind_name(r.kind));
      if (!r.variant.empty()) {
        j += ", \"variant\": ";
        json_append_string(j, r.variant);
        j += ", \"config\": " + dsp::config_to_json(r.config);
      }
      if (!r.key.empty()) {
        j += ", \"key\": ";
        json_append_string(j, r.key);
      }
      if (r.kind == Outcome::Kind::tuned) {
        j += ", \"us\": ";
        json_append_double(j, std::round(r.us * 1000) / 1000);
        j += ", \"default_us\": ";
        json_append_double(j, std::round(r.default_us * 1000) / 1000);
        j += ", \"speedup\": ";
        json_append_double(j, r.us > 0 ? std::round(r.default_us / r.us * 1000) / 1000 : 0.0);
        j += ", \"candidates\": ";
        json_append_int(j, r.candidates);
        j += ", \"rejected\": ";
        json_append_int(j, r.rejected);
      }
      if (!r.message.empty()) {
        j += ", \"message\": ";
        json_append_string(j, r.message);
      }
      j += "}";
    };
    for (const Outcome& r : results) add(r);
    for (const Outcome& r : unsupported) add(r);
    j += "]}\n";
    std::fputs(j.c_str(), stdout);
  } else {
    for (const Outcome& r : unsupported)
      std::fprintf(stderr, "  skipped %s M=%lld: %s\n", r.label.c_str(), (long long)r.m, r.message.c_str());
    std::printf("%lld %s shapes: %lld tuned, %lld skipped (%lld already in %s, %lld too large here, %lld not "
                "tunable here), %lld failed; %.1f s\n",
                (long long)(static_cast<int64_t>(jobs.size()) + n_unsupported), op.c_str(), (long long)n_tuned,
                (long long)(n_done + n_large + n_unsupported), (long long)n_done, o.emit.c_str(), (long long)n_large,
                (long long)n_unsupported, (long long)n_failed, seconds);
    if (n_speed)
      std::printf("geomean speedup vs get_default: %.2fx over %lld tuned shapes\n", geomean, (long long)n_speed);
    std::printf("%zu config file(s) under %s/%s/%s/%s\n", files.size(), o.emit.c_str(), o.backend.c_str(), op.c_str(),
                files.empty() ? "" : " (the format configs/ holds; check them with `kdispatch validate`)");
  }
  return n_failed > 0 ? kExitFailure : kExitOk;
}

}  // namespace kdispatch_cli
